"""The mig collector: MIG mode, the MIG devices, and memory and GPM values per GPU instance.

MIG instances never appear as GPUs: their series are the resmon_gpu_mig_* families, with the
parent's gpu and uuid labels. Inactive (no families) while no GPU has MIG.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import CollectorStatus, ProfilingSample
from .profiling import names, ratio_families
from .series import GPU_LABELS, Scrape, part_status, put

FAMILIES: dict[str, str] = {
    "resmon_gpu_mig_mode_enabled": "gauge",
    "resmon_gpu_mig_info": "gauge",
    "resmon_gpu_mig_memory_total_bytes": "gauge",
    "resmon_gpu_mig_memory_used_bytes": "gauge",
    "resmon_gpu_mig_memory_free_bytes": "gauge",
    **names("resmon_gpu_mig_"),
}


def families(scrape: Scrape) -> Iterator[Metric]:
    """Called where the mig part of the GPU read ran (registry.py)."""
    up, base = scrape.up, scrape.labels
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
                put(mode, {**labels, "mode": name}, value)
        for d in state.devices:
            put(info, {**labels, "gpu_instance_id": str(d.gpu_instance_id), "compute_instance_id": str(d.compute_instance_id),
                        "mig_uuid": d.uuid, "profile": d.profile}, 1)
        for inst in state.instances:
            gi = {**labels, "gpu_instance_id": str(inst.gpu_instance_id)}
            for kind, value in (("total", inst.memory_total_bytes), ("used", inst.memory_used_bytes), ("free", inst.memory_free_bytes)):
                if value is not None:
                    put(memory[kind], gi, value)
            if inst.profiling is not None:
                rows.append((gi, inst.profiling))
    yield mode
    yield info
    yield from memory.values()
    yield from ratio_families("resmon_gpu_mig_", ("gpu_instance_id",), rows, " Per MIG GPU instance.")


def status(scrape: Scrape) -> CollectorStatus | None:
    return part_status(scrape, "mig")
