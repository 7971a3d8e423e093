"""NVIDIA GPUs through NVML (pynvml from nvidia-ml-py).

NVML is initialised once and kept; if it cannot be initialised (library missing, driver
not loaded) or stops answering, the backend retries with exponential backoff on later
refreshes, so GPUs appear without a restart. Retries run only when a refresh asks for
data: there is no background thread. Every NVML call goes through nvml_errors.call().
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import pynvml

from .. import nvml_errors
from ..logs import fields
from ..nvml_errors import BackendDown, DeviceDown, Missing
from ..samples import CLOCK_TYPES, GpuIdentity, GpuReading, GpuSample

_U32_NA = 0xFFFFFFFF
_U64_NA = 0xFFFFFFFFFFFFFFFF
_CLOCK_IDS = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}


class _Fallback:
    """A query with older alternatives: the first call the driver has is kept for good,
    and a query the driver lacks altogether is no longer made (its value stays absent)."""

    def __init__(self, *candidates: Callable[..., Any] | None) -> None:
        self._candidates = [c for c in candidates if c is not None]

    def __call__(self, *args: Any) -> Any:
        while self._candidates:
            try:
                return nvml_errors.call(self._candidates[0], *args)
            except Missing:
                self._candidates.pop(0)
        return None


def _optional(name: str) -> Callable[..., Any] | None:
    """A pynvml wrapper that older bindings may not define."""
    return getattr(pynvml, name, None)


def _bind(fn: Callable[..., Any] | None, *extra: Any) -> Callable[[Any], Any] | None:
    """fn(handle, *extra), or None when the binding lacks fn."""
    if fn is None:
        return None
    return lambda handle: fn(handle, *extra)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):  # old pynvml shims return bytes
        return value.decode("utf-8", "replace")
    return str(value)


def _ratio_from_percent(value: int | None) -> float | None:
    # all-ones and >100 readings are driver garbage (NVIDIA/DCGM #199), not 100 %
    if value is None or value > 100:
        return None
    return value / 100.0


def _u32(value: int | None) -> int | None:
    return None if value is None or value == _U32_NA else value


def _mhz_to_hertz(value: int | None) -> float | None:
    value = _u32(value)
    return None if value is None else value * 1e6


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        log: logging.Logger,
        explicit: bool = False,
        min_backoff: float = 1.0,
        max_backoff: float = 30.0,
    ) -> None:
        self._log = log
        self._explicit = explicit
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._backoff = min_backoff
        self._next_attempt = 0.0
        self._initialised = False
        self._ever_initialised = False
        self._init_failures = 0
        self.last_error = ""
        self._driver_version = ""
        self._handles: dict[int, Any] = {}
        self._identities: dict[int, GpuIdentity] = {}  # every device seen since start
        self._identity_read: set[int] = set()  # read since the latest init
        self._up: dict[int, bool] = {}
        # Newest call first; old drivers fall back (contract: memory v2 -> v1, TemperatureV ->
        # legacy, ClocksEventReasons -> ClocksThrottleReasons, process lists _v3 -> _v2).
        self._memory = _Fallback(
            lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            pynvml.nvmlDeviceGetMemoryInfo,
        )
        self._temperature = _Fallback(
            _bind(_optional("nvmlDeviceGetTemperatureV"), pynvml.NVML_TEMPERATURE_GPU),
            _bind(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        )
        self._throttle = _Fallback(
            _optional("nvmlDeviceGetCurrentClocksEventReasons"),
            _optional("nvmlDeviceGetCurrentClocksThrottleReasons"),
        )
        self._compute_procs = _Fallback(
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            _optional("nvmlDeviceGetComputeRunningProcesses_v2"),
        )
        self._graphics_procs = _Fallback(
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            _optional("nvmlDeviceGetGraphicsRunningProcesses_v2"),
        )
        self._utilization = _Fallback(pynvml.nvmlDeviceGetUtilizationRates)
        self._power = _Fallback(pynvml.nvmlDeviceGetPowerUsage)
        self._power_limit = _Fallback(pynvml.nvmlDeviceGetEnforcedPowerLimit)
        self._energy = _Fallback(pynvml.nvmlDeviceGetTotalEnergyConsumption)
        self._fan = _Fallback(pynvml.nvmlDeviceGetFanSpeed)
        self._clock = _Fallback(pynvml.nvmlDeviceGetClockInfo)
        self._max_clock = _Fallback(pynvml.nvmlDeviceGetMaxClockInfo)
        self._pstate = _Fallback(pynvml.nvmlDeviceGetPerformanceState)

    # -- lifecycle --------------------------------------------------------------------

    def try_init(self) -> bool:
        """Initialise NVML unless the backoff says wait; True when it is usable."""
        if self._initialised:
            return True
        now = time.monotonic()
        if now < self._next_attempt:
            return False
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # LibraryNotFound, DriverNotLoaded, or anything the library raises
            self._init_failed(nvml_errors.init_error(exc), now)
            return False
        self._initialised = True
        self._ever_initialised = True
        self._init_failures = 0
        self._backoff = self._min_backoff
        self._handles.clear()
        self._identity_read.clear()
        try:
            self._driver_version = _text(nvml_errors.call(pynvml.nvmlSystemGetDriverVersion))
        except (DeviceDown, BackendDown, Missing):
            self._driver_version = ""
        self._log.info("NVML initialised", extra=fields(driver_version=self._driver_version or "unknown"))
        return True

    def device_count(self) -> int:
        """Devices NVML enumerates now; 0 when it cannot say."""
        try:
            return nvml_errors.call(pynvml.nvmlDeviceGetCount) or 0
        except (BackendDown, DeviceDown) as err:
            self.last_error = str(err)
            return 0

    def _init_failed(self, err: BackendDown, now: float) -> None:
        self._init_failures += 1
        self.last_error = str(err)
        self._next_attempt = now + self._backoff
        if self._init_failures == 1 and not self._explicit:
            self._log.warning(
                "NVML not available; serving host metrics and retrying with backoff",
                extra=fields(error=str(err), retry_in_seconds=round(self._backoff, 3)),
            )
        else:
            self._log.debug(
                "NVML still not available",
                extra=fields(error=str(err), attempt=self._init_failures, retry_in_seconds=self._backoff),
            )
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def _lost_backend(self, err: BackendDown) -> None:
        self._log.warning(
            "NVML stopped answering; re-initialising with backoff", extra=fields(error=str(err))
        )
        self._initialised = False
        self._handles.clear()
        self._backoff = self._min_backoff
        self._next_attempt = time.monotonic() + self._backoff

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                pynvml.nvmlShutdown()
            except Exception:  # shutting down: nothing left to report to
                pass

    # -- reading ----------------------------------------------------------------------

    def read(self) -> GpuReading:
        if not self.try_init():
            return self._unavailable()
        try:
            count = nvml_errors.call(pynvml.nvmlDeviceGetCount) or 0
            devices = [self._read_device(i) for i in range(count)]
        except (BackendDown, DeviceDown) as err:  # count failing means the library, not a device
            self._lost_backend(err if isinstance(err, BackendDown) else BackendDown(err.code, str(err)))
            return self._unavailable()
        # A device seen before but no longer enumerated stays visible as down.
        for index in sorted(self._identities):
            if index >= count:
                devices.append(self._down(index, None))
        return GpuReading(
            backend="nvml",
            success=True,
            device_count=count,
            driver_version=self._driver_version,
            devices=tuple(devices),
        )

    def _unavailable(self) -> GpuReading:
        """No NVML right now. Before it ever worked (auto mode) the host simply has no GPU
        backend; after, or when NVML was asked for explicitly, it is a failure."""
        failing = self._ever_initialised or self._explicit
        return GpuReading(
            backend="nvml" if failing else "none",
            success=not failing,
            driver_version=self._driver_version,
            devices=tuple(GpuSample(self._identities[i], up=False) for i in sorted(self._identities)),
        )

    def _down(self, index: int, err: DeviceDown | None) -> GpuSample:
        self._handles.pop(index, None)
        identity = self._identities.setdefault(index, GpuIdentity(index=index))
        if self._up.get(index, True):
            self._log.warning(
                "GPU not answering; reporting resmon_gpu_up 0",
                extra=fields(gpu=index, uuid=identity.uuid, error=str(err) if err else "no longer enumerated"),
            )
        self._up[index] = False
        return GpuSample(identity, up=False)

    def _read_device(self, index: int) -> GpuSample:
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = nvml_errors.call(pynvml.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    raise DeviceDown(None, "no handle")
                self._handles[index] = handle
            if index not in self._identity_read:
                self._identities[index] = self._read_identity(index, handle)
                self._identity_read.add(index)
            sample = self._read_values(self._identities[index], handle)
        except DeviceDown as err:
            return self._down(index, err)
        if not self._up.get(index, True):
            self._log.info("GPU answering again", extra=fields(gpu=index, uuid=sample.identity.uuid))
        self._up[index] = True
        return sample

    def _read_identity(self, index: int, handle: Any) -> GpuIdentity:
        pci = nvml_errors.call(pynvml.nvmlDeviceGetPciInfo, handle)
        max_clocks = []
        for clock in CLOCK_TYPES:
            hertz = _mhz_to_hertz(self._max_clock(handle, _CLOCK_IDS[clock]))
            if hertz is not None:
                max_clocks.append((clock, hertz))
        return GpuIdentity(
            index=index,
            uuid=_text(nvml_errors.call(pynvml.nvmlDeviceGetUUID, handle)),
            name=_text(nvml_errors.call(pynvml.nvmlDeviceGetName, handle)),
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            clock_max_hertz=tuple(max_clocks),
        )

    def _read_values(self, identity: GpuIdentity, handle: Any) -> GpuSample:
        total = used = free = reserved = None
        memory = self._memory(handle)
        if memory is not None and memory.total:  # total 0: unified-memory part, no VRAM figures
            total, used, free = memory.total, memory.used, memory.free
            reserved = getattr(memory, "reserved", None)  # v2 only
        util = self._utilization(handle)
        temperature = self._temperature(handle)
        if temperature is not None and (temperature == -1 or not -40 <= temperature <= 200):
            temperature = None
        power = _u32(self._power(handle))
        limit = _u32(self._power_limit(handle))
        energy = self._energy(handle)
        fan = _u32(self._fan(handle))
        clocks = []
        for clock in CLOCK_TYPES:
            hertz = _mhz_to_hertz(self._clock(handle, _CLOCK_IDS[clock]))
            if hertz is not None:
                clocks.append((clock, hertz))
        pstate = self._pstate(handle)
        reasons = self._throttle(handle)
        return GpuSample(
            identity=identity,
            up=True,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            utilization_ratio=_ratio_from_percent(util.gpu) if util is not None else None,
            memory_utilization_ratio=_ratio_from_percent(util.memory) if util is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            energy_joules=energy / 1000.0 if energy is not None and energy != _U64_NA else None,
            fan_speed_ratio=fan / 100.0 if fan is not None else None,  # may exceed 1 (NVML docs)
            clock_hertz=tuple(clocks),
            performance_state=pstate if pstate is not None and 0 <= pstate <= 15 else None,
            throttle_reasons=reasons if reasons is not None and reasons != _U64_NA else None,
            processes=self._process_count(handle),
        )

    def _process_count(self, handle: Any) -> int | None:
        compute = self._compute_procs(handle)
        graphics = self._graphics_procs(handle)
        if compute is None and graphics is None:
            return None
        # one process can be in both lists (gpustat #84)
        return len({p.pid for p in (compute or [])} | {p.pid for p in (graphics or [])})
