"""Busy time integrated from the driver's utilization sample buffers (nvmlDeviceGetSamples).

nvmlDeviceGetUtilizationRates is one recent sample: a gauge scraped every 30 s sees 1 sample
in ~180 and aliases. The driver keeps a ring of samples (about one per 1/6 s on current
GPUs; its length is driver-defined); each refresh takes the samples newer than the last one
seen and adds value/100 x spacing to a counter, so rate() over any window is the true mean.

Each sample counts once, for the interval that ends at its timestamp. Timestamps are the
driver's (µs on its own clock): only differences are used. The first refresh counts what the
ring holds then. Between the last sample seen and the first new one there is either:
- the next sample on time (up to 1.5 x the spacing): its interval, counted;
- a stretch lost to the ring overflowing, when the answer was as long as the ring: filled
  at the mean of the samples that follow it, but never more than the time since this
  engine was last looked at that the new samples do not cover (so hours of a GPU being
  down, NVML away or MIG mode on are not filled);
- else sampling had paused (an idle GPU's ring runs dry): only the first sample's own
  interval is counted.
After nvmlInit the next answer is compared with the last timestamp seen: a clock that went
on is not counted twice, a restarted one starts over. The total never goes down.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

_US_PER_SECOND = 1e6
# an interval longer than this many times the spacing means samples were missing
_GAP_FACTOR = 1.5


@dataclass(slots=True)
class _Engine:
    total_seconds: float = 0.0
    last_us: int | None = None  # newest timestamp seen; None: no starting point yet
    spacing_us: float | None = None  # typical spacing of recent samples
    capacity: int = 0  # the longest answer seen: the ring's length, as far as known
    looked_us: float | None = None  # monotonic time this engine was last looked at (read or not)
    verify: bool = False  # after nvmlInit: the next answer tells whether the clock went on


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

    def add(
        self, key: str, engine: str, samples: Sequence[tuple[int, float]], answered: int | None = None,
        now: float | None = None,
    ) -> float:
        """Fold in one answer's (timestamp µs, percent) samples; the total in seconds.
        answered: how many samples the driver returned (before unusable ones were dropped;
        default len(samples)); now: the monotonic time of the read."""
        now_us = (time.monotonic() if now is None else now) * _US_PER_SECOND
        state = self._engines.setdefault((key, engine), _Engine())
        answered = len(samples) if answered is None else answered
        clean = [(int(ts), min(max(float(v), 0.0), 100.0)) for ts, v in samples if math.isfinite(v)]
        if state.verify and clean:
            state.verify = False
            if max(ts for ts, _ in clean) < (state.last_us or 0):  # the driver's clock restarted
                state.last_us = state.spacing_us = None
                state.capacity = 0
        batch = sorted(s for s in clean if state.last_us is None or s[0] > state.last_us)
        looked, state.looked_us = state.looked_us, now_us
        if not batch:
            return state.total_seconds
        steps = [b[0] - a[0] for a, b in zip(batch, batch[1:]) if b[0] > a[0]]
        if steps:
            state.spacing_us = sorted(steps)[len(steps) // 2]
        busy_us = sum(value * (ts - prev) for (prev, _), (ts, value) in zip(batch, batch[1:])) / 100.0
        if state.last_us is not None:
            unseen = None if looked is None else now_us - looked - (batch[-1][0] - batch[0][0])
            busy_us += self._first_interval(state, batch, answered, unseen)
        state.total_seconds += busy_us / _US_PER_SECOND
        state.capacity = max(state.capacity, answered)
        state.last_us = batch[-1][0]
        return state.total_seconds

    @staticmethod
    def _first_interval(state: _Engine, batch: list[tuple[int, float]], answered: int, unseen: float | None) -> float:
        """Busy µs for the stretch from the last sample seen to the first new one. unseen:
        the time since this engine was last looked at that the new samples do not cover."""
        first_ts, first_value = batch[0]
        assert state.last_us is not None
        gap = first_ts - state.last_us
        spacing = state.spacing_us
        if spacing is None or gap <= _GAP_FACTOR * spacing:
            return first_value * gap / 100.0  # the next sample, on time
        if answered >= state.capacity and unseen is not None:  # a full ring: lost to its overflow
            lost = max(min(gap, unseen), spacing)
            return sum(v for _, v in batch) / len(batch) * lost / 100.0
        return first_value * spacing / 100.0  # sampling had paused; the ring kept the rest

    def unread(self, key: str, now: float | None = None) -> None:
        """This refresh could not read the device's engines (GPU down, NVML away, not
        supported now): the time up to here is not filled when samples come back."""
        now_us = (time.monotonic() if now is None else now) * _US_PER_SECOND
        for (k, _), state in list(self._engines.items()):  # a copy: other GPUs' workers add to it
            if k == key:
                state.looked_us = now_us

    def unread_all(self, now: float | None = None) -> None:
        for key in {k for k, _ in list(self._engines)}:
            self.unread(key, now)

    def total(self, key: str, engine: str) -> float | None:
        """The counter, or None before the first sample of that engine."""
        state = self._engines.get((key, engine))
        return None if state is None else state.total_seconds

    def reset(self) -> None:
        """After nvmlInit: ask for the whole buffer once, and compare it with what was seen."""
        for state in self._engines.values():
            state.verify = True
