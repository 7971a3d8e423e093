"""NVIDIA GPUs through NVML (pynvml from nvidia-ml-py).

NVML is initialised once and kept; if it cannot be initialised (library missing, driver
not loaded) or stops answering, the backend retries with exponential backoff on later
refreshes, so GPUs appear without a restart. Retries run only when a refresh asks for
data: there is no background thread. Every NVML call goes through nvml_errors.

Devices are keyed by UUID (PCI bus id where the UUID cannot be read), never by index: NVML
renumbers after a GPU disappears, so identity, up history and caches follow the UUID and
`gpu` is just the device's current index. A device no longer enumerated stays visible as
down under its last index for a while (DEPARTED_SECONDS, a count bound), then is forgotten.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import pynvml

from ...counters import Monotonic, Unwrap
from ...logs import fields
from ...samples import (
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
from ..base import GpuOptions
from . import errors as nvml_errors
from . import fields as nvml_fields
from . import sized
from .busy import BusyIntegrator, SampleStamps
from .errors import BackendDown, DeviceDown, Fallback as _Fallback, Missing, Undecodable
from .gpm import GpmReader
from .health import SLOW_RECHECK, HealthReader
from .mig import MigLayout, MigReader
from .slow import Cadence, SlowPart
from .workers import GpuSlot, HandleCache, Readers, Starts, device_limit
from .wanted import Wanted
from .xid import XidWatcher

_U32_NA, _U64_NA = nvml_fields.U32_NA, nvml_fields.U64_NA
_SAMPLE_TYPES = dict(zip(BUSY_ENGINES, (1, 2, 3, 4)))  # nvmlSamplingType_t: GPU, MEMORY, ENC, DEC
# Field values read in every device's one batch (the health and nvlink ones are added when on).
_GPU_FIELDS: tuple[tuple[nvml_fields.Request, str], ...] = (  # with the read (wanted.py) each serves
    ((nvml_fields.MEMORY_TEMP, 0), "memory_temperature"),
    *(((fid, 0), "clock_events") for _, fid, _ in nvml_fields.CLOCK_EVENT_FIELDS),
    ((nvml_fields.PCIE_COUNT_TX_BYTES, 0), "pcie_bytes"),
    ((nvml_fields.PCIE_COUNT_RX_BYTES, 0), "pcie_bytes"),
    ((nvml_fields.POWER_AVERAGE, 0), "power"),
    ((nvml_fields.POWER_INSTANT, 0), "power"),
    ((nvml_fields.POWER_CURRENT_LIMIT, 0), "power_limit"),
    ((nvml_fields.TOTAL_ENERGY, 0), "energy"),
    ((nvml_fields.PCIE_REPLAY_COUNTER, 0), "pcie_replays"),
    ((nvml_fields.GPU_TEMP, 0), "temperature"),
)
_XID_STOP_TIMEOUT = 1.5  # seconds; stop() interrupts the watcher's wait (up to 5 s: xid.WAKE_SIGNAL)
_CLOCK_IDS = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}


_PARTS = ("health", "nvlink", "processes", "profiling", "mig")
# A device no longer enumerated stays as resmon_gpu_up 0 for this long (ResmonGpuDown fires
# after 2 minutes), then it and every cache of it are dropped; at most DEPARTED_PER_GPU times
# the most GPUs enumerated at once are kept meanwhile (the oldest departures go first), so
# GPUs reappearing under new UUIDs cannot grow series and memory without bound.
DEPARTED_SECONDS = 600.0
DEPARTED_PER_GPU = 2


@dataclasses.dataclass
class _DeviceRead:
    """What one GPU's worker hands back: nothing of it is written into the backend's
    per-refresh state, which a late (stuck) job could otherwise change under the reader."""

    key: str
    sample: GpuSample
    watch: tuple[str, Any] | None  # (uuid, handle) to watch for XIDs
    seconds: dict[str, float]  # time spent in each collector part on this worker
    failed: frozenset[str]  # the collector parts whose queries failed on this GPU
    slow: SlowPart | None = None  # the slow part read in this job (None: served from before)
    reread: bool = False  # something of the slow part stopped answering: read it next refresh


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


def _celsius(value: float | int | None) -> float | None:
    # -1 and out-of-range readings are the driver's "no sensor", not a temperature
    if value is None or value == -1 or not -40 <= value <= 200:
        return None
    return float(value)


def _ratio_from_percent(value: float | int | None) -> float | None:
    # all-ones and >100 readings are driver garbage (NVIDIA/DCGM #199), not 100 %
    if value is None or value > 100:
        return None
    return value / 100.0


def _u32(value: int | None) -> int | None:
    return None if value is None or value == _U32_NA else value


def _pair(label: str, value: int | None) -> tuple[str, int] | None:
    return None if value is None else (label, int(value))


def _first(fields: Any, *ids: int) -> Any:
    """The first of these fields (scope 0) whose entry answered, else None."""
    for fid in ids:
        value = fields.get((fid, 0))
        if value is not None:
            return value
    return None


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
        forget_after: float = DEPARTED_SECONDS,
    ) -> None:
        self._log = log
        # the reads --metrics.include/exclude leave to make; collectors left with none are off
        self._wanted = Wanted.of((options or GpuOptions()).metrics)
        options = self._wanted.options(options or GpuOptions())
        self._gpu_fields = tuple(r for r, read in _GPU_FIELDS if read in self._wanted)
        # the slow cadence (slow.py): which GPUs read their slow part in a refresh, and the
        # parts as last read (both the reader's; workers only read _slow_parts)
        self._cadence = Cadence(options.slow_interval)
        self._slow_parts: dict[str, SlowPart] = {}
        self._hints = sized.Hints()  # buffer sizes of the sample and process-list reads
        self._forget_after = forget_after
        # the GPUs are read on the reader threads (workers.py); a refresh waits this long for
        # one GPU, after which that GPU alone is down until its read returns (--collect.timeout,
        # a little less)
        self._device_timeout = device_timeout
        self._device_limit = device_limit(device_timeout)
        self._workers: dict[int, GpuSlot] = {}  # each GPU's read state, by index
        self._readers = Readers()
        self._starts = Starts()  # a chain or all at once (workers.py)
        self._stuck: set[int] = set()  # indices whose read is in flight past the limit
        self._any_stuck = False  # in this read
        # guards the identity maps where a worker iterates or re-keys them (never held over an NVML call)
        self._ident_lock = threading.Lock()
        self._close_lock = threading.Lock()  # workers ending after close() finish a pending shutdown once
        self._released = threading.Event()  # after close(): nothing is left inside this init of NVML
        self._options = options
        self._explicit = explicit
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._backoff = min_backoff
        self._next_attempt = 0.0
        self._initialised = False
        self._ever_initialised = False
        self._init_failures = 0
        self.last_error = ""
        # NO_PERMISSION where it is fatal (issue 22 item 12): the init's or the count's error
        # text, and the indices whose handle lookup was refused (workers write it, under _ident_lock)
        self._denied = ""
        self._denied_at: dict[int, str] = {}
        self._denied_logs = 0  # refusals so far: logged at 1, 2, 4, 8, ... (a log line with backoff)
        self._driver_version = ""
        self._count = -1  # device count of the previous read: a change means re-enumeration
        # by current index, dropped when the count changes; generation-checked (a lookup that
        # hung across a count change must not cache the old enumeration's handle)
        self._handles = HandleCache()
        self._identities: dict[str, GpuIdentity] = {}  # every device seen since start, by key
        self._complete: set[str] = set()  # keys whose identity fields are all known since init
        # index -> key its latest identity read found (under _ident_lock): a read stuck after
        # it is reported under that key, never as a second, placeholder device
        self._identified_at: dict[int, str] = {}
        self._unstarted: set[int] = set()  # indices warned about as not started, until read again
        self._key_at: dict[int, str] = {}  # index -> key seen there in the previous read
        # devices no longer enumerated -> monotonic time since when (the reader's alone);
        # forgotten after forget_after, or beyond DEPARTED_PER_GPU x the most GPUs enumerated at once
        self._departed: dict[str, float] = {}
        self._most_enumerated = 0
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
        self._compute_procs = _Fallback(*self._process_lists("Compute"))
        self._graphics_procs = _Fallback(*self._process_lists("Graphics"))
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
        self._fields = _Fallback(nvml_fields.get_field_values if _optional("nvmlDeviceGetFieldValues") else None)
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
        self._process_seen = SampleStamps()  # device key -> newest process sample timestamp (µs)
        self._mig = MigReader()
        self._mig_on = False  # a GPU in this read answers its MIG mode (on or off): the mig collector is active
        self._busy = BusyIntegrator()
        self._health = HealthReader(log)  # also the "not supported on this board" memo
        # counters never decrease (exporter/counters.py): PCIe bytes unwrapped by their width,
        # then every counter family restarted lower kept monotonic, once per read
        self._pcie_unwrap = Unwrap()
        self._counters = Monotonic()
        # (key, reason) -> (driver version, "field" | "violation"): one clock-event source each
        self._clock_event_source: dict[tuple[str, str], tuple[str, str]] = {}
        self._xid = XidWatcher(log) if self._options.xid else None
        self._xid_seen: dict[tuple[str, int], int] = {}  # (uuid, code) -> events seen by the last read
        self._watched: dict[str, Any] = {}  # uuid -> handle of the devices enumerated in this read
        # index -> (uuid, handle) of its last read that got that far: a GPU whose read is
        # stuck stays watched for XIDs (a hung GPU is when they come)
        self._last_watched: dict[int, tuple[str, Any]] = {}
        # the worker thread's own job: its (uuid, handle) and part seconds, returned with its result
        self._job = threading.local()
        self._gpm = GpmReader(log) if self._options.profiling else None
        self._part_seconds = dict.fromkeys(_PARTS, 0.0)  # summed over the GPUs' reads
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
        self._denied = ""
        with self._ident_lock:
            self._denied_at.clear()
        self._handles.clear()
        self._last_watched.clear()
        self._complete.clear()
        self._count = -1
        self._busy.reset()  # the driver's sample clock may have restarted
        self._process_seen.clear()
        self._health.forget()
        self._hints.forget()
        self._cadence.force_all()  # a new init (a driver reload, a reset GPU): every slow part again
        try:
            self._driver_version = _text(nvml_errors.field(pynvml.nvmlSystemGetDriverVersion))
        except BackendDown:
            self._driver_version = ""
        self._log.info("NVML initialised", extra=fields(driver_version=self._driver_version or "unknown"))
        return True

    def device_count(self) -> int:
        """Devices NVML enumerates now; 0 when it cannot say (denied: see `denied`)."""
        try:
            count = nvml_errors.required(pynvml.nvmlDeviceGetCount) or 0
        except nvml_errors.Denied as err:
            self._refused(str(err))
            return 0
        except (BackendDown, DeviceDown, Missing) as err:
            self.last_error = str(err)
            return 0
        self._denied = ""
        return count

    @property
    def denied(self) -> str:
        """NVML's error text while nvmlInit or the device count answers NO_PERMISSION: an
        NVIDIA GPU is there and this process may not open it (auto mode keeps NVML then)."""
        return self._denied

    def _refused(self, error: str, gpus: tuple[int, ...] = ()) -> None:
        """NO_PERMISSION where the exporter cannot do without the answer: warned about at the
        1st, 2nd, 4th, 8th, ... refusal, so it stays in the log without flooding it."""
        if not gpus:
            self._denied = self.last_error = error
        self._denied_logs += 1
        level = logging.WARNING if self._denied_logs & (self._denied_logs - 1) == 0 else logging.DEBUG
        self._log.log(
            level,
            "NVML refuses this process: no permission to open the GPU (/dev/nvidiactl, /dev/nvidia*); "
            "give the exporter the device nodes (the video group or a udev rule; in Docker --gpus or --device "
            "with the NVIDIA container toolkit)",
            extra=fields(error=error, gpu=",".join(map(str, gpus)) or "all", refusals=self._denied_logs),
        )

    def _init_failed(self, err: BackendDown, now: float) -> None:
        self._init_failures += 1
        self.last_error = str(err)
        self._next_attempt = now + self._backoff
        if err.code == nvml_errors.NO_PERMISSION:
            self._refused(str(err))  # a failure, not "no GPU" (issue 22 item 12)
        elif self._init_failures == 1 and not self._explicit:
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
        return self._readers.wait_idle(until)

    def _nvml_shutdown(self) -> None:
        if self._gpm is not None:
            self._gpm.free_all()  # GPM samples belong to this init: back before nvmlShutdown
        try:
            pynvml.nvmlShutdown()
        except Exception:  # the library is already gone or never answered: nothing to release
            pass

    def close(self) -> None:
        """Prompt: the XID watcher (its wait interrupted, else up to 5 s) and a GPU worker stuck in
        a call are not waited for; shutting NVML down under them can crash, so the last of
        them out of NVML does it (_after_close), or this call when all are out already."""
        with self._close_lock:
            if self._initialised:
                self._initialised = False
                self._shutdown_pending = True  # before anyone is told: the last one out sees it
            if not self._shutdown_pending:
                self._released.set()  # never initialised, or already shut down
        if self._xid is not None:
            self._xid.stop(0.0, on_exit=self._after_close)
        # each reader ends once idle; one stuck in a call ends when it returns
        self._readers.stop(self._after_close)
        self._after_close()
        self._readers.join(0.5)  # idle ones end at once

    def _after_close(self) -> None:
        with self._close_lock:
            if self._shutdown_pending and self._nvml_idle(0.0):
                self._shutdown_pending = False
                self._nvml_shutdown()
                self._released.set()

    def wait_released(self, timeout: float) -> bool:
        """After close(): True once the XID watcher and the GPU workers are out of NVML and
        it is shut down (waiting up to timeout). The CLI waits for this before it exits, so
        the event set is freed and NVML released; the Python API's close() does not."""
        return self._released.wait(max(0.0, timeout))

    # -- reading ----------------------------------------------------------------------

    def read(self) -> GpuReading:
        if not self.try_init():
            return self._unavailable()
        self._part_seconds = dict.fromkeys(_PARTS, 0.0)
        self._watched = {}
        try:
            try:
                count = nvml_errors.required(pynvml.nvmlDeviceGetCount) or 0
            except nvml_errors.Denied as err:  # asked again on the next refresh (a cheap call)
                self._refused(str(err))
                return self._unavailable()
            self._denied = ""
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
        for key, sample in by_key.items():
            if not sample.up:  # when it answers again, its slow part is read with it, and
                self._cadence.force(key)  # what it did not support is asked again (a reset, MIG)
                self._health.forget_unsupported(key)
        # a GPU in this read answered its MIG mode (on or off): the mig collector is active
        self._mig_on = any(sample.mig is not None for sample in by_key.values())
        seen = set(by_key)
        samples = list(by_key.values())
        # A device seen before but no longer enumerated stays visible as down, under its last index.
        shown = {(s.identity.index, s.identity.uuid) for s in samples}
        self._most_enumerated = max(self._most_enumerated, count)
        for key in self._departures(seen):
            self._forget(key)
        with self._ident_lock:  # a stuck worker may still be adding to it
            known = list(self._identities.items())
            identified = dict(self._identified_at)
        # a GPU reported stuck under its placeholder whose identity answered while this read
        # finished: its sample is that identity's (one series, never uuid="" beside the UUID)
        placeholders = {s.identity.index: i for i, (k, s) in enumerate(by_key.items()) if k == f"#index-{s.identity.index}"}
        for key, identity in known:
            if key in seen:
                continue
            at = placeholders.get(identity.index)
            if at is not None and identified.get(identity.index) == key:
                samples[at] = dataclasses.replace(samples[at], identity=identity)
                del placeholders[identity.index]
                continue
            if (identity.index, identity.uuid) in shown:
                continue  # same labels as an enumerated device (no UUID to tell them apart)
            samples.append(self._down(key, None))
        samples = self._counters.samples(samples)  # no counter decreases (exporter/counters.py)
        self._backoff = self._min_backoff  # a read that worked: the next loss retries soon again
        with self._ident_lock:  # a late worker may still write it
            refused = {i: e for i, e in self._denied_at.items() if i < count}
        if refused:
            self._refused(next(iter(refused.values())), tuple(sorted(refused)))
        xid = None
        if self._xid is not None:
            if not self._closing:
                self._xid.watch(dict(self._watched))
            xid = self._xid.state()
            self._xid_ever_watched = self._xid_ever_watched or bool(xid.watched)
            self._reread_after_xid(xid)
        return GpuReading(
            backend="nvml",
            # a GPU not read this time, or one we may not open: the collector did not succeed
            success=not self._any_stuck and not refused,
            error="no_permission" if refused else "",
            device_count=count,
            driver_version=self._driver_version,
            devices=in_order(samples),
            memory_api=self.memory_api,
            parts=self._parts(not self._any_stuck, samples),  # a stuck GPU's health is missing too
            xid=xid,
        )

    def _reread_after_xid(self, xid: XidState) -> None:
        """A GPU with a new XID event reads its slow part on the next refresh: ECC, remapping
        and NVLink errors are what XIDs 48, 63, 64, 74, 92, 94, 95, 119, 120 ... announce."""
        counts = {(c.uuid, c.xid): c.count for c in xid.counts}
        for (uuid, code), count in counts.items():
            if count > self._xid_seen.get((uuid, code), 0):
                self._cadence.force(uuid)
        self._xid_seen = counts

    def _departures(self, seen: set[str]) -> list[str]:
        """The departed devices to forget now: gone longer than forget_after, and beyond the
        count bound the oldest departures."""
        now = time.monotonic()
        with self._ident_lock:
            known = set(self._identities)
        for key in [k for k in self._departed if k in seen or k not in known]:
            del self._departed[key]  # enumerated again (or re-keyed meanwhile)
        for key in known - seen:
            self._departed.setdefault(key, now)
        by_age = sorted(self._departed, key=self._departed.__getitem__)
        keep = DEPARTED_PER_GPU * max(self._most_enumerated, 1)
        overflow = by_age[: max(0, len(by_age) - keep)]
        return overflow + [k for k in by_age[len(overflow):] if now - self._departed[k] >= self._forget_after]

    def _forget(self, key: str) -> None:
        """Drop a departed device and every per-device cache of it."""
        del self._departed[key]
        with self._ident_lock:
            identity = self._identities.pop(key, None)
            self._up.pop(key, None)
            self._complete.discard(key)
        self._busy.forget(key)
        self._process_seen.forget(key)
        self._hints.forget(key)
        self._cadence.forget(key)
        self._slow_parts.pop(key, None)
        self._pcie_unwrap.forget(key)
        for source in [s for s in list(self._clock_event_source) if s[0] == key]:
            self._clock_event_source.pop(source, None)
        self._health.forget_device(key)
        if self._gpm is not None:
            self._gpm.forget(key)
        if identity is not None:
            self._counters.forget(identity.uuid or identity.pci_bus_id or f"#index-{identity.index}")
            if self._xid is not None and identity.uuid:  # its XID series go with the rest
                self._xid.forget(identity.uuid)
            self._log.info("GPU no longer enumerated for long; its series are dropped",
                           extra=fields(gpu=identity.index, uuid=identity.uuid))

    def _parts(self, success: bool, samples: list[GpuSample] | tuple[GpuSample, ...] = ()) -> tuple[PartStatus, ...]:
        """health and nvlink fail with the read, and when one of their queries failed on an
        answering GPU in it (the values are then missing, and their alerts blind). Those
        served from slow reads (health, nvlink, mig) carry the oldest slow read's time."""
        failed = self._health.take_failures()
        slow_at = min((s.slow_read_at for s in samples if s.up and s.slow_read_at is not None), default=None)
        parts = []
        if self._options.health:
            ok = success and not failed & {"health", "fields"}
            parts.append(PartStatus("health", ok, self._part_seconds["health"], slow_at))
        if self._options.nvlink and self._has_links:
            ok = success and not failed & {"nvlink", "fields"}
            parts.append(PartStatus("nvlink", ok, self._part_seconds["nvlink"], slow_at))
        if self._gpm is not None and self._gpm.active:
            parts.append(PartStatus("profiling", success and "profiling" not in failed, self._part_seconds["profiling"]))
        if self._options.mig and self._mig_on:
            parts.append(PartStatus("mig", success and "mig" not in failed, self._part_seconds["mig"], slow_at))
        if self._options.processes:
            parts.append(PartStatus("processes", success and "processes" not in failed, self._part_seconds["processes"]))
        return tuple(parts)

    def _unavailable(self) -> GpuReading:
        """No NVML right now. Before it ever worked (auto mode) the host simply has no GPU
        backend; after, or when NVML was asked for explicitly, it is a failure."""
        # NO_PERMISSION is a failure even before NVML ever worked: a GPU is there, closed to us
        failing = self._ever_initialised or self._explicit or bool(self._denied)
        self._busy.unread_all()
        return GpuReading(
            backend="nvml" if failing else "none",
            success=not failing,
            error="no_permission" if self._denied else "",
            driver_version=self._driver_version,
            devices=all_down(self._known()),
            memory_api=self.memory_api,
            parts=self._parts(False) if failing else (),
            xid=self._xid_while_away() if failing else None,
        )

    def _process_lists(self, kind: str) -> tuple[Callable[[str, Any], Any], ...]:
        """The _v3 and _v2 process-list queries of kind (Compute, Graphics), newest first,
        each reading into a buffer of the size it last needed (sized.py)."""
        out = []
        for suffix in ("_v3", "_v2"):
            symbol = f"nvmlDevice Get{kind}RunningProcesses{suffix}".replace(" ", "")
            wrapper = _optional(symbol)
            if wrapper is not None:
                out.append(lambda key, handle, s=symbol, w=wrapper: sized.process_list(self._hints, s, w, key, handle))
        return tuple(out)

    def _known(self) -> list[GpuIdentity]:
        with self._ident_lock:
            return list(self._identities.values())

    def _read_devices(self, count: int) -> tuple[list[tuple[str, GpuSample]], dict[str, Any], dict[str, float]]:
        """Every device read on the GPU readers (workers.py): the samples, the devices to watch for
        XIDs (uuid -> handle) and the part seconds summed over the reads. A device whose read
        does not return within the limit (or is still running from an earlier refresh) is down
        alone, watched by its last handle; the first error of any device is raised once all
        have answered (a defect before a library-level error)."""
        self._readers.ensure(count)  # before the deadline is set: the first refresh makes them
        now = time.monotonic()
        until = now + self._device_limit
        jobs = []
        for i in range(count):
            slot = self._workers.get(i)
            if slot is None:
                slot = self._workers[i] = GpuSlot(i)
            slow = self._cadence.due(self._key_at.get(i), now)
            jobs.append((slot, lambda i=i, slow=slow: self._read_device(i, slow)))
        # busy now: a read still in flight from an earlier refresh, which the chain passes over
        in_flight = [slot.busy for slot, _ in jobs]
        chain = self._readers.run(jobs, until, self._starts.at_once(), self._starts.expect, self._starts.alone)
        out: list[tuple[str, GpuSample]] = []
        watched: dict[str, Any] = {}
        seconds = dict.fromkeys(_PARTS, 0.0)
        error: BaseException | None = None
        defect: BaseException | None = None
        self._any_stuck = False
        for i, (submitted, done, result, err) in enumerate(self._readers.outcome(chain)):
            if not done:
                # neither started nor in flight: the refresh's deadline passed before its turn
                out.append(self._stuck_device(i, started=submitted or in_flight[i]))
                if i in self._last_watched:
                    uuid, handle = self._last_watched[i]
                    watched[uuid] = handle
                continue
            self._unstarted.discard(i)
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
            if result.slow is not None:
                self._slow_parts[result.key] = result.slow
                self._cadence.read(result.key, i, count, now)
            if result.reread:
                self._cadence.force(result.key)
        self._starts.learn(chain)
        if defect is not None:
            if error is not None:  # the library went too: re-initialise as read() would, then report the defect
                self._lost_backend(error)
            raise defect
        if error is not None:
            raise error
        return out, watched, seconds

    def _stuck_device(self, index: int, started: bool = True) -> tuple[str, GpuSample]:
        """A GPU not read in this refresh: its read in flight past the limit, or (started
        False) never started before the refresh's deadline. Reported under the key its
        worker's identity read found (also while that read is still in flight), else the one
        seen at this index before; a placeholder only for a GPU never identified."""
        self._any_stuck = True
        with self._ident_lock:  # _identify sets the key and drops the placeholder under it too
            key = self._identified_at.get(index) or self._key_at.get(index) or f"#index-{index}"
            identity = self._identities.setdefault(key, GpuIdentity(index=index))
        if not started:
            if index not in self._unstarted:
                self._unstarted.add(index)
                self._log.warning(
                    "GPU read not started: the refresh's deadline passed before its turn; reporting this GPU down this time",
                    extra=fields(collect_timeout_seconds=round(self._device_timeout, 3), gpu=index),
                )
            return key, self._down(key, DeviceDown(None, "read not started before the refresh's deadline"), identity)
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

    def _read_device(self, index: int, slow: bool = True) -> _DeviceRead:
        """One GPU's job on its worker; slow: read its slow part too (slow.py)."""
        job = self._job
        job.watch, job.seconds, job.slow, job.reread = None, dict.fromkeys(_PARTS, 0.0), None, False
        self._health.begin_job()
        try:
            key, sample = self._read_one(index, slow)
        finally:
            failed = self._health.end_job()
        return _DeviceRead(key, sample, job.watch, job.seconds, failed, job.slow, job.reread)

    def _spent(self, part: str, seconds: float) -> None:
        """Time of one collector part, on this worker's job (none outside a job)."""
        spent = getattr(self._job, "seconds", None)
        if spent is not None:
            spent[part] += seconds

    def _read_one(self, index: int, slow: bool = True) -> tuple[str, GpuSample]:
        handle = self._handles.get(index)
        cached = handle is not None
        if handle is None:
            generation = self._handles.generation  # before the lookup: a count change meanwhile wins
            refused = ""
            try:
                handle = nvml_errors.required(pynvml.nvmlDeviceGetHandleByIndex, index)
            except nvml_errors.Denied as err:  # we may not open this GPU: a failure (issue 22 item 12)
                handle, refused = None, str(err)
            except (DeviceDown, Missing):
                handle = None
            if handle is None:  # lost at handle: the device that was at this index is down
                key = self._key_at.get(index) or f"#index-{index}"
                with self._ident_lock:  # the reader and other workers iterate it
                    self._identities.setdefault(key, GpuIdentity(index=index))
                    if refused:
                        self._denied_at[index] = refused
                    else:
                        self._denied_at.pop(index, None)
                return key, self._down(key, DeviceDown(None, refused or "no handle"))
            with self._ident_lock:
                self._denied_at.pop(index, None)
            self._handles.put(index, handle, generation)
        key = self._known_key(index) if cached and not slow else None
        if key is None:
            key = self._identify(index, handle)
        uuid = self._identities[key].uuid
        if uuid:  # watched for XIDs even while its values fail: that is when XIDs come
            self._job.watch = (uuid, handle)
        try:
            sample, self._job.slow = self._read_values(key, self._identities[key], handle, slow)
            if self._job.slow is None:
                cached_part = self._slow_parts.get(key)
                for part in cached_part.failed if cached_part else ():
                    self._health.fail(part)  # a slow query that failed stays failed until read again
        except DeviceDown as err:
            self._handles.drop(index, handle)
            return key, self._down(key, err)
        if not self._up.get(key, True):
            self._log.info("GPU answering again", extra=fields(gpu=index, uuid=sample.identity.uuid))
        self._up[key] = True
        return key, sample

    def _known_key(self, index: int) -> str | None:
        """The key of the device at index without asking its UUID: its handle is still the
        cached one of this enumeration, and its identity is complete (the UUID is a slow
        value, read again on the GPU's slow reads, which catch a re-enumeration)."""
        key = self._key_at.get(index)
        with self._ident_lock:
            if key is None or key not in self._complete or key not in self._identities:
                return None
            if self._identities[key].index != index:
                return None
            self._identified_at[index] = key
        return key

    def _identify(self, index: int, handle: Any) -> str:
        """The key of the device at index now (its UUID is read on its slow reads and whenever
        the handle is new: one cheap call that catches re-enumeration), its identity read
        field by field until complete."""
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
            # from here on a read of this GPU stuck later is reported under this key (_stuck_device)
            self._identified_at[index] = key
            if key != placeholder and placeholder in self._identities:
                # the device's first answer: its uuid="" series is replaced by the real one
                self._identities.pop(placeholder)
                self._up.pop(placeholder, None)
            old = self._identities.get(key)
            if old is not None and key in self._complete:
                if old.index != index:
                    old = self._identities[key] = dataclasses.replace(old, index=index)
                return key
            if old is None:  # what is known so far, for a read that gets stuck before the rest answers
                old = self._identities[key] = GpuIdentity(index=index, uuid=uuid, pci_bus_id=pci)
        identity, complete = self._read_identity(index, handle, uuid, pci, old)
        with self._ident_lock:
            self._identities[key] = identity
            if complete:  # no identity call again until the next init
                self._complete.add(key)
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

    def _read_identity(
        self, index: int, handle: Any, uuid: str, pci: str, old: GpuIdentity | None
    ) -> tuple[GpuIdentity, bool]:
        """The identity with the fields old lacks read again, and whether it is complete:
        name and PCI bus id known, and every max clock read or positively not supported (a
        clock that failed, e.g. RESET_REQUIRED at start, is asked again on later reads)."""
        uuid = uuid or (old.uuid if old else "")  # a UUID once read is kept
        name = (old.name if old else "") or self._name(handle)
        pci = (old.pci_bus_id if old else "") or pci or self._pci_bus_id(handle)
        known = dict(old.clock_max_hertz) if old else {}
        settled = True
        for clock in CLOCK_TYPES:
            if clock in known:
                continue
            try:
                hertz = _mhz_to_hertz(self._max_clock(handle, _CLOCK_IDS[clock]))
            except DeviceDown:  # not an answer: asked again next time
                settled = False
                continue
            if hertz is not None:  # None: not supported (or no such call), which is an answer
                known[clock] = hertz
        clocks = tuple((clock, known[clock]) for clock in CLOCK_TYPES if clock in known)
        identity = GpuIdentity(index=index, uuid=uuid, name=name, pci_bus_id=pci, clock_max_hertz=clocks)
        return identity, bool(name and pci and settled)

    def _memory(self, handle: Any) -> Any:
        if self.memory_api == "v2":
            memory = self._memory_v2(handle)
            if memory is not None or self._memory_v2.available:
                return memory
            self.memory_api = "v1"  # this driver has no v2: used then includes reserved memory
        return self._memory_v1(handle)

    def _read_values(self, key: str, identity: GpuIdentity, handle: Any, slow: bool) -> tuple[GpuSample, SlowPart | None]:
        """One GPU's values: the fast ones, and the slow ones when slow (else the last slow
        read's). Returns the sample and the slow part read now (None: served from before)."""
        started = time.time()  # a slow part's time is when its read began: its values are no older
        cached = self._slow_parts.get(key)
        slow = slow or cached is None
        wanted = self._wanted  # a read whose every family is left out is not made (wanted.py)
        total = used = free = reserved = None
        memory = self._memory(handle) if "memory" in wanted else None
        if memory is not None and memory.total:  # total 0: unified-memory part, no VRAM figures
            total, used, free = memory.total, memory.used, memory.free
            reserved = getattr(memory, "reserved", None)  # v2 only
        clocks = []
        for clock in CLOCK_TYPES if "clocks" in wanted else ():
            hertz = _mhz_to_hertz(self._clock(handle, _CLOCK_IDS[clock]))
            if hertz is not None:
                clocks.append((clock, hertz))
        pstate = self._pstate(handle) if "pstate" in wanted else None
        reasons = self._throttle(handle) if "throttle" in wanted else None
        links = self._link_count(key, handle)
        fields = self._batch(key, handle, links, slow)
        power = _u32(_first(fields, nvml_fields.POWER_AVERAGE, nvml_fields.POWER_INSTANT))
        if power is None and "power" in wanted:
            power = _u32(self._power(handle))
        limit = _u32(_first(fields, nvml_fields.POWER_CURRENT_LIMIT))
        if limit is None and "power_limit" in wanted:
            limit = _u32(self._power_limit(handle))
        energy = _first(fields, nvml_fields.TOTAL_ENERGY)
        if energy is None and "energy" in wanted:
            energy = self._energy(handle)
        temperature = _celsius(_first(fields, nvml_fields.GPU_TEMP))  # sub-degree, newest drivers
        if temperature is None and "temperature" in wanted:
            temperature = _celsius(self._temperature(handle))
        busy, newest = self._busy_seconds(key, handle) if "busy" in wanted else ((), {})
        util = self._utilization(handle) if "utilization" in wanted else None  # the gauges' own calls: the contract's source
        gpu_util, memory_util = (util.gpu, util.memory) if util is not None else (None, None)
        ask = self._health.ask
        # the driver's encoder/decoder rate is its newest sample (both report over the one
        # sample period): taken from the buffer just read while it is current, else the call
        encoder = newest.get("encoder")
        if encoder is None and "encoder" in wanted:
            encoder = self._engine_percent(ask(key, "encoder", self._encoder, handle))
        decoder = newest.get("decoder")
        if decoder is None and "decoder" in wanted:
            decoder = self._engine_percent(ask(key, "decoder", self._decoder, handle))
        part = self._read_slow(key, handle, links, fields, started) if slow else cached
        assert part is not None
        replays = _first(fields, nvml_fields.PCIE_REPLAY_COUNTER)
        if replays is None and "pcie_replays" in wanted:
            replays = ask(key, "pcie_replays", self._pcie_replays, handle)
        memory_temperature = nvml_fields.in_range(fields.get((nvml_fields.MEMORY_TEMP, 0)), 1, 200)
        out: dict[str, Any] = {}
        if self._options.health and part.health is not None:
            action = self._health.recovery_action(fields)  # per refresh, on the slow part's health
            out["health"] = part.health if action == part.health.recovery_action else dataclasses.replace(part.health, recovery_action=action)
        if links:
            out["nvlinks"] = self._health.link_traffic(part.links, links, fields)
        if self._gpm is not None and wanted.gpm:
            clock = time.perf_counter()
            if self._gpm.supported(key, handle, ask):
                out["profiling"] = self._gpm.read(key, handle, ask)
            self._spent("profiling", time.perf_counter() - clock)
        out.update(self._read_mig(key, handle, part))
        sample = GpuSample(
            identity=identity,
            up=True,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            utilization_ratio=_ratio_from_percent(gpu_util),
            memory_utilization_ratio=_ratio_from_percent(memory_util),
            temperature_celsius=temperature,
            power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            energy_joules=energy / 1000.0 if energy is not None and energy != _U64_NA else None,
            fan_speed_ratio=part.fan_speed_ratio,
            clock_hertz=tuple(clocks),
            performance_state=pstate if pstate is not None and 0 <= pstate <= 15 else None,
            throttle_reasons=reasons if reasons is not None and reasons != _U64_NA else None,
            memory_temperature_celsius=float(memory_temperature) if memory_temperature is not None else None,
            encoder_utilization_ratio=_ratio_from_percent(encoder),
            decoder_utilization_ratio=_ratio_from_percent(decoder),
            busy_seconds=busy,
            clock_event_seconds=self._clock_events(key, handle, fields) if "clock_events" in wanted else (),
            pcie_bytes=self._pcie_bytes(key, fields),
            pcie_link_generation=part.pcie_link_generation,
            pcie_link_width_lanes=part.pcie_link_width_lanes,
            pcie_replays=_u32(replays),
            slow_read_at=part.read_at,
            **self._processes(key, handle),
            **out,
        )
        return sample, part if slow else None

    # -- the field batch, and the slow part ---------------------------------------------

    def _link_count(self, key: str, handle: Any) -> int:
        if not self._options.nvlink:
            return 0
        clock = time.perf_counter()
        links = self._health.link_count(key, handle, lambda wanted: self._fields_of(key, handle, wanted))
        self._spent("nvlink", time.perf_counter() - clock)
        self._has_links = self._has_links or links > 0
        return links

    def _fields_of(self, key: str, handle: Any, wanted: list[nvml_fields.Request]) -> nvml_fields.Values | None:
        ask = self._health.ask
        return nvml_fields.read(handle, wanted, lambda h, r: ask(key, "fields", self._fields, h, r, part="fields"))

    def _batch(self, key: str, handle: Any, links: int, slow: bool) -> nvml_fields.Values | dict[nvml_fields.Request, float | int]:
        """The one field-value call of this GPU and refresh: the fast fields, and the slow
        ones when slow. An empty answer is kept: it still says which entries failed."""
        wanted = self._wanted
        requests = list(self._gpu_fields)
        if self._options.health and "recovery" in wanted:
            requests.append((nvml_fields.GPU_RECOVERY_ACTION, 0))
        if "nvlink_bytes" in wanted:
            requests += self._health.link_requests(links)
        if slow:
            if self._options.health:
                requests += self._health.health_requests(wanted.reads)
            requests += self._health.link_slow_requests(links, "nvlink_state" in wanted, "nvlink_errors" in wanted)
        if not requests:
            return {}  # every family of the batch left out: no call
        answer = self._fields_of(key, handle, requests)
        return {} if answer is None else answer

    def _read_slow(self, key: str, handle: Any, links: int, fields: Any, started: float) -> SlowPart:
        """The slow values of one GPU (slow.py), read now; started: when this GPU's read began
        (the slow fields come in its field batch, before this)."""
        self._health.begin_slow()
        clock = time.perf_counter()
        health = self._health.health(key, handle, fields, self._wanted.reads) if self._options.health else None
        self._spent("health", time.perf_counter() - clock)
        clock = time.perf_counter()
        wanted = self._wanted
        state = self._health.link_state(key, handle, links, fields, "nvlink_state" in wanted, "nvlink_errors" in wanted) if links else ()
        self._spent("nvlink", time.perf_counter() - clock)
        pcie = self._pcie(key, handle) if "pcie_link" in wanted else {}
        layout = self._read_mig_layout(key, handle)
        fan = _u32(self._fan(handle)) if "fan" in wanted else None
        return SlowPart(
            read_at=started,
            fan_speed_ratio=fan / 100.0 if fan is not None else None,  # may exceed 1 (NVML docs)
            health=health,
            links=state,
            mig=layout,
            failed=self._health.end_slow(),
            **pcie,
        )

    @staticmethod
    def _engine_percent(answer: Any) -> int | None:
        return None if answer is None else int(answer[0])  # [percent, sampling period µs]

    def _clock_events(self, key: str, handle: Any, fields: Any) -> tuple[tuple[str, float], ...]:
        """Seconds per clock-event reason. A reason with an nvmlDeviceGetViolationStatus
        policy has one source per device and driver, chosen once: the field where the
        driver has it (its value answered), the violation call where it has not (the batch
        answered with that entry failed, or there are no field values at all). The two
        differ, so they are never mixed: a refresh whose batch failed leaves a reason on
        the field out, and one not chosen yet (every batch failed so far) is left out."""
        failed = fields.failed if isinstance(fields, nvml_fields.Values) else set()
        no_fields = not self._fields.available  # a driver without nvmlDeviceGetFieldValues
        out = []
        for reason, fid, policy in nvml_fields.CLOCK_EVENT_FIELDS:
            value = fields.get((fid, 0))
            if policy is not None:
                chosen = self._clock_event_source.get((key, reason))
                source = chosen[1] if chosen is not None and chosen[0] == self._driver_version else None
                decided = source is not None  # under this driver: another one chooses again
                if source is None and value is not None:
                    source = "field"
                if source is None and (no_fields or (fid, 0) in failed):
                    source = "violation"  # kept only once it answers (below)
                if source == "violation":
                    answer = self._health.ask(key, f"violation.{policy}", self._violation, handle, policy)
                    value = int(answer.violationTime) if answer is not None else None
                    if value is None and not decided:
                        source = None  # neither answered: not chosen yet
                if source is not None and not decided:
                    self._clock_event_source[(key, reason)] = (self._driver_version, source)
            if value is not None and 0 <= value < _U64_NA:
                out.append((reason, value / nvml_fields.CLOCK_EVENT_UNITS_PER_SECOND))
        return tuple(out)

    def _pcie_bytes(self, key: str, fields: Any) -> tuple[tuple[str, int], ...]:
        """Fields 197/198, documented "Value can be wrapped": unwrapped by the width of the
        entry's value type (exporter/counters.py Unwrap)."""
        bits = fields.bits if isinstance(fields, nvml_fields.Values) else {}
        out = []
        for direction, fid in (("transmit", nvml_fields.PCIE_COUNT_TX_BYTES), ("receive", nvml_fields.PCIE_COUNT_RX_BYTES)):
            value = fields.get((fid, 0))
            if value is not None and value >= 0:
                out.append((direction, self._pcie_unwrap.value((key, direction), int(value), bits.get((fid, 0)))))
        return tuple(out)

    def _pcie(self, key: str, handle: Any) -> dict[str, Any]:
        """The PCIe link now and at most (slow values)."""
        ask = self._health.ask
        slow = {"recheck": SLOW_RECHECK}
        gen_max = _pair("max", _u32(ask(key, "pcie_gen_max", self._pcie_gen_max, handle, **slow)))
        width_max = _pair("max", _u32(ask(key, "pcie_width_max", self._pcie_width_max, handle, **slow)))
        gen = _pair("current", _u32(ask(key, "pcie_gen", self._pcie_gen, handle, **slow)))
        width = _pair("current", _u32(ask(key, "pcie_width", self._pcie_width, handle, **slow)))
        return {
            "pcie_link_generation": tuple(p for p in (gen, gen_max) if p is not None),
            "pcie_link_width_lanes": tuple(p for p in (width, width_max) if p is not None),
        }

    def _busy_seconds(self, key: str, handle: Any) -> tuple[tuple[tuple[str, float], ...], dict[str, float]]:
        """Busy seconds per engine, and each engine's current utilization (percent): its
        newest sample while no newer one is due (BusyIntegrator.current)."""
        out = []
        newest: dict[str, float] = {}
        for engine, sampling_type in _SAMPLE_TYPES.items():
            if self._samples_missing:
                break
            asked = self._busy.last_seen(key, engine)
            try:
                answer = self._health.ask(
                    key, f"samples.{engine}", nvml_errors.newer,
                    sized.samples, self._hints, key, handle, sampling_type, asked, part="gpu",
                )
            except Missing:
                self._samples_missing = True
                break
            if answer is None:  # NOT_SUPPORTED (MIG mode, or this engine): absent
                self._busy.unread(key, engine)  # this engine only: the others were (or will be) read
                continue
            samples: list[tuple[int, float]] = []
            entries: Any = ()
            if answer:
                value_type, entries = answer
                for stamp, raw in entries:
                    value = nvml_fields.raw_value(value_type, raw)
                    if value is not None:
                        samples.append((stamp, float(value)))
            out.append((engine, self._busy.add(key, engine, samples, answered=len(entries))))
            current = self._busy.current(key, engine)
            if current is not None and asked:  # not after a whole-ring answer (its newest may be old)
                newest[engine] = current
        return tuple(out), newest

    def _processes(self, key: str, handle: Any) -> dict[str, Any]:
        """resmon_gpu_processes, and with the processes collector each process's memory and
        utilization. A process in both lists is one process (gpustat #84), its memory the
        larger of the two entries (the same allocation, reported twice)."""
        if not (self._options.processes or "process_count" in self._wanted):
            return {"processes": None}
        compute = self._compute_procs(key, handle)
        graphics = self._graphics_procs(key, handle)
        if compute is None and graphics is None:
            return {"processes": None}
        memory: dict[int, int | None] = {}
        for p in [*(compute or []), *(graphics or [])]:
            pid, used = int(p.pid), p.usedGpuMemory  # pynvml: None for NVML_VALUE_NOT_AVAILABLE
            used = None if used is None or used == _U64_NA else int(used)
            if pid not in memory or (used is not None and (memory[pid] is None or used > memory[pid])):  # type: ignore[operator]
                memory[pid] = used
        out: dict[str, Any] = {"processes": len(memory) if "process_count" in self._wanted else None}
        if self._options.processes:
            clock = time.perf_counter()
            ratios = self._process_utilization(key, handle, set(memory)) if "process_utilization" in self._wanted else None
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
        query = self._process_util  # once: another GPU's worker may set it to None meanwhile
        if query is None:
            return None
        if not pids:
            return {}
        # 0 (the whole buffer) now and then without new samples: a clock stepped back (SampleStamps)
        asked = self._process_seen.last_seen(key)
        try:
            answer = self._health.ask(key, "process_utilization", nvml_errors.newer, query, handle, asked, part="processes")
        except Missing:  # a driver without it: utilization absent from now on
            self._process_util = None
            return None
        if answer is None:
            return None
        seen = self._process_seen.take(key, [int(sample.timeStamp) for sample in answer])
        sums: dict[int, list[float]] = {}
        for sample in answer:
            stamp, pid = int(sample.timeStamp), int(sample.pid)
            if stamp <= seen:
                continue
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

    def _read_mig_layout(self, key: str, handle: Any) -> MigLayout | None:
        """MIG mode and devices (a slow value: one mode query per GPU and slow read for both
        users, NOT_SUPPORTED memoised); None on a GPU without MIG or with both users off."""
        if not (self._options.mig or self._options.mig_devices):
            return None
        clock = time.perf_counter()
        try:
            mode = self._mig.mode(key, handle, self._health.ask)
            if mode is None:
                return None
            return self._mig.layout(key, handle, self._health.ask, lambda: self._health.fail("mig"), mode)
        finally:
            self._spent("mig", time.perf_counter() - clock)

    def _read_mig(self, key: str, handle: Any, part: SlowPart) -> dict[str, Any]:
        """The MIG device UUIDs while MIG is on (device plugins hand these to pods; the
        kubernetes collector resolves them), and with the mig collector the mode of every
        MIG-capable GPU and the instances, their memory and GPM read now. Their GPM reads
        count as profiling time."""
        layout = part.mig
        if layout is None:
            return {}
        out: dict[str, Any] = {}
        if self._options.mig_devices:
            out["mig_uuids"] = layout.uuids
        if not self._options.mig:
            return out
        clock = time.perf_counter()
        gpm_seconds = 0.0
        try:
            def fail() -> None:
                self._health.fail("mig")
            gpm = self._gpm if self._wanted.mig_gpm else None
            out["mig"], gpm_seconds, stale = self._mig.state(key, handle, self._health.ask, fail, gpm, layout, self._memory)
            if stale:
                self._job.reread = True  # an instance's handle failed: the layout is read again next refresh
        finally:  # counted even when the GPU went down inside it
            self._spent("profiling", gpm_seconds)
            self._spent("mig", time.perf_counter() - clock - gpm_seconds)
        return out
