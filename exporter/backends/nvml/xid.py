"""XID events: the exporter's one background thread.

XIDs are events, not values: NVML queues them on an event set and hands them out one per
nvmlEventSetWait_v2 call, which blocks. So one daemon thread owns an event set registered for
nvmlEventTypeXidCriticalError alone on every GPU that supports it, waits up to WAIT_MS (5 s) per
call (an event ends a wait at once; stop() ends one with WAKE_SIGNAL) and counts what arrives
per (UUID, code). Everything else in the exporter stays on the
scrape path; the backend only hands over the devices it enumerated (watch()) and stops the
thread before every nvmlShutdown (stop()), since a set must not outlive the init that made it.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from ...logs import fields
from ...samples import XidCount, XidState
from .errors import LOST_CODES, BackendDown, DeviceDown, Missing, call, describe, field

XID_EVENT = pynvml.nvmlEventTypeXidCriticalError  # 0x8, registered on its own: any other bit may be NOT_SUPPORTED
THREAD_NAME = "resmon-xid"
# The longest wait the contract allows (v4): the thread's only periodic wakeup, once per 5 s
# while nothing happens. An event ends a wait at once, and stop() ends it early (_interrupt).
WAIT_MS = 5000
# stop() cuts a wait short with this signal to the thread: nvml.h says the wait "can return
# before specified timeout passes (e.g. when interrupt arrives)", as NVML_ERROR_TIMEOUT. Its
# default action is to ignore it (nothing would be interrupted); a no-op handler, installed only
# where the process has none of its own, makes it end the blocking call instead. Without that
# handler nothing is sent and a stopped thread leaves when its wait runs out (close() does not
# wait for that; the CLI waits 1 s for it, then exits regardless).
WAKE_SIGNAL = signal.SIGURG
_FORGOTTEN_KEPT = 64  # forgotten UUIDs whose late events are ignored; memory stays bounded
_TIMEOUT = object()  # a wait that saw nothing; call() would report TIMEOUT as a device fault


def _pointer(handle: Any) -> int | None:
    """Handle identity: pynvml's POINTER objects never compare equal, their addresses do."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def _uuid(handle: Any) -> str | None:
    try:
        value = field(pynvml.nvmlDeviceGetUUID, handle)
    except BackendDown:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value or None


def _wait(event_set: Any, wait_ms: int) -> Any:
    try:
        return pynvml.nvmlEventSetWait_v2(event_set, wait_ms)
    except pynvml.NVMLError_Timeout:
        return _TIMEOUT


def _woken(signum: int, frame: Any) -> None:
    """WAKE_SIGNAL's handler: there only so that the signal interrupts the event wait."""


def _install_wake() -> bool:
    """WAKE_SIGNAL's no-op handler, unless the process has its own (Python sets handlers on
    the main thread only: built elsewhere, stop() sends nothing). True when it is ours."""
    try:
        if signal.getsignal(WAKE_SIGNAL) == signal.SIG_DFL and threading.current_thread() is threading.main_thread():
            signal.signal(WAKE_SIGNAL, _woken)
        return signal.getsignal(WAKE_SIGNAL) is _woken
    except (ValueError, OSError):  # an embedding without signals
        return False


def _register(handle: Any, event_set: Any) -> bool:
    pynvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
    return True  # call() answers None for NOT_SUPPORTED, so success needs a value of its own


class _Failed(Exception):
    """A failure that calls for a rebuild; mode names it for warn-once."""

    def __init__(self, mode: str, err: Exception, library_lost: bool = False) -> None:
        super().__init__(describe(err))
        self.mode = mode
        self.code = getattr(err, "code", None)
        self.library_lost = library_lost
        # a GPU that is lost right now cannot register: retried later, but the watcher is not
        # failing for it (the backend already reports that GPU down)
        self.quiet = mode == "register" and self.code in LOST_CODES
        # the header: after UNKNOWN from a registration the set is undefined; free and rebuild
        self.rebuild = library_lost or self.code == pynvml.NVML_ERROR_UNKNOWN


def _worse(old: _Failed | None, new: _Failed) -> _Failed:
    """Of two failures in one pass, the one that decides what happens next."""
    if old is None or new.rebuild or (old.quiet and not new.quiet):
        return new
    return old


class XidWatcher:
    def __init__(
        self, log: logging.Logger, wait_ms: int = WAIT_MS, min_backoff: float = 1.0, max_backoff: float = 30.0
    ) -> None:
        self._log = log
        self._wait_ms = max(0, min(int(wait_ms), WAIT_MS))  # the contract's bound (v4: 5 s)
        self._min_backoff = min_backoff
        self._max_backoff = max(min_backoff, max_backoff)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._devices: dict[str, Any] = {}  # what watch() saw last: uuid -> handle
        self._key: dict[str, int | None] = {}  # the same by pointer value, to notice a change
        self._generation = 0  # bumped on every changed mapping
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._out = False  # the running thread has freed its set and makes no more NVML calls
        self._waiting = False  # the thread is in (or entering) nvmlEventSetWait_v2
        _install_wake()
        self._on_exit: Callable[[], None] | None = None  # stop()'s callback for a thread still inside NVML
        self._counts: dict[tuple[str, int], tuple[int, float]] = {}
        # GPUs the backend forgot (departed long ago): their counts are gone and a late event
        # from them (they stay registered: NVML has no unregister) is not counted, until a
        # watch() names them again
        self._forgotten: dict[str, None] = {}  # insertion-ordered: the oldest go beyond _FORGOTTEN_KEPT
        self._watched: frozenset[str] = frozenset()
        self._healthy = True
        self._duration = 0.0
        self._warned_unknown = False

    # -- the backend's side: cheap, never an NVML call ----------------------------------

    def watch(self, devices: Mapping[str, Any]) -> None:
        key = {uuid: _pointer(h) for uuid, h in devices.items() if uuid}
        with self._lock:
            for uuid in [u for u in key if u in self._forgotten]:
                del self._forgotten[uuid]  # enumerated again: counted again, from 0
            if key != self._key:
                self._devices = {uuid: h for uuid, h in devices.items() if uuid}
                self._key = key
                self._generation += 1
                self._wake.notify_all()
            alive = self._thread is not None and self._thread.is_alive()
            if alive and self._stopping:
                return  # a stop() that timed out: its thread still runs, never a second one
            if not alive:
                self._stopping, self._out, self._on_exit = False, False, None
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()

    def forget(self, uuid: str) -> None:
        """The backend dropped this departed GPU: its XID series leave with its other series
        (a counter that disappears is fine for Prometheus; one relabelled gpu="" is not)."""
        with self._lock:
            for key in [k for k in self._counts if k[0] == uuid]:
                del self._counts[key]
            self._forgotten.pop(uuid, None)
            self._forgotten[uuid] = None
            while len(self._forgotten) > _FORGOTTEN_KEPT:  # a board re-enumerating under new UUIDs again and again
                del self._forgotten[next(iter(self._forgotten))]

    def state(self) -> XidState:
        with self._lock:
            counts = tuple(XidCount(u, x, n, t) for (u, x), (n, t) in sorted(self._counts.items()))
            return XidState(counts, self._watched, self._healthy, self._duration)

    def stop(self, timeout: float, on_exit: Callable[[], None] | None = None) -> bool:
        """Ask the thread to end; True once it makes no more NVML calls (waiting up to
        timeout: its wait is interrupted, else it lasts up to wait_ms). on_exit: called on the thread once
        it is out of NVML, when that is after this returns False (close() does not wait out a
        wait: the thread's way out finishes the shutdown instead)."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return True
            self._stopping = True
            if on_exit is not None:
                self._on_exit = on_exit
            self._wake.notify_all()
            self._interrupt(thread)
        if thread is not threading.current_thread():  # on_exit may ask from the thread itself
            until = time.monotonic() + timeout
            while thread.is_alive() and time.monotonic() < until:
                # again now and then: a signal that came just before the wait began missed it
                thread.join(min(0.1, max(0.0, until - time.monotonic())))
                with self._lock:
                    self._interrupt(thread)
        with self._lock:
            return self._out or not thread.is_alive()

    def _interrupt(self, thread: threading.Thread) -> None:
        """End the thread's event wait now (WAKE_SIGNAL). Called under the lock: while _out is
        unset the thread has not ended, so its id is still its own."""
        if self._waiting and not self._out and thread.ident is not None and thread is not threading.current_thread():
            if signal.getsignal(WAKE_SIGNAL) is _woken:
                signal.pthread_kill(thread.ident, WAKE_SIGNAL)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        event_set: Any = None
        table: dict[int | None, str] = {}  # handle pointer -> UUID, as registered
        unsupported: set[tuple[str, int | None]] = set()  # skipped, not retried as errors
        generation = -1
        retry_at: float | None = None  # a rebuild is pending after a failure
        backoff = self._min_backoff
        proven = True  # the latest build has had a good wait (or has nothing to wait on)
        loud = False  # a failure other than a lost GPU's registration awaits a good pass
        warned: set[str] = set()
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return
                    changed = self._generation != generation
                    now = time.monotonic()
                    due = retry_at is not None and now >= retry_at
                    if event_set is None and not (changed or due):
                        # nothing to wait on: sleep until watch(), stop() or the retry
                        self._wake.wait(None if retry_at is None else retry_at - now)
                        continue
                    generation, devices = self._generation, dict(self._devices)
                failure: _Failed | None = None
                attempted = changed or due  # a (re)registration pass, not a wait
                if (changed or due) and event_set is not None:
                    # new, renumbered or earlier-failed GPUs join the live set: rebuilding it
                    # would drop the events still queued on it (XIDs come in bursts, with a
                    # failing GPU)
                    retry_at = None
                    failure = self._extend(event_set, table, devices, unsupported)
                    if failure is not None and failure.rebuild:
                        if not failure.library_lost:  # a lost library already reclaimed the set
                            self._free(event_set)
                        event_set, table = None, {}
                        with self._lock:
                            self._watched = frozenset()
                elif changed or due:
                    self._free(event_set)
                    event_set, table, failure = self._build(devices, unsupported)
                    retry_at, proven = None, event_set is None
                else:
                    try:
                        self._receive(event_set, table)
                        proven = True
                    except _Failed as err:
                        failure = err
                        if not failure.library_lost:  # a lost library already reclaimed the set
                            self._free(event_set)
                        event_set, table = None, {}
                        with self._lock:
                            self._watched = frozenset()
                if failure is not None:
                    retry_at = time.monotonic() + backoff
                    if not failure.quiet:
                        self._failed(failure, warned, backoff)
                    backoff = min(backoff * 2, self._max_backoff)
                if failure is not None and not failure.quiet:
                    loud = True  # healthy again only after a pass without such a failure
                elif attempted:
                    loud = False
                if not loud and proven and not self._healthy:  # one bool: no lock needed
                    backoff = self._min_backoff  # it works again: the next outage starts short
                    warned.clear()  # and warns again
                    self._resumed()
        except Exception:  # a bug here must not die silently; the next watch() starts a new thread
            self._log.error("XID watcher failed", exc_info=True, extra=fields())
        finally:
            self._free(event_set)
            with self._lock:
                self._watched = frozenset()
                self._out = True
                on_exit, self._on_exit = self._on_exit, None
            if on_exit is not None:  # outside the lock: it may call stop() or state()
                try:
                    on_exit()
                except Exception:
                    self._log.error("XID watcher exit callback failed", exc_info=True, extra=fields())

    def _build(
        self, devices: dict[str, Any], unsupported: set[tuple[str, int | None]]
    ) -> tuple[Any, dict[int | None, str], _Failed | None]:
        """A new set registered on every GPU that supports XID events. A GPU that fails is left
        out and the failure returned (the others stay watched until the retry)."""
        started = time.monotonic()
        table: dict[int | None, str] = {}
        failure: _Failed | None = None
        event_set: Any = None
        try:
            event_set = call(pynvml.nvmlEventSetCreate) if devices else None
        except Missing:
            event_set = None  # a driver without event sets: nothing to watch, nothing wrong
        except (DeviceDown, BackendDown) as err:
            failure = _Failed("create", err, isinstance(err, BackendDown))
        if event_set is not None:
            failure = self._extend(event_set, table, devices, unsupported)
        lost = failure is not None and failure.library_lost
        if event_set is not None and (not table or (failure is not None and failure.rebuild)):
            if not lost:  # a lost library already reclaimed it
                self._free(event_set)
            event_set, table = None, {}  # nothing (usable) registered: no set, no periodic wakeups
        with self._lock:
            self._watched = frozenset(u for u in table.values() if u in devices)
            self._duration = time.monotonic() - started
        return event_set, table, failure

    def _extend(
        self, event_set: Any, table: dict[int | None, str], devices: dict[str, Any], unsupported: set[tuple[str, int | None]]
    ) -> _Failed | None:
        """Register the GPUs the live set lacks and re-label renumbered handles. A GPU no
        longer enumerated stays registered (there is no unregister call; a late event from it
        is still counted under its UUID)."""
        started = time.monotonic()
        failure: _Failed | None = None
        for uuid, handle in devices.items():
            pointer = _pointer(handle)
            if table.get(pointer) == uuid or (uuid, pointer) in unsupported:
                continue
            if pointer in table:  # the same device handle, now enumerated as this UUID
                table[pointer] = uuid
                continue
            try:
                ok = call(_register, handle, event_set)
            except Missing:
                ok = None
            except (DeviceDown, BackendDown) as err:
                failure = _worse(failure, _Failed("register", err, isinstance(err, BackendDown)))
                if failure.rebuild:
                    break  # the set is gone or undefined (header): the caller frees it and builds anew
                continue
            if ok:
                table[pointer] = uuid
            else:  # NOT_SUPPORTED (GeForce), no permission: this GPU has no XID series
                unsupported.add((uuid, pointer))
                self._log.debug("XID events not supported", extra=fields(uuid=uuid))
        with self._lock:
            self._watched = frozenset(u for u in table.values() if u in devices)
            self._duration = time.monotonic() - started
        return failure

    def _receive(self, event_set: Any, table: dict[int | None, str]) -> None:
        """One bounded wait; an XID is counted under the UUID its handle was registered as."""
        with self._lock:
            if self._stopping:  # a stop() since the loop looked: no wait to interrupt
                return
            self._waiting = True
        try:
            data = call(_wait, event_set, self._wait_ms)
        except BackendDown as err:
            raise _Failed("wait", err, library_lost=True) from None
        except (DeviceDown, Missing) as err:  # GPU_IS_LOST, UNKNOWN, ...
            raise _Failed("wait", err) from None
        finally:
            with self._lock:
                self._waiting = False
        if data is _TIMEOUT:
            return
        if data is None:  # NOT_SUPPORTED from a wait: not something to count on
            raise _Failed("wait", pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
        if data.eventType != XID_EVENT:
            return  # eventData is an XID only for XID events (gpud#164 counted "xid 0" from a clock event)
        # the device's UUID now (one call per event, and events are rare), else the UUID it
        # was registered as: right even if the GPUs were renumbered a moment ago
        uuid = _uuid(data.device) or table.get(_pointer(data.device))
        if uuid is None:  # not a handle this set registered: nothing to attribute it to
            if not self._warned_unknown:
                self._warned_unknown = True
                self._log.warning("XID event from an unregistered device handle", extra=fields(xid=int(data.eventData)))
            return
        xid = int(data.eventData)
        with self._lock:
            forgotten = uuid in self._forgotten  # a departed GPU's late event: it has no series any more
            if not forgotten:
                count, _ = self._counts.get((uuid, xid), (0, 0.0))
                self._counts[(uuid, xid)] = (count + 1, time.time())  # the struct has no timestamp
        if forgotten:
            self._log.debug("XID event from a forgotten GPU, not counted", extra=fields(uuid=uuid, xid=xid))
            return
        self._log.info("XID event", extra=fields(uuid=uuid, xid=xid))

    def _free(self, event_set: Any) -> None:
        if event_set is None:
            return
        try:
            call(pynvml.nvmlEventSetFree, event_set)
        except (Missing, DeviceDown, BackendDown) as err:  # nothing left to do about it
            self._log.debug("freeing the XID event set failed", extra=fields(error=str(err)))

    def _failed(self, failure: _Failed, warned: set[str], backoff: float) -> None:
        with self._lock:
            self._healthy = False
        mode = "library" if failure.library_lost else f"{failure.mode}:{failure.code}"
        if mode not in warned:
            warned.add(mode)
            self._log.warning(
                "XID watching failed, rebuilding with backoff",
                extra=fields(step=failure.mode, error=str(failure), retry_seconds=backoff),
            )

    def _resumed(self) -> None:
        with self._lock:
            self._healthy = True
            watched = len(self._watched)
        self._log.info("XID watching resumed", extra=fields(gpus=watched))
