"""Buffer reads without the size query once the size is known (issue 24).

pynvml's wrappers for the sample buffers and process lists first ask for the size (a NULL
buffer), then read: two NVML calls every time. Here each device remembers how large its last
answer was and passes a buffer with room to spare, so the steady state is one call; an
answer that does not fit (INSUFFICIENT_SIZE) falls back to pynvml's two-call protocol once,
and the buffer grows. Errors are raised as pynvml's NVMLError, for errors.py to classify.

One hint per (device key, query): written only by that device's read, one at a time
(workers.py: a GPU is never read twice at once).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Callable, NamedTuple

import pynvml

from . import errors as nvml_errors

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


# nvmlSample_t: unsigned long long timeStamp, then the 8 bytes of an nvmlValue_t
_SAMPLE = struct.Struct("<Q8s")


def samples(hints: Hints, key: str, handle: Any, sampling_type: int, last_seen: int) -> tuple[int, list[tuple[int, bytes]]]:
    """nvmlDeviceGetSamples: (value type, [(timestamp µs, the value's 8 bytes)] newer than
    last_seen; fields.raw_value decodes a value by the type). Read from one copy of the
    buffer, not entry by entry through pynvml's structs (their attribute access is Python)."""
    what = f"samples.{sampling_type}"
    room = hints.room(key, what)
    if room:
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        value_type = ctypes.c_uint()  # nvmlValueType_t
        count = ctypes.c_uint(room)
        buf = ctypes.create_string_buffer(room * _SAMPLE.size)
        ret = fn(handle, ctypes.c_uint(sampling_type), ctypes.c_ulonglong(last_seen),
                 ctypes.byref(value_type), ctypes.byref(count), buf)
        if nvml_errors.nothing_newer(ret):
            return int(value_type.value), []
        if ret != _INSUFFICIENT:
            pynvml._nvmlCheckReturn(ret)
            entries = list(_SAMPLE.iter_unpack(buf.raw[: min(count.value, room) * _SAMPLE.size]))
            hints.saw(key, what, len(entries))
            return int(value_type.value), entries
    answer_type, answer = pynvml.nvmlDeviceGetSamples(handle, sampling_type, last_seen)
    entries = [(int(e.timeStamp), bytes(e.sampleValue)) for e in answer]
    hints.saw(key, what, len(entries))
    return int(answer_type), entries


# nvmlProcessInfo_v2_t (and _v3, the same layout): pid, padding, usedGpuMemory,
# gpuInstanceId, computeInstanceId
_PROCESS = struct.Struct("<I4xQII")
_MEMORY_NA = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


class ProcessEntry(NamedTuple):
    """What the backend reads of a process-list entry (pynvml's own objects have the same
    two attributes): usedGpuMemory None where the driver does not report it."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's name, so either answer reads alike


def process_list(hints: Hints, symbol: str, fallback: Callable[[Any], Any], key: str, handle: Any) -> list[Any]:
    """A process-list query (nvmlDevice{Compute,Graphics}RunningProcesses_v3 / _v2) into a
    buffer of the known size; fallback: pynvml's own wrapper of the same symbol."""
    room = hints.room(key, symbol)
    if room:
        fn = pynvml._nvmlGetFunctionPointer(symbol)
        count = ctypes.c_uint(room)
        buf = ctypes.create_string_buffer(room * _PROCESS.size)
        ret = fn(handle, ctypes.byref(count), buf)
        if ret != _INSUFFICIENT:
            pynvml._nvmlCheckReturn(ret)
            procs = [ProcessEntry(pid, None if used == _MEMORY_NA else used)
                     for pid, used, _, _ in _PROCESS.iter_unpack(buf.raw[: min(count.value, room) * _PROCESS.size])]
            hints.saw(key, symbol, len(procs))
            return procs
    procs = list(fallback(handle))  # pynvml's objects: usedGpuMemory already None when not reported
    hints.saw(key, symbol, len(procs))
    return procs
