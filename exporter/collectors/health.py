"""The health collector: ECC mode and errors, retired pages, remapped rows, recovery action.

Read along with the GPUs (NVML only); a GPU whose board lacks a value has no series for it.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import Metric

from ..samples import CollectorStatus
from .series import Scrape, family, part_status, plain, put

FAMILIES: dict[str, str] = {
    "resmon_gpu_ecc_enabled": "gauge",
    "resmon_gpu_ecc_errors_total": "counter",
    "resmon_gpu_retired_pages": "gauge",
    "resmon_gpu_retired_pages_pending": "gauge",
    "resmon_gpu_remapped_rows": "gauge",
    "resmon_gpu_row_remap_pending": "gauge",
    "resmon_gpu_row_remap_failed": "gauge",
    "resmon_gpu_recovery_action": "gauge",
}


def families(scrape: Scrape) -> Iterator[Metric]:
    """Called where the health part of the GPU read ran (registry.py)."""
    up, base = scrape.up, scrape.labels
    with_health = [g for g in up if g.health is not None]

    ecc = family("resmon_gpu_ecc_enabled", "1 when ECC is on; mode current or pending (after the next reboot).", ("mode",))
    errors = family("resmon_gpu_ecc_errors_total",
                     "ECC errors; scope volatile (since driver load) or aggregate (board lifetime).", ("type", "scope"))
    retired = family("resmon_gpu_retired_pages", "Memory pages retired, by cause (pre-Ampere boards).", ("cause",))
    remapped = family("resmon_gpu_remapped_rows", "Memory rows remapped, by cause (Ampere and newer).", ("cause",))
    for g in with_health:
        h = g.health
        assert h is not None
        labels = base[id(g)]
        for mode, value in h.ecc_enabled:
            put(ecc, {**labels, "mode": mode}, value)
        for kind, scope, count in h.ecc_errors:
            put(errors, {**labels, "type": kind, "scope": scope}, count)
        for cause, count in h.retired_pages:
            put(retired, {**labels, "cause": cause}, count)
        for cause, count in h.remapped_rows:
            put(remapped, {**labels, "cause": cause}, count)
    yield ecc
    yield errors
    yield retired
    yield plain(family("resmon_gpu_retired_pages_pending", "1 when a page retirement waits for the next reattach or reset."),
                with_health, base, lambda g: g.health.retired_pages_pending if g.health else None)
    yield remapped
    yield plain(family("resmon_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset."),
                with_health, base, lambda g: g.health.row_remap_pending if g.health else None)
    yield plain(family("resmon_gpu_row_remap_failed", "1 when a row remap has failed (RMA territory)."),
                with_health, base, lambda g: g.health.row_remap_failed if g.health else None)
    yield plain(
        family("resmon_gpu_recovery_action",
               "Action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset."),
        with_health, base, lambda g: g.health.recovery_action if g.health else None)


def status(scrape: Scrape) -> CollectorStatus | None:
    return part_status(scrape, "health")
