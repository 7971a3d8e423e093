"""The exporter's own families: build info, and each collector's success, duration, refresh
time and known error (node_exporter's scrape_collector_* in one place).

Not a collector (no --collector.X flag): served on every scrape.
"""

from __future__ import annotations

import platform
from typing import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import CollectorStatus
from ..version import __version__
from .series import Scrape

FAMILIES: dict[str, str] = {
    "resmon_build_info": "gauge",
    "resmon_collector_success": "gauge",
    "resmon_collector_duration_seconds": "gauge",
    "resmon_last_refresh_timestamp_seconds": "gauge",
    "resmon_collector_error_info": "gauge",
}
# the collector status is never removed (the contract), even with no collector active
DECLARED_WHEN_EMPTY = frozenset(
    {"resmon_collector_success", "resmon_collector_duration_seconds", "resmon_last_refresh_timestamp_seconds"}
)


def families(scrape: Scrape, statuses: Sequence[tuple[str, CollectorStatus]]) -> Iterator[Metric]:
    """statuses: (collector, its status) of every active collector, in the registry's order."""
    snap = scrape.snap
    build = GaugeMetricFamily(
        "resmon_build_info", "resmon-exporter build, value 1.", labels=["version", "python_version"]
    )
    build.add_metric([__version__, platform.python_version()], 1)
    yield build

    success = GaugeMetricFamily(
        "resmon_collector_success", "1 when the collector's latest refresh succeeded.", labels=["collector"]
    )
    duration = GaugeMetricFamily(
        "resmon_collector_duration_seconds", "How long the collector's latest refresh took.", labels=["collector"]
    )
    stamp = GaugeMetricFamily(
        "resmon_last_refresh_timestamp_seconds",
        "Unix time of the refresh whose values this scrape serves (shows cache age).",
        labels=["collector"],
    )
    for name, status in statuses:
        success.add_metric([name], 1 if status.success else 0)
        duration.add_metric([name], status.duration_seconds)
        if status.timestamp_seconds is not None:  # absent until the collector has read once
            stamp.add_metric([name], status.timestamp_seconds)
    yield success
    yield duration
    yield stamp
    errors = GaugeMetricFamily(
        "resmon_collector_error_info",
        "Why the collector's latest refresh failed, where the cause is known (reason no_permission: "
        "NVML refuses to open the GPU), value 1.",
        labels=["collector", "reason"],
    )
    if snap.gpu_status is not None and snap.gpu is not None and snap.gpu.error:
        errors.add_metric(["gpu", snap.gpu.error], 1)
    yield errors
