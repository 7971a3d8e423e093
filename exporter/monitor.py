"""ResourceMonitor: one cached snapshot of GPUs and host, shared by /metrics and the Python API.

A snapshot younger than cache_ttl is reused; concurrent callers share one refresh (single
flight), and every caller waits at most its own deadline. GPU reads run on one reader
thread (start-up probing first, outside every deadline); the NVML backend reads each GPU on
a worker of its own under it, so a GPU whose read is in flight longer than collect_timeout
is down alone while the others report (amdgpu and intel read each card on a thread of its
own too; gpu-tracker reads as one unit). A read in
flight longer than collect_timeout (NVML: a call outside any one GPU, a little later) is a
hung driver: known GPUs are reported down until it returns. A caller
whose own, shorter deadline expires first gets the last completed reading with the GPU
collector marked unsuccessful, and that answer is not cached for anyone else.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .accounting import Accounting
from .attribution import Attribution
from .backends import GpuBackend, GpuOptions, make_backend
from .config import MonitorOptions, options_from_keywords
from .host import HostReader
from .logs import LOGGER_NAME, fields
from .samples import CollectorStatus, GpuReading, HostSample, ProcessUsage, Snapshot

GIB = 1024**3
_MAX_WAIT = 86400.0  # the longest any caller may ask to wait, seconds
# A read whose caller gave it the whole --collect.timeout may have started a moment after
# the caller did: it counts as hung this much early.
_HUNG_SLACK = 0.05
# A backend that bounds each GPU's read itself (NVML: one worker per GPU) returns within
# --collect.timeout with a hung GPU down alone; its whole read counts as hung (every GPU down)
# only later, when a call outside any one GPU (the device count) hangs. The margin leaves the
# healthy GPUs and the read's tail (after the slow GPU's limit of --collect.timeout - 0.1 s)
# room on a loaded machine: at least _DEVICE_GRACE_MIN, a quarter of the timeout on long ones.
_DEVICE_GRACE_MIN = 1.0
_DEVICE_GRACE_SHARE = 0.25


def device_grace(timeout: float) -> float:
    """How much longer than --collect.timeout a per-GPU-bounded read may run before it counts as hung."""
    return max(_DEVICE_GRACE_MIN, _DEVICE_GRACE_SHARE * timeout)


MAI_KEYS: tuple[str, ...] = (
    "memory_percent",
    "cpu_percent",
    "available_memory_gb",
    "gpu_vram_gb",
    "gpu_total_vram_gb",
    "gpu_used_vram_gb",
    "gpu_free_vram_gb",
    "gpu_utilization_percent",
    "gpu_temperature_c",
)


@dataclass(frozen=True, slots=True)
class _Completed:
    """One finished GPU read."""

    reading: GpuReading
    duration_seconds: float
    timestamp_seconds: float  # Unix time the read finished
    started_monotonic: float
    seq: int


class _GpuReader:
    """The one thread that talks to the GPU backend: prepare() once, then a read whenever one
    is asked for and none is in flight (a hung call never piles up threads), then, when the
    monitor closes, backend.close() after the last read on the same thread (so NVML is never
    shut down under a running call, nvitop #222). Idle, it blocks on a condition: no wakeups."""

    def __init__(self, backend: GpuBackend, log: logging.Logger) -> None:
        self._backend = backend
        self._log = log
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wanted = False
        self._inflight_since: float | None = None  # monotonic start of the running read
        self._prepared = False
        self._closing = False
        self._finished = False  # the thread has closed the backend and ended
        self.last: _Completed | None = None
        self._seq = 0

    @property
    def prepared(self) -> bool:
        return self._prepared

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def completed(self) -> int:
        return self._seq

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="resmon-gpu", daemon=True)
            self._thread.start()

    def ensure(self, now: float, max_age: float) -> int:
        """Make sure a reading at most max_age old (by its start) is or will be available;
        returns the completion number to wait for."""
        with self._cond:
            if self._closing:
                return self._seq  # no new reads: the caller gets the last one
            self._start_locked()
            if self._inflight_since is not None or self._wanted:
                return self._seq + 1
            last = self.last
            if last is not None and last.started_monotonic >= now - max_age:
                return last.seq  # a read that finished after an earlier caller gave up on it
            self._wanted = True
            self._cond.notify_all()
            return self._seq + 1

    def wait(self, target: int, until: float) -> _Completed | None:
        """The completion numbered target (or later), waiting until the monotonic time until."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq >= target or self._finished, max(0.0, until - time.monotonic()))
            return self.last if self._seq >= target else None

    def inflight_age(self, now: float) -> float | None:
        since = self._inflight_since
        return None if since is None else now - since

    def _run(self) -> None:
        with self._cond:
            closing = self._closing
        if not closing:
            self._call("prepare", self._backend.prepare)
        with self._cond:
            self._prepared = True
            self._cond.notify_all()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted or self._closing)
                if self._closing:
                    break
                self._wanted = False
                started = self._inflight_since = time.monotonic()
            clock = time.perf_counter()
            reading = self._call("read", self._backend.read)
            duration = time.perf_counter() - clock
            with self._cond:
                self._seq += 1
                self.last = _Completed(reading or self._failed(), duration, time.time(), started, self._seq)
                self._inflight_since = None
                self._cond.notify_all()
        self._call("close", self._backend.close)
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def _failed(self) -> GpuReading:
        """A read that raised: the devices of the last reading, down (not vanished)."""
        if self.last is None:
            return GpuReading(backend=self._backend.name, success=False)
        return self.last.reading.down()

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # a backend must not raise; if it does, report, don't crash
            self._log.error(
                f"GPU backend {what} failed", exc_info=True, extra=fields(error=f"{exc.__class__.__name__}: {exc}")
            )
            return None

    def close(self, drain: float, release: float = 0.0) -> bool:
        """No new reads; the backend is closed on the reader's thread once it is idle. True
        when that happened within drain seconds, and (release > 0) the backend's background
        work (the XID watcher's event wait) let go of the driver within release seconds more."""
        interrupt = getattr(self._backend, "interrupt", None)
        if interrupt is not None:
            try:
                interrupt()  # background work (the XID watcher) ends alongside the drain
            except Exception:  # closing goes on regardless
                self._log.debug("backend interrupt failed", exc_info=True)
        with self._cond:
            self._closing = True
            self._wanted = False
            self._start_locked()  # never started: it only closes the backend
            self._cond.notify_all()
            thread = self._thread
        assert thread is not None
        thread.join(drain)
        if thread.is_alive():
            return False
        released = getattr(self._backend, "wait_released", None)
        return release <= 0 or released is None or bool(released(release))


def _gpu_options(options: MonitorOptions) -> GpuOptions:
    """What the GPU backend reads along with the GPUs, from the monitor's options."""
    on = options.enabled
    return GpuOptions(
        health=on("health"), nvlink=on("nvlink"), xid=on("xid"), processes=on("processes"),
        profiling=on("profiling"), mig=on("mig"), mig_devices=on("kubernetes"), sysfs=options.sysfs,
        procfs=options.processes.procfs,
        slow_interval=options.slow_interval, metrics=options.metrics,
    )


class ResourceMonitor:
    """GPU and host resources, cached for options.cache_ttl seconds.

    options: a MonitorOptions (exporter/config.py: the collectors, the timeouts, the paths),
    as the CLI builds it from its flags. The keyword arguments of earlier releases
    (cache_ttl, collect_timeout, gpu_backend, collect_<collector>, processes_group_by,
    processes_max_per_gpu, procfs, sysfs, pod_resources_socket, kubernetes_cache_ttl,
    pod_logs_dir, container_logs_dir) still work, applied on top of options.
    memory_threshold and cpu_threshold (percent) keep the Mai assistant's
    is_system_overloaded() working. backend: a GpuBackend object to use instead of
    options.gpu_backend. Use it as a context manager, or call close(), to stop its thread
    and release NVML.
    """

    def __init__(
        self,
        memory_threshold: float = 80.0,
        cpu_threshold: float = 80.0,
        *,
        options: MonitorOptions | None = None,
        logger: logging.Logger | None = None,
        backend: GpuBackend | None = None,
        **keywords: Any,
    ) -> None:
        options = options_from_keywords(options, keywords) if keywords else options or MonitorOptions()
        self.options = options
        self.memory_threshold = memory_threshold
        self.cpu_threshold = cpu_threshold
        self._ttl = options.cache_ttl
        self._timeout = options.collect_timeout
        self._log = logger or logging.getLogger(LOGGER_NAME)
        if options.enabled("gpu") and backend is None:
            backend = make_backend(options.gpu_backend, self._log, options.collect_timeout, _gpu_options(options))
        self._backend: GpuBackend | None = backend if options.enabled("gpu") else None
        self._reader = _GpuReader(self._backend, self._log) if self._backend is not None else None
        self._host = HostReader() if options.enabled("host") else None
        # how /metrics groups and caps process series (and caps allocations): attributes, as
        # they always were, read on every scrape and refresh
        self.processes_group_by = options.processes.group_by
        self.processes_max_per_gpu = options.processes.max_per_gpu
        self._attribution = Attribution(options, options.enabled("processes") and self._backend is not None, self._log)
        self._accounting = Accounting()  # busy time and energy per workload (processes collector)
        self._host_lock = threading.Lock()
        self._cond = threading.Condition()
        self._snapshot: Snapshot | None = None
        self._generation = 0
        self._refreshing = False
        self._gpu_stuck = False
        self._started = False
        self._closed = False
        if self._reader is not None:
            # a monitor dropped without close() still stops its thread and releases NVML
            weakref.finalize(self, self._reader.close, 0.0)

    def __enter__(self) -> "ResourceMonitor":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Begin start-up probing, the first GPU read and the kubelet's first List in the
        background. After start(), a caller never waits for start-up: until the first read
        completes it gets host values and the GPU collector unsuccessful (the CLI serves
        /metrics this way). Without start(), the first caller waits for start-up up to its
        deadline."""
        self._started = True
        if self._reader is not None:
            self._reader.ensure(time.monotonic(), 0.0)
        self._attribution.start()

    # -- snapshot ---------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once the first GPU read has completed (at once without the GPU collector)."""
        return self._reader is None or self._reader.completed > 0

    def snapshot(self, timeout: float | None = None) -> Snapshot:
        """The current snapshot, refreshed if older than the TTL. timeout: this caller's own
        deadline in seconds (default: collect_timeout); it is never exceeded."""
        started = time.monotonic()
        if self._closed:
            # no reads after close(): the last snapshot, its GPU part unsuccessful (a scrape
            # racing the shutdown); the Python API raises instead (_open_snapshot)
            return self._late(self._snapshot, started)
        # bounded: a huge timeout would overflow the condition waits
        deadline = started + (self._timeout if timeout is None else min(max(0.0, timeout), _MAX_WAIT))
        late = False
        with self._cond:
            generation = self._generation
            while True:
                snap = self._snapshot
                if snap is not None and (
                    self._generation != generation or time.monotonic() - snap.taken_monotonic < self._ttl
                ):
                    return snap
                if snap is not None and self._closed:
                    return self._late(snap, started)  # closed meanwhile: no new GPU reads
                if not self._refreshing:
                    self._refreshing = True
                    break
                if not self._cond.wait(deadline - time.monotonic()) and time.monotonic() >= deadline:
                    late = True
                    break
        if late:  # outside the lock: _late may read the host
            return self._late(snap, started)
        snap, publish = None, False
        try:
            snap, publish = self._refresh(started, deadline)
        finally:
            with self._cond:
                if publish and snap is not None:
                    self._snapshot = snap
                    self._generation += 1
                self._refreshing = False
                self._cond.notify_all()
        return snap

    def host_snapshot(self) -> Snapshot:
        """The host part alone (/metrics?collect[]=host): the current snapshot while it is
        younger than the TTL, else a host read of its own, which reads no GPU and is not
        cached (the next full snapshot still reads the GPUs)."""
        with self._cond:
            snap = self._snapshot
        if snap is not None and time.monotonic() - snap.taken_monotonic < self._ttl:
            return snap
        host, host_status = self._read_host()
        return Snapshot(gpu=None, gpu_status=None, host=host, host_status=host_status, taken_monotonic=time.monotonic())

    def _late(self, snap: Snapshot | None, started: float) -> Snapshot:
        """For a caller whose deadline passed while another caller's refresh ran: the last
        snapshot as it was, the GPU part marked unsuccessful."""
        waited = time.monotonic() - started
        if snap is None:
            host, host_status = self._read_host()
            last = self._reader.last if self._reader is not None else None
            return Snapshot(
                gpu=last.reading if last else None,
                gpu_status=CollectorStatus(False, waited, last.timestamp_seconds if last else None) if self._reader else None,
                host=host,
                host_status=host_status,
                taken_monotonic=time.monotonic(),
            )
        if snap.gpu_status is None:
            return snap
        return dataclasses.replace(snap, gpu_status=CollectorStatus(False, waited, snap.gpu_status.timestamp_seconds))

    def _refresh(self, started: float, deadline: float) -> tuple[Snapshot, bool]:
        """A new snapshot, and whether it may be cached for other callers."""
        reader = self._reader
        # The host first (0.2-0.3 ms): a GPU read starting meanwhile would share the GIL with
        # it, and its first calls would look blocked on the driver (backends/nvml/workers.py's probe).
        host, host_status = self._read_host()
        target = reader.ensure(started, self._ttl) if reader is not None else 0
        gpu: GpuReading | None = None
        gpu_status: CollectorStatus | None = None
        complete = True
        if reader is not None:
            gpu, gpu_status, complete = self._await_gpu(reader, target, started, deadline)
        who = self._attribution.refresh(gpu, deadline, self.processes_max_per_gpu)
        usage, workloads, unattributed = (), (), ()
        if who.processes is not None and gpu_status is not None and gpu_status.timestamp_seconds is not None:
            # the reading's own time: a reading served again (a late caller) adds nothing
            accounted = self._accounting.update(who.gpu, who.processes, self.processes_group_by, gpu_status.timestamp_seconds)
            usage, workloads, unattributed = accounted.processes, accounted.workloads, accounted.unattributed
        snap = Snapshot(
            gpu=who.gpu, gpu_status=gpu_status, host=host, host_status=host_status, taken_monotonic=time.monotonic(),
            processes=who.processes, allocations=who.allocations, kubernetes_status=who.kubernetes_status,
            workloads=workloads, unattributed_energy=unattributed, process_usage=usage,
            unresolved_devices=who.unresolved_devices,
        )
        return snap, complete

    def _await_gpu(
        self, reader: _GpuReader, target: int, started: float, deadline: float
    ) -> tuple[GpuReading | None, CollectorStatus, bool]:
        while True:
            now = time.monotonic()
            until = deadline
            if self._started and not reader.prepared:
                until = now  # start-up probing is not waited for by a scrape
            age = reader.inflight_age(now)
            if age is not None:
                until = min(until, now - age + self._hung_after())  # when the read becomes "hung"
            done = reader.wait(target, until)
            if done is not None:
                if self._gpu_stuck:
                    self._log.info("GPU read returned; collection resumed")
                    self._gpu_stuck = False
                return done.reading, CollectorStatus(done.reading.success, done.duration_seconds, done.timestamp_seconds), True
            now = time.monotonic()
            age = reader.inflight_age(now)
            if age is not None and age >= self._hung_after():
                return self._hung(reader, age)
            if now >= deadline or reader.closing or (self._started and not reader.prepared):
                if not reader.prepared:
                    self._started = True  # one caller waited on start-up: later ones do not
                # this caller's own deadline came first: the last completed reading, as it was
                last = reader.last
                status = CollectorStatus(False, now - started, last.timestamp_seconds if last else None)
                return (last.reading if last else None), status, False
            # the read started while we waited (start-up finished): wait again with its limit

    def _hung_after(self) -> float:
        if getattr(self._backend, "device_deadlines", False):
            return self._timeout + device_grace(self._timeout)
        return self._timeout - _HUNG_SLACK

    def _hung(self, reader: _GpuReader, age: float) -> tuple[GpuReading | None, CollectorStatus, bool]:
        if not self._gpu_stuck:
            self._log.warning(
                "GPU read in flight longer than --collect.timeout; reporting GPUs down until it returns",
                extra=fields(collect_timeout_seconds=round(self._timeout, 3), in_flight_seconds=round(age, 3)),
            )
        self._gpu_stuck = True
        last = reader.last
        status = CollectorStatus(False, age, last.timestamp_seconds if last else None)
        if last is None:
            return None, status, True  # never read: no devices to report down, and no count
        return last.reading.down(), status, True

    def _read_host(self) -> tuple[HostSample | None, CollectorStatus | None]:
        if self._host is None:
            return None, None
        start = time.perf_counter()
        try:
            with self._host_lock:  # the CPU delta is state: one reader at a time
                sample: HostSample | None = self._host.read()
        except Exception as exc:  # /proc unreadable etc.: host collector fails, GPUs keep flowing
            self._log.error("host read failed", extra=fields(error=f"{exc.__class__.__name__}: {exc}"))
            sample = None
        return sample, CollectorStatus(sample is not None, time.perf_counter() - start, time.time())

    def close(self, drain: float = 2.0, release: float = 0.0) -> None:
        """Stop the GPU thread and release NVML: no new reads start, an in-flight one gets
        drain seconds to finish, and if it does not, NVML is left alone (shutting NVML down
        under a running call can crash the process, nvitop #222). The XID watcher's event
        wait (up to 0.5 s) is not waited out: the watcher shuts NVML down on its way out;
        release > 0 waits that long for it (the CLI, about to exit, does). Idempotent. Afterwards the
        Python API methods raise RuntimeError, and snapshot() (a scrape racing the shutdown)
        gives the last snapshot with the GPU collector unsuccessful."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        if self._reader is not None and not self._reader.close(drain, release):
            self._log.warning("GPU call still in flight at shutdown; leaving NVML as it is")

    # -- Mai API ----------------------------------------------------------------------

    def _open_snapshot(self) -> Snapshot:
        """snapshot() for the Python API, which refuses to answer after close(): a frozen
        last reading would say "success" and "fits" forever."""
        if self._closed:
            raise RuntimeError("ResourceMonitor is closed")
        return self.snapshot()

    def get_current_resources(self) -> dict[str, float]:
        """The nine Mai keys (GiB and percent, GPU index 0, 0.0 where missing), from the
        same cached snapshot that /metrics serves."""
        snap = self._open_snapshot()
        out = dict.fromkeys(MAI_KEYS, 0.0)
        host = snap.host
        if host is not None:
            if host.memory_total_bytes > 0:
                out["memory_percent"] = host.memory_used_bytes / host.memory_total_bytes * 100.0
            out["cpu_percent"] = host.cpu_utilization_ratio * 100.0
            out["available_memory_gb"] = host.memory_available_bytes / GIB
        gpu = snap.gpu_by_index(0)
        if gpu is not None and gpu.up:
            if gpu.memory_total_bytes is not None:
                out["gpu_total_vram_gb"] = gpu.memory_total_bytes / GIB
            if gpu.memory_used_bytes is not None:
                out["gpu_used_vram_gb"] = gpu.memory_used_bytes / GIB
            if gpu.memory_free_bytes is not None:
                out["gpu_free_vram_gb"] = gpu.memory_free_bytes / GIB
                out["gpu_vram_gb"] = out["gpu_free_vram_gb"]
            if gpu.utilization_ratio is not None:
                out["gpu_utilization_percent"] = gpu.utilization_ratio * 100.0
            if gpu.temperature_celsius is not None:
                out["gpu_temperature_c"] = gpu.temperature_celsius
        return out

    def get_gpus(self) -> list[dict[str, Any]]:
        """One dict per GPU from the same snapshot as /metrics: index, uuid, name, up, memory
        total/used/free in bytes, utilization and memory utilization ratios (0-1),
        temperature (celsius), power (watts); None where the device does not report it."""
        snap = self._open_snapshot()
        if snap.gpu is None:
            return []
        return [
            {
                "index": g.identity.index,
                "uuid": g.identity.uuid,
                "name": g.identity.name,
                "up": g.up,
                "memory_total_bytes": g.memory_total_bytes,
                "memory_used_bytes": g.memory_used_bytes,
                "memory_free_bytes": g.memory_free_bytes,
                "utilization_ratio": g.utilization_ratio,
                "memory_utilization_ratio": g.memory_utilization_ratio,
                "temperature_celsius": g.temperature_celsius,
                "power_watts": g.power_watts,
            }
            for g in snap.gpu.devices
        ]

    def get_gpu_processes(self) -> list[dict[str, Any]]:
        """The processes on the GPUs, from the same snapshot as /metrics (one entry per
        process and GPU, largest VRAM first): gpu index, uuid, pid, process (its comm),
        user, memory_bytes (None where the driver hides it), utilization (engine -> ratio
        since the previous refresh), busy_seconds (engine -> seconds the process kept it busy
        since the exporter first saw it; empty where the GPU has no per-process busy time),
        energy_joules (its share of the GPU's energy since then; None where the GPU has no
        energy counter or no per-process busy time), container_id, pod_uid, namespace, pod,
        container, job_id ("" where unknown). Empty when the processes collector is off
        (collect_processes=False)."""
        snap = self._open_snapshot()
        rows = sorted(snap.processes or (), key=lambda p: (-(p.memory_bytes or 0), p.gpu, p.pid))
        usage = {(u.gpu, u.uuid, u.pid): u for u in snap.process_usage}
        none = ProcessUsage(0, "", 0, (), None)
        return [
            {
                "gpu": p.gpu, "uuid": p.uuid, "pid": p.pid, "process": p.process, "user": p.user,
                "memory_bytes": p.memory_bytes, "utilization": dict(p.utilization),
                "busy_seconds": dict((u := usage.get((p.gpu, p.uuid, p.pid), none)).busy_seconds),
                "energy_joules": u.energy_joules,
                "container_id": p.container_id, "pod_uid": p.pod_uid,
                "namespace": p.namespace, "pod": p.pod, "container": p.container, "job_id": p.job_id,
            }
            for p in rows
        ]

    def can_load_model(self, model_size_gb: float, *, device: str = "gpu") -> bool:
        """Does a model of this many GiB fit now? One rule (docs/api.md):

        - always: available host RAM >= 1.5 x the size (loading stages the weights in RAM);
        - device="gpu" (the default): and one GPU that is up has free VRAM >= the size (the
          largest free VRAM of any single GPU: a model is not split across GPUs here). No
          GPU, the GPU collector off, or a GPU read that failed or timed out: False, since
          no GPU is known to fit. A GPU that reports no VRAM figures (unified memory) fits
          when the RAM rule does;
        - device="cpu": the RAM rule alone, for a model run on the CPU."""
        if device not in ("gpu", "cpu"):
            raise ValueError(f"device must be 'gpu' or 'cpu', not {device!r}")
        snap = self._open_snapshot()
        host = snap.host
        if host is None or host.memory_available_bytes / GIB < model_size_gb * 1.5:
            return False
        if device == "cpu":
            return True
        if self._reader is None:
            return False  # GPU collector off: no GPU is known
        status, reading = snap.gpu_status, snap.gpu
        if reading is None or status is None or not status.success:
            return False  # cannot see the GPUs right now
        return any(
            gpu.memory_free_bytes is None or gpu.memory_free_bytes / GIB >= model_size_gb
            for gpu in reading.devices
            if gpu.up
        )

    def is_system_overloaded(self) -> bool:
        res = self.get_current_resources()
        return res["memory_percent"] > self.memory_threshold or res["cpu_percent"] > self.cpu_threshold

    def get_best_model_size(self) -> str:
        """Mai's tiers by available RAM: large >= 8 GiB, medium >= 4 GiB, else small."""
        available = self.get_current_resources()["available_memory_gb"]
        if available >= 8:
            return "large"
        if available >= 4:
            return "medium"
        return "small"
