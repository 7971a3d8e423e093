"""Host CPU and memory through psutil, with node_exporter's meaning of each value."""

from __future__ import annotations

import os
from typing import Any

import psutil

from .samples import CPU_MODES, HostSample

# node-mixin: busy is everything except idle, iowait and steal. guest/guest_nice are
# already inside user/nice, so they are not counted again.
_NOT_BUSY = ("idle", "iowait", "steal")


def _cpu_modes(times: Any) -> dict[str, float]:
    return {mode: float(getattr(times, mode, 0.0)) for mode in CPU_MODES}


def _busy_and_total(modes: dict[str, float]) -> tuple[float, float]:
    total = sum(modes.values())
    return total - sum(modes[m] for m in _NOT_BUSY), total


class HostReader:
    """Reads the host. CPU utilization is the busy share of CPU time between this read and
    the previous one (primed at construction), so a read never sleeps.

    The CPU seconds served never decrease, though the kernel's can: iowait goes back a little
    (proc(5): "this value can decrease"), and the aggregate line loses a CPU's whole time when
    that CPU goes offline. Either is no restart, so each mode serves its previous value plus
    what the kernel's grew by since the last read (nothing where it went down): rate() stays
    the kernel's rate, without the reset Prometheus would read from a decrease. Not locked:
    the monitor reads the host under its host lock, one reader at a time."""

    def __init__(self) -> None:
        self._raw = _cpu_modes(psutil.cpu_times())  # the kernel's values at the last read
        self._served = dict(self._raw)
        self._previous = dict(self._served)  # served values at the last ratio update
        busy, total = _busy_and_total(self._previous)
        # until two reads are far enough apart, the since-boot average is the best estimate
        self._ratio = busy / total if total > 0 else 0.0

    def _cpu_seconds(self) -> dict[str, float]:
        raw = _cpu_modes(psutil.cpu_times())
        for mode, value in raw.items():
            self._served[mode] += max(value - self._raw[mode], 0.0)
        self._raw = raw
        return dict(self._served)

    def read(self) -> HostSample:
        modes = self._cpu_seconds()
        busy, total = _busy_and_total(modes)
        prev_busy, prev_total = _busy_and_total(self._previous)
        if total - prev_total > 0:  # counters tick at USER_HZ; equal reads keep the last ratio
            self._ratio = min(max((busy - prev_busy) / (total - prev_total), 0.0), 1.0)
            self._previous = modes
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        load1, load5, load15 = os.getloadavg()
        return HostSample(
            cpu_utilization_ratio=self._ratio,
            cpu_seconds=tuple(modes.items()),
            logical_cores=psutil.cpu_count(logical=True) or 0,
            load1=load1,
            load5=load5,
            load15=load15,
            memory_total_bytes=int(memory.total),
            memory_available_bytes=int(memory.available),
            swap_total_bytes=int(swap.total),
            swap_used_bytes=int(swap.used),
        )
