"""The xid collector: XID error events counted per GPU and code since the exporter started.

The counts come from the NVML backend's event thread (resmon-xid); the collector is inactive
(no families) where no GPU can report XIDs.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import Metric

from ..samples import CollectorStatus, GpuReading
from .series import Scrape, family, put

FAMILIES: dict[str, str] = {
    "resmon_gpu_xid_errors_total": "counter",
    "resmon_gpu_xid_last_timestamp_seconds": "gauge",
}
# counters with no event yet are still an answer (the family is declared, without samples)
DECLARED_WHEN_EMPTY = frozenset({"resmon_gpu_xid_errors", "resmon_gpu_xid_last_timestamp_seconds"})


def families(scrape: Scrape) -> Iterator[Metric]:
    reading = scrape.reading
    if reading is not None and reading.xid is not None:
        yield from _families(reading)


def _families(reading: GpuReading) -> Iterator[Metric]:
    state = reading.xid
    assert state is not None
    index = {}
    for g in reading.devices:  # a UUID's current index; a vanished GPU keeps its last one
        if g.identity.uuid and (g.identity.uuid not in index or g.up):
            index[g.identity.uuid] = str(g.identity.index)
    errors = family("resmon_gpu_xid_errors_total", "XID error events received since the exporter started.", ("xid",))
    last = family("resmon_gpu_xid_last_timestamp_seconds", "Unix time the latest XID event of this code was received.", ("xid",))
    for c in sorted(state.counts, key=lambda c: (index.get(c.uuid, ""), c.uuid, c.xid)):
        labels = {"gpu": index.get(c.uuid, ""), "uuid": c.uuid, "xid": str(c.xid)}
        put(errors, labels, c.count)
        put(last, labels, c.last_seen_seconds)
    yield errors
    yield last


def status(scrape: Scrape) -> CollectorStatus | None:
    """The event watcher's health; inactive (None) where no GPU can report XIDs."""
    gpu, reading = scrape.snap.gpu_status, scrape.snap.gpu
    xid = reading.xid if reading is not None else None
    if gpu is None or xid is None or not (xid.watched or not xid.healthy):
        return None
    return CollectorStatus(xid.healthy, xid.duration_seconds, gpu.timestamp_seconds)
