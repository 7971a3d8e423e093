"""One worker thread per GPU, so that a hung or slow GPU holds up only itself.

ctypes releases the GIL during each foreign call, so NVML calls of different GPUs overlap
(a real driver may still serialise some of them internally). Each worker runs at most one
read at a time: a GPU whose read has not returned is not asked again until it does (no
threads pile up behind a hung call). Idle workers block on a condition: no wakeups.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


class DeviceWorker:
    """Runs one job at a time for one GPU on its own daemon thread."""

    def __init__(self, index: int) -> None:
        self._cond = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._submitted = 0
        self._done = 0
        self._result: tuple[Any, BaseException | None] = (None, None)
        self._stopping = False
        self._on_exit: Callable[[], None] | None = None
        self.inflight_since: float | None = None  # monotonic start of the job not yet returned
        self._thread = threading.Thread(target=self._run, name=f"resmon-gpu-{index}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any]) -> bool:
        """Start job unless the previous one is still running (then False: not queued)."""
        with self._cond:
            if self.inflight_since is not None or self._stopping:
                return False
            self._job = job
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

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._stopping)
                if self._job is None:
                    break  # stopping and idle
                job, self._job = self._job, None
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except BaseException as exc:  # handed to the reader, which decides
                error = exc
            with self._cond:
                self._result = (result, error)
                self._done += 1
                self.inflight_since = None
                self._cond.notify_all()
        if self._on_exit is not None:
            self._on_exit()


def device_limit(collect_timeout: float) -> float:
    """How long one refresh waits for one GPU: a little under --collect.timeout, so that the
    refresh (the slow GPU down, the others fresh) reaches a scrape that gave it the whole
    --collect.timeout."""
    return max(collect_timeout * 0.5, collect_timeout - 0.1)
