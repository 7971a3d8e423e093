"""The nvlink collector: link state, bytes and data-link errors per NVLink.

Inactive (no families) on hosts whose GPUs have no links.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import Metric

from ..samples import CollectorStatus
from .series import Scrape, family, part_status, put

FAMILIES: dict[str, str] = {
    "resmon_gpu_nvlink_active": "gauge",
    "resmon_gpu_nvlink_bytes_total": "counter",
    "resmon_gpu_nvlink_errors_total": "counter",
}


def families(scrape: Scrape) -> Iterator[Metric]:
    """Called where the nvlink part of the GPU read ran (registry.py)."""
    up, base = scrape.up, scrape.labels
    active = family("resmon_gpu_nvlink_active", "1 when the NVLink is active.", ("link",))
    moved = family("resmon_gpu_nvlink_bytes_total", "Data bytes over the NVLink since the driver loaded.", ("link", "direction"))
    errors = family("resmon_gpu_nvlink_errors_total", "NVLink data-link errors since the driver loaded.", ("link", "type"))
    for g in up:
        for link in g.nvlinks:
            labels = {**base[id(g)], "link": str(link.link)}
            if link.active is not None:
                put(active, labels, link.active)
            for direction, value in link.bytes:
                put(moved, {**labels, "direction": direction}, value)
            for kind, value in link.errors:
                put(errors, {**labels, "type": kind}, value)
    yield active
    yield moved
    yield errors


def status(scrape: Scrape) -> CollectorStatus | None:
    return part_status(scrape, "nvlink")
