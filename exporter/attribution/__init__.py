"""Who uses the GPUs: processes (procfs, cgroups) and pods (the kubelet), joined to a reading.

Attribution is the one entry point the monitor calls: start() once, then refresh() per
snapshot with the GPU reading and the refresh's deadline. Behind it: procfs on the
resmon-procfs thread, the kubelet's List on its own thread, the pod-log directories on the
resmon-podlogs thread (each waited for a bounded time, so a slow one costs its collector,
never the GPU's), and the join (join.py). grpc is imported only where the socket exists.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Mapping

from ..config import MonitorOptions
from ..logs import fields
from ..samples import AllocationSample, CollectorStatus, GpuReading, MigSlot, PartStatus, ProcessSample
from . import join
from .deviceids import HostGpus, normalise_pci
from .kubelet import KubeletReader, KubeletState
from .podlogs import LogNames
from .procfs import DeadlineReader, ProcReader

# A refresh that starts a kubelet List waits this long for it (a healthy kubelet answers in
# milliseconds); a slower answer is served to the next refresh. Well under the 0.25 s
# shortest scrape deadline, so a hung kubelet cannot fail a concurrent scrape's GPU collector.
_KUBELET_WAIT = 0.1
# The same for a check of the kubelet's log directories (two stats and a few small listings),
# and for procfs (a few files per GPU process: milliseconds for hundreds of processes). A
# slower procfs costs the processes collector (left out, success 0), never the GPU's.
_NAMES_WAIT = 0.1
_PROCFS_WAIT = 0.2


@dataclass(frozen=True, slots=True)
class Attributed:
    """One refresh's attribution. gpu: the reading, its processes part failed where some
    process could not be read in time; None fields: that collector is off."""

    gpu: GpuReading | None
    processes: tuple[ProcessSample, ...] | None
    allocations: tuple[AllocationSample, ...] | None
    kubernetes_status: CollectorStatus | None
    # DRA devices that resolve to no GPU of this host: (driver, count) for every DRA driver
    # the List named; None where allocations are None
    unresolved_devices: tuple[tuple[str, int], ...] | None = None


class Attribution:
    """processes: whether GPU processes are read (the processes collector, with a GPU
    backend); the kubernetes collector follows options."""

    def __init__(self, options: MonitorOptions, processes: bool, log: logging.Logger) -> None:
        kube = options.kubernetes
        # procfs is read on a thread of its own up to the refresh's deadline (issue 22, 16)
        self._procs = DeadlineReader(ProcReader(options.processes.procfs)) if processes else None
        # the GPUs seen so far (replaced whole by the one refresh at a time, read by the List
        # thread): a List keeps only the allocations that may name one of them
        self._host_gpus = HostGpus()
        self._kubelet = (
            KubeletReader(kube.pod_resources_socket, kube.cache_ttl, options.collect_timeout, log,
                          keep=lambda resource, device_id: self._host_gpus.names(resource, device_id),
                          keep_dra=lambda driver, device: self._host_gpus.names_dra(driver, device))
            if options.enabled("kubernetes") else None
        )
        # the kubelet's log directories, listed off the scrape path (only where process
        # attribution can use them)
        self._log = log
        self._warned: frozenset[tuple[str, str]] = frozenset()  # unresolved DRA devices warned about
        self._log_names = (
            LogNames(kube.pod_logs_dir, kube.container_logs_dir, log)
            if self._procs is not None and self._kubelet is not None else None
        )
        # GPU UUID -> MIG UUIDs it listed while up: a down GPU lists none, and its MIG pods
        # must still resolve to it (replaced whole by the one refresh running at a time)
        self._last_migs: Mapping[str, tuple[str, ...]] = {}
        self._last_slots: Mapping[str, tuple[MigSlot, ...]] = {}  # the same for DRA's MIG names

    def start(self) -> None:
        """The kubelet's first List and the first log-directory listing, in the background."""
        if self._kubelet is not None:
            self._kubelet.prepare()  # grpc imported here where the socket exists, not in the first List
            self._kubelet.read(0.0)  # the first List, in the background
        if self._log_names is not None:
            self._log_names.start()  # the first listing, in the background

    def refresh(self, gpu: GpuReading | None, deadline: float, max_per_gpu: int) -> Attributed:
        """Attribution for this GPU reading, read until the monotonic deadline, at most
        max_per_gpu allocation series per GPU. Called by one refresh at a time (the
        monitor's single flight)."""
        kube = self._kubelet.read(min(deadline - time.monotonic(), _KUBELET_WAIT)) if self._kubelet else None
        allocations = None
        unresolved = None
        if self._kubelet is not None:
            self._last_migs = join.known_migs(gpu, self._last_migs)
            self._last_slots = join.known_slots(gpu, self._last_slots)
            if kube is not None:
                missed: dict[str, list[str]] = {}
                allocations = join.allocations(gpu, kube, self._last_migs, self._last_slots, missed)
                unresolved = self._unresolved(kube, missed)
            self._note_gpus(gpu)
            allocations = _capped(allocations, max_per_gpu)
        processes, gpu = self._processes(gpu, deadline)
        status = CollectorStatus(kube.success, kube.duration_seconds, kube.timestamp_seconds) if kube else None
        return Attributed(gpu, processes, allocations, status, unresolved)

    def _unresolved(self, kube: KubeletState, missed: dict[str, list[str]]) -> tuple[tuple[str, int], ...]:
        """(driver, unresolved count) for every DRA driver of the List: those refused while
        decoding and those the join found no GPU for. Warns once per device name while it
        stays unresolved (again only after it resolved or left the List)."""
        if not kube.success:  # nothing listed: no count, and nothing forgotten of what was warned about
            return ()
        counts = {a.resource: 0 for a in kube.allocations if a.dra}
        names: set[tuple[str, str]] = set()
        for driver, n, example in kube.refused:
            counts[driver] = counts.get(driver, 0) + n
            names.add((driver, example))
        for driver, devices in missed.items():
            counts[driver] = counts.get(driver, 0) + len(devices)
            names.update((driver, d) for d in devices)
        for driver, device in sorted(names - self._warned):
            self._log.warning(
                "a DRA device resolves to no GPU of this host: not attributed",
                extra=fields(resource=driver, device=device, unresolved=counts[driver]),
            )
        self._warned = frozenset(names)
        return tuple(sorted(counts.items()))

    def _note_gpus(self, gpu: GpuReading | None) -> None:
        if gpu is None:
            return
        seen = HostGpus(
            uuids=frozenset(d.identity.uuid for d in gpu.devices if d.identity.uuid),
            mig_uuids=frozenset(m for d in gpu.devices for m in d.mig_uuids),
            indices=frozenset(d.identity.index for d in gpu.devices),
            pci=frozenset(normalise_pci(d.identity.pci_bus_id) for d in gpu.devices if d.identity.pci_bus_id),
            drm_cards=frozenset(d.identity.drm_card for d in gpu.devices if d.identity.drm_card),
            minors=frozenset(d.identity.minor for d in gpu.devices if d.identity.minor is not None),
        )
        merged = self._host_gpus.union(seen)  # a GPU that went down keeps its MIG UUIDs here
        if merged != self._host_gpus:
            self._host_gpus = merged

    def _processes(
        self, gpu: GpuReading | None, deadline: float
    ) -> tuple[tuple[ProcessSample, ...] | None, GpuReading | None]:
        """The processes with their owners, read until the refresh's deadline, and the GPU
        reading, its processes part failed where some process could not be read in time
        (those are left out: a slow procfs costs attribution, never the GPU collector)."""
        if self._procs is None:
            return None, gpu
        infos, complete = self._procs.read_all(join.pids(gpu), min(deadline, time.monotonic() + _PROCFS_WAIT))
        names = None
        if self._log_names is not None and gpu is not None and any(d.process_list for d in gpu.devices):
            uids = {i.container.pod_uid for i in infos.values() if i is not None and i.container.pod_uid}
            names = self._log_names.current(uids, min(max(0.0, deadline - time.monotonic()), _NAMES_WAIT))
        if not complete and gpu is not None:
            gpu = _processes_failed(gpu)
        return join.processes(gpu, infos, names), gpu


def _processes_failed(gpu: GpuReading) -> GpuReading:
    """The reading with its processes part unsuccessful (added where the backend has none)."""
    parts = tuple(dataclasses.replace(p, success=False) if p.name == "processes" else p for p in gpu.parts)
    if not any(p.name == "processes" for p in parts):
        parts += (PartStatus("processes", False, 0.0),)
    return dataclasses.replace(gpu, parts=parts)


def _capped(allocations: tuple[AllocationSample, ...] | None, limit: int) -> tuple[AllocationSample, ...] | None:
    """At most limit allocation series per GPU (the processes' --collector.processes.max-per-gpu),
    the first in label order: a List of 50,000 replicas of one GPU is not 50,000 series."""
    if allocations is None:
        return None
    counts: dict[tuple[int, str], int] = {}
    out = []
    for a in allocations:  # sorted by GPU, then labels (join.allocations)
        n = counts.get((a.gpu, a.uuid), 0)
        if n < limit:
            counts[(a.gpu, a.uuid)] = n + 1
            out.append(a)
    return allocations if len(out) == len(allocations) else tuple(out)
