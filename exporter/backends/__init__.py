"""GPU backends: each turns one vendor interface into a GpuReading per refresh."""

from __future__ import annotations

import logging
from typing import Protocol

from ..samples import GpuReading

BACKEND_CHOICES: tuple[str, ...] = ("auto", "nvml", "gpu-tracker", "none")


class BackendError(Exception):
    """A backend that was asked for explicitly cannot be used (a startup error)."""


class GpuBackend(Protocol):
    @property
    def name(self) -> str:
        """nvml, gpu-tracker or none: what resmon_gpu_backend_info reports."""
        ...

    def read(self) -> GpuReading:
        """Read every device once. Must not raise for device or driver faults."""
        ...

    def close(self) -> None:
        """Release the vendor library; called once, when no read is in flight."""
        ...


class NoGpuBackend:
    """Host metrics only: reports no devices."""

    name = "none"

    def read(self) -> GpuReading:
        return GpuReading(backend="none", success=True)

    def close(self) -> None:
        pass


def make_backend(choice: str, log: logging.Logger, timeout: float = 5.0) -> GpuBackend:
    """Build the backend for --gpu.backend. An explicit choice that cannot work now raises
    BackendError (a startup error); auto never does."""
    if choice == "none":
        return NoGpuBackend()
    if choice == "auto":
        from .auto import AutoBackend  # imports pynvml; gpu-tracker only if it is ever needed

        return AutoBackend(log, timeout)
    if choice == "nvml":
        from .nvml import NvmlBackend

        backend = NvmlBackend(log, explicit=True)
        if not backend.try_init():
            raise BackendError(f"--gpu.backend=nvml: NVML cannot be initialised ({backend.last_error})")
        return backend
    if choice == "gpu-tracker":
        from .gpu_tracker import explicit_backend

        return explicit_backend(log, timeout)
    raise BackendError(f"unknown GPU backend {choice!r}; choose one of {', '.join(BACKEND_CHOICES)}")
