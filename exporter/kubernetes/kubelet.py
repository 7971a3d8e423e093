"""The kubernetes collector's source: the kubelet's PodResources List, kept fresh in the
background.

A scrape never waits for the kubelet: it is served the latest completed List, and a List
older than cache_ttl is asked for again on a short-lived thread (one at a time, bounded by
its own timeout). So a slow, hung or refusing kubelet cannot hold up a refresh, nor the
other callers waiting on it. Only until the first List completes does a refresh wait for
it, briefly. A kubelet that timed out is asked again after 5 s, 10 s ... 60 s. Inactive
(None) while the socket does not exist, so hosts without a kubelet see nothing.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass

from ..logs import fields
from .podresources import Allocation, PodResourcesError, list_allocations

_FIRST_PAUSE = 5.0  # seconds before a timed-out kubelet is asked again; doubled each time
_MAX_PAUSE = 60.0


@dataclass(frozen=True, slots=True)
class KubeletState:
    """One List result (or failure)."""

    allocations: tuple[Allocation, ...]  # empty when the call failed
    success: bool
    duration_seconds: float
    timestamp_seconds: float  # Unix time the List finished


class KubeletReader:
    def __init__(self, socket_path: str, cache_ttl: float, timeout: float, log: logging.Logger) -> None:
        self._path = socket_path
        self._ttl = cache_ttl
        self._timeout = timeout
        self._log = log
        self._cond = threading.Condition()
        self._state: KubeletState | None = None
        self._due = 0.0  # monotonic time from which the latest List is stale
        self._inflight = False
        self._timeouts = 0  # consecutive Lists that ran into their timeout
        self._failing = False

    def _presence(self) -> str | None:
        """None: a socket is there; else why there is none ("" = nothing at that path)."""
        try:
            mode = os.stat(self._path).st_mode
        except PermissionError:
            return f"permission denied looking up {self._path} (the kubelet's directories are root's: run as uid 0)"
        except (OSError, ValueError):
            return ""
        return None if stat.S_ISSOCK(mode) else ""

    def read(self, wait: float) -> KubeletState | None:
        """The latest completed List; a new one is started when it is stale. wait: how long
        this caller may wait, used only while no List has completed yet. None: inactive."""
        problem = self._presence()
        if problem == "":
            with self._cond:
                self._state = None  # gone: a kubelet that comes back starts afresh
                self._due = 0.0
            return None
        if problem is not None:
            self._finish(KubeletState((), False, 0.0, time.time()), problem, timed_out=False)
            return self._state
        with self._cond:
            if not self._inflight and time.monotonic() >= self._due:
                self._inflight = True
                threading.Thread(target=self._list, name="resmon-kubelet", daemon=True).start()
            if self._state is None and wait > 0:
                self._cond.wait_for(lambda: self._state is not None, wait)
            if self._state is None:  # the first List has not answered within this caller's wait
                return KubeletState((), False, 0.0, time.time())
            return self._state

    def _list(self) -> None:
        started = time.perf_counter()
        try:
            allocations = list_allocations(self._path, self._timeout)
        except PodResourcesError as err:
            state = KubeletState((), False, time.perf_counter() - started, time.time())
            self._finish(state, str(err), timed_out="DEADLINE_EXCEEDED" in str(err))
        except Exception as err:  # list_allocations raises only PodResourcesError; a thread must not die loudly
            self._finish(KubeletState((), False, time.perf_counter() - started, time.time()), repr(err), timed_out=False)
        else:
            self._finish(KubeletState(allocations, True, time.perf_counter() - started, time.time()), "", timed_out=False)

    def _finish(self, state: KubeletState, error: str, timed_out: bool) -> None:
        with self._cond:
            self._inflight = False
            self._state = state
            self._timeouts = self._timeouts + 1 if timed_out else 0
            pause = min(_FIRST_PAUSE * 2 ** (self._timeouts - 1), _MAX_PAUSE) if timed_out else 0.0
            self._due = time.monotonic() + max(self._ttl, pause)
            was_failing, self._failing = self._failing, not state.success
            self._cond.notify_all()
        if state.success and was_failing:
            self._log.info("kubelet PodResources List answering again", extra=fields(socket=self._path))
        elif not state.success and not was_failing:
            self._log.warning("kubelet PodResources List failed", extra=fields(socket=self._path, error=error))
