"""Buffer reads without the size query once the size is known (issue 24).

pynvml's wrappers for the sample buffers and process lists first ask for the size (a NULL
buffer), then read: two NVML calls every time. Here each device remembers how large its last
answer was and passes a buffer with room to spare, so the steady state is one call; an
answer that does not fit (INSUFFICIENT_SIZE) falls back to pynvml's two-call protocol once,
and the buffer grows. Errors are raised as pynvml's NVMLError, for errors.py to classify.

One hint per (device key, query): written only by that device's worker, one job at a time.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import pynvml

_INSUFFICIENT = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
_MIN_ROOM = 8  # entries a buffer has at least (a process list that grows by a few still fits)


class Hints:
    """The largest answer seen per (device key, query), to size the next buffer."""

    def __init__(self) -> None:
        self._sizes: dict[tuple[str, str], int] = {}

    def room(self, key: str, what: str) -> int:
        """Entries the next buffer holds (0: not known yet, ask for the size)."""
        size = self._sizes.get((key, what))
        return 0 if size is None else max(2 * size, _MIN_ROOM)

    def saw(self, key: str, what: str, count: int) -> None:
        self._sizes[(key, what)] = max(self._sizes.get((key, what), 0), count)

    def forget(self, key: str | None = None) -> None:
        """A device that left (None: every device, after nvmlInit)."""
        if key is None:
            self._sizes.clear()
            return
        for known in [k for k in list(self._sizes) if k[0] == key]:
            self._sizes.pop(known, None)


def samples(hints: Hints, key: str, handle: Any, sampling_type: int, last_seen: int) -> tuple[int, list[Any]]:
    """nvmlDeviceGetSamples: (value type, entries newer than last_seen)."""
    what = f"samples.{sampling_type}"
    room = hints.room(key, what)
    if room:
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        value_type = pynvml._nvmlValueType_t()
        count = ctypes.c_uint(room)
        buf = (pynvml.c_nvmlSample_t * room)()
        ret = fn(handle, pynvml._nvmlSamplingType_t(sampling_type), ctypes.c_ulonglong(last_seen),
                 ctypes.byref(value_type), ctypes.byref(count), buf)
        if ret != _INSUFFICIENT:
            pynvml._nvmlCheckReturn(ret)
            entries = buf[: count.value]
            hints.saw(key, what, len(entries))
            return int(value_type.value), entries
    answer_type, entries = pynvml.nvmlDeviceGetSamples(handle, sampling_type, last_seen)
    hints.saw(key, what, len(entries))
    return int(answer_type), list(entries)


def process_list(hints: Hints, symbol: str, fallback: Callable[[Any], Any], key: str, handle: Any) -> list[Any]:
    """A process-list query (nvmlDevice{Compute,Graphics}RunningProcesses_v3 / _v2) into a
    buffer of the known size; fallback: pynvml's own wrapper of the same symbol."""
    room = hints.room(key, symbol)
    if room:
        fn = pynvml._nvmlGetFunctionPointer(symbol)
        count = ctypes.c_uint(room)
        buf = (pynvml.c_nvmlProcessInfo_v2_t * room)()  # _v3 has the same layout in pynvml
        ret = fn(handle, ctypes.byref(count), buf)
        if ret != _INSUFFICIENT:
            pynvml._nvmlCheckReturn(ret)
            procs = [_friendly(buf[i]) for i in range(count.value)]
            hints.saw(key, symbol, len(procs))
            return procs
    procs = list(fallback(handle))
    hints.saw(key, symbol, len(procs))
    return procs


def _friendly(entry: Any) -> Any:
    obj = pynvml.nvmlStructToFriendlyObject(entry)
    if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
        obj.usedGpuMemory = None  # as pynvml's wrapper: memory not reported
    return obj
