"""Metric families of the v2 GPU collectors: gpu additions, health, xid, nvlink.

Same rules as collector.py: fresh families per scrape, labels gpu and uuid first, a value
the device does not report is an absent series. A collector that is off (or inactive: no
NVLink on this host) yields none of its families.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..samples import GpuReading, GpuSample
from .series import GPU_LABELS, DeviceLabels
from .series import put as _put

GPU_ADDITIONS: dict[str, str] = {
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
HEALTH: dict[str, str] = {
    "resmon_gpu_ecc_enabled": "gauge",
    "resmon_gpu_ecc_errors_total": "counter",
    "resmon_gpu_retired_pages": "gauge",
    "resmon_gpu_retired_pages_pending": "gauge",
    "resmon_gpu_remapped_rows": "gauge",
    "resmon_gpu_row_remap_pending": "gauge",
    "resmon_gpu_row_remap_failed": "gauge",
    "resmon_gpu_recovery_action": "gauge",
}
XID: dict[str, str] = {
    "resmon_gpu_xid_errors_total": "counter",
    "resmon_gpu_xid_last_timestamp_seconds": "gauge",
}
NVLINK: dict[str, str] = {
    "resmon_gpu_nvlink_active": "gauge",
    "resmon_gpu_nvlink_bytes_total": "counter",
    "resmon_gpu_nvlink_errors_total": "counter",
}
FAMILIES: dict[str, str] = {**GPU_ADDITIONS, **HEALTH, **XID, **NVLINK}


def _family(name: str, doc: str, extra: tuple[str, ...] = ()) -> Metric:
    if FAMILIES[name] == "counter":
        return CounterMetricFamily(name[: -len("_total")], doc, labels=[*GPU_LABELS, *extra])
    return GaugeMetricFamily(name, doc, labels=[*GPU_LABELS, *extra])


def _labelled(
    family: Metric, devices: list[GpuSample], base: DeviceLabels, label: str,
    get: Callable[[GpuSample], tuple[tuple[str, float], ...]],
) -> Metric:
    for g in devices:
        for value_label, value in get(g):
            _put(family, {**base[id(g)], label: value_label}, value)
    return family


def _plain(family: Metric, devices: list[GpuSample], base: DeviceLabels, get: Callable[[GpuSample], float | None]) -> Metric:
    for g in devices:
        value = get(g)
        if value is not None:
            _put(family, base[id(g)], value)
    return family


def gpu_additions(up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    yield _plain(_family("resmon_gpu_memory_temperature_celsius", "HBM temperature in degrees Celsius (absent on GDDR boards)."),
                 up, base, lambda g: g.memory_temperature_celsius)
    yield _plain(_family("resmon_gpu_encoder_utilization_ratio", "Video encoder busy fraction of its last sample period (0-1)."),
                 up, base, lambda g: g.encoder_utilization_ratio)
    yield _plain(_family("resmon_gpu_decoder_utilization_ratio", "Video decoder busy fraction of its last sample period (0-1)."),
                 up, base, lambda g: g.decoder_utilization_ratio)
    yield _labelled(
        _family("resmon_gpu_busy_seconds_total",
                "Seconds the engine was busy, integrated from the driver's utilization samples: rate() is the true mean utilization.",
                ("engine",)),
        up, base, "engine", lambda g: g.busy_seconds)
    yield _labelled(
        _family("resmon_gpu_clock_event_seconds_total", "Seconds the clocks were held by this clock-event reason since the driver loaded.",
                ("reason",)),
        up, base, "reason", lambda g: g.clock_event_seconds)
    yield _labelled(_family("resmon_gpu_pcie_link_generation", "PCIe link generation, current and the GPU's maximum.", ("bound",)),
                    up, base, "bound", lambda g: g.pcie_link_generation)
    yield _labelled(_family("resmon_gpu_pcie_link_width_lanes", "PCIe link width in lanes, current and maximum.", ("bound",)),
                    up, base, "bound", lambda g: g.pcie_link_width_lanes)
    yield _plain(_family("resmon_gpu_pcie_replays_total", "PCIe replays since the driver loaded."), up, base, lambda g: g.pcie_replays)
    yield _labelled(_family("resmon_gpu_pcie_bytes_total", "Bytes moved over PCIe since the driver loaded.", ("direction",)),
                    up, base, "direction", lambda g: g.pcie_bytes)


def health_families(up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    with_health = [g for g in up if g.health is not None]

    ecc = _family("resmon_gpu_ecc_enabled", "1 when ECC is on; mode current or pending (after the next reboot).", ("mode",))
    errors = _family("resmon_gpu_ecc_errors_total",
                     "ECC errors; scope volatile (since driver load) or aggregate (board lifetime).", ("type", "scope"))
    retired = _family("resmon_gpu_retired_pages", "Memory pages retired, by cause (pre-Ampere boards).", ("cause",))
    remapped = _family("resmon_gpu_remapped_rows", "Memory rows remapped, by cause (Ampere and newer).", ("cause",))
    for g in with_health:
        h = g.health
        assert h is not None
        labels = base[id(g)]
        for mode, value in h.ecc_enabled:
            _put(ecc, {**labels, "mode": mode}, value)
        for kind, scope, count in h.ecc_errors:
            _put(errors, {**labels, "type": kind, "scope": scope}, count)
        for cause, count in h.retired_pages:
            _put(retired, {**labels, "cause": cause}, count)
        for cause, count in h.remapped_rows:
            _put(remapped, {**labels, "cause": cause}, count)
    yield ecc
    yield errors
    yield retired
    yield _plain(_family("resmon_gpu_retired_pages_pending", "1 when a page retirement waits for the next reattach or reset."),
                 with_health, base, lambda g: g.health.retired_pages_pending if g.health else None)
    yield remapped
    yield _plain(_family("resmon_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset."),
                 with_health, base, lambda g: g.health.row_remap_pending if g.health else None)
    yield _plain(_family("resmon_gpu_row_remap_failed", "1 when a row remap has failed (RMA territory)."),
                 with_health, base, lambda g: g.health.row_remap_failed if g.health else None)
    yield _plain(
        _family("resmon_gpu_recovery_action",
                "Action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset."),
        with_health, base, lambda g: g.health.recovery_action if g.health else None)


def xid_families(reading: GpuReading) -> Iterator[Metric]:
    state = reading.xid
    assert state is not None
    index = {}
    for g in reading.devices:  # a UUID's current index; a vanished GPU keeps its last one
        if g.identity.uuid and (g.identity.uuid not in index or g.up):
            index[g.identity.uuid] = str(g.identity.index)
    errors = _family("resmon_gpu_xid_errors_total", "XID error events received since the exporter started.", ("xid",))
    last = _family("resmon_gpu_xid_last_timestamp_seconds", "Unix time the latest XID event of this code was received.", ("xid",))
    for c in sorted(state.counts, key=lambda c: (index.get(c.uuid, ""), c.uuid, c.xid)):
        labels = {"gpu": index.get(c.uuid, ""), "uuid": c.uuid, "xid": str(c.xid)}
        _put(errors, labels, c.count)
        _put(last, labels, c.last_seen_seconds)
    yield errors
    yield last


def nvlink_families(up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    active = _family("resmon_gpu_nvlink_active", "1 when the NVLink is active.", ("link",))
    moved = _family("resmon_gpu_nvlink_bytes_total", "Data bytes over the NVLink since the driver loaded.", ("link", "direction"))
    errors = _family("resmon_gpu_nvlink_errors_total", "NVLink data-link errors since the driver loaded.", ("link", "type"))
    for g in up:
        for link in g.nvlinks:
            labels = {**base[id(g)], "link": str(link.link)}
            if link.active is not None:
                _put(active, labels, link.active)
            for direction, value in link.bytes:
                _put(moved, {**labels, "direction": direction}, value)
            for kind, value in link.errors:
                _put(errors, {**labels, "type": kind}, value)
    yield active
    yield moved
    yield errors


def families(reading: GpuReading, up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    """Every v2 family the reading's active collectors serve. up: its answering devices;
    base: their labels, as the gpu collector built them for this scrape."""
    yield from gpu_additions(up, base)
    parts = {p.name for p in reading.parts}
    if "health" in parts:
        yield from health_families(up, base)
    if reading.xid is not None:
        yield from xid_families(reading)
    if "nvlink" in parts:
        yield from nvlink_families(up, base)
