"""What the collectors' family builders share: the scrape's device labels and sample helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from ..samples import CollectorStatus, GpuReading, GpuSample, Snapshot

GPU_LABELS = ["gpu", "uuid"]

# id(GpuSample) -> its {"gpu", "uuid"} labels, built once per scrape and shared by every family
DeviceLabels = dict[int, dict[str, str]]


@dataclass(frozen=True)
class Scrape:
    """One scrape's input to every collector: the snapshot, and what the GPU families of all
    collectors share (the answering devices and their labels, built once)."""

    snap: Snapshot
    up: list[GpuSample]
    labels: DeviceLabels
    group_by: str = "process"  # the processes collector's grouping and limit
    max_per_gpu: int = 64

    @classmethod
    def of(cls, snap: Snapshot, group_by: str = "process", max_per_gpu: int = 64) -> Scrape:
        devices = snap.gpu.devices if snap.gpu is not None else ()
        labels = {id(g): {"gpu": str(g.identity.index), "uuid": g.identity.uuid} for g in devices}
        return cls(snap, [g for g in devices if g.up], labels, group_by, max_per_gpu)

    @property
    def reading(self) -> GpuReading | None:
        return self.snap.gpu

    def active(self, part: str) -> bool:
        """Whether the collector read along with the GPUs (health, nvlink, profiling, mig) ran."""
        return self.snap.gpu is not None and any(p.name == part for p in self.snap.gpu.parts)


def part_status(scrape: Scrape, part: str) -> CollectorStatus | None:
    """The status of a collector read along with the GPUs: it follows the GPU read's (a read
    that failed or timed out fails it too) and its own part of it; None where it did not run."""
    gpu, reading = scrape.snap.gpu_status, scrape.snap.gpu
    if gpu is None or reading is None:
        return None
    for p in reading.parts:
        if p.name == part:
            stamp = gpu.timestamp_seconds
            if stamp is not None and p.read_at is not None:
                stamp = min(stamp, p.read_at)  # values from a slow read: as old as that read
            return CollectorStatus(gpu.success and p.success, p.duration_seconds, stamp)
    return None


def put(family: Metric, labels: dict[str, str], value: float) -> None:
    """family.add_metric() without re-zipping the label names for every sample: a device's
    label dicts are built once per scrape and shared (exposition only reads them)."""
    name = family.name + "_total" if family.type == "counter" else family.name
    family.samples.append(Sample(name, labels, value))


def family(name: str, doc: str, extra: tuple[str, ...] = ()) -> Metric:
    """A per-GPU family (labels gpu, uuid, then extra); a name ending in _total is a counter."""
    if name.endswith("_total"):
        return CounterMetricFamily(name[: -len("_total")], doc, labels=[*GPU_LABELS, *extra])
    return GaugeMetricFamily(name, doc, labels=[*GPU_LABELS, *extra])


def labelled(
    fam: Metric, devices: list[GpuSample], base: DeviceLabels, label: str,
    get: Callable[[GpuSample], tuple[tuple[str, float], ...]],
) -> Metric:
    """fam with one sample per device and (label value, value) pair get returns."""
    for g in devices:
        for value_label, value in get(g):
            put(fam, {**base[id(g)], label: value_label}, value)
    return fam


def plain(fam: Metric, devices: list[GpuSample], base: DeviceLabels, get: Callable[[GpuSample], float | None]) -> Metric:
    """fam with one sample per device that has the value (None: absent)."""
    for g in devices:
        value = get(g)
        if value is not None:
            put(fam, base[id(g)], value)
    return fam
