"""What every GPU backend shares: the protocol, its options, the start-up error, the none backend."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, TypeVar

from ..config import FamilyFilter
from ..samples import GpuReading

BACKEND_CHOICES: tuple[str, ...] = ("auto", "nvml", "amdgpu", "intel", "gpu-tracker", "none")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """Which collectors read along with the GPUs (--[no-]collector.health/nvlink/xid/processes/
    profiling/mig);
    mig_devices: the MIG device UUIDs (the kubernetes collector resolves device ids with them);
    sysfs: where sysfs is mounted (--path.sysfs), for the amdgpu and intel backends;
    procfs: where procfs is mounted (--path.procfs): DRM client usage stats (amdgpu, intel);
    slow_interval: seconds between reads of the values that change rarely (NVML: slow.py);
    metrics: the families served (the NVML backend skips the reads of those left out)."""

    health: bool = True
    nvlink: bool = True
    xid: bool = True
    processes: bool = False
    profiling: bool = True
    mig: bool = True
    mig_devices: bool = False
    sysfs: str = "/sys"
    procfs: str = "/proc"
    slow_interval: float = 30.0  # --collect.slow-interval: how often rarely changing values are read
    metrics: FamilyFilter = field(default_factory=FamilyFilter)  # --metrics.include/exclude (NVML: wanted.py)


class BackendError(Exception):
    """A backend that was asked for explicitly cannot be used (a startup error)."""


class GpuBackend(Protocol):
    @property
    def name(self) -> str:
        """nvml, amdgpu, intel, gpu-tracker or none: what resmon_gpu_backend_info reports."""
        ...

    def prepare(self) -> None:
        """One-time start-up work (library init, probing vendor CLIs), run on the monitor's
        GPU thread before the first read and outside every scrape deadline."""
        ...

    def read(self) -> GpuReading:
        """Read every device once. Must not raise for device or driver faults."""
        ...

    def close(self) -> None:
        """Release the vendor library; called once, when no read is in flight. A backend
        with background work may also have interrupt(): called from the closing thread
        first, so that work ends while the last read drains; and wait_released(timeout)
        -> bool, when close() leaves the library's release to that work (NVML: the XID
        watcher, inside its event wait, shuts NVML down on its way out)."""
        ...


class NoGpuBackend:
    """Host metrics only: reports no devices."""

    name = "none"

    def prepare(self) -> None:
        pass

    def read(self) -> GpuReading:
        return GpuReading(backend="none", success=True)

    def close(self) -> None:
        pass


def bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """fn() on a daemon thread, waited for at most timeout seconds: a start-up call into a
    wedged driver becomes a BackendError (a one-line startup error), not a hang."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller below
            error.append(exc)

    thread = threading.Thread(target=target, name="resmon-start", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise BackendError(f"{what} did not return within {timeout:g}s")
    if error:
        raise error[0]
    return result[0]
