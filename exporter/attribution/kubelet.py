"""The kubernetes collector's source: the kubelet's PodResources List, cached, fetched on a
short-lived thread so that a scrape waits for the kubelet only briefly.

A read finds the latest List older than cache_ttl: it starts a new one (one at a time,
bounded by its own timeout) and waits for it at most `wait` seconds. A kubelet that
answers in time gives values at most one TTL old; a slower one is served its previous
answer (its age is in the timestamp) while the new List completes in the background, so
a hung kubelet costs a refresh at most `wait` while its List is in flight, and nothing
during the back-off: a kubelet that timed out is asked again after 5 s, 10 s ... 60 s.

Inactive (None) while no socket is at the path; something else there (a regular file, a FIFO,
a directory: a mis-mounted hostPath) is inactive too, but warned about once, naming the
path and what is there. A socket that changes (the kubelet
restarted: a new inode) or comes back starts afresh: no back-off inherited, and an answer
still in flight from the old one is dropped.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass

from ..logs import fields
from .podresources import Allocation, Keep, KeepDra, PodResourcesError, Refused, list_allocations, preload

_FIRST_PAUSE = 5.0  # seconds before a timed-out kubelet is asked again; doubled each time
_MAX_PAUSE = 60.0
_DENIED = "denied"
_KINDS = ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


@dataclass(frozen=True, slots=True)
class _NotASocket:
    """What is at the path instead of a socket (its inode too: a new one is warned about again)."""

    kind: str
    inode: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class KubeletState:
    """One List result (or failure)."""

    allocations: tuple[Allocation, ...]  # empty when the call failed
    success: bool
    duration_seconds: float
    timestamp_seconds: float | None  # Unix time the List finished; None: no List has
    # DRA devices keep_dra refused while decoding: (driver, count, the first device name)
    refused: tuple[tuple[str, int, str], ...] = ()


class KubeletReader:
    def __init__(
        self, socket_path: str, cache_ttl: float, timeout: float, log: logging.Logger, keep: Keep | None = None,
        keep_dra: KeepDra | None = None,
    ) -> None:
        """keep(resource, device id), keep_dra(driver, device name): which allocations a List
        keeps (decided while decoding; the DRA devices refused are counted in the state)."""
        self._path = socket_path
        self._keep = keep
        self._keep_dra = keep_dra
        self._ttl = cache_ttl
        self._timeout = timeout
        self._log = log
        self._cond = threading.Condition()
        self._socket: object = None  # what is at the path: None, _DENIED or (st_dev, st_ino, st_ctime_ns)
        self._generation = 0  # bumped when that changes; an answer of an older one is dropped
        self._state: KubeletState | None = None
        self._completed = 0  # Lists finished in this generation
        self._due = 0.0  # monotonic time from which the latest List is stale
        self._inflight = False
        self._timeouts = 0  # consecutive Lists that ran into their timeout
        self._failing = False

    def _identity(self) -> object:
        try:
            st = os.stat(self._path)
        except PermissionError:
            return _DENIED
        except (OSError, ValueError):
            return None
        # the change time too: a freed inode number is soon reused by the next socket
        inode = (st.st_dev, st.st_ino, st.st_ctime_ns)
        if stat.S_ISSOCK(st.st_mode):
            return inode
        kind = next((name for test, name in _KINDS if test(st.st_mode)), f"file of mode {st.st_mode:o}")
        return _NotASocket(kind, inode)

    def prepare(self) -> None:
        """Import the gRPC client now where the socket exists (at start, not in the first
        List: its 0.1 s import would use up a refresh's whole wait for the answer). Without
        grpcio the List reports what to install."""
        if isinstance(self._identity(), tuple):
            try:
                preload()
            except PodResourcesError:
                pass

    def read(self, wait: float) -> KubeletState | None:
        """The latest completed List, a new one started when it is stale and waited for at
        most `wait` seconds. None: nothing at the socket path (the collector is inactive)."""
        identity = self._identity()
        with self._cond:
            if identity != self._socket:
                self._socket = identity
                self._generation += 1
                self._state, self._completed, self._due = None, 0, 0.0
                self._inflight, self._timeouts = False, 0
                if isinstance(identity, _NotASocket):  # once per thing found there, not per read
                    self._log.warning(
                        "not a socket at the kubelet PodResources path: kubernetes collector inactive",
                        extra=fields(socket=self._path, found=identity.kind),
                    )
            if identity is None or isinstance(identity, _NotASocket):
                return None
            if identity == _DENIED:
                state = KubeletState((), False, 0.0, None)
                error = f"permission denied looking up {self._path} (the kubelet's directories are root's: run as uid 0)"
                self._record(state, error)
                return state
            target = self._completed + 1
            if not self._inflight and time.monotonic() >= self._due:
                self._start()
            if self._inflight and wait > 0:
                self._cond.wait_for(lambda: self._completed >= target or not self._inflight, wait)
            return self._state or KubeletState((), False, 0.0, None)

    def _start(self) -> None:
        generation = self._generation
        thread = threading.Thread(target=self._list, args=(generation,), name="resmon-kubelet", daemon=True)
        try:
            thread.start()
        except RuntimeError as err:  # no thread left (RLIMIT_NPROC): a failed List, tried again after the TTL
            self._due = time.monotonic() + self._ttl
            self._record(KubeletState((), False, 0.0, time.time()), f"cannot start a thread for the List: {err}")
            return
        self._inflight = True

    def _list(self, generation: int) -> None:
        started = time.perf_counter()
        timed_out = False
        try:
            refused = Refused()
            allocations = list_allocations(self._path, self._timeout, self._keep, self._keep_dra, refused)
            counted = tuple(sorted((d, n, refused.examples[d]) for d, n in refused.counts.items()))
            state, error = KubeletState(allocations, True, time.perf_counter() - started, time.time(), counted), ""
        except PodResourcesError as err:
            timed_out = "DEADLINE_EXCEEDED" in str(err)
            state, error = KubeletState((), False, time.perf_counter() - started, time.time()), str(err)
        except Exception as err:  # list_allocations raises only PodResourcesError; this thread must not die loudly
            state, error = KubeletState((), False, time.perf_counter() - started, time.time()), repr(err)
        with self._cond:
            if generation != self._generation:
                return  # the socket changed meanwhile: this answer is the old kubelet's
            self._inflight = False
            self._completed += 1
            self._timeouts = self._timeouts + 1 if timed_out else 0
            pause = min(_FIRST_PAUSE * 2 ** (self._timeouts - 1), _MAX_PAUSE) if timed_out else 0.0
            self._due = time.monotonic() + max(self._ttl, pause)
            self._record(state, error)
            self._cond.notify_all()

    def _record(self, state: KubeletState, error: str) -> None:
        """Called with the lock held: the new state, logged when failing starts or ends."""
        self._state = state
        was_failing, self._failing = self._failing, not state.success
        if state.success and was_failing:
            self._log.info("kubelet PodResources List answering again", extra=fields(socket=self._path))
        elif not state.success and not was_failing:
            self._log.warning("kubelet PodResources List failed", extra=fields(socket=self._path, error=error))
