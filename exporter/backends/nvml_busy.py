"""Busy time integrated from the driver's utilization sample buffers (nvmlDeviceGetSamples).

nvmlDeviceGetUtilizationRates is one recent sample: a gauge scraped every 30 s sees 1 sample
in ~180 and aliases. The driver keeps a ring of samples (about one per 1/6 s on current
GPUs; its length is driver-defined); each refresh takes the samples newer than the last one
seen and adds value/100 x spacing to a counter, so rate() over any window is the true mean.

Rules: each sample counts once, for the interval that ends at its timestamp. Timestamps are
opaque (µs on the driver's clock, not the epoch): only differences and the last one seen
are used. The first refresh counts what the buffer holds then. A gap longer than the
spacing of the samples that follow it is either the ring overflowing between refreshes
(the answer is as long as the longest seen: filled at the mean of those samples) or
sampling having paused (an idle GPU's ring runs dry: a shorter answer, or a refresh that
found nothing newer although a sample was due; that part counts as idle).
After nvmlInit the next batch is checked against the last timestamp seen: a clock that
continued is not counted twice, a restarted one starts over; totals never go down.
"""

from __future__ import annotations

import math
import time
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
    capacity: int = 0  # the most samples one answer has held: the ring's length, as far as seen
    offset_us: float | None = None  # driver clock minus the monotonic clock, at the latest batch
    dry_until_us: float | None = None  # driver time of the latest refresh that found nothing newer
    verify: bool = False  # after nvmlInit: the next batch tells whether the clock continued


@dataclass(slots=True)
class BusyIntegrator:
    """Per (device key, engine) counters. Used only on the backend's reader thread."""

    _engines: dict[tuple[str, str], _Engine] = field(default_factory=dict)

    def last_seen(self, key: str, engine: str) -> int:
        """The lastSeenTimeStamp to pass to nvmlDeviceGetSamples (0: the whole buffer)."""
        state = self._engines.get((key, engine))
        if state is None or state.last_us is None or state.verify:
            return 0
        return state.last_us

    def add(self, key: str, engine: str, samples: Sequence[tuple[int, float]], now: float | None = None) -> float:
        """Fold in (timestamp µs, percent) samples; the total in seconds. now: the monotonic
        time of the read (default: now)."""
        now_us = (time.monotonic() if now is None else now) * _US_PER_SECOND
        state = self._engines.setdefault((key, engine), _Engine())
        clean = [(int(ts), min(max(float(v), 0.0), 100.0)) for ts, v in samples if math.isfinite(v)]
        if state.verify:
            state.verify = False
            if not clean or max(ts for ts, _ in clean) <= (state.last_us or 0):
                state.last_us = state.spacing_us = state.dry_until_us = None  # restarted: start over
        batch = sorted(s for s in clean if state.last_us is None or s[0] > state.last_us)
        if not batch:
            if state.last_us is not None and state.offset_us is not None and state.spacing_us is not None:
                driver_now = now_us + state.offset_us
                # nothing newer although a sample was due: sampling has paused (a refresh
                # between two samples of a busy GPU is not that)
                if driver_now - state.last_us > _GAP_FACTOR * state.spacing_us:
                    state.dry_until_us = driver_now
            return state.total_seconds
        steps = [b[0] - a[0] for a, b in zip(batch, batch[1:]) if b[0] > a[0]]
        if steps:
            state.spacing_us = sorted(steps)[len(steps) // 2]
        busy_us = sum(value * (ts - prev) for (prev, _), (ts, value) in zip(batch, batch[1:])) / 100.0
        full = len(batch) >= state.capacity  # a full ring may have dropped older samples
        state.capacity = max(state.capacity, len(batch))
        if state.last_us is not None:
            first_ts, first_value = batch[0]
            start = state.last_us
            if state.dry_until_us is not None:  # nothing was sampled up to then: idle
                start = max(start, min(first_ts, int(state.dry_until_us)))
            gap = first_ts - start
            if state.spacing_us is not None and gap > _GAP_FACTOR * state.spacing_us:
                if full:  # lost to the ring's overflow: the mean of what follows
                    busy_us += sum(v for _, v in batch) / len(batch) * gap / 100.0
                else:  # the ring kept everything since sampling resumed: before that, idle
                    busy_us += first_value * state.spacing_us / 100.0
            else:
                busy_us += first_value * gap / 100.0
        state.total_seconds += busy_us / _US_PER_SECOND
        state.last_us = batch[-1][0]
        state.offset_us = batch[-1][0] - now_us
        state.dry_until_us = None
        return state.total_seconds

    def total(self, key: str, engine: str) -> float | None:
        """The counter, or None before the first sample of that engine."""
        state = self._engines.get((key, engine))
        return None if state is None else state.total_seconds

    def reset(self) -> None:
        """After nvmlInit: ask for the whole buffer once, and compare it with what was seen."""
        for state in self._engines.values():
            state.verify = True
