"""The host collector: CPU utilization and time, load, memory and swap (psutil)."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..samples import CollectorStatus, HostSample
from .series import Scrape

FAMILIES: dict[str, str] = {
    "resmon_cpu_utilization_ratio": "gauge",
    "resmon_cpu_seconds_total": "counter",
    "resmon_cpu_logical_cores": "gauge",
    "resmon_load1": "gauge",
    "resmon_load5": "gauge",
    "resmon_load15": "gauge",
    "resmon_memory_total_bytes": "gauge",
    "resmon_memory_available_bytes": "gauge",
    "resmon_memory_used_bytes": "gauge",
    "resmon_swap_total_bytes": "gauge",
    "resmon_swap_used_bytes": "gauge",
}


def families(scrape: Scrape) -> Iterator[Metric]:
    yield from _families(scrape.snap.host)


def _families(host: HostSample | None) -> Iterator[Metric]:
    if host is None:
        return
    yield GaugeMetricFamily(
        "resmon_cpu_utilization_ratio",
        "Busy fraction of all logical CPUs (not idle, iowait or steal) between the previous refresh and this one.",
        value=host.cpu_utilization_ratio,
    )
    seconds = CounterMetricFamily(
        "resmon_cpu_seconds", "CPU time spent in each mode, summed over all CPUs.", labels=["mode"]
    )
    for mode, value in host.cpu_seconds:
        seconds.add_metric([mode], value)
    yield seconds
    yield GaugeMetricFamily("resmon_cpu_logical_cores", "Logical CPUs.", value=host.logical_cores)
    yield GaugeMetricFamily("resmon_load1", "1-minute load average.", value=host.load1)
    yield GaugeMetricFamily("resmon_load5", "5-minute load average.", value=host.load5)
    yield GaugeMetricFamily("resmon_load15", "15-minute load average.", value=host.load15)
    yield GaugeMetricFamily("resmon_memory_total_bytes", "MemTotal in bytes.", value=host.memory_total_bytes)
    yield GaugeMetricFamily(
        "resmon_memory_available_bytes", "MemAvailable in bytes.", value=host.memory_available_bytes
    )
    yield GaugeMetricFamily(
        "resmon_memory_used_bytes", "MemTotal - MemAvailable in bytes.", value=host.memory_used_bytes
    )
    yield GaugeMetricFamily("resmon_swap_total_bytes", "Swap size in bytes.", value=host.swap_total_bytes)
    yield GaugeMetricFamily("resmon_swap_used_bytes", "Swap in use in bytes.", value=host.swap_used_bytes)


def status(scrape: Scrape) -> CollectorStatus | None:
    return scrape.snap.host_status
