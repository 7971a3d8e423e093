"""The NVML session: nvmlInit and nvmlShutdown, the backoff between tries, and NVML's
refusals (NO_PERMISSION).

NVML is initialised once and kept; if it cannot be initialised (library missing, driver
not loaded) or stops answering, the backend retries with exponential backoff on later
refreshes, so GPUs appear without a restart. Retries run only when a refresh asks for
data: there is no background thread. Every NVML call goes through nvml_errors.

NvmlSession is a room of NvmlBackend (a mixin: backend.py says why): the state set in
_init_session is its own; it stops what may be inside NVML (the XID watcher, the GPU
readers, the GPM samples: the backend's _xid, _readers and _gpm) before a shutdown, and asks
the backend to drop what the other rooms knew of an init (_new_init, _init_lost).
"""

from __future__ import annotations

import logging
import threading
import time

import pynvml

from ...logs import fields
from . import errors as nvml_errors
from .errors import BackendDown, DeviceDown, Missing
from .units import text as _text

XID_STOP_TIMEOUT = 1.5  # seconds; stop() interrupts the watcher's wait (up to 5 s: xid.WAKE_SIGNAL)


class NvmlSession:
    """nvmlInit with backoff, the permission refusals, nvmlShutdown once nothing is inside NVML."""

    def _init_session(self, explicit: bool, min_backoff: float, max_backoff: float) -> None:
        self._close_lock = threading.Lock()  # workers ending after close() finish a pending shutdown once
        self._released = threading.Event()  # after close(): nothing is left inside this init of NVML
        self._explicit = explicit
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._backoff = min_backoff
        self._next_attempt = 0.0
        self._initialised = False
        self._ever_initialised = False
        self._init_failures = 0
        self.last_error = ""
        # NO_PERMISSION where it is fatal (issue 22 item 12): the init's or the count's error
        # text, and the indices whose handle lookup was refused (workers write it, under _ident_lock)
        self._denied = ""
        self._denied_at: dict[int, str] = {}
        self._denied_logs = 0  # refusals so far: logged at 1, 2, 4, 8, ... (a log line with backoff)
        self._driver_version = ""
        self._closing = False
        self._shutdown_pending = False  # nvmlShutdown waits for a watcher stuck inside NVML

    def try_init(self) -> bool:
        """Initialise NVML unless the backoff says wait; True when it is usable."""
        if self._initialised:
            return True
        if self._shutdown_pending:
            if not self._nvml_idle(0.0):
                return False  # the watcher or a GPU worker is still inside the old init
            self._shutdown_pending = False
            self._nvml_shutdown()
        now = time.monotonic()
        if now < self._next_attempt:
            return False
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # LibraryNotFound, DriverNotLoaded, or anything the library raises
            self._init_failed(nvml_errors.init_error(exc), now)
            return False
        self._initialised = True
        self._ever_initialised = True
        self._init_failures = 0
        self._denied = ""
        with self._ident_lock:
            self._denied_at.clear()
        self._new_init()  # what the other rooms knew of the old init goes (backend.py)
        try:
            self._driver_version = _text(nvml_errors.field(pynvml.nvmlSystemGetDriverVersion))
        except BackendDown:
            self._driver_version = ""
        self._log.info("NVML initialised", extra=fields(driver_version=self._driver_version or "unknown"))
        return True

    def device_count(self) -> int:
        """Devices NVML enumerates now; 0 when it cannot say (denied: see `denied`)."""
        try:
            count = nvml_errors.required(pynvml.nvmlDeviceGetCount) or 0
        except nvml_errors.Denied as err:
            self._refused(str(err))
            return 0
        except (BackendDown, DeviceDown, Missing) as err:
            self.last_error = str(err)
            return 0
        self._denied = ""
        return count

    @property
    def denied(self) -> str:
        """NVML's error text while nvmlInit or the device count answers NO_PERMISSION: an
        NVIDIA GPU is there and this process may not open it (auto mode keeps NVML then)."""
        return self._denied

    def _refused(self, error: str, gpus: tuple[int, ...] = ()) -> None:
        """NO_PERMISSION where the exporter cannot do without the answer: warned about at the
        1st, 2nd, 4th, 8th, ... refusal, so it stays in the log without flooding it."""
        if not gpus:
            self._denied = self.last_error = error
        self._denied_logs += 1
        level = logging.WARNING if self._denied_logs & (self._denied_logs - 1) == 0 else logging.DEBUG
        self._log.log(
            level,
            "NVML refuses this process: no permission to open the GPU (/dev/nvidiactl, /dev/nvidia*); "
            "give the exporter the device nodes (the video group or a udev rule; in Docker --gpus or --device "
            "with the NVIDIA container toolkit)",
            extra=fields(error=error, gpu=",".join(map(str, gpus)) or "all", refusals=self._denied_logs),
        )

    def _init_failed(self, err: BackendDown, now: float) -> None:
        self._init_failures += 1
        self.last_error = str(err)
        self._next_attempt = now + self._backoff
        if err.code == nvml_errors.NO_PERMISSION:
            self._refused(str(err))  # a failure, not "no GPU" (issue 22 item 12)
        elif self._init_failures == 1 and not self._explicit:
            self._log.warning(
                "NVML not available; serving host metrics and retrying with backoff",
                extra=fields(error=str(err), retry_in_seconds=round(self._backoff, 3)),
            )
        else:
            self._log.debug(
                "NVML still not available",
                extra=fields(error=str(err), attempt=self._init_failures, retry_in_seconds=self._backoff),
            )
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def _lost_backend(self, err: BackendDown | DeviceDown | Missing) -> None:
        """The library stopped answering (a failing count or handle lookup means the library,
        not a device): release this init and retry it with backoff."""
        self._log.warning(
            "NVML stopped answering; re-initialising with backoff", extra=fields(error=str(err))
        )
        # release this init before the next nvmlInit: NVML counts inits, and a re-init
        # without shutdown would leak one reference per driver reload
        self._shutdown()
        self._init_lost()  # its handles go with it (backend.py)
        # doubling until a read succeeds again: an init that works but a count that keeps
        # failing must not re-init every second
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def interrupt(self) -> None:
        """Called from the closing thread before the last read drains: the XID watcher ends
        its wait now, in parallel, and no read starts it again."""
        self._closing = True
        if self._xid is not None:
            self._xid.stop(0.0)

    def _shutdown(self) -> None:
        if self._initialised:
            self._initialised = False
            # the watcher's event set belongs to this init: stop it first; if it or a GPU
            # worker is still inside a call, shutting down under it can crash, so the shutdown
            # waits for them (try_init does it) and no new init is taken on top of the old one meanwhile
            if not self._nvml_idle(XID_STOP_TIMEOUT):
                self._log.warning("XID watcher or a GPU read still inside NVML; shutting NVML down once it returns")
                self._shutdown_pending = True
                return
            self._nvml_shutdown()

    def _nvml_idle(self, wait: float) -> bool:
        """True when neither the XID watcher nor any GPU worker is inside NVML (waiting up to
        wait seconds for them)."""
        until = time.monotonic() + wait
        if self._xid is not None and not self._xid.stop(wait):
            return False
        return self._readers.wait_idle(until)

    def _nvml_shutdown(self) -> None:
        if self._gpm is not None:
            self._gpm.free_all()  # GPM samples belong to this init: back before nvmlShutdown
        try:
            pynvml.nvmlShutdown()
        except Exception:  # the library is already gone or never answered: nothing to release
            pass

    def close(self) -> None:
        """Prompt: the XID watcher (its wait interrupted, else up to 5 s) and a GPU worker stuck in
        a call are not waited for; shutting NVML down under them can crash, so the last of
        them out of NVML does it (_after_close), or this call when all are out already."""
        with self._close_lock:
            if self._initialised:
                self._initialised = False
                self._shutdown_pending = True  # before anyone is told: the last one out sees it
            if not self._shutdown_pending:
                self._released.set()  # never initialised, or already shut down
        if self._xid is not None:
            self._xid.stop(0.0, on_exit=self._after_close)
        # each reader ends once idle; one stuck in a call ends when it returns
        self._readers.stop(self._after_close)
        self._after_close()
        self._readers.join(0.5)  # idle ones end at once

    def _after_close(self) -> None:
        with self._close_lock:
            if self._shutdown_pending and self._nvml_idle(0.0):
                self._shutdown_pending = False
                self._nvml_shutdown()
                self._released.set()

    def wait_released(self, timeout: float) -> bool:
        """After close(): True once the XID watcher and the GPU workers are out of NVML and
        it is shut down (waiting up to timeout). The CLI waits for this before it exits, so
        the event set is freed and NVML released; the Python API's close() does not."""
        return self._released.wait(max(0.0, timeout))
