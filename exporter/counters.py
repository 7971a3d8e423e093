"""Counters that never decrease while the exporter runs.

Prometheus reads any decrease of a counter as a reset and rate() jumps by the whole value.
Device counters restart on their own (energy, volatile ECC counts and the driver's other
counters after a GPU reset or driver reload; busy seconds after an NVML re-init), and some
wrap at their width (PCIe bytes). Two rules, applied once per refresh after the GPU workers
returned:

- Monotonic: per (device, family, labels) the raw value last seen and an offset; a raw value
  below the last one is a restart, and the offset grows by that last value. The served value
  is raw + offset, so increase() and rate() are right across a restart; the raw value the
  driver shows is the served one minus the offset.
- Unwrap: a counter the driver documents as wrapping, by the width of its value type. A
  32-bit value below the last one wrapped once (more wraps between two refreshes cannot be
  seen); a 64-bit one cannot wrap in practice, so a decrease there is a restart and is left
  to Monotonic.

Both are shared by every GPU worker: one lock each.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Hashable, Iterable

from .samples import GpuHealth, GpuSample, NvLinkSample

Number = int | float


class Monotonic:
    """raw counter values -> values that never decrease (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[Hashable, tuple[Number, Number]] = {}  # key -> (last raw, offset)

    def value(self, key: Hashable, raw: Number) -> Number:
        with self._lock:
            return self._value(key, raw)

    def _value(self, key: Hashable, raw: Number) -> Number:
        """value() with the lock held by the caller."""
        state = self._state.get(key)
        if state is None:
            self._state[key] = (raw, 0)
            return raw
        last, offset = state
        if raw < last:  # restarted lower: what was counted before stays counted
            offset += last
        if raw != last or offset != state[1]:
            self._state[key] = (raw, offset)
        return raw + offset

    def forget(self, device: str) -> None:
        """A device that will never be served again: its state goes."""
        with self._lock:
            for key in [k for k in self._state if isinstance(k, tuple) and k and k[0] == device]:
                del self._state[key]

    def samples(self, samples: Iterable[GpuSample]) -> list[GpuSample]:
        """The samples with every counter field made monotonic, per device (the lock taken
        once per device: an H100 has over a hundred counters)."""
        out = []
        for s in samples:
            if s.up:
                with self._lock:
                    s = self._sample(s)
            out.append(s)
        return out

    def _pairs(self, key: tuple[Hashable, ...], values: tuple[tuple[str, Number], ...]) -> tuple[tuple[str, Number], ...]:
        served = tuple((label, self._value((*key, label), v)) for label, v in values)
        return values if served == values else served  # no offset: the same tuple (no copies)

    def _sample(self, s: GpuSample) -> GpuSample:
        ident = s.identity
        device = ident.uuid or ident.pci_bus_id or f"#index-{ident.index}"
        changes: dict[str, object] = {}  # only what an offset changed: most refreshes copy nothing
        for name, family in (("busy_seconds", "busy"), ("clock_event_seconds", "clock_event"), ("pcie_bytes", "pcie_bytes")):
            values = getattr(s, name)
            served = self._pairs((device, family), values)
            if served is not values:
                changes[name] = served
        for name, family in (("energy_joules", "energy"), ("pcie_replays", "pcie_replays")):
            raw = getattr(s, name)
            if raw is not None:
                value = self._value((device, family), raw)
                if value != raw:
                    changes[name] = value
        if s.health is not None and s.health.ecc_errors:
            health = self._health(device, s.health)
            if health is not s.health:
                changes["health"] = health
        if s.nvlinks:
            links = tuple(self._link(device, link) for link in s.nvlinks)
            if any(new is not old for new, old in zip(links, s.nvlinks)):
                changes["nvlinks"] = links
        return dataclasses.replace(s, **changes) if changes else s  # type: ignore[arg-type]

    def _health(self, device: str, health: GpuHealth) -> GpuHealth:
        errors = tuple(
            (kind, scope, self._value((device, "ecc", kind, scope), n)) for kind, scope, n in health.ecc_errors
        )
        return health if errors == health.ecc_errors else dataclasses.replace(health, ecc_errors=errors)

    def _link(self, device: str, link: NvLinkSample) -> NvLinkSample:
        moved = self._pairs((device, "nvlink_bytes", link.link), link.bytes)
        errors = self._pairs((device, "nvlink_errors", link.link), link.errors)
        if moved is link.bytes and errors is link.errors:
            return link
        return dataclasses.replace(link, bytes=moved, errors=errors)


class Unwrap:
    """A wrapping counter's raw values -> a running total (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[Hashable, tuple[int, int | None, int]] = {}  # key -> (last raw, bits, total)

    def value(self, key: Hashable, raw: int, bits: int | None) -> int:
        """bits: the value type's width (None: not known, never unwrapped)."""
        with self._lock:
            state = self._state.get(key)
            if state is None or state[1] != bits or bits is None or bits >= 64:
                total = raw  # first value, another type, or a 64-bit restart (Monotonic's)
            else:
                last, _, total = state
                total += raw - last if raw >= last else raw + (1 << bits) - last
            self._state[key] = (raw, bits, total)
        return total

    def forget(self, device: str) -> None:
        """A device that will never be served again (keys are (device, ...)): its state goes."""
        with self._lock:
            for key in [k for k in self._state if isinstance(k, tuple) and k and k[0] == device]:
                del self._state[key]
