"""The gpu collector: identity, up, the core gauges, energy, clocks, clock events, PCIe.

Families are built fresh on every scrape (no shared mutable metric objects); labels gpu and
uuid first; a value the device does not report is an absent series, and a GPU that is down
keeps only its resmon_gpu_info and resmon_gpu_up series.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..samples import THROTTLE_REASONS, CollectorStatus, GpuSample
from .series import GPU_LABELS, DeviceLabels, Scrape, family, labelled, plain
from .series import put as _put

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

# the v2 additions to the gpu collector
_ADDITIONS: dict[str, str] = {
    "resmon_gpu_memory_temperature_celsius": "gauge",
    "resmon_gpu_encoder_utilization_ratio": "gauge",
    "resmon_gpu_decoder_utilization_ratio": "gauge",
    "resmon_gpu_busy_seconds_total": "counter",
    "resmon_gpu_clock_event_seconds_total": "counter",
    "resmon_gpu_pcie_link_generation": "gauge",
    "resmon_gpu_pcie_link_width_lanes": "gauge",
    "resmon_gpu_pcie_replays_total": "counter",
    "resmon_gpu_pcie_bytes_total": "counter",
}
FAMILIES: dict[str, str] = {
    "resmon_gpu_info": "gauge",
    "resmon_gpu_up": "gauge",
    **{name: "gauge" for name, _, _ in _GPU_GAUGES},
    "resmon_gpu_energy_joules_total": "counter",
    "resmon_gpu_clock_hertz": "gauge",
    "resmon_gpu_clock_max_hertz": "gauge",
    "resmon_gpu_throttle_active": "gauge",
    **_ADDITIONS,
    "resmon_gpu_backend_info": "gauge",
    "resmon_gpu_devices": "gauge",
}
# identity is served even without a sample (the contract never removes it)
DECLARED_WHEN_EMPTY = frozenset({"resmon_gpu_info", "resmon_gpu_up"})


def families(scrape: Scrape) -> Iterator[Metric]:
    reading = scrape.reading
    if reading is None:
        return
    devices = reading.devices
    labels = scrape.labels
    up_devices = scrape.up

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
        gauge = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
        for g in up_devices:
            value = get(g)
            if value is not None:
                _put(gauge, labels[id(g)], value)
        yield gauge

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
    yield from _additions(up_devices, labels)

    backend = GaugeMetricFamily(
        "resmon_gpu_backend_info", "The GPU backend in use, value 1.", labels=["backend"]
    )
    backend.add_metric([reading.backend], 1)
    yield backend
    yield GaugeMetricFamily("resmon_gpu_devices", "GPUs the backend reports.", value=reading.device_count)


def _additions(up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    yield plain(family("resmon_gpu_memory_temperature_celsius", "HBM temperature in degrees Celsius (absent on GDDR boards)."),
                up, base, lambda g: g.memory_temperature_celsius)
    yield plain(family("resmon_gpu_encoder_utilization_ratio", "Video encoder busy fraction of its last sample period (0-1)."),
                up, base, lambda g: g.encoder_utilization_ratio)
    yield plain(family("resmon_gpu_decoder_utilization_ratio", "Video decoder busy fraction of its last sample period (0-1)."),
                up, base, lambda g: g.decoder_utilization_ratio)
    yield labelled(
        family("resmon_gpu_busy_seconds_total",
               "Seconds the engine was busy, integrated from the driver's utilization samples: rate() is the true mean utilization.",
               ("engine",)),
        up, base, "engine", lambda g: g.busy_seconds)
    yield labelled(
        family("resmon_gpu_clock_event_seconds_total", "Seconds the clocks were held by this clock-event reason since the driver loaded.",
               ("reason",)),
        up, base, "reason", lambda g: g.clock_event_seconds)
    yield labelled(family("resmon_gpu_pcie_link_generation", "PCIe link generation, current and the GPU's maximum.", ("bound",)),
                   up, base, "bound", lambda g: g.pcie_link_generation)
    yield labelled(family("resmon_gpu_pcie_link_width_lanes", "PCIe link width in lanes, current and maximum.", ("bound",)),
                   up, base, "bound", lambda g: g.pcie_link_width_lanes)
    yield plain(family("resmon_gpu_pcie_replays_total", "PCIe replays since the driver loaded."), up, base, lambda g: g.pcie_replays)
    yield labelled(family("resmon_gpu_pcie_bytes_total", "Bytes moved over PCIe since the driver loaded.", ("direction",)),
                   up, base, "direction", lambda g: g.pcie_bytes)


def status(scrape: Scrape) -> CollectorStatus | None:
    return scrape.snap.gpu_status
