"""GPUs through gpu-tracker (nvidia-smi or amd-smi), for hosts where NVML is not usable.

Gives identity (UUID only), up, memory total/used/free and utilization; every other GPU
family is absent. The CLIs report memory in MiB (amd-smi calls them MB; they are
1024 x 1024 bytes): values are multiplied by 1048576. Each refresh spawns one CLI call
(totals are re-read only when the set of UUIDs changes), bounded by the collection timeout.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from types import ModuleType

from ...logs import fields
from ...samples import GpuIdentity, GpuReading, GpuSample, all_down, in_order
from ..base import BackendError

MIB = 1048576
INSTALL_HINT = 'pip install "resmon-exporter[gpu-tracker]"'


def extra_installed() -> bool:
    try:
        return importlib.util.find_spec("gpu_tracker") is not None
    except (ImportError, ValueError):
        return False


def load_adapter() -> ModuleType:
    """Import the adapter (and with it gpu-tracker and pandas); BackendError when missing."""
    try:
        from . import adapter as gpu_tracker_adapter
    except ImportError as exc:
        raise BackendError(f"the gpu-tracker backend needs its extra ({exc}); install it with: {INSTALL_HINT}") from None
    return gpu_tracker_adapter


def detect_vendor(timeout: float) -> tuple[str | None, list[str]]:
    """The first vendor CLI that answers (NVIDIA first), and why the others did not."""
    adapter = load_adapter()
    reasons: list[str] = []
    for vendor in ("nvidia", "amd"):
        why = adapter.available(vendor, timeout)
        if why is None:
            return vendor, reasons
        reasons.append(why)
    return None, reasons


class GpuTrackerBackend:
    name = "gpu-tracker"

    def __init__(self, log: logging.Logger, vendor: str, timeout: float) -> None:
        self._log = log
        self._adapter = load_adapter()
        self._vendor = vendor
        self._timeout = timeout
        self._totals: dict[str, float | None] | None = None
        self._identities: dict[str, GpuIdentity] = {}  # by UUID (index where the CLI gives none)
        self._failing = False

    def prepare(self) -> None:
        pass  # the CLI was probed when this backend was chosen

    def read(self) -> GpuReading:
        start = time.monotonic()
        try:
            gpus, self._totals = self._adapter.query(self._vendor, self._timeout, self._totals)
        except self._adapter.CliError as exc:
            if not self._failing:
                self._log.warning("GPU CLI failed; reporting GPUs down", extra=fields(error=str(exc)))
            self._failing = True
            return GpuReading(
                backend=self.name,
                success=False,
                devices=all_down(self._identities.values()),
            )
        if self._failing:
            self._log.info("GPU CLI answering again", extra=fields(seconds=round(time.monotonic() - start, 3)))
        self._failing = False
        devices = []
        seen = set()
        for index, gpu in enumerate(gpus):
            key = gpu.uuid or f"#index-{index}"
            seen.add(key)
            identity = self._identities.get(key)
            if identity is None or identity.index != index:
                identity = self._identities[key] = GpuIdentity(index=index, uuid=gpu.uuid)
            total = gpu.memory_total_mib * MIB if gpu.memory_total_mib is not None else None
            used = gpu.memory_used_mib * MIB if gpu.memory_used_mib is not None else None
            util = gpu.utilization_percent
            devices.append(
                GpuSample(
                    identity=identity,
                    up=True,
                    memory_total_bytes=int(total) if total else None,  # 0 total: no VRAM figures
                    memory_used_bytes=int(used) if used is not None and total else None,
                    memory_free_bytes=int(total - used) if used is not None and total else None,
                    utilization_ratio=util / 100.0 if util is not None and util <= 100 else None,
                )
            )
        # a GPU no longer listed stays visible as down, under its last index
        devices += [GpuSample(i, up=False) for key, i in self._identities.items() if key not in seen]
        return GpuReading(backend=self.name, success=True, device_count=len(gpus), devices=in_order(devices))

    def close(self) -> None:
        pass


def explicit_backend(log: logging.Logger, timeout: float) -> GpuTrackerBackend:
    """--gpu.backend=gpu-tracker: it must work now, or the exporter does not start."""
    vendor, reasons = detect_vendor(timeout)
    if vendor is None:
        raise BackendError("--gpu.backend=gpu-tracker: neither nvidia-smi nor amd-smi answers (" + "; ".join(reasons) + ")")
    return GpuTrackerBackend(log, vendor, timeout)
