"""The processes collector: VRAM and utilization per process on each GPU, with its owner.

One series per process (group-by=process) or per container and Slurm job (group-by=container,
summed; pid, process and user left out), at most max_per_gpu per GPU and family (per engine
for utilization), the largest by memory. And one resmon_gpu_job_info per GPU and Slurm job
with a process on it, every job (not cut by max_per_gpu: a job's processes may all be below
the cut, and the per-job joins need its row), whatever the grouping.

Busy seconds and energy per row are counters kept by exporter/accounting.py (the snapshot's
workloads: a container's keep what its exited processes added), served for the same rows as
the other families (the cut by memory), and the unattributed energy once per GPU.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..samples import CollectorStatus, ProcessSample, UnattributedEnergy, WorkloadUsage
from .series import GPU_LABELS, Scrape, part_status
from .series import put as _put

OWNER_LABELS = ["container_id", "pod_uid", "namespace", "pod", "container", "job_id"]
PROCESS_LABELS = ["pid", "process", "user"]
JOB_LABELS = ["scheduler", "job_id", "user"]
FAMILIES: dict[str, str] = {
    "resmon_gpu_process_memory_used_bytes": "gauge",
    "resmon_gpu_process_utilization_ratio": "gauge",
    "resmon_gpu_job_info": "gauge",
    "resmon_gpu_process_busy_seconds_total": "counter",
    "resmon_gpu_process_energy_joules_total": "counter",
    "resmon_gpu_unattributed_energy_joules_total": "counter",
}
# no process on a GPU is itself an answer: the families are declared, without samples (by
# the metric family's own name: a counter's without _total)
DECLARED_WHEN_EMPTY = frozenset(name.removesuffix("_total") for name in FAMILIES)

_Row = tuple[dict[str, str], int | None, dict[str, float]]  # labels, memory bytes, engine -> ratio


def _rows(processes: tuple[ProcessSample, ...], group_by: str) -> list[list[_Row]]:
    """The rows to serve, one list per GPU, before the per-GPU limit. Rows with the same
    labels (with group-by=container a container's processes of one Slurm job, or the host's
    outside any job) are summed."""
    per_gpu: dict[tuple[int, str], dict[tuple[str, ...], _Row]] = {}
    for p in processes:
        labels = {"gpu": str(p.gpu), "uuid": p.uuid}
        if group_by == "process":
            labels.update(pid=str(p.pid), process=p.process, user=p.user)
        labels.update(container_id=p.container_id, pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod,
                      container=p.container, job_id=p.job_id)
        rows = per_gpu.setdefault((p.gpu, p.uuid), {})
        key = tuple(labels.values())
        known = rows.get(key)
        if known is None:
            rows[key] = (labels, p.memory_bytes, dict(p.utilization))
            continue
        _, memory, ratios = known
        if p.memory_bytes is not None:
            memory = p.memory_bytes + (memory or 0)
        for engine, ratio in p.utilization:
            ratios[engine] = min(1.0, ratios.get(engine, 0.0) + ratio)  # processes of one container share the engine
        rows[key] = (labels, memory, ratios)
    return [list(rows.values()) for rows in per_gpu.values()]


def _jobs(processes: tuple[ProcessSample, ...]) -> list[tuple[int, str, str, str]]:
    """(gpu, uuid, job id, user) for each GPU and Slurm job with a process on it. The user is
    that of the job's lowest PID on the GPU with a known user: slurmstepd runs every process of
    a job as its owner, so they agree (one that ran su or sudo inside the job could differ: the
    rule keeps one series, the same from scrape to scrape)."""
    jobs: dict[tuple[int, str, str], tuple[int, str]] = {}
    for p in processes:
        if not p.job_id:
            continue
        key = (p.gpu, p.uuid, p.job_id)
        known = jobs.get(key)
        if known is None or (not known[1], known[0]) > (not p.user, p.pid):
            jobs[key] = (p.pid, p.user)
    return sorted(((g, u, j, user) for (g, u, j), (_, user) in jobs.items()), key=lambda r: (r[0], r[1], int(r[2])))


def families(scrape: Scrape) -> Iterator[Metric]:
    snap = scrape.snap
    yield from process_families(
        snap.processes, scrape.group_by, scrape.max_per_gpu, snap.workloads, snap.unattributed_energy
    )


def process_families(
    processes: tuple[ProcessSample, ...] | None, group_by: str, max_per_gpu: int,
    workloads: tuple[WorkloadUsage, ...] = (), unattributed: tuple[UnattributedEnergy, ...] = (),
) -> Iterator[Metric]:
    if processes is None:
        return
    extra = (PROCESS_LABELS if group_by == "process" else []) + OWNER_LABELS
    memory = GaugeMetricFamily(
        "resmon_gpu_process_memory_used_bytes",
        "VRAM used by the process (or the container's processes) on this GPU, in bytes.",
        labels=GPU_LABELS + extra,
    )
    util = GaugeMetricFamily(
        "resmon_gpu_process_utilization_ratio",
        "Mean utilization of the GPU engine by the process (or container) since the previous refresh (0-1).",
        labels=GPU_LABELS + extra + ["engine"],
    )
    busy = CounterMetricFamily(
        "resmon_gpu_process_busy_seconds",
        "Seconds the process (or the container's processes) kept the GPU engine busy, since the exporter first saw it.",
        labels=GPU_LABELS + extra + ["engine"],
    )
    energy = CounterMetricFamily(
        "resmon_gpu_process_energy_joules",
        "The process's (or container's) share of the GPU's energy, by its busiest engine's share of each refresh interval, in joules.",
        labels=GPU_LABELS + extra,
    )
    usage = {(w.gpu, w.uuid, w.key): w for w in workloads}
    for rows in _rows(processes, group_by):
        rows.sort(key=lambda r: (-(r[1] if r[1] is not None else -1), tuple(r[0].values())))
        for labels, used, ratios in rows[:max_per_gpu]:
            if used is not None:
                _put(memory, labels, used)
            engines = {}  # engine -> the row's labels with it: one dict for both families (read only)
            for engine, ratio in ratios.items():
                engines[engine] = {**labels, "engine": engine}
                _put(util, engines[engine], ratio)
            values = tuple(labels.values())
            work = usage.get((int(values[0]), values[1], values[2:]))
            if work is None:
                continue  # no per-process busy time (MIG, gpu-tracker)
            for engine, seconds in work.busy_seconds:
                _put(busy, engines.get(engine) or {**labels, "engine": engine}, seconds)
            if work.energy_joules is not None:
                _put(energy, labels, work.energy_joules)
    yield memory
    yield util
    yield busy
    yield energy
    rest = CounterMetricFamily(
        "resmon_gpu_unattributed_energy_joules",
        "The GPU's energy no process it lists was charged with (idle time, processes the exporter cannot see), in joules.",
        labels=GPU_LABELS,
    )
    for part in unattributed:
        _put(rest, {"gpu": str(part.gpu), "uuid": part.uuid}, part.joules)
    yield rest
    jobs = GaugeMetricFamily(
        "resmon_gpu_job_info",
        "A Slurm job with a process on this GPU (its cgroup's job_<id>); user: the job's process owner. Value 1.",
        labels=GPU_LABELS + JOB_LABELS,
    )
    for gpu, uuid, job_id, user in _jobs(processes):
        _put(jobs, {"gpu": str(gpu), "uuid": uuid, "scheduler": "slurm", "job_id": job_id, "user": user}, 1)
    yield jobs


def status(scrape: Scrape) -> CollectorStatus | None:
    """The processes part of the GPU read (failed too where procfs was not read in time)."""
    return part_status(scrape, "processes")
