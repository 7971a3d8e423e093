"""The kubernetes collector's source: the kubelet's PodResources List, cached.

Inactive (None) while the socket does not exist, so hosts without a kubelet see nothing.
A failing kubelet never raises: the reading says unsuccessful, and a kubelet that timed
out is asked again only after a growing pause (5 s, 10 s ... 60 s), so a hung kubelet
costs one slow refresh per pause instead of every scrape waiting out its deadline.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass

from ..logs import fields
from .podresources import Allocation, PodResourcesError, list_allocations

_MAX_PAUSE = 60.0  # seconds, the longest wait before asking a timed-out kubelet again
_MIN_CALL = 0.05  # seconds: with less left of the caller's deadline, the kubelet is not asked


@dataclass(frozen=True, slots=True)
class KubeletState:
    """One List result (or failure) as served for cache_ttl."""

    allocations: tuple[Allocation, ...]  # empty when the call failed
    success: bool
    duration_seconds: float
    timestamp_seconds: float  # Unix time of the List call


class KubeletReader:
    def __init__(self, socket_path: str, cache_ttl: float, log: logging.Logger) -> None:
        self._path = socket_path
        self._ttl = cache_ttl
        self._log = log
        self._state: KubeletState | None = None
        self._next = 0.0  # monotonic time after which the kubelet is asked again
        self._timeouts = 0  # consecutive calls that ran into their deadline
        self._failing = False

    def active(self) -> bool:
        try:
            return stat.S_ISSOCK(os.stat(self._path).st_mode)
        except OSError:
            return False

    def read(self, timeout: float) -> KubeletState | None:
        """The cached List, refreshed when older than cache_ttl; the call waits at most
        timeout seconds. None: no socket (the collector is inactive)."""
        if not self.active():
            self._state = None
            return None
        now = time.monotonic()
        if self._state is not None and now < self._next:
            return self._state
        if timeout < _MIN_CALL:  # the GPU read took the whole deadline: not the kubelet's fault
            return self._state or KubeletState((), False, 0.0, time.time())
        started = time.perf_counter()
        try:
            allocations = list_allocations(self._path, timeout)
        except PodResourcesError as err:
            self._state = KubeletState((), False, time.perf_counter() - started, time.time())
            timed_out = "DEADLINE_EXCEEDED" in str(err)
            self._timeouts = self._timeouts + 1 if timed_out else 0
            pause = min(self._ttl * 2 ** (self._timeouts - 1), _MAX_PAUSE) if timed_out else self._ttl
            self._next = time.monotonic() + max(pause, self._ttl)
            if not self._failing:
                self._log.warning("kubelet PodResources List failed", extra=fields(socket=self._path, error=str(err)))
            self._failing = True
            return self._state
        if self._failing:
            self._log.info("kubelet PodResources List answering again", extra=fields(socket=self._path))
        self._failing = False
        self._timeouts = 0
        self._state = KubeletState(allocations, True, time.perf_counter() - started, time.time())
        self._next = time.monotonic() + self._ttl
        return self._state
