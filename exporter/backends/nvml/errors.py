"""The one place that turns NVML errors into what the exporter does about them.

Every NVML call of the backend goes through call(): a value the device does not support
comes back as None, a symbol the driver lacks raises Missing (the caller may fall back to
an older call, else the value is absent), a device fault raises DeviceDown, and a
library-wide fault raises BackendDown (re-initialise later). field() is the same boundary
for identity fields, which must never take a device down on their own.
"""

from __future__ import annotations

import threading
from time import perf_counter
from typing import Any, Callable, TypeVar

import pynvml

T = TypeVar("T")


class Missing(Exception):
    """The driver or binding lacks this call (old driver): try an older one, else absent."""


class DeviceDown(Exception):
    """The device did not answer: it is reported with resmon_gpu_up 0."""

    def __init__(self, code: int | None, text: str) -> None:
        super().__init__(text)
        self.code = code


class Undecodable(DeviceDown):
    """The driver answered with text that is not UTF-8: the caller may read the raw bytes."""


class BackendDown(Exception):
    """NVML as a whole is unusable: not loaded, not initialised, driver mismatch."""

    def __init__(self, code: int | None, text: str) -> None:
        super().__init__(text)
        self.code = code


class Denied(DeviceDown):
    """NO_PERMISSION from a call the exporter cannot do without (required()): this process may
    not open the GPU (device nodes, group, container runtime), a failure, not an absent value."""


NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION


# Value not available on this device: leave the series out, the device stays up.
ABSENT_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_NOT_FOUND,
        getattr(pynvml, "NVML_ERROR_NO_DATA", 21),
    }
)
# The binding is newer than the driver: a fallback call may exist.
MISSING_CODES = frozenset(
    {
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
    }
)
# The library as a whole is gone or was never usable.
BACKEND_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# Everything else (GPU_IS_LOST, RESET_REQUIRED, UNKNOWN, TIMEOUT, INVALID_ARGUMENT for a
# handle that vanished, ...) means the device is down.
# For a health or v2 value only these do (health.py HealthReader.ask): any
# other failure of such a call makes just that value absent, so one odd answer to a newer
# query never hides a working GPU.
LOST_CODES = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, getattr(pynvml, "NVML_ERROR_RESET_REQUIRED", 16)})


def describe(exc: BaseException) -> str:
    """A short text for logs: NVML's own message, never a traceback."""
    try:
        return str(exc)
    except Exception:  # str() of NVMLError may call into the library
        return exc.__class__.__name__


# A call that takes longer than this waited on the driver, or ran one of the binding's
# heavier wrappers (process lists, field values: 50-100 us of Python): a GPU reader's
# probe counts such calls (workers.py).
BLOCKING_SECONDS = 40e-6


class _Blocking(threading.local):
    """Per thread: whom to tell that an NVML call took long (a GPU reader's probe);
    a thread that never asks (the monitor's reader, the XID watcher) is told nothing and not timed."""

    notify: Callable[[float], None] | None = None
    calling: Any = None  # an object whose call_since is set while this thread is inside an NVML call


_blocking = _Blocking()


def tell_when_blocking(notify: Callable[[float], None] | None, calling: Any = None) -> None:
    """On this thread, call notify(seconds) after every NVML call that took long (only with
    calling given), and keep calling.call_since at the perf_counter() start of the call in progress (None outside one)
    so another thread can tell a call that waits from Python that runs (None, None: stop)."""
    _blocking.notify = notify
    _blocking.calling = calling


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run one NVML query and classify its failure; see the module docstring."""
    return _timed(ABSENT_CODES, fn, args, kwargs)


def required(fn: Callable[..., T], *args: Any) -> T | None:
    """As call(), for what the exporter cannot do without (the device count, a handle): there
    NO_PERMISSION raises Denied instead of meaning "absent" (issue 22 item 12)."""
    return _timed(_REQUIRED_ABSENT, fn, args, {})


_REQUIRED_ABSENT = ABSENT_CODES - {NO_PERMISSION}


def _timed(absent: frozenset[int], fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T | None:
    # one frame around the call: this runs for every NVML call of a refresh
    calling = _blocking.calling
    if calling is None:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            return _classified(absent, exc)
    start = perf_counter()
    calling.call_since = start
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return _classified(absent, exc)
    finally:
        calling.call_since = None
        took = perf_counter() - start
        notify = _blocking.notify
        if notify is not None and took > BLOCKING_SECONDS:
            notify(took)


def _classified(absent: frozenset[int], exc: Exception) -> None:
    """None for an absent value; raises what the failure means otherwise."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):  # not an NVMLError: old driver, no _v3
        raise Missing(describe(exc)) from None
    if isinstance(exc, pynvml.NVMLError):
        code = exc.value
        if code in absent:
            return None
        if code == NO_PERMISSION:
            raise Denied(code, describe(exc)) from None
        if code in MISSING_CODES:
            raise Missing(describe(exc)) from None
        if code in BACKEND_CODES:
            raise BackendDown(code, describe(exc)) from None
        raise DeviceDown(code, describe(exc)) from None
    if isinstance(exc, UnicodeDecodeError):  # a name that is not UTF-8: that field only
        raise Undecodable(None, f"{exc.__class__.__name__}: {exc}") from None
    # other garbage from the driver or binding: that device only
    raise DeviceDown(None, f"{exc.__class__.__name__}: {exc}") from None


# A sample-buffer query's "nothing newer than the timestamp you gave": an empty answer.
_NOTHING_NEWER = pynvml.NVML_ERROR_NOT_FOUND


def nothing_newer(code: int) -> bool:
    """For the raw return of a sample-buffer query read without pynvml's wrapper (sized.py):
    an empty answer, not a failure (no exception raised and caught on every refresh that
    finds no new sample)."""
    return code == _NOTHING_NEWER


def newer(fn: Callable[..., T], *args: Any) -> T | tuple[()] | None:
    """A query of the driver's sample buffers (nvmlDeviceGetSamples,
    nvmlDeviceGetProcessUtilization): NOT_FOUND means "nothing newer than the timestamp you
    gave", which is an empty answer (), not an unsupported value (None); so is pynvml's
    "NVML Error with code 0" (its process-utilization wrapper raises when the size query
    finds nothing to size). Otherwise as call()."""

    def attempt() -> T | tuple[()]:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if nothing_newer(exc.value) or exc.value == pynvml.NVML_SUCCESS:
                return ()
            raise

    return call(attempt)  # every other failure classified the one usual way


def entry_ok(code: int) -> bool:
    """The per-entry status of a batched query (nvmlFieldValue_t.nvmlReturn, GPM metrics):
    anything but SUCCESS leaves that one value out; the value is undefined then."""
    return code == pynvml.NVML_SUCCESS


class Fallback:
    """A query with older alternatives: the first call the driver has is kept for good,
    and a query the driver lacks altogether is no longer made (its value stays absent).

    Shared by every GPU's worker: several may find the same call missing at the same moment
    (a binding newer than the driver answers ARGUMENT_VERSION_MISMATCH on every GPU at once).
    Each drops only the candidate it called, if it is still the first (compared under the
    lock, never held over the NVML call); the candidates are an immutable tuple swapped
    whole, so a worker reading them never sees half a change."""

    def __init__(self, *candidates: Callable[..., Any] | None) -> None:
        self._candidates: tuple[Callable[..., Any], ...] = tuple(c for c in candidates if c is not None)
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        """False once the driver has been found to lack every candidate."""
        return bool(self._candidates)

    def __call__(self, *args: Any) -> Any:
        while True:
            candidates = self._candidates  # one snapshot: another worker may drop its head meanwhile
            if not candidates:
                return None
            first = candidates[0]
            try:
                return call(first, *args)
            except Missing:
                with self._lock:
                    if self._candidates and self._candidates[0] is first:  # not yet dropped by another worker
                        self._candidates = self._candidates[1:]


def field(fn: Callable[..., T], *args: Any) -> T | None:
    """An identity field (UUID, name, PCI info): each is tolerant of its own failure, so a
    device that is lost for metrics but still enumerated keeps its identity. None when the
    driver lacks the call, does not support it or the device does not answer it; only
    BackendDown (the library as a whole) propagates."""
    try:
        return call(fn, *args)
    except (Missing, DeviceDown):
        return None


def init_error(exc: BaseException) -> BackendDown:
    """Classify a failure of nvmlInit: whatever it is, the backend is unusable for now."""
    code = exc.value if isinstance(exc, pynvml.NVMLError) else None
    return BackendDown(code, describe(exc))
