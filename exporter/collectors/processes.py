"""The processes collector: VRAM and utilization per process on each GPU, with its owner.

One series per process (group-by=process) or per container (group-by=container, summed;
pid, process and user left out), at most max_per_gpu per GPU and family (per engine for
utilization), the largest by memory.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import CollectorStatus, ProcessSample
from .series import GPU_LABELS, Scrape, part_status
from .series import put as _put

OWNER_LABELS = ["container_id", "pod_uid", "namespace", "pod", "container"]
PROCESS_LABELS = ["pid", "process", "user"]
FAMILIES: dict[str, str] = {
    "resmon_gpu_process_memory_used_bytes": "gauge",
    "resmon_gpu_process_utilization_ratio": "gauge",
}
# no process on a GPU is itself an answer: the families are declared, without samples
DECLARED_WHEN_EMPTY = frozenset(FAMILIES)

_Row = tuple[dict[str, str], int | None, dict[str, float]]  # labels, memory bytes, engine -> ratio


def _rows(processes: tuple[ProcessSample, ...], group_by: str) -> list[list[_Row]]:
    """The rows to serve, one list per GPU, before the per-GPU limit. Rows with the same
    labels (a container's processes, with group-by=container) are summed."""
    per_gpu: dict[tuple[int, str], dict[tuple[str, ...], _Row]] = {}
    for p in processes:
        labels = {"gpu": str(p.gpu), "uuid": p.uuid}
        if group_by == "process":
            labels.update(pid=str(p.pid), process=p.process, user=p.user)
        labels.update(container_id=p.container_id, pod_uid=p.pod_uid, namespace=p.namespace, pod=p.pod, container=p.container)
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


def families(scrape: Scrape) -> Iterator[Metric]:
    yield from process_families(scrape.snap.processes, scrape.group_by, scrape.max_per_gpu)


def process_families(processes: tuple[ProcessSample, ...] | None, group_by: str, max_per_gpu: int) -> Iterator[Metric]:
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
    for rows in _rows(processes, group_by):
        rows.sort(key=lambda r: (-(r[1] if r[1] is not None else -1), tuple(r[0].values())))
        for labels, used, ratios in rows[:max_per_gpu]:
            if used is not None:
                _put(memory, labels, used)
            for engine, ratio in ratios.items():
                _put(util, {**labels, "engine": engine}, ratio)
    yield memory
    yield util


def status(scrape: Scrape) -> CollectorStatus | None:
    """The processes part of the GPU read (failed too where procfs was not read in time)."""
    return part_status(scrape, "processes")
