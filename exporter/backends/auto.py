"""--gpu.backend=auto: NVML when it initialises and sees a GPU; else amdgpu when a DRM card
of the amdgpu driver is in sysfs; else intel when a card of the xe or i915 driver is; else gpu-tracker when its extra is installed and
nvidia-smi or amd-smi answers; else none.

NVML keeps being retried (with the NVML backend's backoff) while another backend serves,
so a host that booted before its driver was loaded picks NVML up later. Once NVML has
seen a GPU the choice is final: later NVML faults show as GPUs down, not as a switch.
Once amdgpu, intel (or gpu-tracker) is chosen it stays; while on none, sysfs is looked at again
on every refresh (a directory listing) and the CLIs with a backoff.
"""

from __future__ import annotations

import logging
import time

from ..logs import fields
from ..samples import GpuReading
from .amdgpu.sysfs import AmdgpuBackend, find_cards
from .base import GpuOptions, NoGpuBackend
from .gpu_tracker.backend import GpuTrackerBackend, detect_vendor, extra_installed
from .intel.backend import IntelBackend
from .intel.backend import find_cards as find_intel_cards
from .nvml.backend import NvmlBackend

_CLI_RETRY_MIN, _CLI_RETRY_MAX = 30.0, 600.0


class AutoBackend:
    def __init__(self, log: logging.Logger, timeout: float, options: GpuOptions | None = None) -> None:
        self._log = log
        self._timeout = timeout
        self._options = options or GpuOptions()
        self._nvml = NvmlBackend(log, options=options, device_timeout=timeout)
        self._nvml_final = False
        self._fallback: AmdgpuBackend | IntelBackend | GpuTrackerBackend | NoGpuBackend | None = None
        self._cli_retry_at = 0.0
        self._cli_backoff = _CLI_RETRY_MIN
        self._announced = ""

    @property
    def name(self) -> str:
        return "nvml" if self._nvml_final else (self._fallback.name if self._fallback else "none")

    @property
    def device_deadlines(self) -> bool:
        """NVML, amdgpu and intel bound each GPU's read themselves; gpu-tracker is bounded as one read."""
        return self._nvml_final or bool(getattr(self._fallback, "device_deadlines", False))

    def prepare(self) -> None:
        # the choice, with its slow parts (nvmlInit, bare nvidia-smi / amd-smi probes), is
        # made once here, outside every scrape deadline
        if not self._nvml_has_gpus():
            self._choose_fallback()

    def read(self) -> GpuReading:
        if self._nvml_final or self._nvml_has_gpus():
            return self._nvml.read()
        if self._nvml.denied:  # an NVIDIA GPU we may not open: NVML's failure, not "no GPU"
            self._announce("nvml", f"NVML refuses this process ({self._nvml.denied})")
            return self._nvml.read()
        fallback = self._choose_fallback()
        return fallback.read()

    def _nvml_has_gpus(self) -> bool:
        if not self._nvml.try_init():
            return False
        count = self._nvml.device_count()
        if count:
            self._nvml_final = True
            self._announce("nvml", f"NVML sees {count} GPU(s)")
        return bool(count)

    def _choose_fallback(self) -> AmdgpuBackend | IntelBackend | GpuTrackerBackend | NoGpuBackend:
        if isinstance(self._fallback, (AmdgpuBackend, IntelBackend, GpuTrackerBackend)):
            return self._fallback
        skipped = [f"nvml: {self._nvml.last_error or 'no GPU'}"]
        cards = find_cards(self._options.sysfs)
        if cards:
            self._fallback = AmdgpuBackend(self._log, self._options.sysfs, self._options, device_timeout=self._timeout)
            self._announce("amdgpu", f"{len(cards)} amdgpu card(s) in {self._options.sysfs}/class/drm", skipped)
            return self._fallback
        skipped.append("amdgpu: no amdgpu card")
        intel = find_intel_cards(self._options.sysfs)
        if intel:
            self._fallback = IntelBackend(self._log, self._options.sysfs, self._options, device_timeout=self._timeout)
            self._announce("intel", f"{len(intel)} xe/i915 card(s) in {self._options.sysfs}/class/drm", skipped)
            return self._fallback
        skipped.append("intel: no xe or i915 card")
        now = time.monotonic()
        if self._fallback is not None and now < self._cli_retry_at:
            return self._fallback
        if extra_installed():
            vendor, reasons = detect_vendor(self._timeout)
            if vendor is not None:
                self._fallback = GpuTrackerBackend(self._log, vendor, self._timeout)
                self._announce("gpu-tracker", f"{vendor} CLI answers", skipped)
                return self._fallback
            skipped.append("gpu-tracker: " + "; ".join(reasons))
            # the CLIs are probed again later, but rarely: a hung bare nvidia-smi costs a timeout
            self._cli_retry_at = now + self._cli_backoff
            self._cli_backoff = min(self._cli_backoff * 2, _CLI_RETRY_MAX)
        else:
            skipped.append("gpu-tracker: extra not installed")
        self._fallback = NoGpuBackend()
        self._announce("none", "no GPU backend usable", skipped)
        return self._fallback

    def _announce(self, backend: str, why: str, skipped: list[str] | None = None) -> None:
        if self._announced == backend:
            return
        self._announced = backend
        self._log.info(
            "GPU backend selected",
            extra=fields(backend=backend, reason=why, skipped=" | ".join(skipped or []) or "-"),
        )

    def interrupt(self) -> None:
        self._nvml.interrupt()

    def close(self) -> None:
        self._nvml.close()
        if self._fallback is not None:
            self._fallback.close()  # amdgpu and intel: their card readers end

    def wait_released(self, timeout: float) -> bool:
        return self._nvml.wait_released(timeout)
