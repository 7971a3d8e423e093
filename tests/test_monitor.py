"""ResourceMonitor's concurrency in-process: waiter deadlines, single flight, hung reads,
start-up, close, a backend that raises. pynvml runs for real against the fake libnvidia-ml
loaded into this process. Timing assertions are about deadlines the code promises (a caller
never waits past its own deadline), with margins of a second or more against much longer
driver delays, so a slow machine cannot make them pass or fail by luck."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

import pytest

import scenarios as sc
from resmon_exporter import ResourceMonitor
from resmon_exporter.backends import GpuOptions
from resmon_exporter.backends.nvml.backend import NvmlBackend
from resmon_exporter.samples import GpuReading
from fakenvml import Records, Scenario, Trace, load_in_process
from scenarios import DRIVER_NOT_LOADED, UNKNOWN, three_gpus


@pytest.fixture
def nvml(fake_libs, tmp_path_factory, tmp_path, monkeypatch) -> tuple[Scenario, Trace]:
    trace = load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    trace.clear()
    scenario = Scenario(tmp_path / "scenario.txt", three_gpus())
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    return scenario, trace


def monitor(log: tuple[logging.Logger, Records], **kwargs: Any) -> ResourceMonitor:
    return ResourceMonitor(logger=log[0], gpu_backend="nvml", **kwargs)


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def ups(snap) -> list[bool]:
    return [d.up for d in snap.gpu.devices]


def test_a_waiter_gets_its_own_deadline_and_the_last_reading(nvml, log):
    scenario, _ = nvml
    with monitor(log, cache_ttl=0, collect_timeout=10) as m:
        first = m.snapshot()
        assert first.gpu_status.success and ups(first) == [True] * 3
        scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 2500})
        result: dict[str, Any] = {}
        refresher = threading.Thread(target=lambda: result.setdefault("a", m.snapshot()))
        refresher.start()
        wait_until(lambda: m._refreshing)  # A is refreshing, in the driver for 2.5 s
        started = time.monotonic()
        late = m.snapshot(timeout=0.3)
        waited = time.monotonic() - started
        refresher.join(10)
    assert waited < 1.5, waited  # its own 0.3 s, not A's 2.5 s read
    assert late.gpu_status.success is False
    assert ups(late) == [True] * 3  # the last completed reading, not "down"
    assert late.gpu_status.timestamp_seconds == first.gpu_status.timestamp_seconds  # its real age
    assert result["a"].gpu_status.success and result["a"].gpu_status.timestamp_seconds > first.gpu_status.timestamp_seconds


def test_a_short_deadline_on_the_first_refresh_is_not_cached_for_anyone(nvml, log):
    scenario, trace = nvml
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 1500})
    with monitor(log, cache_ttl=30, collect_timeout=10) as m:
        hurried = m.snapshot(timeout=0.2)
        # no reading yet: no GPU families at all (resmon_gpu_devices absent, never 0)
        assert hurried.gpu is None
        assert hurried.gpu_status.success is False and hurried.gpu_status.timestamp_seconds is None
        assert hurried.host is not None and hurried.host_status.success
        assert not m.ready
        patient = m.snapshot()  # a 30 s TTL: the hurried answer must not be what it gets
        assert patient.gpu_status.success and ups(patient) == [True] * 3
        assert patient.gpu.device_count == 3
        assert m.ready
    assert trace.count("nvmlDeviceGetUtilizationRates", device=0) == 1  # the patient caller joined the same read


def test_gpus_are_down_only_after_a_read_outlives_collect_timeout(nvml, log):
    scenario, _ = nvml
    _, records = log
    with monitor(log, cache_ttl=0, collect_timeout=1.0) as m:
        m.snapshot()
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetPerformanceState": 4000})
        read_started = time.monotonic()
        stale = m.snapshot(timeout=0.3)
        assert time.monotonic() - read_started < 0.9
        assert stale.gpu_status.success is False and ups(stale) == [True] * 3  # young read: not a hung driver
        hung = m.snapshot(timeout=3.0)
        in_flight = time.monotonic() - read_started
        assert ups(hung) == [True, False, True] and hung.gpu_status.success is False  # the hung GPU alone
        assert in_flight >= 0.85  # reported down only once its read had run for --collect.timeout (less 0.1 s)
        assert in_flight < 2.5  # and not held to the caller's 3 s: the hang was known at 1 s
        warnings = [r for r in records.records if "longer than --collect.timeout" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].resmon_fields["collect_timeout_seconds"] == 1.0
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetPerformanceState": None})
        wait_until(lambda: m.snapshot(timeout=1.0).gpu_status.success, timeout=15)
        assert ups(m.snapshot()) == [True] * 3


def test_start_up_probing_is_outside_every_deadline(nvml, log):
    scenario, _ = nvml
    scenario.update(**{"delay_ms.nvmlInitWithFlags": 1500})  # no persistence mode: a slow nvmlInit
    m = ResourceMonitor(logger=log[0], collect_timeout=1.0)  # auto: the probing happens in prepare
    with m:
        m.start()
        started = time.monotonic()
        early = m.snapshot()
        assert time.monotonic() - started < 1.0  # a scrape does not wait for start-up
        assert early.gpu is None and early.gpu_status.success is False and early.host is not None
        assert not m.ready
        wait_until(lambda: m.ready)
        snap = m.snapshot()
        # the 1.5 s init is longer than --collect.timeout, and still no GPU was reported down
        assert snap.gpu_status.success and ups(snap) == [True] * 3
    assert not any("longer than --collect.timeout" in text for text in log[1].messages())


def test_without_start_the_first_caller_waits_for_start_up(nvml, log):
    scenario, _ = nvml
    scenario.update(**{"delay_ms.nvmlInitWithFlags": 800})
    with ResourceMonitor(logger=log[0], collect_timeout=5.0) as m:
        snap = m.snapshot()
        assert snap.gpu_status.success and ups(snap) == [True] * 3


def test_concurrent_callers_share_one_read(nvml, log):
    scenario, trace = nvml
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 300})
    with monitor(log, cache_ttl=30) as m:
        results: list[Any] = []
        threads = [threading.Thread(target=lambda: results.append(m.snapshot())) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert len(results) == 12 and len({id(s) for s in results}) == 1
    assert trace.count("nvmlDeviceGetUtilizationRates", device=0) == 1


def gpu_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("resmon-gpu"))  # the monitor's reader and the GPU readers


def test_close_stops_the_thread_and_releases_the_monitor(nvml, log):
    _, trace = nvml
    before = gpu_threads()
    ref = None
    for _ in range(30):
        with monitor(log, cache_ttl=0) as m:
            assert m.snapshot().gpu_status.success
        ref = weakref.ref(m)
    del m
    gc.collect()
    assert gpu_threads() == before  # 30 cycles, no thread left behind
    assert ref is not None and ref() is None  # nor the monitor itself
    # close() does not wait out the XID watcher's event wait: each watcher shuts its NVML
    # down on its way out, within one wait
    wait_until(lambda: trace.count("nvmlShutdown") == 30)
    assert trace.count("nvmlInitWithFlags") == trace.count("nvmlShutdown") == 30


def test_close_right_after_start_never_reads_after_shutdown(nvml, log):
    scenario, trace = nvml
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 200})
    for _ in range(5):
        trace.clear()
        m = ResourceMonitor(logger=log[0], cache_ttl=0)
        m.start()
        m.close(drain=5)
        time.sleep(0.3)  # bounded: room for a straggling start-up read to show in the trace
        lines = trace.lines()
        if lines:  # the start-up read may or may not have begun; if NVML was used, it ends in shutdown
            inits = [i for i, (s, _) in enumerate(lines) if s == "nvmlInitWithFlags"]
            assert lines[-1][0] == "nvmlShutdown", lines[-5:]
            assert len(inits) == 1 and trace.count("nvmlShutdown") == 1


def test_close_waits_for_an_in_flight_read_then_shuts_down(nvml, log):
    scenario, trace = nvml
    scenario.update(**{"gpu.2.delay_ms.nvmlDeviceGetUtilizationRates": 800})
    m = monitor(log, cache_ttl=0)
    m.start()
    wait_until(lambda: trace.count("nvmlDeviceGetUtilizationRates", device=2) == 1)
    m.close(drain=5)
    lines = trace.lines()
    assert lines[-1] == ("nvmlShutdown", -1)
    assert ("nvmlDeviceGetPerformanceState", 2) in lines  # the read ran to its end before shutdown
    assert m.ready


def test_a_hung_gpu_is_down_alone_with_one_read_in_flight(nvml, log):
    scenario, trace = nvml
    with monitor(log, cache_ttl=0, collect_timeout=0.6) as m:
        assert ups(m.snapshot()) == [True] * 3
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetUtilizationRates": 2500})
        for _ in range(4):
            snap = m.snapshot()
            assert ups(snap) == [True, False, True]  # the others keep reporting
            assert not snap.gpu_status.success
            assert snap.gpu_by_index(0).memory_total_bytes is not None
        assert trace.count("nvmlDeviceGetUtilizationRates", device=1) <= 2  # no pile-up behind the hung call
        # a reader per GPU, GPU 1's held by its hung call, one made in its place: no thread per scrape
        assert sum(t.name.startswith("resmon-gpu-read-") for t in threading.enumerate()) <= 3 + 1
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetUtilizationRates": None})
        wait_until(lambda: m.snapshot().gpu_status.success, timeout=10)
        assert ups(m.snapshot()) == [True] * 3


def test_close_under_a_hung_gpu_shuts_nvml_down_only_once_it_returns(nvml, log):
    scenario, trace = nvml
    before = gpu_threads()
    m = monitor(log, cache_ttl=0, collect_timeout=0.6)
    m.snapshot()
    scenario.update(**{"gpu.2.delay_ms.nvmlDeviceGetUtilizationRates": 3000})
    assert ups(m.snapshot()) == [True, True, False]
    m.close(drain=0.5)
    assert trace.count("nvmlShutdown") == 0  # a worker is inside NVML: no shutdown under it
    wait_until(lambda: trace.count("nvmlShutdown") == 1, timeout=10)  # the worker's call returned
    lines = trace.lines()
    assert lines[-1] == ("nvmlShutdown", -1)
    wait_until(lambda: gpu_threads() == before, timeout=5)


def test_a_hung_nvml_shutdown_is_bounded(nvml, log):
    scenario, _ = nvml
    m = monitor(log, cache_ttl=0)
    m.snapshot()
    scenario.update(**{"delay_ms.nvmlShutdown": 3000})
    started = time.monotonic()
    m.close(drain=0.5, release=0.5)  # the CLI's way: wait for the release, bounded
    assert time.monotonic() - started < 2.0  # drain and release 0.5 s each, not the 3 s shutdown
    assert any("still in flight at shutdown" in text for text in log[1].messages(logging.WARNING))


def test_reinitialising_after_a_lost_driver_shuts_the_old_init_down(nvml, log):
    scenario, trace = nvml
    with monitor(log, cache_ttl=0) as m:
        m.snapshot()
        scenario.update(**{"rc.nvmlDeviceGetCount_v2": DRIVER_NOT_LOADED})
        assert ups(m.snapshot()) == [False] * 3
        scenario.update(**{"rc.nvmlDeviceGetCount_v2": None})
        wait_until(lambda: m.snapshot().gpu_status.success, timeout=15)
        assert trace.count("nvmlInitWithFlags") == 2
        assert trace.count("nvmlShutdown") == 1  # the lost init was released before the new one


class FlakyBackend:
    """A backend whose read raises twice (a bug in a backend, not a device fault)."""

    name = "flaky"

    def __init__(self) -> None:
        self.reads = 0
        self.closed = False

    def prepare(self) -> None:
        pass

    def read(self) -> GpuReading:
        self.reads += 1
        if self.reads <= 2:
            raise RuntimeError("backend bug")
        return GpuReading(backend=self.name, success=True)

    def close(self) -> None:
        self.closed = True


def test_a_backend_that_raises_fails_the_gpu_collector_and_recovers(log):
    backend = FlakyBackend()
    with ResourceMonitor(logger=log[0], cache_ttl=0, backend=backend) as m:
        for _ in range(2):
            snap = m.snapshot()
            assert snap.gpu_status.success is False and snap.gpu.backend == "flaky"
            assert snap.host_status.success
        assert m.snapshot().gpu_status.success is True
    assert backend.closed
    errors = [r for r in log[1].records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in errors)


def test_get_gpus_reports_every_gpu_with_none_for_unsupported(nvml, log):
    with monitor(log) as m:
        gpus = m.get_gpus()
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert gpus[0]["uuid"] == three_gpus()["gpu.0.uuid"] and gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["memory_total_bytes"] == 80 * 1024**3 and gpus[0]["utilization_ratio"] == 0.87
    assert gpus[2]["utilization_ratio"] is None and gpus[2]["power_watts"] is None  # L4: not supported
    assert all(g["up"] for g in gpus)


def test_an_unbounded_timeout_is_clamped_not_an_overflow(nvml, log):
    nvml[0].update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 500})
    with monitor(log, cache_ttl=0) as m:
        for timeout in (float("inf"), 1e10):
            refresher = threading.Thread(target=m.snapshot)
            refresher.start()
            wait_until(lambda: m._refreshing)
            assert m.snapshot(timeout=timeout).gpu_status.success  # it waits on the other's refresh
            refresher.join(10)


class SlowStart(FlakyBackend):
    """prepare() takes most of the caller's deadline; the read after it is quick but not instant."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 2  # reads succeed

    def prepare(self) -> None:
        time.sleep(0.8)  # bounded: the start-up work under test

    def read(self) -> GpuReading:
        time.sleep(0.5)  # bounded: a read shorter than --collect.timeout
        return super().read()


def test_a_read_that_started_late_in_a_deadline_is_not_called_hung(log):
    with ResourceMonitor(logger=log[0], cache_ttl=0, collect_timeout=1.0, backend=SlowStart()) as m:
        first = m.snapshot()  # waits 1 s: 0.8 s start-up, then 0.2 s of a 0.5 s read
        assert first.gpu_status.success is False
        assert not any("longer than --collect.timeout" in t for t in log[1].messages())
        started = time.monotonic()
        assert m.snapshot(timeout=0.1) is not None and time.monotonic() - started < 1.0
        wait_until(lambda: m.snapshot().gpu_status.success, timeout=10)


def test_a_driver_that_keeps_failing_is_reinitialised_with_growing_backoff(nvml, log):
    scenario, trace = nvml
    with monitor(log, cache_ttl=0) as m:
        m.snapshot()
        scenario.update(**{"rc.nvmlDeviceGetCount_v2": DRIVER_NOT_LOADED})  # init works, every count fails
        end = time.monotonic() + 8
        while time.monotonic() < end:
            m.snapshot()
            time.sleep(0.05)  # bounded: a scraper polling for 8 s
    # backoff 1, 2, 4 s: at most 4 inits in 8 s (1 s apart would be 9)
    assert 2 <= trace.count("nvmlInitWithFlags") <= 4, trace.count("nvmlInitWithFlags")


def test_a_monitor_dropped_without_close_stops_its_thread(nvml, log):
    before = gpu_threads()
    m = monitor(log)
    m.snapshot()
    assert gpu_threads() == before + 1 + 3  # the monitor's reader and one GPU reader per GPU
    del m
    gc.collect()
    wait_until(lambda: gpu_threads() == before, timeout=5)


def xid_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "resmon-xid" and t.is_alive()]


def test_closing_ends_the_xid_watcher_alongside_a_read_still_in_flight(nvml, log):
    # the CLI drains the GPU thread for 1 s at exit: the watcher's own wait (up to 0.5 s)
    # must end in parallel with the last read, not after it
    scenario, trace = nvml
    m = monitor(log, cache_ttl=0)
    m.snapshot()
    wait_until(lambda: trace.count("nvmlEventSetWait_v2") > 0)  # the watcher is waiting
    assert len(xid_threads()) == 1
    scenario.update(**{"delay_ms.nvmlDeviceGetCount_v2": 1500})
    reader = threading.Thread(target=m.snapshot, kwargs={"timeout": 5})
    reader.start()
    wait_until(lambda: trace.count("nvmlDeviceGetCount_v2") >= 2)  # the slow read is in flight
    started = time.monotonic()
    m.close(drain=0.0)  # no waiting here: what must happen is signalled
    wait_until(lambda: not xid_threads(), timeout=1.2)  # while the read is still inside NVML
    assert time.monotonic() - started < 1.4
    assert reader.is_alive()
    reader.join(10)
    scenario.update(**{"delay_ms.nvmlDeviceGetCount_v2": None})
    wait_until(lambda: trace.count("nvmlShutdown") == 1)  # the reader shut NVML down after its read
    assert not xid_threads()


def test_nvml_is_not_shut_down_under_a_stuck_xid_wait_nor_initialised_twice(nvml, log):
    scenario, trace = nvml
    with monitor(log, cache_ttl=0) as m:
        m.snapshot()
        wait_until(lambda: trace.count("nvmlEventSetWait_v2") > 0)
        scenario.update(**{"delay_ms.nvmlEventSetWait_v2": 4000})  # the next wait hangs 4 s
        waits = trace.count("nvmlEventSetWait_v2")
        wait_until(lambda: trace.count("nvmlEventSetWait_v2") > waits)  # it is inside it now
        scenario.update(**{"rc.nvmlDeviceGetCount_v2": DRIVER_NOT_LOADED})
        m.snapshot()  # the library is lost: re-init wanted, but the watcher is inside NVML
        scenario.update(**{"rc.nvmlDeviceGetCount_v2": None})
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # meanwhile: no shutdown under it, no second init
            assert not m.snapshot().gpu_status.success
            assert trace.count("nvmlShutdown") == 0 and trace.count("nvmlInitWithFlags") == 1
            time.sleep(0.1)
        scenario.update(**{"delay_ms.nvmlEventSetWait_v2": None})
        wait_until(lambda: m.snapshot().gpu_status.success, timeout=15)
        symbols = [s for s, _ in trace.lines()]
        assert trace.count("nvmlShutdown") == 1 and trace.count("nvmlInitWithFlags") == 2
        assert symbols.index("nvmlShutdown") < len(symbols) - 1 - symbols[::-1].index("nvmlInitWithFlags")


# -- GPU reads: what each hands back (in process, the backend alone) --------------


def test_a_stuck_gpu_stays_watched_for_xids_on_every_refresh(nvml, log):
    # a hung GPU is when XIDs come: its read in flight must not take it out of the event set
    scenario, _ = nvml
    backend = NvmlBackend(log[0], device_timeout=0.6)
    try:
        assert [d.up for d in backend.read().devices] == [True] * 3
        assert backend._xid is not None
        uuids = sorted(backend._xid._devices)
        assert len(uuids) == 3
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetUtilizationRates": 3000})
        for _ in range(2):  # the first stuck refresh, and the next one (GPU 1 not re-submitted)
            reading = backend.read()
            assert [d.up for d in reading.devices] == [True, False, True]
            assert sorted(backend._xid._devices) == uuids
    finally:
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetUtilizationRates": None})
        backend.close()
        wait_until(lambda: not any(w.busy for w in backend._workers.values()), timeout=10)


def read_with_a_defect_on_gpu_0(backend: NvmlBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read in which GPU 0's job raises a bug (not an NVML error); it must reach the caller."""
    plain = backend._read_device

    def faulty(index: int, slow: bool = True):
        if index == 0:
            raise RuntimeError("a defect")
        return plain(index, slow)

    monkeypatch.setattr(backend, "_read_device", faulty)
    with pytest.raises(RuntimeError, match="a defect"):
        backend.read()


def test_a_defect_in_one_gpu_read_is_raised_only_once_every_worker_answered(nvml, log, monkeypatch):
    scenario, _ = nvml
    backend = NvmlBackend(log[0], device_timeout=5.0)
    try:
        backend.read()
        scenario.update(**{"gpu.2.delay_ms.nvmlDeviceGetUtilizationRates": 400})
        read_with_a_defect_on_gpu_0(backend, monkeypatch)
        assert not any(w.busy for w in backend._workers.values())  # GPU 2's slow read was waited for
    finally:
        scenario.update(**{"gpu.2.delay_ms.nvmlDeviceGetUtilizationRates": None})
        backend.close()


def test_a_defect_and_a_lost_library_in_one_read_still_reinitialise_nvml(nvml, log, monkeypatch):
    # GPU 0's read hits a bug while GPU 1's finds the driver gone: the defect is reported and
    # the library released, so the next read initialises again instead of reading a dead init
    scenario, trace = nvml
    backend = NvmlBackend(log[0], device_timeout=5.0)
    try:
        backend.read()
        scenario.update(**{"gpu.1.rc.nvmlDeviceGetMemoryInfo_v2": DRIVER_NOT_LOADED})
        read_with_a_defect_on_gpu_0(backend, monkeypatch)
        assert trace.count("nvmlShutdown") == 1
        assert not backend._initialised
    finally:
        scenario.update(**{"gpu.1.rc.nvmlDeviceGetMemoryInfo_v2": None})
        backend.close()


def _health_status(reading: GpuReading) -> bool:
    return {p.name: p.success for p in reading.parts}["health"]


def test_a_stuck_gpus_late_health_failure_fails_only_its_own_read(nvml, log):
    # GPU 1's remapped-rows query hangs, then fails: the read it hung in reports the health
    # collector unsuccessful (GPU 1's values are missing); the failure arriving later, from
    # the job no read waits for any more, must not fail the next read, where GPU 1 answers
    scenario, _ = nvml
    scenario.update(**{"gpu.1.row_remapping": 1})
    backend = NvmlBackend(log[0], device_timeout=0.6, options=GpuOptions(slow_interval=0.0))  # remapped rows each refresh
    try:
        assert _health_status(backend.read())
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetRemappedRows": 1500, "gpu.1.rc.nvmlDeviceGetRemappedRows": UNKNOWN})
        stuck = backend.read()
        assert [d.up for d in stuck.devices] == [True, False, True]
        assert not _health_status(stuck)
        wait_until(lambda: not backend._workers[1].busy)  # the late job has failed by now
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetRemappedRows": None, "gpu.1.rc.nvmlDeviceGetRemappedRows": None})
        after = backend.read()
        assert [d.up for d in after.devices] == [True, True, True]
        assert _health_status(after)
    finally:
        scenario.update(**{"gpu.1.delay_ms.nvmlDeviceGetRemappedRows": None, "gpu.1.rc.nvmlDeviceGetRemappedRows": None})
        backend.close()


def _two_mig_gpus() -> dict[str, Any]:
    values: dict[str, Any] = {"count": 2}
    for i in (0, 1):
        uuids = {slot: f"{uuid[:-1]}{i}" for slot, uuid in sc.MIG_UUIDS.items()}
        values.update(sc.hopper_board(i))
        values.update({f"gpu.{i}.gpm": 1, f"gpu.{i}.rc.nvmlGpmSampleGet": sc.NOT_SUPPORTED,
                       f"gpu.{i}.mig_devices": sc.mig_slots(uuids=uuids)})
        values.update({k: v for gi, gpm in sc.MIG_GPM.items() for k, v in sc.gpm_keys(f"gpu.{i}.gi.{gi}.", gpm).items()})
    return values


def test_mig_gpm_time_of_parallel_gpus_is_counted_per_gpu(nvml, log):
    # GPU 1's GPU-instance samples (2 x 500 ms) overlap GPU 0's (2 x 300 ms), which start 600 ms
    # later: time kept on the shared reader was counted on the wrong GPU (mig went negative)
    scenario, _ = nvml
    scenario.write({**_two_mig_gpus(), "gpu.0.delay_ms.nvmlDeviceGetPerformanceState": 600,
                    "gpu.0.delay_ms.nvmlGpmMigSampleGet": 300, "gpu.1.delay_ms.nvmlGpmMigSampleGet": 500})
    backend = NvmlBackend(log[0], device_timeout=5.0, options=GpuOptions(profiling=True, mig=True))
    try:
        parts = {p.name: p for p in backend.read().parts}
    finally:
        backend.close()
    assert parts["profiling"].success and parts["mig"].success
    # summed over the workers: 0.6 s + 1.0 s of GPM samples, though they overlapped
    assert parts["profiling"].duration_seconds >= 1.6
    assert 0.0 <= parts["mig"].duration_seconds < 0.3  # enumeration only (milliseconds)


class SlowTail(FlakyBackend):
    """Bounds each GPU itself (device_deadlines) and returns a while after --collect.timeout,
    as a read with a slow GPU at its limit and a loaded machine's tail does."""

    device_deadlines = True

    def __init__(self) -> None:
        super().__init__()
        self.reads = 2  # reads succeed

    def read(self) -> GpuReading:
        time.sleep(0.9)  # bounded: collect_timeout 0.4 s plus a 0.5 s tail
        return super().read()


def test_a_per_gpu_bounded_read_has_room_past_collect_timeout(log):
    with ResourceMonitor(logger=log[0], cache_ttl=0, collect_timeout=0.4, backend=SlowTail()) as m:
        snap = m.snapshot(timeout=5.0)
        assert snap.gpu_status.success  # the read that returned, not every GPU down as hung
        assert not any("longer than --collect.timeout" in t for t in log[1].messages())
