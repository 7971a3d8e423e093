"""The threads that read the GPUs: a hung or slow GPU holds up only itself.

ctypes releases the GIL during each foreign call, so NVML calls of different GPUs overlap
(a real driver may still serialise some of them internally). A GPU whose read has not
returned is not asked again until it does (GpuSlot: no threads pile up behind a hung call).
Idle readers block on a lock: no wakeups.

How a refresh reads its GPUs (Readers.run, a Chain): with a driver that answers at once,
every hand-off between threads costs more than a GPU's calls (a thread switch per GPU was a
quarter of a refresh's CPU; with a thread per GPU all started together, every ctypes call was
one: 3-4x). So one reader thread takes the GPUs one after another, in order. The refresh
lends the chain another reader when the read in front has made no progress for
RELAY_SECONDS while inside one NVML call (hung or long), or for STALL_SECONDS in all; the new
reader goes on with the next GPU, and the one passed leaves the chain to it when its read
returns (a chain has one reader taking GPUs: two would hand the GIL to each other at every
call, and a preempted read, which a busy machine passes now and then, would leave two for the
rest of the refresh).

Every read of a chain not yet all at once is a probe: a read with BLOCKED_CALLS calls longer
than nvml_errors.BLOCKING_SECONDS, or one call longer than BLOCKED_SECONDS (a driver where a
single call per GPU waits), trips. The driver blocks when two reads of one refresh trip, or
one trips right after a refresh that found the driver blocking, or right after a refresh
where another GPU tripped alone (Starts); every GPU left then gets a reader of its own at
once (their waits overlap), and so do the next PROBE_EVERY - 1 refreshes, after which a
chain probes again. One trip is not enough: on a busy machine a read preempted inside a
call, or waiting for the GIL when the call returns, trips too (one 64-GPU refresh in 25 to
70 on this project's shared 2-core machine), and a fast driver read all at once costs 3x
the CPU and wall time of a chain (the thread switches): that was the p99 of a 64-GPU
scrape. A driver that blocks trips on every GPU; one slow GPU that trips on every refresh
is not one (the refresh's timer passes it while it waits).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from . import errors as nvml_errors

RELAY_SECONDS = 0.001  # a read without progress for this long (1-2 ms in all) is passed
BLOCKED_CALLS = 4  # long calls that make a probe: the binding's two or three heavy
# wrappers and a preempted call are not yet a driver that blocks
BLOCKED_SECONDS = 0.0005  # ... or one call this long: a call that waits on the driver for
# half a millisecond is a driver that blocks, even if it is the only one
STALL_SECONDS = 0.01  # a read without progress this long is passed even while it runs Python
PROBE_EVERY = 4  # while the driver blocks, one refresh in this many starts as a chain

Job = Callable[[], Any]


class GpuSlot:
    """One GPU's read state, shared by whichever reader runs its read."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.inflight_since: float | None = None  # monotonic start of the read not yet returned
        self.call_since: float | None = None  # perf_counter() start of the NVML call its read is inside

    @property
    def busy(self) -> bool:
        return self.inflight_since is not None


class Chain:
    """One refresh's reads, taken in order by the readers lent to it. Changed under the
    Readers' lock."""

    def __init__(self, jobs: Sequence[tuple[GpuSlot, Job]], at_once: bool, until: float = float("inf")) -> None:
        self.jobs = tuple(jobs)
        self.until = until  # monotonic: no job but the first starts at or after it
        self.next = 0  # the next job to take
        self.running = 0  # taken, not returned
        self.progress = 0  # takes and returns so far: the refresh watches it move
        self.closed = False  # the refresh's deadline passed: nothing more starts
        self.at_once = at_once
        self.blocked = False  # the probes found the driver blocking: the rest started at once
        self.tripped: list[int] = []  # the GPUs whose reads' calls took long (see the module docstring)
        self.expect = False  # the refresh before found the driver blocking: one trip is enough
        self.alone: frozenset[int] = frozenset()  # the GPU that tripped alone in the refresh before
        self.last: GpuSlot | None = None  # the slot of the read taken last
        self.front: _Reader | None = None  # the reader lent last: in a chain only it takes on
        self.started = [False] * len(self.jobs)
        self.results: list[tuple[bool, Any, BaseException | None]] = [(False, None, None)] * len(self.jobs)
        self.finished = threading.Event()  # every job returned, passed over or not to start

    def left(self) -> int:
        return len(self.jobs) - self.next


class _Probe:
    """Told of one read's long NVML calls (on its reader's thread, errors.tell_when_blocking)."""

    def __init__(self, readers: Readers, chain: Chain, index: int) -> None:
        self._readers, self._chain, self._index, self._calls = readers, chain, index, 0
        self._tripped = False

    def __call__(self, seconds: float) -> None:
        self._calls += 1
        if not self._tripped and (self._calls >= BLOCKED_CALLS or seconds >= BLOCKED_SECONDS):
            self._tripped = True  # once per read: a read's many long calls are one trip
            self._readers.tripped(self._chain, self._index)


class _Reader:
    """One daemon thread that runs the chains it is lent."""

    def __init__(self, readers: Readers, number: int) -> None:
        self._readers = readers
        self.chain: Chain | None = None
        self.first = 0  # the job of the chain taken for this reader when it was lent
        self._gate = threading.Lock()  # released to lend a chain (or to stop): held while idle
        self._gate.acquire()
        self.thread = threading.Thread(target=self._run, name=f"resmon-gpu-read-{number}", daemon=True)
        self.thread.start()

    def lend(self, chain: Chain | None, first: int = 0) -> None:
        self.chain, self.first = chain, first
        self._gate.release()

    def _run(self) -> None:
        readers = self._readers
        while True:
            self._gate.acquire()
            chain = self.chain
            if chain is None:
                break  # stopped while idle
            if not readers.work(chain, self.first, self):
                break  # stopping, or one reader more than the GPUs
        readers.exited(self)


class Readers:
    """The reader threads of one backend, made as they are first needed and kept idle."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[_Reader] = []
        self._all: list[_Reader] = []
        self._made = 0
        self._running = 0  # reads in flight, every chain
        self._keep = 0  # readers kept (idle or not): one per GPU, ensure()
        self._stopping = False
        self._ending: list[_Reader] = []  # the readers at stop(): join() waits for them all
        self._on_exit: Callable[[], None] | None = None

    def ensure(self, count: int) -> None:
        """Keep one idle reader per GPU between refreshes, made now (idle ones cost nothing):
        the number of threads does not change with the load (a chain lent a reader when its
        front stalled), only while a read hangs (its reader is held beside them, and ends
        when the read returns to a full pool)."""
        with self._cond:
            self._keep = count
            while len(self._idle) < count and not self._stopping:
                if not self._make():
                    break

    def _make(self) -> bool:
        """One more idle reader (under the lock); False where no thread can be started (the
        chains go on with the readers there are)."""
        try:
            reader = _Reader(self, self._made + 1)
        except RuntimeError:  # can't start new thread
            return False
        self._made += 1
        self._all.append(reader)
        self._idle.append(reader)
        return True

    def run(
        self, jobs: Sequence[tuple[GpuSlot, Job]], until: float, at_once: bool = False, expect: bool = False,
        alone: frozenset[int] = frozenset(),
    ) -> Chain:
        """Read the jobs (a slot still busy from an earlier refresh is passed over), none
        started after the monotonic time until; returns once every started read returned or
        at until (the reads still running are the refresh's stuck GPUs). expect: one read
        that trips is enough to find the driver blocking; alone: so is one of a GPU other
        than these (Starts)."""
        chain = Chain(jobs, at_once, until)
        chain.expect, chain.alone = expect, alone
        with self._cond:
            if self._stopping or not chain.jobs:
                chain.closed = True
                chain.finished.set()
                return chain
            self._lend(chain, chain.left() if at_once else 1)
        seen = chain.progress
        moved = time.monotonic()  # when the chain last made progress
        while not chain.finished.is_set():
            now = time.monotonic()
            if now >= until:
                with self._cond:
                    chain.closed = True  # a late return starts nothing
                break
            if chain.next >= len(chain.jobs):  # every job taken: nothing left to lend
                chain.finished.wait(until - now)
                continue
            wait = min(RELAY_SECONDS, until - now)
            # no progress for a whole RELAY_SECONDS, and the read in front inside one NVML call
            # that long: it waits on the driver (hung or slow). A read running Python on a busy
            # machine is passed only after STALL_SECONDS (two at once would only hand the GIL to
            # each other, and a read in the GIL's queue is not hung). A wait cut short by the
            # deadline lends nothing.
            if not chain.finished.wait(wait) and chain.progress == seen and wait == RELAY_SECONDS:
                if self._front_waits(chain) or time.monotonic() - moved >= STALL_SECONDS:
                    with self._cond:
                        if chain.progress == seen:  # not a read that was taken just now
                            self._lend(chain, 1)
            if chain.progress != seen:
                moved = time.monotonic()
            seen = chain.progress
        return chain

    def outcome(self, chain: Chain) -> list[tuple[bool, bool, Any, BaseException | None]]:
        """(started, returned, result, error) of each job, as of now."""
        with self._cond:
            return [(s, *r) for s, r in zip(chain.started, chain.results)]

    @staticmethod
    def _front_waits(chain: Chain) -> bool:
        """The read taken last is inside an NVML call for RELAY_SECONDS or more (a reader
        not yet running is waited for up to STALL_SECONDS)."""
        slot = chain.last
        since = slot.call_since if slot is not None else None
        return since is not None and time.perf_counter() - since >= RELAY_SECONDS

    def tripped(self, chain: Chain, index: int) -> None:
        """GPU index's read of the chain tripped: the second, or the first one expected (see
        the module docstring), finds the driver blocking, and every job left gets a reader of
        its own."""
        with self._cond:
            chain.tripped.append(index)
            if chain.at_once or chain.closed:
                return
            if len(chain.tripped) < 2 and not chain.expect and (not chain.alone or index in chain.alone):
                return
            chain.blocked = chain.at_once = True
            self._lend(chain, chain.left())

    def _lend(self, chain: Chain, n: int) -> None:
        """Lend the chain up to n more readers, each with the next job taken for it (under
        the lock): a lent reader always has a read to start, which counts as started."""
        for _ in range(n):
            if self._stopping or (not self._idle and not self._make()):
                return
            i = self._take(chain)
            if i is None:
                if chain.running == 0:
                    chain.finished.set()
                return
            reader = self._idle.pop()
            chain.front = reader
            reader.lend(chain, i)

    def _take(self, chain: Chain) -> int | None:
        """The next job of the chain to start, marked in flight (under the lock); None when
        none is left or the chain is closed. A slot still busy from an earlier refresh is
        passed over."""
        while not (chain.closed or self._stopping) and chain.next < len(chain.jobs):
            if chain.next and time.monotonic() >= chain.until:  # a reader that returned late
                chain.closed = True
                break
            i = chain.next
            chain.next += 1
            slot = chain.jobs[i][0]
            if slot.busy:
                continue
            slot.inflight_since = time.monotonic()
            chain.started[i] = True
            chain.running += 1
            chain.progress += 1
            chain.last = slot
            self._running += 1
            return i
        return None

    def work(self, chain: Chain, first: int, reader: _Reader) -> bool:
        """On a reader: run job first of the chain, then take the next ones until none is
        left; then back to the idle readers (False: stopping, or the pool is full: it ends)."""
        i = first
        while True:
            slot, job = chain.jobs[i]
            nvml_errors.tell_when_blocking(None if chain.at_once else _Probe(self, chain, slot.index), slot)
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except BaseException as exc:  # handed to the refresh, which decides
                error = exc
            nvml_errors.tell_when_blocking(None)
            with self._cond:
                slot.inflight_since = slot.call_since = None
                chain.results[i] = (True, result, error)
                chain.running -= 1
                chain.progress += 1
                self._running -= 1
                # a chain's reader that was passed (its read waited or stalled, and the chain
                # went on with another) leaves the chain to that one: two readers taking
                # turns would hand the GIL to each other at every NVML call
                taken = self._take(chain) if chain.at_once or chain.front is reader else None
                if taken is None and chain.running == 0:
                    chain.finished.set()
                self._cond.notify_all()  # wait_idle()
                if taken is None:
                    return self._rest(reader)
            i = taken

    def _rest(self, reader: _Reader) -> bool:
        """Under the lock: reader is done with its chain. Idle again, unless stopping or the
        pool already has one idle reader per GPU (then it ends)."""
        reader.chain = None
        if self._stopping:
            return False
        if len(self._idle) >= self._keep:
            if reader in self._all:
                self._all.remove(reader)
            return False
        self._idle.append(reader)
        return True

    def exited(self, reader: _Reader) -> None:
        with self._cond:
            if reader in self._all:
                self._all.remove(reader)
            on_exit = self._on_exit
        if on_exit is not None:
            on_exit()

    def wait_idle(self, until: float) -> bool:
        """True once no read is running (by the monotonic time until)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == 0, max(0.0, until - time.monotonic()))

    @property
    def threads(self) -> int:
        with self._cond:
            return len(self._all)

    def stop(self, on_exit: Callable[[], None] | None = None) -> None:
        """Every reader ends once idle (a read still inside NVML finishes first), calling
        on_exit on its way out."""
        with self._cond:
            self._stopping = True
            self._on_exit = on_exit
            self._ending = list(self._all)  # each leaves _all on its way out, before on_exit
            idle, self._idle = self._idle, []
        for reader in idle:
            reader.lend(None)

    def join(self, timeout: float) -> None:
        until = time.monotonic() + timeout
        with self._cond:
            readers = list(self._ending) if self._stopping else list(self._all)
        for reader in readers:
            reader.thread.join(max(0.0, until - time.monotonic()))


class Starts:
    """Whether the next refresh starts its reads as a chain or all at once (see the module
    docstring). Used by the refresh's one thread."""

    def __init__(self) -> None:
        self._at_once_left = 0  # refreshes still to start at once before the next chain
        self.expect = False  # the last chain found the driver blocking: one trip of the next is enough
        self.alone: frozenset[int] = frozenset()  # the GPU that tripped alone in the last chain

    def at_once(self) -> bool:
        at_once = self._at_once_left > 0
        self._at_once_left = max(0, self._at_once_left - 1)
        return at_once

    def learn(self, chain: Chain) -> None:
        """After the refresh's reads returned: probes that found the driver blocking, a
        driver that blocks; a GPU that tripped alone makes a trip of another GPU in the next
        chain enough. A refresh read all at once, or one that started no read (every GPU still
        busy), probed nothing: what was learnt stays."""
        if chain.blocked:
            self._at_once_left = PROBE_EVERY - 1
            self.expect, self.alone = True, frozenset()
        elif not chain.at_once and any(chain.started):
            self.expect, self.alone = False, frozenset(chain.tripped)


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
