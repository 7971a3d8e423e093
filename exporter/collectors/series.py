"""Appending samples to metric families, shared by the collectors' family builders."""

from __future__ import annotations

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

GPU_LABELS = ["gpu", "uuid"]

# id(GpuSample) -> its {"gpu", "uuid"} labels, built once per scrape and shared by every family
DeviceLabels = dict[int, dict[str, str]]


def put(family: Metric, labels: dict[str, str], value: float) -> None:
    """family.add_metric() without re-zipping the label names for every sample: a device's
    label dicts are built once per scrape and shared (exposition only reads them)."""
    name = family.name + "_total" if family.type == "counter" else family.name
    family.samples.append(Sample(name, labels, value))
