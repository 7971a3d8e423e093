"""One worker thread per GPU, so that a hung or slow GPU holds up only itself.

ctypes releases the GIL during each foreign call, so NVML calls of different GPUs overlap
(a real driver may still serialise some of them internally). Each worker runs at most one
read at a time: a GPU whose read has not returned is not asked again until it does (no
threads pile up behind a hung call). Idle workers block on a condition: no wakeups.

How a refresh starts its reads (Relay, Starts): with a driver that answers at once, runnable
workers only hand the GIL to each other at every ctypes call (with 8 or 64 of them each
call was a thread switch: 3-4x the CPU of reading the GPUs one after another). So a refresh
starts its reads as a relay: each read starts the next one when it returns, and the refresh
itself starts the next one when a read has held the relay RELAY_SECONDS (hung or long). The
reads the refresh starts itself are probes: they time their NVML calls, and a probe with
BLOCKED_CALLS calls longer than nvml_errors.BLOCKING_SECONDS, or one call longer than
BLOCKED_SECONDS (a driver where a single call per GPU waits), finds a driver that blocks;
every read left then starts at once, and so do the next PROBE_EVERY - 1 refreshes (all in
flight together, the GPUs' waits overlap), after which a relay probes again.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from . import errors as nvml_errors

RELAY_SECONDS = 0.001  # a read without progress for this long (1-2 ms in all) is passed
BLOCKED_CALLS = 4  # long calls that pass a probe on: the binding's two or three heavy
# wrappers and a preempted call are not yet a driver that blocks
BLOCKED_SECONDS = 0.0005  # ... or one call this long: a call that waits on the driver for
# half a millisecond is a driver that blocks, even if it is the only one
STALL_SECONDS = 0.01  # a read without progress this long is passed even while it runs Python
PROBE_EVERY = 4  # while the driver blocks, one refresh in this many starts as a relay


class DeviceWorker:
    """Runs one job at a time for one GPU on its own daemon thread."""

    def __init__(self, index: int) -> None:
        self._cond = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._submitted = 0
        self._done = 0
        self._result: tuple[Any, BaseException | None] = (None, None)
        self._relay: Relay | None = None  # told once when the running job is released
        self._probe = False  # the running job tells the relay whether the driver blocks
        self._blocking = 0  # NVML calls of the running job that blocked
        self._stopping = False
        self._on_exit: Callable[[], None] | None = None
        self.inflight_since: float | None = None  # monotonic start of the job not yet returned
        self.call_since: float | None = None  # perf_counter() start of the NVML call its job is inside
        self._thread = threading.Thread(target=self._run, name=f"resmon-gpu-{index}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any], relay: Relay | None = None, probe: bool = False) -> bool:
        """Start job unless the previous one is still running (then False: not queued);
        relay: told when the job returns, or (probe) once its calls blocked."""
        with self._cond:
            if self.inflight_since is not None or self._stopping:
                return False
            self._job = job
            self._relay = relay
            self._probe = probe
            self._blocking = 0
            self._submitted += 1
            self.inflight_since = time.monotonic()
            self._cond.notify_all()
            return True

    def wait(self, until: float) -> tuple[bool, Any, BaseException | None]:
        """(finished, result, error) of the submitted job, waiting until the monotonic time until."""
        with self._cond:
            self._cond.wait_for(lambda: self._done == self._submitted, max(0.0, until - time.monotonic()))
            if self._done != self._submitted:
                return False, None, None
            return True, *self._result

    @property
    def busy(self) -> bool:
        return self.inflight_since is not None

    def wait_idle(self, until: float) -> bool:
        """True once no job is running (by the monotonic time until)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.inflight_since is None, max(0.0, until - time.monotonic()))

    def stop(self, on_exit: Callable[[], None] | None = None) -> None:
        """The thread ends once idle (a job still inside NVML finishes first), calling
        on_exit on its way out."""
        with self._cond:
            self._stopping = True
            self._on_exit = on_exit
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _blocked(self, seconds: float) -> None:
        """One NVML call of the running job blocked for seconds (on this worker's thread)."""
        self._blocking += 1
        if self._blocking >= BLOCKED_CALLS or seconds >= BLOCKED_SECONDS:
            self._pass_relay(blocked=True)  # once: _pass_relay forgets the relay

    def _pass_relay(self, blocked: bool = False) -> None:
        relay, self._relay = self._relay, None  # this thread alone runs the job: no lock
        if relay is not None:
            relay.passed(blocked)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._stopping)
                if self._job is None:
                    break  # stopping and idle
                job, self._job = self._job, None
            result: Any = None
            error: BaseException | None = None
            # only a probe counts its long calls; every job shows when it is inside one (Relay.run)
            nvml_errors.tell_when_blocking(self._blocked if self._probe else None, self)
            try:
                result = job()
            except BaseException as exc:  # handed to the reader, which decides
                error = exc
            nvml_errors.tell_when_blocking(None)
            try:
                self._pass_relay()  # before the result: the next GPU need not wait for the reader
            finally:
                with self._cond:
                    self._result = (result, error)
                    self._done += 1
                    self.inflight_since = None
                    self._cond.notify_all()
        if self._on_exit is not None:
            self._on_exit()


class Relay:
    """Starts one refresh's jobs in order (see the module docstring): all at once, or as a
    relay. A relay's probe, the read the refresh starts itself (the first, or the next one
    after a read held the relay RELAY_SECONDS), tells whether the driver blocks: when its
    calls did, every read left starts at once. A worker still busy from an earlier refresh
    is passed over."""

    def __init__(self, jobs: Sequence[tuple[DeviceWorker, Callable[[], Any]]], at_once: bool = False) -> None:
        self._jobs = jobs
        self._lock = threading.Lock()
        self._next = 0
        self._all_started = threading.Event()
        self.at_once = at_once
        self.blocked = False  # a probe's calls blocked: the rest started at once
        self.submitted = [False] * len(jobs)

    def run(self, until: float) -> list[bool]:
        """Start the jobs, none after the monotonic time until (the refresh has given up on
        those by then: they are reported as not read); which were submitted."""
        self._start(probe=True)
        seen = self._next
        moved = time.monotonic()  # when the relay last made progress
        while not self._all_started.is_set():
            now = time.monotonic()
            if now >= until:
                with self._lock:
                    self._next = len(self._jobs)  # a late pass starts nothing either
                    self._all_started.set()
                break
            wait = min(RELAY_SECONDS, until - now)
            # no progress for a whole RELAY_SECONDS, and the read in front inside one NVML call
            # that long: it waits on the driver (hung or slow). A read running Python on a busy
            # machine is passed only after STALL_SECONDS (two at once would only hand the GIL to
            # each other, and a read in the GIL's queue is not hung). A wait
            # cut short by the deadline starts nothing (it once started one after it).
            if not self._all_started.wait(wait) and self._next == seen and wait == RELAY_SECONDS:
                if self._front_waits() or time.monotonic() - moved >= STALL_SECONDS:
                    self._start(probe=True)
            if self._next != seen:
                moved = time.monotonic()
            seen = self._next
        return self.submitted

    def _front_waits(self) -> bool:
        """The read started last is inside an NVML call for RELAY_SECONDS or more (or its
        worker is gone from under it: not knowable, so yes)."""
        with self._lock:
            started = [w for (w, _), s in zip(self._jobs[: self._next], self.submitted) if s]
        if not started:
            return True
        since = started[-1].call_since
        return since is not None and time.perf_counter() - since >= RELAY_SECONDS

    def passed(self, blocked: bool) -> None:
        """From a worker: its read returned, or (blocked) the probe's calls blocked."""
        if blocked:
            with self._lock:
                self.blocked = self.at_once = True
        self._start(probe=False)

    def _start(self, probe: bool) -> None:
        """Start the next job that can start, or every one left when at once."""
        with self._lock:
            while self._next < len(self._jobs):
                i = self._next
                self._next += 1
                worker, job = self._jobs[i]
                if self.at_once:
                    self.submitted[i] = worker.submit(job)
                elif worker.submit(job, self, probe):
                    self.submitted[i] = True
                    break
            if self._next == len(self._jobs):
                self._all_started.set()


class Starts:
    """Whether the next refresh starts its reads as a relay or all at once (see the module
    docstring). Used by the refresh's one thread."""

    def __init__(self) -> None:
        self._at_once_left = 0  # refreshes still to start at once before the next relay

    def relay(self, jobs: Sequence[tuple[DeviceWorker, Callable[[], Any]]]) -> Relay:
        at_once = self._at_once_left > 0
        self._at_once_left = max(0, self._at_once_left - 1)
        return Relay(jobs, at_once)

    def learn(self, relay: Relay) -> None:
        """After the refresh's reads returned: a probe that blocked, a driver that does."""
        if relay.blocked:
            self._at_once_left = PROBE_EVERY - 1


class HandleCache:
    """Device handles by current index, shared by the workers and the reader. clear() (the
    devices were re-enumerated: an index may now be another device) starts a new generation;
    a lookup stores its handle only if the generation it started in is still current, so a
    lookup that hung across a count change cannot cache the old enumeration's handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self.generation = 0

    def get(self, index: int) -> Any:
        with self._lock:
            return self._handles.get(index)

    def put(self, index: int, handle: Any, generation: int) -> bool:
        """Cache handle, looked up in generation; False (not cached) when that has passed."""
        with self._lock:
            if generation != self.generation:
                return False
            self._handles[index] = handle
            return True

    def drop(self, index: int, handle: Any) -> None:
        """Forget index's handle if it is still this one (a late job must not drop a newer one)."""
        with self._lock:
            if self._handles.get(index) is handle:
                del self._handles[index]

    def clear(self) -> None:
        with self._lock:
            self._handles.clear()
            self.generation += 1


def device_limit(collect_timeout: float) -> float:
    """How long one refresh waits for one GPU: a little under --collect.timeout, so that the
    refresh (the slow GPU down, the others fresh) reaches a scrape that gave it the whole
    --collect.timeout."""
    return max(collect_timeout * 0.5, collect_timeout - 0.1)
