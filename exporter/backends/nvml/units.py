"""Small conversions of NVML's answers shared by the NVML backend's rooms: text, the
"not available" sentinels, units, and pynvml wrappers an older binding may lack."""

from __future__ import annotations

from typing import Any, Callable

import pynvml

from . import fields as nvml_fields

U32_NA, U64_NA = nvml_fields.U32_NA, nvml_fields.U64_NA
CLOCK_IDS = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}


def optional(name: str) -> Callable[..., Any] | None:
    """A pynvml wrapper that older bindings may not define."""
    return getattr(pynvml, name, None)


def bind(fn: Callable[..., Any] | None, *extra: Any) -> Callable[[Any], Any] | None:
    """fn(handle, *extra), or None when the binding lacks fn."""
    if fn is None:
        return None
    return lambda handle: fn(handle, *extra)


def text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):  # old pynvml shims return bytes
        return value.decode("utf-8", "replace")
    return str(value)


def celsius(value: float | int | None) -> float | None:
    # -1 and out-of-range readings are the driver's "no sensor", not a temperature
    if value is None or value == -1 or not -40 <= value <= 200:
        return None
    return float(value)


def ratio_from_percent(value: float | int | None) -> float | None:
    # all-ones and >100 readings are driver garbage (NVIDIA/DCGM #199), not 100 %
    if value is None or value > 100:
        return None
    return value / 100.0


def u32(value: int | None) -> int | None:
    return None if value is None or value == U32_NA else value


def pair(label: str, value: int | None) -> tuple[str, int] | None:
    return None if value is None else (label, int(value))


def first(fields: Any, *ids: int) -> Any:
    """The first of these fields (scope 0) whose entry answered, else None."""
    for fid in ids:
        value = fields.get((fid, 0))
        if value is not None:
            return value
    return None


def mhz_to_hertz(value: int | None) -> float | None:
    value = u32(value)
    return None if value is None else value * 1e6

