"""Metric families of the profiling (GPM) and mig collectors.

Same rules as collector.py: fresh families per scrape, labels gpu and uuid first, a value the
device does not report is an absent series. MIG instances never appear as GPUs: their series
are the resmon_gpu_mig_* families, with the parent's gpu and uuid labels.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import PROFILING_BANDWIDTHS, PROFILING_RATIOS, GpuReading, GpuSample, ProfilingSample
from .series import GPU_LABELS, DeviceLabels
from .series import put as _put

_RATIO_HELP: dict[str, str] = {
    "graphics_active": "Fraction of time the graphics or compute engine was active (GPM 1, DCGM_FI_PROF_GR_ENGINE_ACTIVE).",
    "sm_active": "Fraction of time at least one warp was resident on an SM, averaged over SMs (GPM 2, DCGM_FI_PROF_SM_ACTIVE).",
    "sm_occupancy": "Resident warps as a fraction of the SMs' maximum, averaged over time (GPM 3, DCGM_FI_PROF_SM_OCCUPANCY).",
    "tensor_active": "Fraction of cycles any tensor pipe was active (GPM 5, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
    "dram_active": "Fraction of cycles device memory was sending or receiving data (GPM 10, DCGM_FI_PROF_DRAM_ACTIVE).",
    "fp64_active": "Fraction of cycles the FP64 pipe was active (GPM 11, DCGM_FI_PROF_PIPE_FP64_ACTIVE).",
    "fp32_active": "Fraction of cycles the FP32 pipe was active (GPM 12, DCGM_FI_PROF_PIPE_FP32_ACTIVE).",
    "fp16_active": "Fraction of cycles the FP16 pipe was active (GPM 13, DCGM_FI_PROF_PIPE_FP16_ACTIVE).",
}
_BANDWIDTH_HELP: dict[str, str] = {
    "pcie": "PCIe bandwidth in bytes per second over the GPM window (GPM 20/21, DCGM_FI_PROF_PCIE_TX/RX_BYTES).",
    "nvlink": "NVLink bandwidth in bytes per second over the GPM window (GPM 61/60, DCGM_FI_PROF_NVLINK_TX/RX_BYTES).",
}


def _names(prefix: str) -> dict[str, str]:
    out = {f"{prefix}{name}_ratio": "gauge" for name, _ in PROFILING_RATIOS}
    out.update({f"{prefix}{link}_bandwidth_bytes_per_second": "gauge" for link in dict.fromkeys(b[0] for b in PROFILING_BANDWIDTHS)})
    return out


PROFILING: dict[str, str] = _names("resmon_gpu_")
MIG: dict[str, str] = {
    "resmon_gpu_mig_mode_enabled": "gauge",
    "resmon_gpu_mig_info": "gauge",
    "resmon_gpu_mig_memory_total_bytes": "gauge",
    "resmon_gpu_mig_memory_used_bytes": "gauge",
    "resmon_gpu_mig_memory_free_bytes": "gauge",
    **_names("resmon_gpu_mig_"),
}
FAMILIES: dict[str, str] = {**PROFILING, **MIG}


def _profiling_families(prefix: str, extra: tuple[str, ...], rows: list[tuple[dict[str, str], ProfilingSample]], what: str) -> Iterator[Metric]:
    labels = [*GPU_LABELS, *extra]
    for name, _ in PROFILING_RATIOS:
        family = GaugeMetricFamily(f"{prefix}{name}_ratio", _RATIO_HELP[name] + what, labels=labels)
        for base, sample in rows:
            for ratio, value in sample.ratios:
                if ratio == name:
                    _put(family, base, value)
        yield family
    for link in dict.fromkeys(b[0] for b in PROFILING_BANDWIDTHS):
        family = GaugeMetricFamily(f"{prefix}{link}_bandwidth_bytes_per_second", _BANDWIDTH_HELP[link] + what, labels=[*labels, "direction"])
        for base, sample in rows:
            for kind, direction, value in sample.bandwidths:
                if kind == link:
                    _put(family, {**base, "direction": direction}, value)
        yield family


def profiling_families(up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    rows = [(base[id(g)], g.profiling) for g in up if g.profiling is not None]
    yield from _profiling_families("resmon_gpu_", (), rows, "")


def mig_families(up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    migs = [g for g in up if g.mig is not None]
    mode = GaugeMetricFamily("resmon_gpu_mig_mode_enabled", "1 when MIG mode is on; mode current or pending (after the next GPU reset).",
                             labels=[*GPU_LABELS, "mode"])
    info = GaugeMetricFamily("resmon_gpu_mig_info", "One MIG device (compute instance) of the GPU, value 1.",
                             labels=[*GPU_LABELS, "gpu_instance_id", "compute_instance_id", "mig_uuid", "profile"])
    memory = {
        kind: GaugeMetricFamily(f"resmon_gpu_mig_memory_{kind}_bytes", f"Memory {kind} of the MIG GPU instance in bytes.",
                                labels=[*GPU_LABELS, "gpu_instance_id"])
        for kind in ("total", "used", "free")
    }
    rows: list[tuple[dict[str, str], ProfilingSample]] = []
    for g in migs:
        state = g.mig
        assert state is not None
        labels = base[id(g)]
        for name, value in (("current", state.current), ("pending", state.pending)):
            if value is not None:
                _put(mode, {**labels, "mode": name}, value)
        for d in state.devices:
            _put(info, {**labels, "gpu_instance_id": str(d.gpu_instance_id), "compute_instance_id": str(d.compute_instance_id),
                        "mig_uuid": d.uuid, "profile": d.profile}, 1)
        for inst in state.instances:
            gi = {**labels, "gpu_instance_id": str(inst.gpu_instance_id)}
            for kind, value in (("total", inst.memory_total_bytes), ("used", inst.memory_used_bytes), ("free", inst.memory_free_bytes)):
                if value is not None:
                    _put(memory[kind], gi, value)
            if inst.profiling is not None:
                rows.append((gi, inst.profiling))
    yield mode
    yield info
    yield from memory.values()
    yield from _profiling_families("resmon_gpu_mig_", ("gpu_instance_id",), rows, " Per MIG GPU instance.")


def families(reading: GpuReading, up: list[GpuSample], base: DeviceLabels) -> Iterator[Metric]:
    parts = {p.name for p in reading.parts}
    if "profiling" in parts:
        yield from profiling_families(up, base)
    if "mig" in parts:
        yield from mig_families(up, base)
