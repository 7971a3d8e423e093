"""Busy seconds per process, integrated from nvmlDeviceGetProcessUtilization samples.

Each sample is one process's utilization per engine (sm, memory, encoder, decoder, percent)
over the driver's sampling period ending at its timestamp; a process idle in a period has no
sample. As the device's busy time (busy.py) integrates its sample ring, each new sample adds
value/100 x its interval to the process's counter: the interval from that process's previous
sample, where that is the next one on time (up to 1.5 x the sampling period); else (the
process was idle in between, or it is its first sample) one sampling period. The period is
the lower median step between successive samples of one process, as last seen; until one is known
(one sample per process so far) nothing is counted. Each sample counts once: the caller
passes only the samples newer than the last timestamp consumed (SampleStamps, with its guard
against a clock stepped back).

Counters start at 0 when a process is first listed and end with it (a process no longer
listed is forgotten); the workload counters that outlive a process are exporter/accounting.py's.
Shared by the GPUs' workers: one lock, pure arithmetic under it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ...samples import PROCESS_ENGINES

_US_PER_SECOND = 1e6
_GAP_FACTOR = 1.5  # as busy.py: a longer step than this many periods means samples were missing
ENGINES: tuple[str, ...] = tuple(engine for engine, _ in PROCESS_ENGINES)

Sample = tuple[int, int, Sequence[float]]  # (timestamp µs, pid, percent per engine in ENGINES order)


@dataclass(slots=True)
class _Process:
    last_us: int | None = None  # its newest sample's timestamp
    seconds: list[float] = field(default_factory=lambda: [0.0] * len(ENGINES))


@dataclass(slots=True)
class _Device:
    period_us: float | None = None
    processes: dict[int, _Process] = field(default_factory=dict)


class ProcessBusy:
    """Per device key and pid: busy seconds per engine (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[str, _Device] = {}

    def add(self, key: str, samples: Iterable[Sample], listed: Iterable[int]) -> dict[int, tuple[tuple[str, float], ...]]:
        """Fold in one answer's new samples; the counters of the listed processes (0 for one
        listed without samples yet). Samples of processes not listed are dropped."""
        pids = set(listed)
        with self._lock:
            device = self._devices.setdefault(key, _Device())
            for pid in device.processes.keys() - pids:  # exited: its counter ends with it
                del device.processes[pid]
            by_pid: dict[int, list[tuple[int, Sequence[float]]]] = {}
            for stamp, pid, values in samples:
                if pid in pids:
                    by_pid.setdefault(pid, []).append((stamp, values))
            steps = []
            for pid, mine in by_pid.items():
                mine.sort(key=lambda s: s[0])
                last = device.processes[pid].last_us if pid in device.processes else None
                stamps = ([last] if last is not None else []) + [s for s, _ in mine]
                steps += [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
            if steps:
                device.period_us = float(sorted(steps)[(len(steps) - 1) // 2])  # the lower median: idle gaps only lengthen steps
            period = device.period_us
            out = {}
            for pid in sorted(pids):
                proc = device.processes.get(pid)
                if proc is None:
                    proc = device.processes[pid] = _Process()
                for stamp, values in by_pid.get(pid, ()):
                    if proc.last_us is not None and stamp <= proc.last_us:
                        continue  # not newer than what was counted (a duplicate entry)
                    if period is not None:
                        gap = stamp - proc.last_us if proc.last_us is not None else None
                        span = gap if gap is not None and gap <= _GAP_FACTOR * period else period
                        for i, value in enumerate(values[: len(ENGINES)]):
                            proc.seconds[i] += min(max(float(value), 0.0), 100.0) / 100.0 * span / _US_PER_SECOND
                    proc.last_us = stamp
                out[pid] = tuple(zip(ENGINES, proc.seconds))
            return out

    def restart(self) -> None:
        """After nvmlInit: the driver's sample clock may have restarted, so the timestamps
        seen are no starting point; the counters go on."""
        with self._lock:
            for device in self._devices.values():
                device.period_us = None
                for proc in device.processes.values():
                    proc.last_us = None

    def forget(self, key: str) -> None:
        """A device that left for good."""
        with self._lock:
            self._devices.pop(key, None)
