"""The slow cadence (--collect.slow-interval, issue 24): values that change rarely are read
once per interval per GPU instead of on every refresh.

Slow: the UUID (which catches a re-enumeration; name, PCI bus id and max clocks are read
once per init), fan speed (a fan follows the temperature over tens of seconds), the PCIe link (generation and width, current and max),
ECC mode and counts, retired pages, remapped rows, NVLink state and
error counters, and the MIG layout. Everything else is read on every refresh.

The GPUs' slow reads are spread over the interval: after the first refresh (which reads every
GPU's slow part) GPU i is next due interval x (i + 1) / GPUs later, then every interval after
its own read, so each refresh reads the slow part of about GPUs x refresh gap / interval of
them, never all at once. A GPU is due at once, on the next refresh, after an XID event of its
own, while it was down (so it answers again with fresh values), and after nvmlInit. A slow
value is therefore at most the interval plus one refresh gap old; interval 0 reads it on
every refresh. Used by the refresh's one thread (the reader) only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...samples import GpuHealth, NvLinkSample
from .mig import MigLayout

DEFAULT_INTERVAL = 30.0  # seconds


@dataclass(frozen=True, slots=True)
class SlowPart:
    """One GPU's slow values as last read, and when (Unix time): served until the next slow read."""

    read_at: float
    fan_speed_ratio: float | None = None
    pcie_link_generation: tuple[tuple[str, int], ...] = ()
    pcie_link_width_lanes: tuple[tuple[str, int], ...] = ()
    health: GpuHealth | None = None  # recovery_action is a fast value: filled in per refresh
    links: tuple[NvLinkSample, ...] = ()  # state and errors; bytes are fast
    mig: MigLayout | None = None  # mode and devices; instance memory and GPM are fast
    failed: frozenset[str] = frozenset()  # parts whose slow queries failed: reported until re-read


class Cadence:
    """When each GPU (by device key) reads its slow part next."""

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = max(0.0, interval)
        self._next: dict[str, float] = {}  # key -> monotonic time its slow part is due
        self._forced: set[str] = set()

    def due(self, key: str | None, now: float) -> bool:
        if key is None or self.interval == 0 or key in self._forced:
            return True
        due = self._next.get(key)
        return due is None or now >= due

    def force(self, key: str) -> None:
        """Read this GPU's slow part on its next refresh (an XID, down, a new init)."""
        self._forced.add(key)

    def force_all(self) -> None:
        self._forced.update(self._next)
        self._next.clear()

    def read(self, key: str, index: int, count: int, now: float) -> None:
        """key's slow part was read in the refresh at now (monotonic); index of count GPUs."""
        first = key not in self._next
        self._forced.discard(key)
        if first and count > 1:
            # the first refresh reads every GPU: spread their next reads over the interval
            self._next[key] = now + self.interval * (index % count + 1) / count
        else:
            self._next[key] = now + self.interval

    def forget(self, key: str) -> None:
        self._next.pop(key, None)
        self._forced.discard(key)
