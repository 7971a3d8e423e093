"""nvmlDeviceGetFieldValues: one batch per device per refresh, every entry checked on its own.

The call succeeds when any entry was filled; an entry whose own nvmlReturn is not SUCCESS
(a field this driver does not know, NOT_SUPPORTED on this board) has an undefined value and
is left out, never read as 0 (DCGM #311: memory temperature 0 on an L4).
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Iterable

import pynvml

from . import errors as nvml_errors

# Field ids (nvml.h, NVML_FI_DEV_*); pynvml lacks some constants on older bindings.
MEMORY_TEMP = 82
NVLINK_LINK_COUNT = 91
NVLINK_THROUGHPUT_DATA_TX = 138
NVLINK_THROUGHPUT_DATA_RX = 139
PCIE_COUNT_TX_BYTES = 197
PCIE_COUNT_RX_BYTES = 198
GPU_RECOVERY_ACTION = 230
# values that also have a call of their own: the call is the fallback where the entry fails
TOTAL_ENERGY = 83
PCIE_REPLAY_COUNTER = 94
POWER_AVERAGE = 185  # what nvmlDeviceGetPowerUsage reads on Ampere (but GA100) and newer
POWER_INSTANT = 186  # ... and on older GPUs
POWER_CURRENT_LIMIT = 190  # the enforced limit (nvmlDeviceGetEnforcedPowerLimit)
GPU_TEMP = 308  # the core sensor as a double (nvmlDeviceGetTemperatureV rounds it); newest drivers
# slow values (health and nvlink collectors)
ECC_CURRENT, ECC_PENDING = 1, 2
ECC_COUNTS = {(0, 0): 3, (1, 0): 4, (0, 1): 5, (1, 1): 6}  # (nvmlMemoryErrorType_t, nvmlEccCounterType_t) -> id
RETIRED_PAGES = {0: 29, 1: 30}  # nvmlPageRetirementCause_t -> id
RETIRED_PENDING = 31
REMAPPED = (142, 143, 144, 145)  # correctable, uncorrectable, pending, failure
NVLINK_GET_STATE = 165  # scopeId = link
NVLINK_DL_ERRORS = {"replay": 161, "recovery": 162, "crc_flit": 163}  # scopeId = link


def nvlink_crc_data_field(link: int) -> int | None:
    """NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L<link>: ids 39-44 (links 0-5), 102-107 (6-11);
    no id for later links (their counter is read by its own call)."""
    if 0 <= link < 6:
        return 39 + link
    if 6 <= link < 12:
        return 102 + link - 6
    return None

# reason -> (field id, nvmlPerfPolicyType_t of the nvmlDeviceGetViolationStatus fallback)
CLOCK_EVENT_FIELDS: tuple[tuple[str, int, int | None], ...] = (
    ("sw_power_cap", 74, 0),
    ("sync_boost", 76, 2),
    ("sw_thermal_slowdown", 269, 1),
    ("hw_thermal_slowdown", 270, None),
    ("hw_power_brake_slowdown", 271, None),
    ("board_limit", 77, 3),
    ("low_utilization", 78, 4),
    ("reliability", 79, 5),
)
# The header says nanoseconds for the clock-event fields and violationTime; nvidia-smi
# prints microseconds after converting. One named constant, so a hardware check that
# proves otherwise changes one line.
CLOCK_EVENT_UNITS_PER_SECOND = 1e9

# NVML's all-ones "not available" values
U32_NA = 0xFFFFFFFF
U64_NA = 0xFFFFFFFFFFFFFFFF
_DOUBLE = 0
_SENTINELS = {1: U32_NA, 2: U64_NA, 3: U64_NA}  # unsigned types' all-ones value

Request = tuple[int, int]  # (field id, scope id)
# integer nvmlValueType_t -> width in bits (UINT, ULONG on LP64, ULONGLONG, SLONGLONG, SINT, USHORT)
_BITS = {1: 32, 2: 64, 3: 64, 4: 64, 5: 32, 6: 16}


class Values(dict[Request, float | int]):
    """{(id, scope): value} of one batch that answered (possibly empty: every entry failed);
    bits: each integer entry's width by its value type, for counters that wrap (None: a
    double); failed: the entries whose own nvmlReturn was not SUCCESS."""

    def __init__(self) -> None:
        super().__init__()
        self.bits: dict[Request, int | None] = {}
        self.failed: set[Request] = set()


class _Value(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class _Entry(ctypes.Structure):
    """nvmlFieldValue_t (40 bytes; shared/reference/nvml-extended.md 4a) as a plain ctypes
    struct: pynvml's own adds a Python-level __getattribute__ to every field access, a third
    of a GPU's read time with a batch of 40 entries."""

    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", _Value)]


assert ctypes.sizeof(_Entry) == 40


# One entry as bytes (the struct above): fieldId, scopeId, timestamp, latencyUsec, valueType,
# nvmlReturn, the 8 bytes of the value. A batch is decoded from one copy of the array with
# struct, not entry by entry through ctypes attributes (a fifth of a GPU's refresh).
_ENTRY = struct.Struct("<IIqqII8s")
_RAW = {0: struct.Struct("<Q"), 1: struct.Struct("<I"), 2: struct.Struct("<Q"), 3: struct.Struct("<Q"),
        4: struct.Struct("<q"), 5: struct.Struct("<i"), 6: struct.Struct("<H")}
_AS_DOUBLE = struct.Struct("<d")
_REQUEST = struct.Struct("<II32x")  # an entry with only fieldId and scopeId set


def get_field_values(handle: Any, requests: list[Request]) -> Any:
    """nvmlDeviceGetFieldValues for [(field id, scope id)]: the filled array (errors raised as
    pynvml's NVMLError, for errors.py). The request array is packed in one go, not set
    entry by entry through ctypes attributes."""
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    packed = b"".join([_REQUEST.pack(fid, scope) for fid, scope in requests])
    entries = (_Entry * len(requests)).from_buffer_copy(packed)
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int(len(requests)), entries))
    return entries


def decode(entry: Any) -> float | int | None:
    """The value of one nvmlFieldValue_t (any ctypes struct of its layout), or None when its
    own return says it has none; read() decodes a whole batch the same way."""
    _, _, _, _, value_type, code, raw = _ENTRY.unpack(bytes(entry))
    return raw_value(value_type, raw) if nvml_errors.entry_ok(code) else None


def read(handle: Any, requests: Iterable[Request], call: Any) -> Values | None:
    """One batch; {(id, scope): value} for the entries that answered, None when the call
    as a whole is not available (driver without field values). call: the backend's
    Fallback for nvmlDeviceGetFieldValues (DeviceDown propagates: the device is down)."""
    wanted = list(requests)
    if not wanted:
        return Values()
    entries = call(handle, wanted)
    if entries is None:
        return None
    out = Values()
    for fid, scope, _, _, value_type, code, raw in _ENTRY.iter_unpack(bytes(entries)):
        request = (fid, scope)
        if not nvml_errors.entry_ok(code):  # the value is undefined
            out.failed.add(request)
            continue
        value = raw_value(value_type, raw)
        if value is not None:
            out[request] = value
            out.bits[request] = width(value_type, value)
    return out


def raw_value(value_type: int, raw: bytes) -> float | int | None:
    """An nvmlValue_t (its 8 bytes as the driver wrote them) by its nvmlValueType_t (field
    values, sample buffers). A DOUBLE whose upper 32 bits are 0 is an integer the driver
    mislabelled (r545 wrote memory temperature as uiVal but said DOUBLE, nvbug 4300930): as a
    double it would be a denormal, never a real reading. Non-finite doubles and all-ones
    sentinels are None."""
    unpack = _RAW.get(value_type)
    if unpack is None:
        return None
    number = unpack.unpack_from(raw)[0]
    if value_type == _DOUBLE:
        if number >> 32 == 0:  # the mislabelled uiVal
            return number
        double = _AS_DOUBLE.unpack(raw)[0]
        return double if math.isfinite(double) else None
    if number == _SENTINELS.get(value_type):  # all ones: "not available"
        return None
    return number


def width(value_type: int, value: float | int) -> int | None:
    """The width of an entry's value; a DOUBLE that raw_value read as an integer is the
    mislabelled uiVal (32 bits)."""
    if value_type == _DOUBLE:
        return 32 if isinstance(value, int) else None
    return _BITS.get(value_type)


def in_range(value: float | int | None, low: float, high: float) -> float | int | None:
    """Range check on top of the type: a driver branch that writes garbage must not become
    a plausible-looking series."""
    if value is None or not low <= value <= high:
        return None
    return value
