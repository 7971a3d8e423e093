"""ResourceMonitor: one cached snapshot of GPUs and host, shared by /metrics and the Python API.

A snapshot younger than cache_ttl is reused. Concurrent callers share one refresh (single
flight). GPU reads run on one worker thread and are awaited at most until the collection
deadline: a hung driver call makes that refresh report the GPU collector failed and every
known GPU down, while host values stay fresh; no second GPU read starts while one hangs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Generic, TypeVar

from .backends import GpuBackend, make_backend
from .host import HostReader
from .logs import LOGGER_NAME, fields
from .samples import CollectorStatus, GpuReading, GpuSample, HostSample, Snapshot

GIB = 1024**3
T = TypeVar("T")

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


class _Worker(Generic[T]):
    """A single daemon thread running fn on demand. submit() while a run is in flight returns
    that run's future, so a hung call never piles up threads. Idle, it blocks on a queue:
    no wakeups."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Future[T]] = queue.SimpleQueue()
        self._pending: Future[T] | None = None
        self._thread: threading.Thread | None = None

    def submit(self) -> Future[T]:
        with self._lock:
            if self._pending is not None and not self._pending.done():
                return self._pending
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._pending = Future()
            self._jobs.put(self._pending)
            return self._pending

    def wait_idle(self, timeout: float) -> bool:
        """True once no run is in flight (waiting up to timeout seconds)."""
        with self._lock:
            pending = self._pending
        if pending is None:
            return True
        try:
            pending.exception(timeout=timeout)
        except FutureTimeout:
            return False
        return True

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.set_result(self._fn())
            except BaseException as exc:  # keep the worker alive; the caller sees the error
                job.set_exception(exc)


class ResourceMonitor:
    """GPU and host resources, cached for cache_ttl seconds.

    memory_threshold and cpu_threshold (percent) keep the Mai assistant's
    is_system_overloaded() working; the keyword arguments match the CLI flags.
    """

    def __init__(
        self,
        memory_threshold: float = 80.0,
        cpu_threshold: float = 80.0,
        *,
        cache_ttl: float = 1.0,
        collect_timeout: float = 5.0,
        gpu_backend: str = "auto",
        collect_gpu: bool = True,
        collect_host: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        self.memory_threshold = memory_threshold
        self.cpu_threshold = cpu_threshold
        self._ttl = cache_ttl
        self._timeout = collect_timeout
        self._log = logger or logging.getLogger(LOGGER_NAME)
        self._backend: GpuBackend | None = make_backend(gpu_backend, self._log, collect_timeout) if collect_gpu else None
        self._gpu_worker = _Worker(self._read_gpu, "resmon-gpu") if self._backend else None
        self._host = HostReader() if collect_host else None
        self._cond = threading.Condition()
        self._snapshot: Snapshot | None = None
        self._generation = 0
        self._refreshing = False
        self._gpu_stuck = False
        self._closed = False

    def start(self) -> None:
        """Begin start-up probing and the first read in the background (the CLI calls this;
        an application may, to have data before its first call)."""
        threading.Thread(target=self.snapshot, name="resmon-first-refresh", daemon=True).start()

    # -- snapshot ---------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once the first refresh has completed."""
        return self._snapshot is not None

    def snapshot(self, timeout: float | None = None) -> Snapshot:
        """The current snapshot, refreshed if older than the TTL. timeout (seconds) bounds a
        refresh; default: collect_timeout."""
        with self._cond:
            generation = self._generation
            while True:
                snap = self._snapshot
                if snap is not None and (
                    self._generation != generation or time.monotonic() - snap.taken_monotonic < self._ttl
                ):
                    return snap
                if snap is not None and self._closed:
                    return snap  # shutting down: no new GPU reads
                if not self._refreshing:
                    self._refreshing = True
                    break
                self._cond.wait()
        snap = None
        try:
            snap = self._refresh(self._timeout if timeout is None else timeout)
        finally:
            with self._cond:
                if snap is not None:
                    self._snapshot = snap
                    self._generation += 1
                self._refreshing = False
                self._cond.notify_all()
        return snap

    def _refresh(self, timeout: float) -> Snapshot:
        deadline = time.monotonic() + timeout
        future = self._gpu_worker.submit() if self._gpu_worker else None  # GPU and host in parallel
        host, host_status = self._read_host()
        gpu, gpu_status = self._await_gpu(future, deadline) if future else (None, None)
        return Snapshot(
            gpu=gpu,
            gpu_status=gpu_status,
            host=host,
            host_status=host_status,
            taken_monotonic=time.monotonic(),
        )

    def _read_gpu(self) -> tuple[GpuReading, float, float]:
        assert self._backend is not None
        start = time.perf_counter()
        try:
            reading = self._backend.read()
        except Exception as exc:  # a backend must not raise; if it does, report, don't crash
            self._log.error("GPU backend failed", extra=fields(error=f"{exc.__class__.__name__}: {exc}"))
            reading = GpuReading(backend=self._backend.name, success=False)
        return reading, time.perf_counter() - start, time.time()

    def _await_gpu(
        self, future: Future[tuple[GpuReading, float, float]], deadline: float
    ) -> tuple[GpuReading, CollectorStatus]:
        start = time.perf_counter()
        try:
            reading, duration, stamp = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            if not self._gpu_stuck:
                self._log.warning(
                    "GPU read exceeded the collection deadline; reporting GPUs down until it returns",
                    extra=fields(timeout_seconds=round(self._timeout, 3)),
                )
            self._gpu_stuck = True
            return self._timed_out(), CollectorStatus(False, time.perf_counter() - start, time.time())
        if self._gpu_stuck:
            self._log.info("GPU read returned; collection resumed")
            self._gpu_stuck = False
        return reading, CollectorStatus(reading.success, duration, stamp)

    def _timed_out(self) -> GpuReading:
        last = self._snapshot.gpu if self._snapshot is not None else None
        if last is None:
            return GpuReading(backend=self._backend.name if self._backend else "none", success=False)
        return GpuReading(
            backend=last.backend,
            success=False,
            device_count=last.device_count,
            driver_version=last.driver_version,
            devices=tuple(GpuSample(d.identity, up=False) for d in last.devices),
        )

    def _read_host(self) -> tuple[HostSample | None, CollectorStatus | None]:
        if self._host is None:
            return None, None
        start = time.perf_counter()
        try:
            sample: HostSample | None = self._host.read()
        except Exception as exc:  # /proc unreadable etc.: host collector fails, GPUs keep flowing
            self._log.error("host read failed", extra=fields(error=f"{exc.__class__.__name__}: {exc}"))
            sample = None
        return sample, CollectorStatus(sample is not None, time.perf_counter() - start, time.time())

    def close(self, drain: float = 2.0) -> None:
        """Release NVML: no new reads start, an in-flight one gets drain seconds to finish,
        and if it does not, NVML is left alone (shutting NVML down under a running call can
        crash the process, nvitop #222)."""
        if self._backend is None:
            return
        with self._cond:
            self._closed = True
        if self._gpu_worker is not None and not self._gpu_worker.wait_idle(drain):
            self._log.warning("GPU call still in flight at shutdown; leaving NVML as it is")
            return
        self._backend.close()

    # -- Mai API ----------------------------------------------------------------------

    def get_current_resources(self) -> dict[str, float]:
        """The nine Mai keys (GiB and percent, GPU index 0, 0.0 where missing), from the
        same cached snapshot that /metrics serves."""
        snap = self.snapshot()
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

    def can_load_model(self, model_size_gb: float) -> bool:
        """Mai's rule: available RAM >= 1.5 x the model, and free VRAM >= the model when the
        host has a GPU."""
        res = self.get_current_resources()
        if res["available_memory_gb"] < model_size_gb * 1.5:
            return False
        if res["gpu_total_vram_gb"] > 0 and res["gpu_free_vram_gb"] < model_size_gb:
            return False
        return True

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
