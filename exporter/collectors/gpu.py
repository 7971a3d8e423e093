"""prometheus_client custom collector: one snapshot -> the contract's metric families.

Families are built fresh on every collect() (no shared mutable metric objects), so it can
be registered in any application's CollectorRegistry next to its own metrics.
"""

from __future__ import annotations

import platform
from typing import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import health as health_collector, processes as process_collector, profiling as profiling_collector
from ..monitor import ResourceMonitor
from ..samples import THROTTLE_REASONS, CollectorStatus, GpuReading, GpuSample, HostSample, Snapshot
from .series import GPU_LABELS
from .series import put as _put
from ..version import __version__


# (name, help, value getter) of per-GPU gauges with just the gpu and uuid labels.
_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | int | None]], ...] = (
    ("resmon_gpu_memory_total_bytes", "Total VRAM in bytes.", lambda g: g.memory_total_bytes),
    (
        "resmon_gpu_memory_used_bytes",
        "VRAM allocated by processes in bytes, driver-reserved memory not included (as nvidia-smi).",
        lambda g: g.memory_used_bytes,
    ),
    ("resmon_gpu_memory_free_bytes", "Free VRAM in bytes.", lambda g: g.memory_free_bytes),
    (
        "resmon_gpu_memory_reserved_bytes",
        "VRAM reserved by the driver and firmware in bytes.",
        lambda g: g.memory_reserved_bytes,
    ),
    (
        "resmon_gpu_utilization_ratio",
        "Fraction of the last sample period in which a kernel ran on the GPU (0-1).",
        lambda g: g.utilization_ratio,
    ),
    (
        "resmon_gpu_memory_utilization_ratio",
        "Fraction of the last sample period in which device memory was read or written (0-1); bandwidth, not capacity.",
        lambda g: g.memory_utilization_ratio,
    ),
    ("resmon_gpu_temperature_celsius", "GPU core temperature in degrees Celsius.", lambda g: g.temperature_celsius),
    ("resmon_gpu_power_watts", "Power draw in watts.", lambda g: g.power_watts),
    ("resmon_gpu_power_limit_watts", "Enforced power limit in watts.", lambda g: g.power_limit_watts),
    (
        "resmon_gpu_fan_speed_ratio",
        "Intended fan speed as a fraction of the maximum (may exceed 1).",
        lambda g: g.fan_speed_ratio,
    ),
    (
        "resmon_gpu_performance_state",
        "Performance state, 0 (fastest) to 15.",
        lambda g: g.performance_state,
    ),
    (
        "resmon_gpu_processes",
        "Distinct processes in the device's compute and graphics process lists.",
        lambda g: g.processes,
    ),
    (
        "resmon_gpu_junction_temperature_celsius",
        "Junction (hotspot) temperature in degrees Celsius (amdgpu).",
        lambda g: g.junction_temperature_celsius,
    ),
    (
        "resmon_gpu_gtt_total_bytes",
        "System memory the GPU can map (GTT) in bytes (amdgpu; the main memory pool of an APU).",
        lambda g: g.gtt_total_bytes,
    ),
    ("resmon_gpu_gtt_used_bytes", "GTT in use in bytes (amdgpu).", lambda g: g.gtt_used_bytes),
)

_MEMORY_USED_V1_HELP = (
    "VRAM in use in bytes, driver-reserved memory included (this driver has no nvmlDeviceGetMemoryInfo_v2)."
)

# Every family this collector can emit, with its type: describe() and docs/metrics.md use it.
FAMILIES: dict[str, str] = {
    "resmon_gpu_info": "gauge",
    "resmon_gpu_up": "gauge",
    **{name: "gauge" for name, _, _ in _GPU_GAUGES},
    "resmon_gpu_energy_joules_total": "counter",
    "resmon_gpu_clock_hertz": "gauge",
    "resmon_gpu_clock_max_hertz": "gauge",
    "resmon_gpu_throttle_active": "gauge",
    **health_collector.FAMILIES,
    **profiling_collector.FAMILIES,
    **process_collector.FAMILIES,
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
    "resmon_build_info": "gauge",
    "resmon_gpu_backend_info": "gauge",
    "resmon_gpu_devices": "gauge",
    "resmon_collector_success": "gauge",
    "resmon_collector_duration_seconds": "gauge",
    "resmon_last_refresh_timestamp_seconds": "gauge",
    "resmon_collector_error_info": "gauge",
}

# Families served even without a sample while their collector is active: identity and the
# collector status (the contract never removes them), and those whose empty state is itself an
# answer (no XID event yet, no process on a GPU, no pod holding one). Every other family is
# left out of a scrape where it has no sample: no device here has that value (issue 22 item 9).
DECLARED_WHEN_EMPTY = frozenset({
    "resmon_gpu_info", "resmon_gpu_up",
    "resmon_collector_success", "resmon_collector_duration_seconds", "resmon_last_refresh_timestamp_seconds",
    "resmon_gpu_xid_errors", "resmon_gpu_xid_last_timestamp_seconds",  # counters: named without _total
    *process_collector.FAMILIES,
})


def gpu_families(snap: Snapshot) -> Iterator[Metric]:
    reading = snap.gpu
    if reading is None:
        return
    devices = reading.devices
    labels = {id(g): {"gpu": str(g.identity.index), "uuid": g.identity.uuid} for g in devices}
    up_devices = [g for g in devices if g.up]

    info = GaugeMetricFamily(
        "resmon_gpu_info",
        "GPU identity, value 1.",
        labels=GPU_LABELS + ["name", "pci_bus_id", "driver_version", "backend"],
    )
    up = GaugeMetricFamily(
        "resmon_gpu_up",
        "1 when the GPU answered in the latest refresh, 0 when it is lost, failing or timed out.",
        labels=GPU_LABELS,
    )
    for g in devices:
        ident = g.identity
        base = labels[id(g)]
        _put(info, {**base, "name": ident.name, "pci_bus_id": ident.pci_bus_id,
                    "driver_version": reading.driver_version, "backend": reading.backend}, 1)
        _put(up, base, 1 if g.up else 0)
    yield info
    yield up

    for name, doc, get in _GPU_GAUGES:
        if name == "resmon_gpu_memory_used_bytes" and reading.memory_api == "v1":
            doc = _MEMORY_USED_V1_HELP
        family = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
        for g in up_devices:
            value = get(g)
            if value is not None:
                _put(family, labels[id(g)], value)
        yield family

    energy = CounterMetricFamily(
        "resmon_gpu_energy_joules",
        "Energy consumed since the driver was loaded, in joules (resets on driver reload).",
        labels=GPU_LABELS,
    )
    clock = GaugeMetricFamily("resmon_gpu_clock_hertz", "Current clock in hertz.", labels=GPU_LABELS + ["clock"])
    clock_max = GaugeMetricFamily(
        "resmon_gpu_clock_max_hertz", "Maximum clock in hertz.", labels=GPU_LABELS + ["clock"]
    )
    throttle = GaugeMetricFamily(
        "resmon_gpu_throttle_active",
        "1 when the clock-event (throttle) reason is active.",
        labels=GPU_LABELS + ["reason"],
    )
    for g in up_devices:
        base = labels[id(g)]
        if g.energy_joules is not None:
            _put(energy, base, g.energy_joules)
        for kind, hertz in g.clock_hertz:
            _put(clock, {**base, "clock": kind}, hertz)
        for kind, hertz in g.identity.clock_max_hertz:
            _put(clock_max, {**base, "clock": kind}, hertz)
        if g.throttle_reasons is not None:
            mask = g.throttle_reasons
            for reason, bit in THROTTLE_REASONS:
                _put(throttle, {**base, "reason": reason}, 1 if mask & bit else 0)
    yield energy
    yield clock
    yield clock_max
    yield throttle
    yield from health_collector.families(reading, up_devices, labels)
    yield from profiling_collector.families(reading, up_devices, labels)

    backend = GaugeMetricFamily(
        "resmon_gpu_backend_info", "The GPU backend in use, value 1.", labels=["backend"]
    )
    backend.add_metric([reading.backend], 1)
    yield backend
    yield GaugeMetricFamily("resmon_gpu_devices", "GPUs the backend reports.", value=reading.device_count)


def host_families(host: HostSample | None) -> Iterator[Metric]:
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


def exporter_families(snap: Snapshot) -> Iterator[Metric]:
    build = GaugeMetricFamily(
        "resmon_build_info", "resmon-exporter build, value 1.", labels=["version", "python_version"]
    )
    build.add_metric([__version__, platform.python_version()], 1)
    yield build

    statuses: list[tuple[str, CollectorStatus]] = []
    if snap.gpu_status is not None:
        statuses.append(("gpu", snap.gpu_status))
        statuses += _gpu_part_statuses(snap.gpu, snap.gpu_status)
    if snap.kubernetes_status is not None:
        statuses.append(("kubernetes", snap.kubernetes_status))
    if snap.host_status is not None:
        statuses.append(("host", snap.host_status))
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


def _gpu_part_statuses(reading: GpuReading | None, gpu: CollectorStatus) -> list[tuple[str, CollectorStatus]]:
    """The collectors read along with the GPUs: their status follows the GPU read's (a read
    that failed or timed out fails them too) and their own part of it."""
    if reading is None:
        return []
    out = [(p.name, CollectorStatus(gpu.success and p.success, p.duration_seconds, gpu.timestamp_seconds)) for p in reading.parts]
    xid = reading.xid
    if xid is not None and (xid.watched or not xid.healthy):  # inactive where no GPU can report XIDs
        out.append(("xid", CollectorStatus(xid.healthy, xid.duration_seconds, gpu.timestamp_seconds)))
    return out


def snapshot_families(snap: Snapshot, group_by: str = "process", max_per_gpu: int = 64) -> Iterator[Metric]:
    for family in _all_families(snap, group_by, max_per_gpu):
        if family.samples or family.name in DECLARED_WHEN_EMPTY:
            yield family


def _all_families(snap: Snapshot, group_by: str, max_per_gpu: int) -> Iterator[Metric]:
    yield from gpu_families(snap)
    yield from process_collector.process_families(snap.processes, group_by, max_per_gpu)
    yield from process_collector.allocation_families(snap.allocations)
    yield from host_families(snap.host)
    yield from exporter_families(snap)


class ResourceCollector(Collector):
    """Register with registry.register(ResourceCollector(monitor))."""

    def __init__(self, monitor: ResourceMonitor) -> None:
        self._monitor = monitor

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering touches no GPU and ?name[]= filtering works.
        for name, kind in FAMILIES.items():
            if kind == "counter":
                yield CounterMetricFamily(name, "")
            else:
                yield GaugeMetricFamily(name, "")

    def families(self, snap: Snapshot) -> list[Metric]:
        """The families of one given snapshot: the HTTP router renders a pinned snapshot
        through this, so one scrape reads one snapshot."""
        # how process series are grouped is the monitor's setting (any object with snapshot() works)
        group_by = getattr(self._monitor, "processes_group_by", "process")
        return list(snapshot_families(snap, group_by, getattr(self._monitor, "processes_max_per_gpu", 64)))

    def collect(self) -> Iterable[Metric]:
        return self.families(self._monitor.snapshot())
