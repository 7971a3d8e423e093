"""One GPU's read in the NVML backend: its values (memory, clocks, power, temperature,
utilization), the field batch, clock events, PCIe, busy seconds, processes, MIG and GPM, and
its slow part (slow.py) when the cadence says so.

GpuRead is a room of NvmlBackend (a mixin: backend.py says why): the state set in _init_read
is its own (the fallbacks, readers and memos of the reads). A read runs on a GPU reader
thread (workers.py): what it finds goes back in its DeviceRead, never into the refresh's
state; the caches it shares with other readers are locked. It asks the registry for the
handle and identity (_open, _known_key, _identify) and reports a failing GPU through _down.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

import pynvml

from ...counters import Unwrap
from ...logs import fields
from ...samples import BUSY_ENGINES, CLOCK_TYPES, PROCESS_ENGINES, GpuIdentity, GpuProcess, GpuSample
from . import errors as nvml_errors
from . import fields as nvml_fields
from . import sized
from .busy import BusyIntegrator, SampleStamps
from .process_busy import ProcessBusy
from .errors import DeviceDown, Fallback as _Fallback, Missing
from .health import SLOW_RECHECK, HealthReader
from .mig import MigLayout, MigReader
from .slow import SlowPart
from .units import CLOCK_IDS, U64_NA, bind, celsius, first, mhz_to_hertz, optional, pair, ratio_from_percent, u32

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
PARTS = ("health", "nvlink", "processes", "profiling", "mig")


@dataclasses.dataclass
class DeviceRead:
    """What one GPU's worker hands back: nothing of it is written into the backend's
    per-refresh state, which a late (stuck) job could otherwise change under the reader."""

    key: str
    sample: GpuSample
    watch: tuple[str, Any] | None  # (uuid, handle) to watch for XIDs
    seconds: dict[str, float]  # time spent in each collector part on this worker
    failed: frozenset[str]  # the collector parts whose queries failed on this GPU
    slow: SlowPart | None = None  # the slow part read in this job (None: served from before)
    reread: bool = False  # something of the slow part stopped answering: read it next refresh


class GpuRead:
    """One GPU's job on its reader: identity, values, the slow part, the collector parts' time."""

    def _init_read(self) -> None:
        self._gpu_fields = tuple(r for r, read in _GPU_FIELDS if read in self._wanted)
        self._hints = sized.Hints()  # buffer sizes of the sample and process-list reads
        self.memory_api = "v2"
        # Newest call first; old drivers fall back (contract: memory v2 -> v1, TemperatureV ->
        # legacy, ClocksEventReasons -> ClocksThrottleReasons, process lists _v3 -> _v2).
        self._memory_v2 = _Fallback(lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2))
        self._memory_v1 = _Fallback(pynvml.nvmlDeviceGetMemoryInfo)
        self._temperature = _Fallback(
            bind(optional("nvmlDeviceGetTemperatureV"), pynvml.NVML_TEMPERATURE_GPU),
            bind(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        )
        self._throttle = _Fallback(
            optional("nvmlDeviceGetCurrentClocksEventReasons"),
            optional("nvmlDeviceGetCurrentClocksThrottleReasons"),
        )
        self._compute_procs = _Fallback(*self._process_lists("Compute"))
        self._graphics_procs = _Fallback(*self._process_lists("Graphics"))
        self._utilization = _Fallback(pynvml.nvmlDeviceGetUtilizationRates)
        self._power = _Fallback(pynvml.nvmlDeviceGetPowerUsage)
        self._power_limit = _Fallback(pynvml.nvmlDeviceGetEnforcedPowerLimit)
        self._energy = _Fallback(pynvml.nvmlDeviceGetTotalEnergyConsumption)
        self._fan = _Fallback(pynvml.nvmlDeviceGetFanSpeed)
        self._clock = _Fallback(pynvml.nvmlDeviceGetClockInfo)
        self._pstate = _Fallback(pynvml.nvmlDeviceGetPerformanceState)
        # v2: gpu additions, health, nvlink, xid; called through HealthReader.ask: a failure
        # other than a lost GPU leaves the value out instead of taking the device down
        self._fields = _Fallback(nvml_fields.get_field_values if optional("nvmlDeviceGetFieldValues") else None)
        self._violation = _Fallback(optional("nvmlDeviceGetViolationStatus"))
        self._encoder = _Fallback(pynvml.nvmlDeviceGetEncoderUtilization)
        self._decoder = _Fallback(pynvml.nvmlDeviceGetDecoderUtilization)
        self._pcie_gen = _Fallback(pynvml.nvmlDeviceGetCurrPcieLinkGeneration)
        self._pcie_gen_max = _Fallback(
            optional("nvmlDeviceGetGpuMaxPcieLinkGeneration"), pynvml.nvmlDeviceGetMaxPcieLinkGeneration
        )
        self._pcie_width = _Fallback(pynvml.nvmlDeviceGetCurrPcieLinkWidth)
        self._pcie_width_max = _Fallback(pynvml.nvmlDeviceGetMaxPcieLinkWidth)
        self._pcie_replays = _Fallback(pynvml.nvmlDeviceGetPcieReplayCounter)
        self._samples_missing = optional("nvmlDeviceGetSamples") is None
        self._process_util = optional("nvmlDeviceGetProcessUtilization")
        self._process_seen = SampleStamps()  # device key -> newest process sample timestamp (µs)
        self._process_busy = ProcessBusy()  # the same samples integrated: busy seconds per process
        self._mig = MigReader()
        self._busy = BusyIntegrator()
        self._health = HealthReader(self._log)  # also the "not supported on this board" memo
        # PCIe bytes unwrapped by their width (exporter/counters.py)
        self._pcie_unwrap = Unwrap()
        # (key, reason) -> (driver version, "field" | "violation"): one clock-event source each
        self._clock_event_source: dict[tuple[str, str], tuple[str, str]] = {}
        # the worker thread's own job: its (uuid, handle) and part seconds, returned with its result
        self._job = threading.local()
        self._has_links = False  # a device with NVLinks was seen: the nvlink collector is active

    def _process_lists(self, kind: str) -> tuple[Callable[[str, Any], Any], ...]:
        """The _v3 and _v2 process-list queries of kind (Compute, Graphics), newest first,
        each reading into a buffer of the size it last needed (sized.py)."""
        out = []
        for suffix in ("_v3", "_v2"):
            symbol = f"nvmlDevice Get{kind}RunningProcesses{suffix}".replace(" ", "")
            wrapper = optional(symbol)
            if wrapper is not None:
                out.append(lambda key, handle, s=symbol, w=wrapper: sized.process_list(self._hints, s, w, key, handle))
        return tuple(out)

    def _read_device(self, index: int, slow: bool = True) -> DeviceRead:
        """One GPU's job on its worker; slow: read its slow part too (slow.py)."""
        job = self._job
        job.watch, job.seconds, job.slow, job.reread = None, dict.fromkeys(PARTS, 0.0), None, False
        self._health.begin_job()
        try:
            key, sample = self._read_one(index, slow)
        finally:
            failed = self._health.end_job()
        return DeviceRead(key, sample, job.watch, job.seconds, failed, job.slow, job.reread)

    def _spent(self, part: str, seconds: float) -> None:
        """Time of one collector part, on this worker's job (none outside a job)."""
        spent = getattr(self._job, "seconds", None)
        if spent is not None:
            spent[part] += seconds

    def _read_one(self, index: int, slow: bool = True) -> tuple[str, GpuSample]:
        handle, cached, lost = self._open(index)
        if lost is not None:  # lost at handle: the device that was at this index is down
            return lost
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
            hertz = mhz_to_hertz(self._clock(handle, CLOCK_IDS[clock]))
            if hertz is not None:
                clocks.append((clock, hertz))
        pstate = self._pstate(handle) if "pstate" in wanted else None
        reasons = self._throttle(handle) if "throttle" in wanted else None
        links = self._link_count(key, handle)
        fields = self._batch(key, handle, links, slow)
        power = u32(first(fields, nvml_fields.POWER_AVERAGE, nvml_fields.POWER_INSTANT))
        if power is None and "power" in wanted:
            power = u32(self._power(handle))
        limit = u32(first(fields, nvml_fields.POWER_CURRENT_LIMIT))
        if limit is None and "power_limit" in wanted:
            limit = u32(self._power_limit(handle))
        energy = first(fields, nvml_fields.TOTAL_ENERGY)
        if energy is None and "energy" in wanted:
            energy = self._energy(handle)
        temperature = celsius(first(fields, nvml_fields.GPU_TEMP))  # sub-degree, newest drivers
        if temperature is None and "temperature" in wanted:
            temperature = celsius(self._temperature(handle))
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
        replays = first(fields, nvml_fields.PCIE_REPLAY_COUNTER)
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
            utilization_ratio=ratio_from_percent(gpu_util),
            memory_utilization_ratio=ratio_from_percent(memory_util),
            temperature_celsius=temperature,
            power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            energy_joules=energy / 1000.0 if energy is not None and energy != U64_NA else None,
            fan_speed_ratio=part.fan_speed_ratio,
            clock_hertz=tuple(clocks),
            performance_state=pstate if pstate is not None and 0 <= pstate <= 15 else None,
            throttle_reasons=reasons if reasons is not None and reasons != U64_NA else None,
            memory_temperature_celsius=float(memory_temperature) if memory_temperature is not None else None,
            encoder_utilization_ratio=ratio_from_percent(encoder),
            decoder_utilization_ratio=ratio_from_percent(decoder),
            busy_seconds=busy,
            clock_event_seconds=self._clock_events(key, handle, fields) if "clock_events" in wanted else (),
            pcie_bytes=self._pcie_bytes(key, fields),
            pcie_link_generation=part.pcie_link_generation,
            pcie_link_width_lanes=part.pcie_link_width_lanes,
            pcie_replays=u32(replays),
            slow_read_at=part.read_at,
            **self._processes(key, handle),
            **out,
        )
        return sample, part if slow else None

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
        fan = u32(self._fan(handle)) if "fan" in wanted else None
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
            if value is not None and 0 <= value < U64_NA:
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
        gen_max = pair("max", u32(ask(key, "pcie_gen_max", self._pcie_gen_max, handle, **slow)))
        width_max = pair("max", u32(ask(key, "pcie_width_max", self._pcie_width_max, handle, **slow)))
        gen = pair("current", u32(ask(key, "pcie_gen", self._pcie_gen, handle, **slow)))
        width = pair("current", u32(ask(key, "pcie_width", self._pcie_width, handle, **slow)))
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
            used = None if used is None or used == U64_NA else int(used)
            if pid not in memory or (used is not None and (memory[pid] is None or used > memory[pid])):  # type: ignore[operator]
                memory[pid] = used
        out: dict[str, Any] = {"processes": len(memory) if "process_count" in self._wanted else None}
        if self._options.processes:
            clock = time.perf_counter()
            ratios = self._process_utilization(key, handle, set(memory)) if "process_utilization" in self._wanted else None
            out["process_list"] = tuple(
                GpuProcess(pid, used, *(ratios.get(pid, ((), ())) if ratios is not None else ((), ())))
                for pid, used in sorted(memory.items())
            )
            self._spent("processes", time.perf_counter() - clock)
        return out

    def _process_utilization(
        self, key: str, handle: Any, pids: set[int]
    ) -> dict[int, tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]] | None:
        """Each listed process's mean utilization per engine over the driver's samples since
        the previous refresh (a listed process without new samples was idle: 0), and its busy
        seconds per engine, those samples integrated (process_busy.py). None where the GPU
        does not report it (MIG on). The newest timestamp is passed back, so a sample is
        counted once; samples of processes no longer listed are dropped."""
        query = self._process_util  # once: another GPU's worker may set it to None meanwhile
        if query is None:
            return None
        if not pids:
            self._process_busy.add(key, (), ())  # the processes that were listed ended
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
        new: list[tuple[int, int, list[float]]] = []
        for sample in answer:
            stamp, pid = int(sample.timeStamp), int(sample.pid)
            if stamp <= seen:
                continue
            if pid not in pids:  # exited since, or a stale entry of the driver's buffer
                continue
            acc = sums.setdefault(pid, [0.0] * (len(PROCESS_ENGINES) + 1))
            values = [min(max(float(getattr(sample, attr)), 0.0), 100.0) for _, attr in PROCESS_ENGINES]  # >100 seen (nvtop #110)
            for i, value in enumerate(values):
                acc[i] += value
            acc[-1] += 1
            new.append((stamp, pid, values))
        busy = self._process_busy.add(key, new, pids)
        out = {}
        for pid in pids:
            acc = sums.get(pid)
            out[pid] = (tuple(
                (engine, (acc[i] / acc[-1] / 100.0) if acc else 0.0) for i, (engine, _) in enumerate(PROCESS_ENGINES)
            ), busy[pid])
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
            out["mig_slots"] = layout.slots  # the same devices by GPU instance placement (DRA names)
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
