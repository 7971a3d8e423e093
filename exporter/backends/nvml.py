"""NVIDIA GPUs through NVML (pynvml from nvidia-ml-py).

NVML is initialised once and kept; if it cannot be initialised (library missing, driver
not loaded) or stops answering, the backend retries with exponential backoff on later
refreshes, so GPUs appear without a restart. Retries run only when a refresh asks for
data: there is no background thread. Every NVML call goes through nvml_errors.

Devices are keyed by UUID (PCI bus id where the UUID cannot be read), never by index: NVML
renumbers after a GPU disappears, so identity, up history and caches follow the UUID and
`gpu` is just the device's current index. A device no longer enumerated stays visible as
down under its last index.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import pynvml

from .. import nvml_errors
from ..logs import fields
from ..nvml_errors import BackendDown, DeviceDown, Fallback as _Fallback, Missing, Undecodable
from ..samples import (
    BUSY_ENGINES,
    CLOCK_TYPES,
    PROCESS_ENGINES,
    GpuIdentity,
    GpuProcess,
    GpuReading,
    GpuSample,
    PartStatus,
    XidState,
    all_down,
    in_order,
)
from . import GpuOptions, nvml_fields
from .nvml_busy import BusyIntegrator
from .nvml_gpm import GpmReader
from .nvml_mig import MigReader
from .nvml_health import HealthReader
from .nvml_workers import DeviceWorker, Starts, device_limit
from .nvml_xid import XidWatcher

_U32_NA, _U64_NA = nvml_fields.U32_NA, nvml_fields.U64_NA
_SAMPLE_TYPES = dict(zip(BUSY_ENGINES, (1, 2, 3, 4)))  # nvmlSamplingType_t: GPU, MEMORY, ENC, DEC
# Field values read in every device's one batch (the health and nvlink ones are added when on).
_GPU_FIELDS: tuple[nvml_fields.Request, ...] = (
    (nvml_fields.MEMORY_TEMP, 0),
    *((fid, 0) for _, fid, _ in nvml_fields.CLOCK_EVENT_FIELDS),
    (nvml_fields.PCIE_COUNT_TX_BYTES, 0),
    (nvml_fields.PCIE_COUNT_RX_BYTES, 0),
)
_XID_STOP_TIMEOUT = 1.5  # seconds; the watcher's wait is at most 0.5 s
_CLOCK_IDS = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}


_PARTS = ("health", "nvlink", "processes", "profiling", "mig")


@dataclasses.dataclass
class _DeviceRead:
    """What one GPU's worker hands back: nothing of it is written into the backend's
    per-refresh state, which a late (stuck) job could otherwise change under the reader."""

    key: str
    sample: GpuSample
    watch: tuple[str, Any] | None  # (uuid, handle) to watch for XIDs
    seconds: dict[str, float]  # time spent in each collector part on this worker
    failed: frozenset[str]  # the collector parts whose queries failed on this GPU


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


def _raw_name(handle: Any) -> str:
    """nvmlDeviceGetName without pynvml's strict UTF-8 decode (a driver or VBIOS with a
    Latin-1 board name must not make a working GPU look down)."""
    buf = ctypes.create_string_buffer(96)  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    pynvml._nvmlCheckReturn(fn(handle, buf, ctypes.c_uint(len(buf))))
    return buf.value.decode("utf-8", "replace")


def _ratio_from_percent(value: int | None) -> float | None:
    # all-ones and >100 readings are driver garbage (NVIDIA/DCGM #199), not 100 %
    if value is None or value > 100:
        return None
    return value / 100.0


def _u32(value: int | None) -> int | None:
    return None if value is None or value == _U32_NA else value


def _pair(label: str, value: int | None) -> tuple[str, int] | None:
    return None if value is None else (label, int(value))


def _mhz_to_hertz(value: int | None) -> float | None:
    value = _u32(value)
    return None if value is None else value * 1e6


class NvmlBackend:
    name = "nvml"
    device_deadlines = True  # read() itself bounds each GPU (see ResourceMonitor)

    def __init__(
        self,
        log: logging.Logger,
        explicit: bool = False,
        min_backoff: float = 1.0,
        max_backoff: float = 30.0,
        options: GpuOptions | None = None,
        device_timeout: float = 5.0,
    ) -> None:
        self._log = log
        # each GPU is read on its own worker; a refresh waits this long for one GPU, after
        # which that GPU alone is down until its read returns (--collect.timeout, a little less)
        self._device_timeout = device_timeout
        self._device_limit = device_limit(device_timeout)
        self._workers: dict[int, DeviceWorker] = {}  # by index
        self._starts = Starts()  # a relay or all at once (nvml_workers)
        self._stuck: set[int] = set()  # indices whose read is in flight past the limit
        self._any_stuck = False  # in this read
        # guards the identity maps where a worker iterates or re-keys them (never held over an NVML call)
        self._ident_lock = threading.Lock()
        self._close_lock = threading.Lock()  # workers ending after close() finish a pending shutdown once
        self._options = options or GpuOptions()
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
        self._count = -1  # device count of the previous read: a change means re-enumeration
        self._handles: dict[int, Any] = {}  # by current index, dropped when the count changes
        self._identities: dict[str, GpuIdentity] = {}  # every device seen since start, by key
        self._complete: set[str] = set()  # keys whose identity fields are all known since init
        self._key_at: dict[int, str] = {}  # index -> key seen there in the previous read
        self._up: dict[str, bool] = {}
        self.memory_api = "v2"
        # Newest call first; old drivers fall back (contract: memory v2 -> v1, TemperatureV ->
        # legacy, ClocksEventReasons -> ClocksThrottleReasons, process lists _v3 -> _v2).
        self._memory_v2 = _Fallback(lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2))
        self._memory_v1 = _Fallback(pynvml.nvmlDeviceGetMemoryInfo)
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
        # v2: gpu additions, health, nvlink, xid; called through HealthReader.ask: a failure
        # other than a lost GPU leaves the value out instead of taking the device down
        self._fields = _Fallback(_optional("nvmlDeviceGetFieldValues"))
        self._violation = _Fallback(_optional("nvmlDeviceGetViolationStatus"))
        self._encoder = _Fallback(pynvml.nvmlDeviceGetEncoderUtilization)
        self._decoder = _Fallback(pynvml.nvmlDeviceGetDecoderUtilization)
        self._pcie_gen = _Fallback(pynvml.nvmlDeviceGetCurrPcieLinkGeneration)
        self._pcie_gen_max = _Fallback(
            _optional("nvmlDeviceGetGpuMaxPcieLinkGeneration"), pynvml.nvmlDeviceGetMaxPcieLinkGeneration
        )
        self._pcie_width = _Fallback(pynvml.nvmlDeviceGetCurrPcieLinkWidth)
        self._pcie_width_max = _Fallback(pynvml.nvmlDeviceGetMaxPcieLinkWidth)
        self._pcie_replays = _Fallback(pynvml.nvmlDeviceGetPcieReplayCounter)
        self._samples_missing = _optional("nvmlDeviceGetSamples") is None
        self._process_util = _optional("nvmlDeviceGetProcessUtilization")
        self._process_seen: dict[str, int] = {}  # device key -> newest process sample timestamp (µs)
        self._mig = MigReader()
        self._mig_on = False  # a GPU in this read answers its MIG mode (on or off): the mig collector is active
        self._busy = BusyIntegrator()
        self._health = HealthReader(log)  # also the "not supported on this board" memo
        self._pcie_max: dict[str, tuple[tuple[str, int] | None, tuple[str, int] | None]] = {}
        self._xid = XidWatcher(log) if self._options.xid else None
        self._watched: dict[str, Any] = {}  # uuid -> handle of the devices enumerated in this read
        # index -> (uuid, handle) of its last read that got that far: a GPU whose read is
        # stuck stays watched for XIDs (a hung GPU is when they come)
        self._last_watched: dict[int, tuple[str, Any]] = {}
        # the worker thread's own job: its (uuid, handle) and part seconds, returned with its result
        self._job = threading.local()
        self._gpm = GpmReader(log) if self._options.profiling else None
        self._part_seconds = dict.fromkeys(_PARTS, 0.0)  # summed over the GPUs' parallel workers
        self._has_links = False  # a device with NVLinks was seen: the nvlink collector is active
        self._xid_ever_watched = False  # the xid collector has been active (some GPU registered)
        self._closing = False
        self._shutdown_pending = False  # nvmlShutdown waits for a watcher stuck inside NVML

    # -- lifecycle --------------------------------------------------------------------

    def prepare(self) -> None:
        self.try_init()  # nvmlInit can take seconds without persistence mode: not in a scrape

    def try_init(self) -> bool:
        """Initialise NVML unless the backoff says wait; True when it is usable."""
        if self._initialised:
            return True
        if self._shutdown_pending:
            if not self._nvml_idle(0.0):
                return False  # the watcher or a GPU worker is still inside the old init
            self._shutdown_pending = False
            self._nvml_shutdown()
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
        self._handles.clear()
        self._last_watched.clear()
        self._complete.clear()
        self._count = -1
        self._busy.reset()  # the driver's sample clock may have restarted
        self._process_seen.clear()
        self._health.forget()
        self._pcie_max.clear()
        try:
            self._driver_version = _text(nvml_errors.field(pynvml.nvmlSystemGetDriverVersion))
        except BackendDown:
            self._driver_version = ""
        self._log.info("NVML initialised", extra=fields(driver_version=self._driver_version or "unknown"))
        return True

    def device_count(self) -> int:
        """Devices NVML enumerates now; 0 when it cannot say."""
        try:
            return nvml_errors.call(pynvml.nvmlDeviceGetCount) or 0
        except (BackendDown, DeviceDown, Missing) as err:
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

    def _lost_backend(self, err: BackendDown | DeviceDown | Missing) -> None:
        """The library stopped answering (a failing count or handle lookup means the library,
        not a device): release this init and retry it with backoff."""
        self._log.warning(
            "NVML stopped answering; re-initialising with backoff", extra=fields(error=str(err))
        )
        # release this init before the next nvmlInit: NVML counts inits, and a re-init
        # without shutdown would leak one reference per driver reload
        self._shutdown()
        self._handles.clear()
        self._last_watched.clear()
        # doubling until a read succeeds again: an init that works but a count that keeps
        # failing must not re-init every second
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def interrupt(self) -> None:
        """Called from the closing thread before the last read drains: the XID watcher ends
        its wait now, in parallel, and no read starts it again."""
        self._closing = True
        if self._xid is not None:
            self._xid.stop(0.0)

    def _shutdown(self) -> None:
        if self._initialised:
            self._initialised = False
            # the watcher's event set belongs to this init: stop it first; if it or a GPU
            # worker is still inside a call, shutting down under it can crash, so the shutdown
            # waits for them (try_init does it) and no new init is taken on top of the old one meanwhile
            if not self._nvml_idle(_XID_STOP_TIMEOUT):
                self._log.warning("XID watcher or a GPU read still inside NVML; shutting NVML down once it returns")
                self._shutdown_pending = True
                return
            self._nvml_shutdown()

    def _nvml_idle(self, wait: float) -> bool:
        """True when neither the XID watcher nor any GPU worker is inside NVML (waiting up to
        wait seconds for them)."""
        until = time.monotonic() + wait
        if self._xid is not None and not self._xid.stop(wait):
            return False
        return all(worker.wait_idle(until) for worker in list(self._workers.values()))

    def _nvml_shutdown(self) -> None:
        if self._gpm is not None:
            self._gpm.free_all()  # GPM samples belong to this init: back before nvmlShutdown
        try:
            pynvml.nvmlShutdown()
        except Exception:  # the library is already gone or never answered: nothing to release
            pass

    def close(self) -> None:
        self._shutdown()
        workers = list(self._workers.values())
        for worker in workers:
            # each ends once idle; one stuck in a call ends when it returns, and the last one
            # out does the shutdown that was left pending for it
            worker.stop(self._after_close)
        until = time.monotonic() + 0.5
        for worker in workers:
            worker.join(max(0.0, until - time.monotonic()))  # idle ones end at once

    def _after_close(self) -> None:
        with self._close_lock:
            if self._shutdown_pending and self._nvml_idle(0.0):
                self._shutdown_pending = False
                self._nvml_shutdown()

    # -- reading ----------------------------------------------------------------------

    def read(self) -> GpuReading:
        if not self.try_init():
            return self._unavailable()
        self._part_seconds = dict.fromkeys(_PARTS, 0.0)
        self._watched = {}
        try:
            count = nvml_errors.call(pynvml.nvmlDeviceGetCount) or 0
            if count != self._count:  # re-enumerated: an index may now be another device
                self._handles.clear()
                self._last_watched.clear()
                self._count = count
            devices, self._watched, self._part_seconds = self._read_devices(count)
        except (BackendDown, DeviceDown, Missing) as err:  # count failing means the library, not a device
            self._lost_backend(err)
            return self._unavailable()
        by_key: dict[str, GpuSample] = {}
        for key, sample in devices:  # two indices can claim one key mid re-enumeration: the answering one wins
            if key not in by_key or sample.up:
                by_key[key] = sample
        self._key_at = {sample.identity.index: key for key, sample in by_key.items()}
        # a GPU in this read answered its MIG mode (on or off): the mig collector is active
        self._mig_on = any(sample.mig is not None for sample in by_key.values())
        seen = set(by_key)
        samples = list(by_key.values())
        # A device seen before but no longer enumerated stays visible as down, under its last index.
        shown = {(s.identity.index, s.identity.uuid) for s in samples}
        with self._ident_lock:  # a stuck worker may still be adding to it
            known = list(self._identities.items())
        for key, identity in known:
            if key in seen:
                continue
            if (identity.index, identity.uuid) in shown:
                continue  # same labels as an enumerated device (no UUID to tell them apart)
            samples.append(self._down(key, None))
        self._backoff = self._min_backoff  # a read that worked: the next loss retries soon again
        xid = None
        if self._xid is not None:
            if not self._closing:
                self._xid.watch(dict(self._watched))
            xid = self._xid.state()
            self._xid_ever_watched = self._xid_ever_watched or bool(xid.watched)
        return GpuReading(
            backend="nvml",
            success=not self._any_stuck,  # a GPU not read this time: the collector did not succeed
            device_count=count,
            driver_version=self._driver_version,
            devices=in_order(samples),
            memory_api=self.memory_api,
            parts=self._parts(not self._any_stuck),  # a stuck GPU's health is missing too
            xid=xid,
        )

    def _parts(self, success: bool) -> tuple[PartStatus, ...]:
        """health and nvlink fail with the read, and when one of their queries failed on an
        answering GPU in it (the values are then missing, and their alerts blind)."""
        failed = self._health.take_failures()
        parts = []
        if self._options.health:
            ok = success and not failed & {"health", "fields"}
            parts.append(PartStatus("health", ok, self._part_seconds["health"]))
        if self._options.nvlink and self._has_links:
            ok = success and not failed & {"nvlink", "fields"}
            parts.append(PartStatus("nvlink", ok, self._part_seconds["nvlink"]))
        if self._gpm is not None and self._gpm.active:
            parts.append(PartStatus("profiling", success and "profiling" not in failed, self._part_seconds["profiling"]))
        if self._options.mig and self._mig_on:
            parts.append(PartStatus("mig", success and "mig" not in failed, self._part_seconds["mig"]))
        if self._options.processes:
            parts.append(PartStatus("processes", success and "processes" not in failed, self._part_seconds["processes"]))
        return tuple(parts)

    def _unavailable(self) -> GpuReading:
        """No NVML right now. Before it ever worked (auto mode) the host simply has no GPU
        backend; after, or when NVML was asked for explicitly, it is a failure."""
        failing = self._ever_initialised or self._explicit
        self._busy.unread_all()
        return GpuReading(
            backend="nvml" if failing else "none",
            success=not failing,
            driver_version=self._driver_version,
            devices=all_down(self._known()),
            memory_api=self.memory_api,
            parts=self._parts(False) if failing else (),
            xid=self._xid_while_away() if failing else None,
        )

    def _known(self) -> list[GpuIdentity]:
        with self._ident_lock:
            return list(self._identities.values())

    def _read_devices(self, count: int) -> tuple[list[tuple[str, GpuSample]], dict[str, Any], dict[str, float]]:
        """Every device on its own worker, in parallel: the samples, the devices to watch for
        XIDs (uuid -> handle) and the part seconds summed over the workers. A device whose read
        does not return within the limit (or is still running from an earlier refresh) is down
        alone, watched by its last handle; the first error of any device is raised once all
        have answered (a defect before a library-level error)."""
        until = time.monotonic() + self._device_limit
        jobs = []
        for i in range(count):
            worker = self._workers.get(i)
            if worker is None:
                worker = self._workers[i] = DeviceWorker(i)
            jobs.append((worker, lambda i=i: self._read_device(i)))
        relay = self._starts.relay(jobs)
        started = relay.run(until)
        out: list[tuple[str, GpuSample]] = []
        watched: dict[str, Any] = {}
        seconds = dict.fromkeys(_PARTS, 0.0)
        error: BaseException | None = None
        defect: BaseException | None = None
        self._any_stuck = False
        for i, submitted in enumerate(started):
            done, result, err = self._workers[i].wait(until) if submitted else (False, None, None)
            if not done:
                out.append(self._stuck_device(i))
                if i in self._last_watched:
                    uuid, handle = self._last_watched[i]
                    watched[uuid] = handle
                continue
            if i in self._stuck:
                self._stuck.discard(i)
                self._log.info("GPU read returned; reading it again", extra=fields(gpu=i))
            if err is not None:
                if isinstance(err, (BackendDown, DeviceDown, Missing)):
                    error = error or err
                else:  # a defect (the reader logs it): raised once every worker is waited for
                    defect = defect or err
                continue
            assert isinstance(result, _DeviceRead)
            out.append((result.key, result.sample))
            if result.watch is not None:
                self._last_watched[i] = result.watch
                watched[result.watch[0]] = result.watch[1]
            else:
                self._last_watched.pop(i, None)
            for part, spent in result.seconds.items():
                seconds[part] += spent
            for part in result.failed:
                self._health.fail(part)  # on this thread: the read's own failures
        self._starts.learn(relay)
        if defect is not None:
            if error is not None:  # the library went too: re-initialise as read() would, then report the defect
                self._lost_backend(error)
            raise defect
        if error is not None:
            raise error
        return out, watched, seconds

    def _stuck_device(self, index: int) -> tuple[str, GpuSample]:
        self._any_stuck = True
        key = self._key_at.get(index) or f"#index-{index}"
        with self._ident_lock:
            identity = self._identities.setdefault(key, GpuIdentity(index=index))
        if index not in self._stuck:
            self._stuck.add(index)
            self._log.warning(
                "GPU read in flight longer than --collect.timeout; reporting this GPU down until it returns",
                extra=fields(collect_timeout_seconds=round(self._device_timeout, 3), gpu=index),
            )
        return key, self._down(key, DeviceDown(None, "read in flight longer than --collect.timeout"), identity)

    def _xid_while_away(self) -> XidState | None:
        """The counts so far stay served; an xid collector that was active fails while NVML
        is away (nothing is watched), one that never was (GeForce only) stays inactive."""
        if self._xid is None:
            return None
        state = self._xid.state()
        return dataclasses.replace(state, healthy=False) if self._xid_ever_watched else state

    def _down(self, key: str, err: DeviceDown | None, identity: GpuIdentity | None = None) -> GpuSample:
        """identity: where the caller holds it (a stuck GPU's placeholder, which a late
        worker may replace in _identities meanwhile)."""
        if identity is None:
            with self._ident_lock:
                identity = self._identities[key]
        self._busy.unread(key)  # not read now: not filled at the busy mean when it answers again
        if self._up.get(key, True):
            self._log.warning(
                "GPU not answering; reporting resmon_gpu_up 0",
                extra=fields(gpu=identity.index, uuid=identity.uuid, error=str(err) if err else "no longer enumerated"),
            )
        self._up[key] = False
        if self._gpm is not None:
            self._gpm.drop(key)  # it may be reset before it answers again: no GPM window across the gap
        return GpuSample(identity, up=False)

    def _read_device(self, index: int) -> _DeviceRead:
        """One GPU's job on its worker."""
        job = self._job
        job.watch, job.seconds = None, dict.fromkeys(_PARTS, 0.0)
        self._health.begin_job()
        try:
            key, sample = self._read_one(index)
        finally:
            failed = self._health.end_job()
        return _DeviceRead(key, sample, job.watch, job.seconds, failed)

    def _spent(self, part: str, seconds: float) -> None:
        """Time of one collector part, on this worker's job (none outside a job)."""
        spent = getattr(self._job, "seconds", None)
        if spent is not None:
            spent[part] += seconds

    def _read_one(self, index: int) -> tuple[str, GpuSample]:
        handle = self._handles.get(index)
        if handle is None:
            try:
                handle = nvml_errors.call(pynvml.nvmlDeviceGetHandleByIndex, index)
            except (DeviceDown, Missing):
                handle = None
            if handle is None:  # lost at handle: the device that was at this index is down
                key = self._key_at.get(index) or f"#index-{index}"
                with self._ident_lock:  # the reader and other workers iterate it
                    self._identities.setdefault(key, GpuIdentity(index=index))
                return key, self._down(key, DeviceDown(None, "no handle"))
            self._handles[index] = handle
        key = self._identify(index, handle)
        uuid = self._identities[key].uuid
        if uuid:  # watched for XIDs even while its values fail: that is when XIDs come
            self._job.watch = (uuid, handle)
        try:
            sample = self._read_values(key, self._identities[key], handle)
        except DeviceDown as err:
            self._handles.pop(index, None)
            return key, self._down(key, err)
        if not self._up.get(key, True):
            self._log.info("GPU answering again", extra=fields(gpu=index, uuid=sample.identity.uuid))
        self._up[key] = True
        return key, sample

    def _identify(self, index: int, handle: Any) -> str:
        """The key of the device at index now (its UUID is read on every refresh: one cheap
        call that catches re-enumeration), its identity read field by field until complete."""
        uuid = _text(nvml_errors.field(pynvml.nvmlDeviceGetUUID, handle))
        pci = ""
        key = uuid
        if not uuid:
            # a UUID that does not answer (this once, or on this driver): the device known by
            # this PCI bus id, else a new key by PCI bus id, else whoever was at this index
            pci = self._pci_bus_id(handle)
            with self._ident_lock:
                key = self._key_by_pci(pci) or pci or self._key_at.get(index) or f"#index-{index}"
        placeholder = f"#index-{index}"
        with self._ident_lock:  # NVML calls stay outside: a hung GPU must not block the others
            if key != placeholder and placeholder in self._identities:
                # the device's first answer: its uuid="" series is replaced by the real one
                self._identities.pop(placeholder)
                self._up.pop(placeholder, None)
            old = self._identities.get(key)
            if old is not None and key in self._complete:
                if old.index != index:
                    old = self._identities[key] = dataclasses.replace(old, index=index)
                return key
        identity = self._read_identity(index, handle, uuid, pci, old)
        with self._ident_lock:
            self._identities[key] = identity
            if uuid and identity.pci_bus_id:
                # the UUID answers now: a device that was known by its PCI bus id is this one
                for other in [k for k, i in self._identities.items() if k != key and not i.uuid and i.pci_bus_id == identity.pci_bus_id]:
                    del self._identities[other]
                    self._up.pop(other, None)
        return key

    def _key_by_pci(self, pci: str) -> str | None:
        if not pci:
            return None
        for key, identity in self._identities.items():
            if identity.pci_bus_id == pci:
                return key
        return None

    def _pci_bus_id(self, handle: Any) -> str:
        pci = nvml_errors.field(pynvml.nvmlDeviceGetPciInfo, handle)
        return _text(pci.busId) if pci is not None else ""

    def _name(self, handle: Any) -> str:
        try:
            return _text(nvml_errors.call(pynvml.nvmlDeviceGetName, handle))
        except Undecodable:
            return _text(nvml_errors.field(_raw_name, handle))
        except (DeviceDown, Missing):
            return ""

    def _read_identity(self, index: int, handle: Any, uuid: str, pci: str, old: GpuIdentity | None) -> GpuIdentity:
        uuid = uuid or (old.uuid if old else "")  # a UUID once read is kept
        name = (old.name if old else "") or self._name(handle)
        pci = (old.pci_bus_id if old else "") or pci or self._pci_bus_id(handle)
        clocks = old.clock_max_hertz if old else ()
        if not clocks:
            found = []
            for clock in CLOCK_TYPES:
                try:
                    hertz = _mhz_to_hertz(self._max_clock(handle, _CLOCK_IDS[clock]))
                except DeviceDown:
                    hertz = None
                if hertz is not None:
                    found.append((clock, hertz))
            clocks = tuple(found)
        identity = GpuIdentity(index=index, uuid=uuid, name=name, pci_bus_id=pci, clock_max_hertz=clocks)
        if name and pci:  # complete: no identity call again until the next init
            self._complete.add(uuid or pci)
        return identity

    def _memory(self, handle: Any) -> Any:
        if self.memory_api == "v2":
            memory = self._memory_v2(handle)
            if memory is not None or self._memory_v2.available:
                return memory
            self.memory_api = "v1"  # this driver has no v2: used then includes reserved memory
        return self._memory_v1(handle)

    def _read_values(self, key: str, identity: GpuIdentity, handle: Any) -> GpuSample:
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
            **self._processes(key, handle),
            **self._read_v2(key, handle),
        )

    # -- v2: gpu additions, health, nvlink ----------------------------------------------

    def _read_v2(self, key: str, handle: Any) -> dict[str, Any]:
        """The v2 values of one device, from one field-value batch plus the plain calls."""
        ask = self._health.ask
        requests = list(_GPU_FIELDS)
        if self._options.health:
            requests.append((nvml_fields.GPU_RECOVERY_ACTION, 0))

        def batch(wanted: list[nvml_fields.Request]) -> nvml_fields.Values | None:
            return nvml_fields.read(handle, wanted, lambda h, r: ask(key, "fields", self._fields, h, r, part="fields"))

        links = 0
        if self._options.nvlink:
            clock = time.perf_counter()
            links = self._health.link_count(key, handle, batch)
            self._spent("nvlink", time.perf_counter() - clock)
            requests += self._health.link_requests(links)
            self._has_links = self._has_links or links > 0
        fields = batch(requests) or {}
        memory_temperature = nvml_fields.in_range(fields.get((nvml_fields.MEMORY_TEMP, 0)), 1, 200)
        out: dict[str, Any] = {
            "memory_temperature_celsius": float(memory_temperature) if memory_temperature is not None else None,
            "encoder_utilization_ratio": self._engine_ratio(ask(key, "encoder", self._encoder, handle)),
            "decoder_utilization_ratio": self._engine_ratio(ask(key, "decoder", self._decoder, handle)),
            "busy_seconds": self._busy_seconds(key, handle),
            "clock_event_seconds": self._clock_events(key, handle, fields),
            "pcie_bytes": tuple(
                (direction, int(value))
                for direction, fid in (("transmit", nvml_fields.PCIE_COUNT_TX_BYTES), ("receive", nvml_fields.PCIE_COUNT_RX_BYTES))
                if (value := fields.get((fid, 0))) is not None and value >= 0
            ),
            **self._pcie(key, handle),
        }
        if self._options.health:
            clock = time.perf_counter()
            out["health"] = self._health.health(key, handle, fields)
            self._spent("health", time.perf_counter() - clock)
        if self._gpm is not None:
            clock = time.perf_counter()
            if self._gpm.supported(key, handle, ask):
                out["profiling"] = self._gpm.read(key, handle, ask)
            self._spent("profiling", time.perf_counter() - clock)
        out.update(self._read_mig(key, handle))
        if links:
            clock = time.perf_counter()
            out["nvlinks"] = self._health.nvlinks(key, handle, links, fields)
            self._spent("nvlink", time.perf_counter() - clock)
        return out

    @staticmethod
    def _engine_ratio(answer: Any) -> float | None:
        if answer is None:
            return None
        return _ratio_from_percent(int(answer[0]))  # [percent, sampling period µs]

    def _clock_events(self, key: str, handle: Any, fields: nvml_fields.Values) -> tuple[tuple[str, float], ...]:
        out = []
        for reason, fid, policy in nvml_fields.CLOCK_EVENT_FIELDS:
            value = fields.get((fid, 0))
            if value is None and policy is not None:  # a driver before the field ids
                answer = self._health.ask(key, f"violation.{policy}", self._violation, handle, policy)
                value = int(answer.violationTime) if answer is not None else None
            if value is not None and 0 <= value < _U64_NA:
                out.append((reason, value / nvml_fields.CLOCK_EVENT_UNITS_PER_SECOND))
        return tuple(out)

    def _pcie(self, key: str, handle: Any) -> dict[str, Any]:
        ask = self._health.ask
        # the board's maxima do not change: kept once answered (a failed or unsupported
        # answer is asked again, see HealthReader.ask)
        gen_max, width_max = self._pcie_max.get(key, (None, None))
        gen_max = gen_max or _pair("max", _u32(ask(key, "pcie_gen_max", self._pcie_gen_max, handle)))
        width_max = width_max or _pair("max", _u32(ask(key, "pcie_width_max", self._pcie_width_max, handle)))
        self._pcie_max[key] = (gen_max, width_max)
        gen = _pair("current", _u32(ask(key, "pcie_gen", self._pcie_gen, handle)))
        width = _pair("current", _u32(ask(key, "pcie_width", self._pcie_width, handle)))
        return {
            "pcie_link_generation": tuple(p for p in (gen, gen_max) if p is not None),
            "pcie_link_width_lanes": tuple(p for p in (width, width_max) if p is not None),
            "pcie_replays": _u32(ask(key, "pcie_replays", self._pcie_replays, handle)),
        }

    def _busy_seconds(self, key: str, handle: Any) -> tuple[tuple[str, float], ...]:
        out = []
        for engine, sampling_type in _SAMPLE_TYPES.items():
            if self._samples_missing:
                break
            try:
                answer = self._health.ask(
                    key, f"samples.{engine}", nvml_errors.newer,
                    pynvml.nvmlDeviceGetSamples, handle, sampling_type, self._busy.last_seen(key, engine),
                    part="gpu",
                )
            except Missing:
                self._samples_missing = True
                break
            if answer is None:  # NOT_SUPPORTED (MIG mode, or this engine): absent
                self._busy.unread(key)
                continue
            samples: list[tuple[int, float]] = []
            entries: Any = ()
            if answer:
                value_type, entries = answer
                for e in entries:
                    value = nvml_fields.union_value(int(value_type), e.sampleValue)
                    if value is not None:
                        samples.append((int(e.timeStamp), float(value)))
            out.append((engine, self._busy.add(key, engine, samples, answered=len(entries))))
        return tuple(out)

    def _processes(self, key: str, handle: Any) -> dict[str, Any]:
        """resmon_gpu_processes, and with the processes collector each process's memory and
        utilization. A process in both lists is one process (gpustat #84), its memory the
        larger of the two entries (the same allocation, reported twice)."""
        compute = self._compute_procs(handle)
        graphics = self._graphics_procs(handle)
        if compute is None and graphics is None:
            return {"processes": None}
        memory: dict[int, int | None] = {}
        for p in [*(compute or []), *(graphics or [])]:
            pid, used = int(p.pid), p.usedGpuMemory  # pynvml: None for NVML_VALUE_NOT_AVAILABLE
            used = None if used is None or used == _U64_NA else int(used)
            if pid not in memory or (used is not None and (memory[pid] is None or used > memory[pid])):  # type: ignore[operator]
                memory[pid] = used
        out: dict[str, Any] = {"processes": len(memory)}
        if self._options.processes:
            clock = time.perf_counter()
            ratios = self._process_utilization(key, handle, set(memory))
            out["process_list"] = tuple(
                GpuProcess(pid, used, ratios.get(pid, ()) if ratios is not None else ()) for pid, used in sorted(memory.items())
            )
            self._spent("processes", time.perf_counter() - clock)
        return out

    def _process_utilization(self, key: str, handle: Any, pids: set[int]) -> dict[int, tuple[tuple[str, float], ...]] | None:
        """Each listed process's mean utilization per engine over the driver's samples since
        the previous refresh (a listed process without new samples was idle: 0). None where
        the GPU does not report it (MIG on). The newest timestamp is passed back, so a sample
        is counted once; samples of processes no longer listed are dropped."""
        if self._process_util is None:
            return None
        if not pids:
            return {}
        seen = self._process_seen.get(key, 0)
        try:
            answer = self._health.ask(key, "process_utilization", nvml_errors.newer, self._process_util, handle, seen, part="processes")
        except Missing:  # a driver without it: utilization absent from now on
            self._process_util = None
            return None
        if answer is None:
            return None
        sums: dict[int, list[float]] = {}
        for sample in answer:
            stamp, pid = int(sample.timeStamp), int(sample.pid)
            if stamp <= seen:
                continue
            self._process_seen[key] = max(self._process_seen.get(key, 0), stamp)
            if pid not in pids:  # exited since, or a stale entry of the driver's buffer
                continue
            acc = sums.setdefault(pid, [0.0] * (len(PROCESS_ENGINES) + 1))
            for i, (_, attr) in enumerate(PROCESS_ENGINES):
                acc[i] += min(max(float(getattr(sample, attr)), 0.0), 100.0)  # >100 seen (nvtop #110)
            acc[-1] += 1
        out = {}
        for pid in pids:
            acc = sums.get(pid)
            out[pid] = tuple(
                (engine, (acc[i] / acc[-1] / 100.0) if acc else 0.0) for i, (engine, _) in enumerate(PROCESS_ENGINES)
            )
        return out

    def _read_mig(self, key: str, handle: Any) -> dict[str, Any]:
        """MIG mode (one query per GPU and refresh for both users, NOT_SUPPORTED memoised)
        and devices: the UUIDs while MIG is on (device plugins hand these to pods; the
        kubernetes collector resolves them), and with the mig collector the mode of every
        MIG-capable GPU and the instances. Their GPM reads count as profiling time."""
        if not (self._options.mig or self._options.mig_devices):
            return {}
        clock = time.perf_counter()
        ask = self._health.ask
        out: dict[str, Any] = {}
        gpm_seconds = 0.0
        try:
            mode = self._mig.mode(key, handle, ask)
            if mode is not None:
                def fail() -> None:
                    self._health.fail("mig")
                migs = self._mig.handles(key, handle, ask, fail) if mode[0] == 1 else []
                if self._options.mig_devices:
                    out["mig_uuids"] = tuple(self._mig.uuids(migs))
                if self._options.mig:
                    out["mig"], gpm_seconds = self._mig.state(key, handle, ask, fail, self._gpm, mode, migs, self._memory)
        finally:  # counted even when the GPU went down inside it
            self._spent("profiling", gpm_seconds)
            self._spent("mig", time.perf_counter() - clock - gpm_seconds)
        return out
