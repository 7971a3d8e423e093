"""State the per-GPU workers share (issue 22 items 1, 2, 11b, 11d): fallbacks that many
workers find missing at the same moment, the busy integrator's per-engine bookkeeping, the
handle cache across a device-count change, and sample timestamps whose clock steps back.

The fallback race is forced with a barrier (unit) and, through the real pynvml against the
fake, with a slow newer call that every worker enters before the first one returns."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import pynvml
import pytest

from resmon_exporter.backends import GpuOptions
from resmon_exporter.backends.nvml import busy as nvml_busy
from resmon_exporter.backends.nvml.backend import NvmlBackend
from resmon_exporter.backends.nvml.busy import BusyIntegrator
from resmon_exporter.backends.nvml.errors import Fallback
from fakenvml import Scenario, Trace, gpu_keys, load_in_process

ARGUMENT_VERSION_MISMATCH = 25
WORKERS = 25


# -- Fallback, unit ---------------------------------------------------------------------


def _raise(code: int) -> Any:
    raise pynvml.NVMLError(code)


def test_many_workers_finding_the_newer_call_missing_together_all_get_the_older_one():
    barrier = threading.Barrier(WORKERS)

    def newer(handle: int) -> int:
        barrier.wait(10)  # every worker is inside the newer call before any gets Missing
        return _raise(ARGUMENT_VERSION_MISMATCH)

    fallback = Fallback(newer, lambda handle: handle * 10)
    results: dict[int, Any] = {}

    def worker(i: int) -> None:
        try:
            results[i] = fallback(i)
        except BaseException as exc:  # noqa: BLE001 - what a worker would hand the reader
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == {i: i * 10 for i in range(WORKERS)}
    assert fallback.available
    assert fallback(3) == 30  # the older call is kept for good


def test_a_query_missing_on_every_candidate_is_unavailable_and_answers_none_on_every_worker():
    barrier = threading.Barrier(WORKERS)

    def only(handle: int) -> int:
        barrier.wait(10)
        return _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    fallback = Fallback(only)
    results: list[Any] = []

    def worker() -> None:
        try:
            results.append(fallback(0))
        except BaseException as exc:  # noqa: BLE001
            results.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == [None] * WORKERS
    assert not fallback.available


# -- in process, against the fake --------------------------------------------------------


@pytest.fixture
def nvml(fake_libs, tmp_path_factory, tmp_path, monkeypatch) -> tuple[Scenario, Trace]:
    trace = load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    trace.clear()
    scenario = Scenario(tmp_path / "scenario.txt")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    return scenario, trace


@pytest.fixture
def backends():
    made: list[NvmlBackend] = []

    def make(**kwargs: Any) -> NvmlBackend:
        options = kwargs.pop("options", GpuOptions(xid=False, profiling=False, mig=False, nvlink=False))
        backend = NvmlBackend(logging.getLogger("test.shared_state"), explicit=True, options=options, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def many_gpus(n: int = WORKERS, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"count": n}
    for i in range(n):
        values.update(gpu_keys(i, temperature=40 + i, memory_used=(i + 1) * 2**20, memory_reserved=0))
    values.update(extra)
    return values


def test_every_gpu_keeps_its_values_when_all_workers_meet_a_version_mismatch_at_once(nvml, backends):
    scenario, _ = nvml
    # the newer calls answer ARGUMENT_VERSION_MISMATCH after 300 ms: every worker is inside
    # them before the first returns (the relay starts all reads at once: 100 us a call)
    scenario.write(many_gpus(**{
        "delay_us.all": 100,
        "rc.nvmlDeviceGetTemperatureV": ARGUMENT_VERSION_MISMATCH,
        "delay_ms.nvmlDeviceGetTemperatureV": 300,
        "rc.nvmlDeviceGetMemoryInfo_v2": ARGUMENT_VERSION_MISMATCH,
        "delay_ms.nvmlDeviceGetMemoryInfo_v2": 300,
    }))
    backend = backends(device_timeout=10.0)
    assert backend.try_init()
    for _ in range(2):  # the refresh that met the race, and the next (the fallback kept)
        reading = backend.read()
        assert reading.success and reading.device_count == WORKERS
        temperatures = {d.identity.index: d.temperature_celsius for d in reading.devices}
        assert temperatures == {i: 40.0 + i for i in range(WORKERS)}
        used = {d.identity.index: d.memory_used_bytes for d in reading.devices}
        assert used == {i: (i + 1) * 2**20 for i in range(WORKERS)}
        assert reading.memory_api == "v1"


def test_every_gpu_has_its_temperature_and_the_device_count_on_the_exporter(run_exporter, scenario):
    scenario.write(many_gpus(**{
        "delay_us.all": 100,
        "rc.nvmlDeviceGetTemperatureV": ARGUMENT_VERSION_MISMATCH,
        "delay_ms.nvmlDeviceGetTemperatureV": 300,
    }))
    exporter = run_exporter("--collect.cache-ttl=0", "--no-collector.xid", "--collect.timeout=10s")

    def complete(s) -> bool:
        temps = {labels["gpu"]: v for labels, v in s.series("resmon_gpu_temperature_celsius")}
        return temps == {str(i): 40.0 + i for i in range(WORKERS)}

    s = exporter.wait_for(complete, timeout=30)
    assert s.value("resmon_gpu_devices") == WORKERS
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert "IndexError" not in exporter.stderr


# -- item 2: an unsupported engine does not mark the others as looked at -----------------


def test_an_unsupported_encoder_does_not_stop_the_decoder_filling_ring_overflow(nvml, backends):
    scenario, _ = nvml
    # a 10-sample ring of 10 ms samples (100 ms), read every ~300 ms: two thirds of every
    # interval are lost to the ring and filled at the mean of what follows (50 %)
    scenario.write({
        "count": 1,
        **gpu_keys(0, samples__period_ms=10, samples__capacity=10, samples__decoder="100,0",
                   samples__rc__encoder=pynvml.NVML_ERROR_NOT_SUPPORTED),
    })
    backend = backends()
    assert backend.try_init()

    def decoder() -> tuple[float, float]:
        (sample,) = backend.read().devices
        busy = dict(sample.busy_seconds)
        assert "encoder" not in busy
        return time.monotonic(), busy["decoder"]

    start_at, start = decoder()
    end_at, end = start_at, start
    while end_at - start_at < 3.0:
        time.sleep(0.3)  # refreshes further apart than the ring (the scenario, not a wait)
        end_at, end = decoder()
    rate = (end - start) / (end_at - start_at)
    assert 0.4 < rate < 0.6, rate


def test_unread_marks_only_the_engine_named():
    busy = BusyIntegrator()
    ring = [(i * 10_000, 100.0 if i % 2 == 0 else 0.0) for i in range(10)]
    for engine in ("encoder", "decoder"):
        busy.add("g", engine, ring, now=0.09)
    busy.unread("g", "encoder", now=1.0)  # only the encoder was not read
    later = [(1_000_000 + i * 10_000, 100.0 if i % 2 == 0 else 0.0) for i in range(10)]
    total = busy.add("g", "decoder", later, now=1.09)
    # the decoder's 0.91 s gap was lost to the ring: filled at 50 %, not one 10 ms spacing
    assert total == pytest.approx(0.04 + 0.5 * 0.91 + 0.04)


# -- 11b: a handle lookup that hangs across a device-count change ------------------------


def test_a_handle_looked_up_before_a_count_change_is_not_cached(nvml, backends):
    scenario, trace = nvml
    values = many_gpus(2, **{"gpu.1.delay_ms.nvmlDeviceGetHandleByIndex_v2": 1500})
    scenario.write(values)
    backend = backends(device_timeout=0.5)
    assert backend.try_init()
    first = backend.read()  # GPU 1's lookup hangs past the deadline
    assert [d.up for d in sorted(first.devices, key=lambda d: d.identity.index)] == [True, False]
    values = many_gpus(3)
    scenario.write(values)  # re-enumerated while the lookup hangs: index 1 may be another GPU
    second = backend.read()
    assert second.device_count == 3
    deadline = time.monotonic() + 10
    while backend._workers[1].busy:  # the hung lookup returns (after the count change)
        assert time.monotonic() < deadline, "GPU 1's read never returned"
        time.sleep(0.02)
    trace.clear()
    third = backend.read()
    assert third.success
    assert trace.count("nvmlDeviceGetHandleByIndex_v2", 1) == 1  # looked up again in this enumeration


# -- 11d: sample timestamps whose clock steps back ---------------------------------------


class WallRing:
    """A driver ring of 10 samples, 100 ms apart, stamped with a wall clock that can step."""

    def __init__(self) -> None:
        self.offset_us = 1_700_000_000_000_000
        self.samples: list[tuple[int, float]] = []
        self.k = 0

    def run_until(self, mono_s: float) -> None:
        while self.k + 1 <= round(mono_s * 10):
            self.k += 1
            self.samples.append((self.k * 100_000 + self.offset_us, 50.0))
            self.samples = self.samples[-10:]

    def pause_until(self, mono_s: float) -> None:
        """Sampling paused (an idle GPU): the ring keeps what it has."""
        self.k = round(mono_s * 10)

    def answer(self, last_seen: int) -> list[tuple[int, float]]:
        return [s for s in self.samples if s[0] > last_seen]  # what NVML returns: newer only


def test_busy_seconds_go_on_after_the_sample_clock_steps_back():
    busy, ring = BusyIntegrator(), WallRing()

    def refresh(at: float) -> float:
        ring.run_until(at)
        answer = ring.answer(busy.last_seen("g", "gpu"))
        return busy.add("g", "gpu", answer, answered=len(answer), now=at)

    totals = [refresh(t / 2) for t in range(1, 21)]  # 10 s, refreshes every 0.5 s
    ring.offset_us -= 3600 * 1_000_000  # the wall clock steps back an hour
    totals += [refresh(10 + t / 2) for t in range(1, 41)]  # 20 s more
    assert all(b >= a for a, b in zip(totals, totals[1:])), totals  # never decreases
    gained = totals[-1] - totals[19]
    assert 0.5 * (20 - 5) <= gained <= 0.5 * 20 + 0.1, gained  # a few seconds lost at most, none twice


def test_a_paused_ring_is_not_taken_for_a_clock_step_nor_counted_twice():
    busy, ring = BusyIntegrator(), WallRing()

    def refresh(at: float) -> float:
        answer = ring.answer(busy.last_seen("g", "gpu"))
        return busy.add("g", "gpu", answer, answered=len(answer), now=at)

    for t in range(1, 21):  # 10 s sampled
        ring.run_until(t / 2)
        refresh(t / 2)
    for t in range(21, 61):  # 20 s paused: the whole ring is asked again now and then
        ring.pause_until(t / 2)
        refresh(t / 2)
    for t in range(61, 81):  # 10 s sampled again
        ring.run_until(t / 2)
        total = refresh(t / 2)
    # 99 intervals of the first stretch, 100 samples of the second (its first one spacing): at 50 %
    assert total == pytest.approx(0.05 * 199)


def test_stamps_restart_the_baseline_only_when_every_stamp_is_far_below():
    clock = [100.0]
    stamps = nvml_busy.SampleStamps(recheck=5.0, step=10.0, clock=lambda: clock[0])
    assert stamps.last_seen("g") == 0
    assert stamps.take("g", [10_000_000, 20_000_000]) == 0  # the first answer: everything new
    assert stamps.last_seen("g") == 20_000_000
    clock[0] += 6  # nothing newer for longer than the recheck: ask for the whole buffer
    assert stamps.last_seen("g") == 0
    # the whole buffer holds what was seen, or a little less (a process that exited took its
    # newest samples along): only newer stamps count, and the recheck waits again
    assert stamps.take("g", [12_000_000, 15_000_000]) == 20_000_000
    assert stamps.last_seen("g") == 20_000_000
    clock[0] += 6
    assert stamps.last_seen("g") == 0
    # every stamp more than `step` below: the clock stepped back, all of them are new
    assert stamps.take("g", [1_000_000, 2_000_000]) == 0
    assert stamps.last_seen("g") == 2_000_000


def test_process_utilization_goes_on_after_the_sample_clock_steps_back(nvml, backends, monkeypatch):
    scenario, _ = nvml
    monkeypatch.setattr(nvml_busy, "STAMP_RECHECK_SECONDS", 0.2, raising=False)
    me = os.getpid()
    wall_us = 1_700_000_000_000_000
    values = {"count": 1, **gpu_keys(0, processes=f"{me}:1048576", process_util=f"{me}:40:10:0:0@{wall_us}")}
    scenario.write(values)
    backend = backends(options=GpuOptions(xid=False, profiling=False, mig=False, nvlink=False, health=False, processes=True))
    assert backend.try_init()

    def sm() -> float:
        (sample,) = backend.read().devices
        (process,) = sample.process_list
        return dict(process.utilization)["sm"]

    assert sm() == pytest.approx(0.4)
    # the wall clock steps back an hour: the driver's new samples are stamped below the last seen
    values = {**values, "gpu.0.process_util": f"{me}:70:10:0:0@{wall_us - 3_600_000_000}"}
    scenario.write(values)
    deadline = time.monotonic() + 10
    while (value := sm()) != pytest.approx(0.7):
        assert value == 0.0
        assert time.monotonic() < deadline, "process utilization stalled after the clock step"
        time.sleep(0.05)
    assert sm() == 0.0  # counted once: nothing newer since
