"""Each DRM card read on a thread of its own, bounded by the refresh's deadline (amdgpu, intel).

A sysfs read can block: a hung SMU never answers a sensor file, a FUSE or 9p sysfs can block a
listing. As the NVML backend's readers (nvml/workers.py) do, one card's hang must not hold up
the others: each key (a card's PCI address, or the /sys/class/drm listing) has one reader
thread, made when it is first read and kept until it is forgotten or the backend closes. A
refresh hands each reader its job and waits for them all, up to its deadline; a job still in
flight then is the caller's to report (the card down alone), and no second job of that key
starts until it returns. Its late result is dropped: the next refresh reads afresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def device_limit(collect_timeout: float) -> float:
    """How long one refresh waits for one card: a little under --collect.timeout, so that the
    refresh (the slow card down, the others fresh) reaches a scrape that gave it the whole
    --collect.timeout (NVML's rule, nvml/workers.py)."""
    return max(collect_timeout * 0.5, collect_timeout - 0.1)


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What one job gave: its value, or the exception it raised (raised again by the caller)."""

    value: T | None = None
    error: Exception | None = None


class _Reader(Generic[T]):
    """One key's thread: one job at a time; every field is guarded by the readers' lock."""

    def __init__(self, lock: threading.Lock, done: threading.Condition, number: int | None) -> None:
        self._wake = threading.Condition(lock)
        self._done = done
        self.job: Callable[[], T] | None = None
        self.busy = False  # a job handed over and not returned yet
        self.outcome: Outcome[T] | None = None
        self.stopping = False
        if number is None:
            thread = threading.Thread(target=self._run, name="resmon-drm-scan", daemon=True)
        else:
            thread = threading.Thread(target=self._run, name=f"resmon-drm-read-{number}", daemon=True)
        thread.start()

    def hand(self, job: Callable[[], T]) -> None:
        self.job, self.busy, self.outcome = job, True, None
        self._wake.notify()

    def stop(self) -> None:
        self.stopping = True
        self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self.job is None and not self.stopping:
                    self._wake.wait()
                if self.job is None:
                    return
                job, self.job = self.job, None
            try:
                outcome: Outcome[T] = Outcome(value=job())
            except Exception as exc:  # handed to the refresh, which raises it on its own thread
                outcome = Outcome(error=exc)
            with self._wake:
                self.outcome, self.busy = outcome, False
                self._done.notify_all()
                if self.stopping:
                    return


class Readers(Generic[T]):
    """The readers of one backend's cards (or of its listing). Thread-safe; a backend's refresh
    runs on the monitor's one GPU thread, so run() has one caller at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._readers: dict[str, _Reader[T]] = {}

    def run(self, jobs: Iterable[tuple[str, int | None, Callable[[], T]]], deadline: float) -> tuple[dict[str, Outcome[T]], set[str]]:
        """Each (key, number for the thread's name, job) on its key's reader, unless that one's
        previous job is still in flight; waits for them until deadline (time.monotonic()).
        Returns the outcomes of the jobs it started that returned, and the other keys (in flight)."""
        with self._lock:
            keys, started = [], []
            for key, number, job in jobs:
                reader = self._readers.get(key)
                if reader is None:
                    reader = self._readers[key] = _Reader(self._lock, self._done, number)
                if not reader.busy:  # in flight since an earlier refresh: not started twice, nor waited for
                    reader.hand(job)
                    started.append(key)
                keys.append(key)
            while any(self._readers[k].busy for k in started):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._done.wait(left)
            # a job of an earlier refresh that returned meanwhile is dropped: read afresh next time
            outcomes = {k: o for k in started if not self._readers[k].busy and (o := self._readers[k].outcome) is not None}
            return outcomes, set(keys) - outcomes.keys()

    def forget(self, key: str) -> None:
        """The key is not read again: its thread ends (after its job, if one is in flight)."""
        with self._lock:
            reader = self._readers.pop(key, None)
            if reader is not None:
                reader.stop()

    def close(self) -> None:
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
            for reader in readers:
                reader.stop()
