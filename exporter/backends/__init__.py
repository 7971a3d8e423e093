"""GPU backends: each turns one vendor interface into a GpuReading per refresh."""

from __future__ import annotations

import logging
from typing import Protocol

from ..samples import GpuReading

BACKEND_CHOICES: tuple[str, ...] = ("auto", "nvml", "gpu-tracker", "none")


class BackendError(Exception):
    """A backend that was asked for explicitly cannot be used (a startup error)."""


class GpuBackend(Protocol):
    name: str

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


def make_backend(choice: str, log: logging.Logger) -> GpuBackend:
    """Build the backend for --gpu.backend; BackendError for one that cannot work."""
    if choice == "none":
        return NoGpuBackend()
    if choice in ("auto", "nvml"):
        from .nvml import NvmlBackend  # imports pynvml only when NVML is wanted

        return NvmlBackend(log, explicit=choice == "nvml")
    if choice == "gpu-tracker":
        raise BackendError(
            "--gpu.backend=gpu-tracker is not available in this release; use auto, nvml or none"
        )
    raise BackendError(f"unknown GPU backend {choice!r}; choose one of {', '.join(BACKEND_CHOICES)}")
