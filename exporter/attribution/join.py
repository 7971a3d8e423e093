"""Who uses the GPU: joins the driver's process lists, procfs and the kubelet's allocations.

- A device id the kubelet reports (GPU-..., MIG-..., replicas ::N, indices, PCI ids) is
  resolved to one of the backend's GPUs; an id that resolves to none (another vendor's
  device, a GPU this backend does not see) is left out.
- A DRA device (driver, device name: draids.py) is resolved by the GPU's minor number, its
  MIG slot (GPU instance profile id and placement start, the profile cross-checked), its
  DRM card or PCI address; one that resolves to none is counted as unresolved, never put
  on a GPU by a guess.
- A process's container id, pod UID and Slurm job id come from its cgroup; namespace, pod and container
  names from the kubelet's log directories (by container id, else by pod UID: the
  PodResources API carries neither). Each process is attributed by its own cgroup: pods
  sharing a GPU never inherit each other's (or the whole device's) numbers, and a sidecar
  that did not ask for the GPU is not named after the container that did.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

from ..samples import AllocationSample, GpuReading, GpuSample, MigSlot, ProcessSample
from .cgroups import ContainerRef
from .deviceids import DRM_CARD_RESOURCES, INDEXED_RESOURCES, DeviceRef, normalise_pci, parse_device_id
from .draids import BACKEND_OF, DraRef, parse_dra_device, profile_in_name
from .kubelet import KubeletState
from .podlogs import AMBIGUOUS, Names
from .procfs import ProcessInfo


class _Devices:
    """The reading's GPUs, looked up the ways device plugins name them."""

    def __init__(
        self, devices: Iterable[GpuSample], last_migs: Mapping[str, tuple[str, ...]],
        last_slots: Mapping[str, tuple[MigSlot, ...]] | None = None,
    ) -> None:
        self.by_minor: dict[int, GpuSample] = {}
        self.by_slot: dict[tuple[int, int, int], tuple[GpuSample, MigSlot]] = {}
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
            if ident.minor is not None and (ident.minor not in self.by_minor or d.up):
                self.by_minor[ident.minor] = d
                # a down GPU answers no MIG query: its MIG slots are the last ones it listed
                slots = d.mig_slots if d.up else d.mig_slots or (last_slots or {}).get(ident.uuid, ())
                for slot in slots:
                    self.by_slot[(ident.minor, slot.gi_profile_id, slot.placement_start)] = (d, slot)

    def resolve_dra(self, ref: DraRef) -> GpuSample | None:
        if ref.mig:
            assert ref.minor is not None and ref.gi_profile_id is not None and ref.placement_start is not None
            found = self.by_slot.get((ref.minor, ref.gi_profile_id, ref.placement_start))
            # the profile text must agree too: an older driver's "gpu-<minor>-mig-<profile id>-<start>-<size>"
            # parses as well, with other numbers
            if found is None or profile_in_name(found[1].profile) != ref.mig_profile:
                return None
            return found[0]
        if ref.minor is not None:
            return self.by_minor.get(ref.minor)
        if ref.drm_card:
            return self.by_card.get(ref.drm_card)
        if ref.pci_bus_id:
            return self.by_pci.get(ref.pci_bus_id)
        return None

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
    reading: GpuReading | None, state: KubeletState, last_migs: Mapping[str, tuple[str, ...]] | None = None,
    last_slots: Mapping[str, tuple[MigSlot, ...]] | None = None, unresolved: dict[str, list[str]] | None = None,
) -> tuple[AllocationSample, ...]:
    """One sample per container and device id that resolves to a GPU, duplicates (old
    kubelets list terminal pods too) merged, sorted for stable output. last_migs, last_slots:
    GPU UUID -> the MIG UUIDs and slots it last listed while up (known_migs, known_slots), for
    the GPUs that are down now. unresolved: filled with driver -> the names of the DRA devices
    that resolve to no GPU of the reading (device-plugin ids that do not resolve are not GPU
    ids of this backend and are left out silently)."""
    if reading is None:
        return ()
    devices = _Devices(reading.devices, last_migs or {}, last_slots)
    out: set[AllocationSample] = set()
    for a in state.allocations:
        if a.dra:
            dra = parse_dra_device(a.resource, a.device_id) if BACKEND_OF.get(a.resource) == reading.backend else None
            gpu = devices.resolve_dra(dra) if dra is not None else None
            if gpu is None and unresolved is not None:
                unresolved.setdefault(a.resource, []).append(a.device_id)
        else:
            ref = parse_device_id(a.device_id)
            gpu = devices.resolve(ref, a.resource) if ref is not None else None
        if gpu is not None:
            out.add(AllocationSample(gpu.identity.index, gpu.identity.uuid, a.namespace, a.pod, a.container,
                                     a.resource, a.device_id, a.claim, a.share))
    return tuple(sorted(out, key=lambda s: (s.gpu, s.uuid, s.namespace, s.pod, s.container, s.device_id,
                                            s.resource, s.claim, s.share)))


def known_slots(reading: GpuReading | None, last: Mapping[str, tuple[MigSlot, ...]]) -> Mapping[str, tuple[MigSlot, ...]]:
    """GPU UUID -> its MIG slots, as known_migs() keeps the UUIDs (a down GPU's last ones)."""
    return _known_per_gpu(reading, last, "mig_slots")


def known_migs(reading: GpuReading | None, last: Mapping[str, tuple[str, ...]]) -> Mapping[str, tuple[str, ...]]:
    """GPU UUID -> its MIG UUIDs: an answering GPU's own list (empty with MIG off), a down
    GPU's last known one; GPUs no longer in the reading are forgotten. A new mapping: the
    caller swaps it in whole, so a concurrent reader never sees it half updated."""
    return _known_per_gpu(reading, last, "mig_uuids")


def _known_per_gpu(reading: GpuReading | None, last: Mapping[str, tuple[Any, ...]], field: str) -> Mapping[str, tuple[Any, ...]]:
    """GPU UUID -> the device's tuple `field`: an answering GPU's own, a down GPU's last known."""
    if reading is None:
        return last
    out: dict[str, tuple[Any, ...]] = {}
    for d in reading.devices:
        uuid = d.identity.uuid
        if not uuid:
            continue
        values = getattr(d, field) if d.up else getattr(d, field) or last.get(uuid, ())
        if values:
            out[uuid] = values
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
