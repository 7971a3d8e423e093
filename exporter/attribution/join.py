"""Who uses the GPU: joins the driver's process lists, procfs and the kubelet's allocations.

- A device id the kubelet reports (GPU-..., MIG-..., replicas ::N, indices, PCI ids) is
  resolved to one of the backend's GPUs; an id that resolves to none (another vendor's
  device, a GPU this backend does not see) is left out.
- A process's container id, pod UID and Slurm job id come from its cgroup; namespace, pod and container
  names from the kubelet's log directories (by container id, else by pod UID: the
  PodResources API carries neither). Each process is attributed by its own cgroup: pods
  sharing a GPU never inherit each other's (or the whole device's) numbers, and a sidecar
  that did not ask for the GPU is not named after the container that did.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol

from ..samples import AllocationSample, GpuReading, GpuSample, ProcessSample
from .cgroups import ContainerRef
from .deviceids import DRM_CARD_RESOURCES, INDEXED_RESOURCES, DeviceRef, normalise_pci, parse_device_id
from .kubelet import KubeletState
from .podlogs import AMBIGUOUS, Names
from .procfs import ProcessInfo


class _Devices:
    """The reading's GPUs, looked up the ways device plugins name them."""

    def __init__(self, devices: Iterable[GpuSample], last_migs: Mapping[str, tuple[str, ...]]) -> None:
        self.by_uuid: dict[str, GpuSample] = {}
        self.by_mig: dict[str, GpuSample] = {}
        self.by_index: dict[int, GpuSample] = {}
        self.by_pci: dict[str, GpuSample] = {}
        self.by_card: dict[str, GpuSample] = {}
        for d in devices:
            ident = d.identity
            if ident.uuid:
                self.by_uuid[ident.uuid] = d
            # a down GPU answers no MIG query: its MIG devices are the last ones it listed
            for mig in d.mig_uuids if d.up else d.mig_uuids or last_migs.get(ident.uuid, ()):
                self.by_mig[mig] = d
            if ident.index not in self.by_index or d.up:  # a vanished GPU keeps its last index
                self.by_index[ident.index] = d
            if ident.pci_bus_id:
                self.by_pci[normalise_pci(ident.pci_bus_id)] = d
            if ident.drm_card:
                self.by_card[ident.drm_card] = d

    def resolve(self, ref: DeviceRef, resource: str) -> GpuSample | None:
        if ref.uuid:
            return self.by_uuid.get(ref.uuid)
        if ref.mig_uuid:
            return self.by_mig.get(ref.mig_uuid)
        if ref.mig_parent_uuid:
            return self.by_uuid.get(ref.mig_parent_uuid)
        if ref.pci_bus_id:
            return self.by_pci.get(normalise_pci(ref.pci_bus_id))
        if ref.index is not None and resource.startswith(INDEXED_RESOURCES):
            return self.by_index.get(ref.index)
        if ref.drm_card and resource.startswith(DRM_CARD_RESOURCES):
            return self.by_card.get(ref.drm_card)
        return None


def allocations(
    reading: GpuReading | None, state: KubeletState, last_migs: Mapping[str, tuple[str, ...]] | None = None
) -> tuple[AllocationSample, ...]:
    """One sample per container and device id that resolves to a GPU, duplicates (old
    kubelets list terminal pods too) merged, sorted for stable output. last_migs: GPU UUID ->
    the MIG UUIDs it last listed while up (see known_migs), for the GPUs that are down now."""
    if reading is None:
        return ()
    devices = _Devices(reading.devices, last_migs or {})
    out: set[AllocationSample] = set()
    for a in state.allocations:
        ref = parse_device_id(a.device_id)
        gpu = devices.resolve(ref, a.resource) if ref is not None else None
        if gpu is not None:
            out.add(AllocationSample(gpu.identity.index, gpu.identity.uuid, a.namespace, a.pod, a.container, a.resource, a.device_id))
    return tuple(sorted(out, key=lambda s: (s.gpu, s.uuid, s.namespace, s.pod, s.container, s.device_id)))


def known_migs(reading: GpuReading | None, last: Mapping[str, tuple[str, ...]]) -> Mapping[str, tuple[str, ...]]:
    """GPU UUID -> its MIG UUIDs: an answering GPU's own list (empty with MIG off), a down
    GPU's last known one; GPUs no longer in the reading are forgotten. A new mapping: the
    caller swaps it in whole, so a concurrent reader never sees it half updated."""
    if reading is None:
        return last
    out: dict[str, tuple[str, ...]] = {}
    for d in reading.devices:
        uuid = d.identity.uuid
        if not uuid:
            continue
        migs = d.mig_uuids if d.up else d.mig_uuids or last.get(uuid, ())
        if migs:
            out[uuid] = migs
    return out


def _owner(ref: ContainerRef, names: Names | None) -> tuple[str, str, str]:
    """namespace, pod, container of a process's cgroup: by container id where the kubelet
    linked its log into the directory of the cgroup's own pod UID, else the pod by UID (and
    its container only if it has just one). A UID two pod directories carry names nothing."""
    if names is None or not ref.pod_uid:
        return "", "", ""
    pod = names.pods.get(ref.pod_uid)
    if pod == AMBIGUOUS:
        return "", "", ""
    by_id = names.containers.get(ref.container_id) if ref.container_id else None
    if by_id is not None and by_id.pod_uid == ref.pod_uid:
        return by_id.namespace, by_id.pod, by_id.container
    if pod is None:
        return "", "", ""
    return pod.namespace, pod.pod, pod.containers[0] if len(pod.containers) == 1 else ""


def pids(reading: GpuReading | None) -> list[int]:
    """The PIDs processes() will look up: those of every answering GPU's process list."""
    if reading is None:
        return []
    return [p.pid for d in reading.devices if d.up and d.process_list is not None for p in d.process_list]


class _Reader(Protocol):
    def read(self, pid: int) -> ProcessInfo | None: ...


def processes(reading: GpuReading | None, procs: _Reader, names: Names | None) -> tuple[ProcessSample, ...]:
    """The processes of every answering GPU with their owners. A process that exited since
    the driver listed it (or that procs has no answer for) is skipped. procs: a ProcReader, or
    the Reads a DeadlineReader returned. names: None with the kubernetes collector off."""
    if reading is None:
        return ()
    out = []
    for d in reading.devices:
        if not d.up or d.process_list is None:
            continue
        for p in d.process_list:
            info = procs.read(p.pid)
            if info is None:
                continue
            ref = info.container
            namespace, pod, container = _owner(ref, names)
            out.append(
                ProcessSample(
                    gpu=d.identity.index, uuid=d.identity.uuid, pid=p.pid, process=info.comm, user=info.user,
                    container_id=ref.container_id, pod_uid=ref.pod_uid, namespace=namespace, pod=pod,
                    container=container, memory_bytes=p.memory_bytes, utilization=p.utilization,
                    job_id=ref.job_id,
                )
            )
    return tuple(out)
