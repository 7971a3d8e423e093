"""GPU backends: each turns one vendor interface into a GpuReading per refresh.

nvml/ (NVIDIA, through pynvml), amdgpu/ (AMD, from sysfs), intel/ (xe and i915, from sysfs),
drm/ (what amdgpu and intel share), gpu_tracker/ (the vendor CLIs),
auto (the first that works); each backend package owns its vendor's error boundary. The
vendor packages are imported only when their backend is chosen.
"""

from __future__ import annotations

import logging

from .base import BACKEND_CHOICES, BackendError, GpuBackend, GpuOptions, NoGpuBackend, bounded

__all__ = ["BACKEND_CHOICES", "BackendError", "GpuBackend", "GpuOptions", "NoGpuBackend", "bounded", "make_backend"]


def make_backend(
    choice: str, log: logging.Logger, timeout: float = 5.0, options: GpuOptions | None = None
) -> GpuBackend:
    """Build the backend for --gpu.backend. An explicit choice that cannot work now raises
    BackendError (a startup error); auto never does."""
    if choice == "none":
        return NoGpuBackend()
    if choice == "auto":
        from .auto import AutoBackend  # imports pynvml; gpu-tracker only if it is ever needed

        return AutoBackend(log, timeout, options)
    if choice == "nvml":
        from .nvml.backend import NvmlBackend

        backend = NvmlBackend(log, explicit=True, options=options, device_timeout=timeout)
        if not bounded(backend.try_init, timeout, "--gpu.backend=nvml: nvmlInit"):
            raise BackendError(f"--gpu.backend=nvml: NVML cannot be initialised ({backend.last_error})")
        return backend
    if choice == "amdgpu":
        from .amdgpu.sysfs import explicit_backend as amdgpu_backend

        sysfs = (options or GpuOptions()).sysfs
        return bounded(lambda: amdgpu_backend(log, sysfs, options, timeout), timeout, "--gpu.backend=amdgpu: finding cards")
    if choice == "intel":
        from .intel.backend import explicit_backend as intel_backend

        sysfs = (options or GpuOptions()).sysfs
        return bounded(lambda: intel_backend(log, sysfs, options, timeout), timeout, "--gpu.backend=intel: finding cards")
    if choice == "gpu-tracker":
        from .gpu_tracker.backend import explicit_backend, load_adapter

        # the import of gpu-tracker (pandas, SQLAlchemy) is outside the bound: it cannot wedge
        # like a vendor CLI, and on a loaded host it alone can take longer than the bound
        load_adapter()
        return bounded(lambda: explicit_backend(log, timeout), timeout * 3 + 1, "--gpu.backend=gpu-tracker: probing")
    raise BackendError(f"unknown GPU backend {choice!r}; choose one of {', '.join(BACKEND_CHOICES)}")
