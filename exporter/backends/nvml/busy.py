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

NVML calls the timestamps "CPU timestamp in microseconds"; if that is wall time, a clock
stepped back makes every new sample older than the last one seen, and the driver, asked for
samples newer than that, answers nothing until the clock catches up (hours for a step of
hours). So an engine without new samples for a ring's worth of time (at least
MIN_RECHECK_SECONDS) is asked for its whole ring once, as after nvmlInit: a ring whose every
sample lies more than a ring's worth below the last one seen is a clock that stepped back,
and the engine starts over from it (those samples were never counted; the stretch before
them is lost, the total never goes down). A ring that still holds what was seen (an idle
GPU) is only compared, and asked again after another ring's worth of time.

GPUs are read on parallel workers, and the reader marks down GPUs as not read: every method
takes the one lock (pure arithmetic, never an NVML call under it).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

_US_PER_SECOND = 1e6
# an interval longer than this many times the spacing means samples were missing
_GAP_FACTOR = 1.5
# an engine without new samples this long (or a ring's worth, when longer) is asked for its
# whole ring once, to see whether the driver's clock stepped back
MIN_RECHECK_SECONDS = 1.0
# the same for the process-utilization buffer (SampleStamps), whose length NVML does not say;
# there a step is a whole buffer more than STAMP_STEP_SECONDS below the newest stamp seen
# (a shorter step back stalls utilization at most that long: the clock catches up)
STAMP_RECHECK_SECONDS = 20.0
STAMP_STEP_SECONDS = 60.0


@dataclass(slots=True)
class _Engine:
    total_seconds: float = 0.0
    last_us: int | None = None  # newest timestamp seen; None: no starting point yet
    spacing_us: float | None = None  # typical spacing of recent samples
    capacity: int = 0  # the longest answer seen: the ring's length, as far as known
    looked_us: float | None = None  # monotonic time this engine was last looked at (read or not)
    verify: bool = False  # the next answer (the whole ring) tells whether the clock went on
    fresh_us: float | None = None  # monotonic time of the last answer with new samples (or compared)
    newest_value: float | None = None  # the newest sample's value (percent): the engine's current utilization

    def ring_us(self) -> float:
        """How long the ring lasts, as far as known (0: not known)."""
        return self.capacity * self.spacing_us if self.capacity and self.spacing_us else 0.0


@dataclass(slots=True)
class BusyIntegrator:
    """Per (device key, engine) counters, shared by the GPUs' workers and the reader."""

    _engines: dict[tuple[str, str], _Engine] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def last_seen(self, key: str, engine: str) -> int:
        """The lastSeenTimeStamp to pass to nvmlDeviceGetSamples (0: the whole buffer)."""
        with self._lock:
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
        answered = len(samples) if answered is None else answered
        clean = [(int(ts), min(max(float(v), 0.0), 100.0)) for ts, v in samples if math.isfinite(v)]
        with self._lock:
            return self._add(self._engines.setdefault((key, engine), _Engine()), clean, answered, now_us)

    def _add(self, state: _Engine, clean: list[tuple[int, float]], answered: int, now_us: float) -> float:
        if state.verify and clean:
            state.verify = False
            state.fresh_us = now_us
            # every sample more than a ring's worth below the last one seen: the driver's clock
            # restarted (a new init) or stepped back (wall time); what was seen stays counted
            if max(ts for ts, _ in clean) < (state.last_us or 0) - state.ring_us():
                state.last_us = state.spacing_us = None
                state.capacity = 0
        batch = sorted(s for s in clean if state.last_us is None or s[0] > state.last_us)
        # samples seen before (a whole-ring answer, a driver ignoring lastSeen) are not new:
        # the answer was as long as the ring only if they were not in it
        ring_len, answered = answered, answered - (len(clean) - len(batch))
        looked, state.looked_us = state.looked_us, now_us
        if not batch:
            if state.last_us is not None and not state.verify:
                if state.fresh_us is None:
                    state.fresh_us = now_us
                elif now_us - state.fresh_us > max(state.ring_us(), MIN_RECHECK_SECONDS * _US_PER_SECOND):
                    state.verify = True  # nothing new for a ring's worth: did the clock step back?
            return state.total_seconds
        state.fresh_us = now_us
        steps = [b[0] - a[0] for a, b in zip(batch, batch[1:]) if b[0] > a[0]]
        if steps:
            state.spacing_us = sorted(steps)[len(steps) // 2]
        busy_us = sum(value * (ts - prev) for (prev, _), (ts, value) in zip(batch, batch[1:])) / 100.0
        if state.last_us is not None:
            unseen = None if looked is None else now_us - looked - (batch[-1][0] - batch[0][0])
            busy_us += self._first_interval(state, batch, answered, unseen)
        state.total_seconds += busy_us / _US_PER_SECOND
        state.capacity = max(state.capacity, ring_len)
        state.last_us = batch[-1][0]
        state.newest_value = batch[-1][1]
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

    def unread(self, key: str, engine: str | None = None, now: float | None = None) -> None:
        """This refresh could not read the device's engines (GPU down, NVML away), or just
        this engine (engine: not supported now): the time up to here is not filled when its
        samples come back. The engines that were read are not touched: marking them would
        stop their ring overflow being filled (issue 22: a decoder after an unsupported
        encoder read a third of its busy time)."""
        now_us = (time.monotonic() if now is None else now) * _US_PER_SECOND
        with self._lock:
            for (k, e), state in self._engines.items():
                if k == key and (engine is None or e == engine):
                    state.looked_us = now_us

    def unread_all(self, now: float | None = None) -> None:
        now_us = (time.monotonic() if now is None else now) * _US_PER_SECOND
        with self._lock:
            for state in self._engines.values():
                state.looked_us = now_us

    def current(self, key: str, engine: str, now: float | None = None) -> float | None:
        """The engine's current utilization (percent): its newest sample, while that is still
        the newest the driver has (within 1.5 x the spacing of the last answer with new
        samples); None when not known (a ring run dry, no samples yet)."""
        now_us = (time.monotonic() if now is None else now) * _US_PER_SECOND
        with self._lock:
            state = self._engines.get((key, engine))
            if state is None or state.newest_value is None or state.fresh_us is None or state.spacing_us is None:
                return None
            if now_us - state.fresh_us > _GAP_FACTOR * state.spacing_us:
                return None
            return state.newest_value

    def total(self, key: str, engine: str) -> float | None:
        """The counter, or None before the first sample of that engine."""
        with self._lock:
            state = self._engines.get((key, engine))
            return None if state is None else state.total_seconds

    def reset(self) -> None:
        """After nvmlInit: ask for the whole buffer once, and compare it with what was seen."""
        with self._lock:
            for state in self._engines.values():
                state.verify = True

    def forget(self, key: str) -> None:
        """A device that left for good (NvmlBackend forgets departed GPUs): its engines go."""
        with self._lock:
            for engine in [k for k in self._engines if k[0] == key]:
                del self._engines[engine]


@dataclass(slots=True)
class _Stamp:
    seen: int  # the newest timestamp seen
    fresh: float  # monotonic time of the last answer with new samples (or compared)


class SampleStamps:
    """The newest timestamp seen per device key of a buffer asked for "samples newer than"
    (nvmlDeviceGetProcessUtilization), with the same guard against a clock stepped back as
    the busy integrator: without new samples for `recheck` seconds the whole buffer is asked
    for once; when every stamp in it lies more than `step` seconds below the newest seen (a
    process that exited takes its newest samples with it, so somewhat below is no step), the
    clock stepped back and they are all new. Shared by the GPUs' workers: one lock."""

    def __init__(
        self, recheck: float | None = None, step: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._recheck = STAMP_RECHECK_SECONDS if recheck is None else recheck
        self._step_us = (STAMP_STEP_SECONDS if step is None else step) * _US_PER_SECOND
        self._clock = clock
        self._lock = threading.Lock()
        self._stamps: dict[str, _Stamp] = {}

    def last_seen(self, key: str) -> int:
        """The lastSeenTimeStamp to pass (0: the whole buffer)."""
        with self._lock:
            stamp = self._stamps.get(key)
            if stamp is None or self._clock() - stamp.fresh > self._recheck:
                return 0
            return stamp.seen

    def take(self, key: str, stamps: Sequence[int]) -> int:
        """Fold in one answer's timestamps; the bound: a sample of this answer is new when
        its timestamp is above it."""
        now = self._clock()
        with self._lock:
            stamp = self._stamps.get(key)
            if stamp is None:
                if stamps:
                    self._stamps[key] = _Stamp(max(stamps), now)
                return 0
            bound = stamp.seen
            if stamps and max(stamps) < stamp.seen - self._step_us:
                bound = 0  # the clock stepped back: none of these was counted
                stamp.seen = max(stamps)
            elif any(s > bound for s in stamps):
                stamp.seen = max(stamp.seen, *stamps)
            if stamps:  # new samples, or the whole buffer compared: the recheck waits again
                stamp.fresh = now
            return bound

    def clear(self) -> None:
        """After nvmlInit."""
        with self._lock:
            self._stamps.clear()

    def forget(self, key: str) -> None:
        """A device that left for good."""
        with self._lock:
            self._stamps.pop(key, None)
