"""Busy time integrated from the driver's utilization sample buffers (nvmlDeviceGetSamples).

nvmlDeviceGetUtilizationRates is one recent sample: a gauge scraped every 30 s sees 1 sample
in ~180 and aliases. The driver keeps a ring of samples (about one per 1/6 s on current
GPUs; its length is driver-defined); each refresh takes the samples newer than the last one
seen and adds value/100 x spacing to a counter, so rate() over any window is the true mean.

Rules: each sample counts once, for the interval that ends at its timestamp. Timestamps are
opaque (µs on the driver's clock, not the epoch): only differences and the last one seen
are used. The first refresh counts what the buffer holds then. A gap longer
than the spacing of the samples that follow it (the ring overflowed between refreshes, or
sampling paused) is filled at the mean of those samples. A driver reload restarts the clock:
reset() forgets the timestamps, keeping the totals (a counter never goes down).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

_US_PER_SECOND = 1e6
# a first interval longer than this many times the batch's own spacing is a gap
_GAP_FACTOR = 1.5


@dataclass(slots=True)
class _Engine:
    total_seconds: float = 0.0
    last_us: int | None = None  # newest timestamp seen; None: no starting point yet
    spacing_us: float | None = None  # typical spacing of recent samples


@dataclass(slots=True)
class BusyIntegrator:
    """Per (device key, engine) counters. Used only on the backend's reader thread."""

    _engines: dict[tuple[str, str], _Engine] = field(default_factory=dict)

    def last_seen(self, key: str, engine: str) -> int:
        """The lastSeenTimeStamp to pass to nvmlDeviceGetSamples (0: the whole buffer)."""
        state = self._engines.get((key, engine))
        return state.last_us or 0 if state is not None else 0

    def add(self, key: str, engine: str, samples: Sequence[tuple[int, float]]) -> float:
        """Fold in (timestamp µs, percent) samples newer than last_seen(); the total in seconds."""
        state = self._engines.setdefault((key, engine), _Engine())
        batch = sorted((ts, min(max(value, 0.0), 100.0)) for ts, value in samples if state.last_us is None or ts > state.last_us)
        if not batch:
            return state.total_seconds
        steps = [b[0] - a[0] for a, b in zip(batch, batch[1:]) if b[0] > a[0]]
        if steps:
            state.spacing_us = sorted(steps)[len(steps) // 2]
        busy_us = sum(value * (ts - prev) for (prev, _), (ts, value) in zip(batch, batch[1:])) / 100.0
        if state.last_us is not None:
            first_ts, first_value = batch[0]
            gap = first_ts - state.last_us
            if state.spacing_us is not None and gap > _GAP_FACTOR * state.spacing_us:
                mean = sum(v for _, v in batch) / len(batch)
                busy_us += mean * gap / 100.0
            else:
                busy_us += first_value * gap / 100.0
        state.total_seconds += busy_us / _US_PER_SECOND
        state.last_us = batch[-1][0]
        return state.total_seconds

    def total(self, key: str, engine: str) -> float | None:
        """The counter, or None before the first sample of that engine."""
        state = self._engines.get((key, engine))
        return None if state is None else state.total_seconds

    def reset(self) -> None:
        """After nvmlInit: the driver's sample clock may have restarted."""
        for state in self._engines.values():
            state.last_us = None
