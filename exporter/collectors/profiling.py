"""The profiling collector: GPM ratios and bandwidths (Hopper and newer; absent elsewhere).

ratio_families() builds the same families per MIG GPU instance for the mig collector.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import PROFILING_BANDWIDTHS, PROFILING_RATIOS, CollectorStatus, ProfilingSample
from .series import GPU_LABELS, Scrape, part_status, put

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



def names(prefix: str) -> dict[str, str]:
    out = {f"{prefix}{name}_ratio": "gauge" for name, _ in PROFILING_RATIOS}
    out.update({f"{prefix}{link}_bandwidth_bytes_per_second": "gauge" for link in dict.fromkeys(b[0] for b in PROFILING_BANDWIDTHS)})
    return out


FAMILIES: dict[str, str] = names("resmon_gpu_")


def ratio_families(prefix: str, extra: tuple[str, ...], rows: list[tuple[dict[str, str], ProfilingSample]], what: str) -> Iterator[Metric]:
    labels = [*GPU_LABELS, *extra]
    for name, _ in PROFILING_RATIOS:
        family = GaugeMetricFamily(f"{prefix}{name}_ratio", _RATIO_HELP[name] + what, labels=labels)
        for base, sample in rows:
            for ratio, value in sample.ratios:
                if ratio == name:
                    put(family, base, value)
        yield family
    for link in dict.fromkeys(b[0] for b in PROFILING_BANDWIDTHS):
        family = GaugeMetricFamily(f"{prefix}{link}_bandwidth_bytes_per_second", _BANDWIDTH_HELP[link] + what, labels=[*labels, "direction"])
        for base, sample in rows:
            for kind, direction, value in sample.bandwidths:
                if kind == link:
                    put(family, {**base, "direction": direction}, value)
        yield family


def families(scrape: Scrape) -> Iterator[Metric]:
    """Called where the profiling part of the GPU read ran (registry.py)."""
    up, base = scrape.up, scrape.labels
    rows = [(base[id(g)], g.profiling) for g in up if g.profiling is not None]
    yield from ratio_families("resmon_gpu_", (), rows, "")


def status(scrape: Scrape) -> CollectorStatus | None:
    return part_status(scrape, "profiling")
