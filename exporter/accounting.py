"""Busy time and energy per workload: the processes' busy counters and the device's energy
counter, split per refresh interval (docs/metrics.md, "Busy time and energy per workload").

Per GPU and interval (from one reading in which the GPU answered with an energy value to the
next such reading, T seconds apart by the readings' own times):

- each listed process's busy seconds grew by b[p, engine] (the backend's per-process counters:
  NVML's per-process samples integrated, DRM client usage stats; a counter that went down was
  restarted by the backend: that interval counts nothing of it);
- its share time s[p] is its busiest engine's growth, max over engines of b[p, engine]: engines
  run at the same time, so a sum would count the overlap twice, and the busiest engine is the
  least the process kept the GPU from idling;
- the device's energy grew by dE (a decrease, a driver reload: the interval counts nothing,
  the next one starts from the new value);
- process p is charged e[p] = dE x s[p] / max(T, sum of s): a process busy the whole interval
  alone takes all of it; time-sliced processes whose shares add up to more than the interval
  (their samples overlap) are scaled down together, so the parts never exceed dE;
- the unattributed counter takes dE - sum of e[p]: idle time, and the share of listed
  processes the exporter could not attribute (procfs had no answer for them).

So the increases of the parts add up to dE (to float rounding) in every interval. A workload
is what the collector serves one series for (workload_key): a process, or with
group-by=container a container's processes of one Slurm job. Its counters are sums of its
processes' increases while they were listed, so they never decrease when one of them exits; a
workload without a process on the GPU is not served, and its counters are kept RETAIN_SECONDS
(at most RETAIN_MAX per GPU) in case a process of it comes back. Per process (group-by=process)
the counters end with the process.

Pure arithmetic on the snapshot's samples, no I/O. The monitor calls it from the refresh,
which is single flight; the lock keeps it right should two refreshes ever overlap. Cost per
refresh: a few dictionary operations per listed process; a process or workload whose counters
did not move keeps its served object (most refreshes build none).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .samples import GpuIdentity, GpuReading, ProcessSample, ProcessUsage, UnattributedEnergy, WorkloadUsage

# how long, and how many per GPU, the counters of a workload with no process left are kept
RETAIN_SECONDS = 3600.0
RETAIN_MAX = 256


def workload_key(p: ProcessSample, group_by: str) -> tuple[str, ...]:
    """The label values after gpu and uuid of the series p is served in (collectors/processes.py)."""
    owner = (p.container_id, p.pod_uid, p.namespace, p.pod, p.container, p.job_id)
    if group_by == "process":
        return (str(p.pid), p.process, p.user, *owner)
    return owner


_NONE: dict[str, float] = {}  # no growth (shared, never written)


@dataclass(slots=True)
class _Process:
    seen: dict[str, float] = field(default_factory=dict)  # engine -> the backend's counter, last seen
    raw: tuple[tuple[str, float], ...] = ()  # the backend's counters as last seen, whole (most refreshes: the same)
    busy: dict[str, float] = field(default_factory=dict)  # engine -> seconds counted here
    energy: float = 0.0
    usage: ProcessUsage | None = None  # what was served, kept while the counters stay (most refreshes)


@dataclass(slots=True)
class _Workload:
    at: float  # the time of the last reading it had a process in
    busy: dict[str, float] = field(default_factory=dict)
    energy: float = 0.0
    usage: WorkloadUsage | None = None  # as _Process.usage


@dataclass(slots=True)
class _Gpu:
    energy: float | None = None  # the device's counter at the last reading with one
    at: float | None = None  # that reading's time
    unattributed: float = 0.0
    processes: dict[int, _Process] = field(default_factory=dict)
    workloads: dict[tuple[str, ...], _Workload] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Accounted:
    processes: tuple[ProcessUsage, ...]  # per listed, attributed process with per-process busy time
    workloads: tuple[WorkloadUsage, ...]
    unattributed: tuple[UnattributedEnergy, ...]


def _device(identity: GpuIdentity) -> str:
    return identity.uuid or f"#{identity.index}"


class Accounting:
    """The counters per GPU, process and workload between refreshes (see the module docstring)."""

    def __init__(self, retain_seconds: float = RETAIN_SECONDS, retain_max: int = RETAIN_MAX) -> None:
        self._retain_seconds = retain_seconds
        self._retain_max = retain_max
        self._lock = threading.Lock()
        self._gpus: dict[str, _Gpu] = {}

    def update(
        self, reading: GpuReading | None, processes: tuple[ProcessSample, ...], group_by: str, at: float
    ) -> Accounted:
        """Fold in one reading (at: its time, seconds) and the processes attributed from it.
        A reading given twice (a caller served the last one again) adds nothing."""
        with self._lock:
            return self._update(reading, processes, group_by, at)

    def _update(
        self, reading: GpuReading | None, processes: tuple[ProcessSample, ...], group_by: str, at: float
    ) -> Accounted:
        if reading is None:
            return Accounted((), (), ())
        attributed: dict[tuple[int, str], list[ProcessSample]] = {}
        for p in processes:
            attributed.setdefault((p.gpu, p.uuid), []).append(p)
        usages: list[ProcessUsage] = []
        workloads: list[WorkloadUsage] = []
        unattributed: list[UnattributedEnergy] = []
        present: set[str] = set()
        for d in reading.devices:
            device = _device(d.identity)
            present.add(device)
            if not d.up or d.process_list is None:
                continue  # counters kept: a GPU back up goes on from them
            index, uuid = d.identity.index, d.identity.uuid
            state = self._gpus.setdefault(device, _Gpu())
            mine = attributed.get((index, uuid), [])
            grown = self._busy(state, [(p.pid, p.busy_seconds) for p in d.process_list if p.busy_seconds])
            charged = self._energy(state, d.energy_joules, at, grown, {p.pid for p in mine})
            has_energy = d.energy_joules is not None
            if has_energy:
                unattributed.append(UnattributedEnergy(index, uuid, state.unattributed))
            served: dict[tuple[str, ...], _Workload] = {}
            for p in mine:
                proc = state.processes.get(p.pid)
                if proc is None:
                    continue  # no per-process busy time: no counters
                usage = proc.usage
                if usage is None or (usage.energy_joules is not None) != has_energy:
                    usage = proc.usage = ProcessUsage(
                        index, uuid, p.pid, tuple(proc.busy.items()), proc.energy if has_energy else None
                    )
                usages.append(usage)
                key = workload_key(p, group_by)
                work = state.workloads.get(key)
                if work is None:  # a new workload: its process's engines from 0
                    work = state.workloads[key] = _Workload(at, dict.fromkeys(proc.busy, 0.0))
                work.at = at
                steps = grown[p.pid]
                if steps:
                    for engine, seconds in steps.items():
                        work.busy[engine] = work.busy.get(engine, 0.0) + seconds
                    work.usage = None
                joules = charged.get(p.pid)
                if joules:
                    work.energy += joules
                    work.usage = None
                served[key] = work
            for key, work in served.items():
                wusage = work.usage
                if wusage is None or (wusage.energy_joules is not None) != has_energy:
                    wusage = work.usage = WorkloadUsage(
                        index, uuid, key, tuple(work.busy.items()), work.energy if has_energy else None
                    )
                workloads.append(wusage)
            self._expire(state, served, group_by, at)
        for gone in self._gpus.keys() - present:  # a GPU the backend forgot
            del self._gpus[gone]
        return Accounted(tuple(usages), tuple(workloads), tuple(unattributed))

    @staticmethod
    def _busy(state: _Gpu, listed: list[tuple[int, tuple[tuple[str, float], ...]]]) -> dict[int, dict[str, float]]:
        """Each listed process's busy growth per engine since the last reading (only the
        engines that grew); processes no longer listed are forgotten (their counters end with
        them)."""
        grown: dict[int, dict[str, float]] = {}
        processes = state.processes
        for pid, counters in listed:
            proc = processes.get(pid)
            if proc is None:
                # the backend's counters start at 0 with it: all it reports is this interval's
                proc = processes[pid] = _Process(dict.fromkeys((e for e, _ in counters), 0.0),
                                                 dict.fromkeys((e for e, _ in counters), 0.0))
            elif counters == proc.raw:
                grown[pid] = _NONE  # nothing moved: the usual case of a listed process
                continue
            proc.raw = counters
            seen, busy = proc.seen, proc.busy
            steps: dict[str, float] = {}
            for engine, value in counters:
                last = seen.get(engine, 0.0)
                if value != last:
                    seen[engine] = value
                    if value > last:  # lower: restarted by the backend, a new baseline
                        steps[engine] = value - last
                        busy[engine] = busy.get(engine, 0.0) + value - last
                elif engine not in busy:
                    busy[engine] = 0.0
            if steps:
                proc.usage = None
            grown[pid] = steps
        if len(processes) != len(grown):
            for pid in processes.keys() - grown.keys():
                del processes[pid]
        return grown

    @staticmethod
    def _energy(
        state: _Gpu, energy: float | None, at: float, grown: dict[int, dict[str, float]], attributed: set[int]
    ) -> dict[int, float]:
        """The interval's energy split: joules per process (added to their counters), the
        rest to the unattributed counter, with the shares of listed processes that are not
        attributed (no procfs answer). Nothing before the first reading with energy, and
        nothing for an interval in which the device's counter went down."""
        if energy is None:
            return {}
        last, last_at = state.energy, state.at
        state.energy, state.at = energy, at
        if last is None or last_at is None or energy < last:
            return {}
        delta = energy - last
        shares = {pid: max(steps.values(), default=0.0) for pid, steps in grown.items()}
        total = sum(shares.values())
        span = max(at - last_at, total)
        charged: dict[int, float] = {}
        if span > 0 and total > 0:
            for pid, share in shares.items():
                if share > 0 and pid in attributed:
                    charged[pid] = delta * share / span
                    proc = state.processes[pid]
                    proc.energy += charged[pid]
                    proc.usage = None
        state.unattributed += delta - sum(charged.values())
        return charged

    def _expire(self, state: _Gpu, served: dict[tuple[str, ...], _Workload], group_by: str, at: float) -> None:
        """Workloads with no process now: per process gone at once; per container kept a while."""
        idle = [(work.at, key) for key, work in state.workloads.items() if key not in served]
        if group_by == "process":
            drop = [key for _, key in idle]
        else:
            idle.sort()
            drop = [key for when, key in idle if at - when > self._retain_seconds]
            keep = [key for when, key in idle if at - when <= self._retain_seconds]
            drop += keep[: max(0, len(keep) - self._retain_max)]
        for key in drop:
            del state.workloads[key]

