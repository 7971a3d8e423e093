"""Deadlines and GPU faults, end to end: what a scrape answers while a driver call hangs,
fails or recovers, and while start-up is still probing. Every wait is bounded; time bounds
are the deadlines the exporter promises, with a second or more of margin, against driver
delays several times longer."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fakenvml import Scrape
from scenarios import GPU_IS_LOST, three_gpus

UUID1 = three_gpus()["gpu.1.uuid"]
HEADER = "X-Prometheus-Scrape-Timeout-Seconds"


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture
def machine(scenario):
    scenario.write(three_gpus())
    return scenario


def timed_scrape(exporter, timeout_header: str | None = None) -> tuple[Scrape, float]:
    started = time.monotonic()
    status, _, body = exporter.request("/metrics", headers={HEADER: timeout_header} if timeout_header else {}, timeout=30)
    assert status == 200, body[:300]
    return Scrape(body.decode()), time.monotonic() - started


def gpu_ups(s: Scrape) -> set[float]:
    return {v for _, v in s.series("resmon_gpu_up")}


def test_a_short_scrape_deadline_serves_the_last_reading_not_gpus_down(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=20s")
    exporter.wait_ready()
    before = exporter.scrape()
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 30000})
    s, waited = timed_scrape(exporter, "2")
    assert waited < 1.5 + 1.0  # the header's 2 s minus the 0.5 s offset, not the 20 s collect timeout
    assert s.value("resmon_collector_success", collector="gpu") == 0
    assert s.value("resmon_collector_success", collector="host") == 1
    assert gpu_ups(s) == {1.0}  # a read younger than --collect.timeout is not a hung driver
    assert s.value("resmon_gpu_memory_total_bytes", gpu="1", uuid=UUID1) == 40 * 1024**3
    # the stale-data alert can fire: the timestamp is the reading's, while the host's moves on
    stamp = before.value("resmon_last_refresh_timestamp_seconds", collector="gpu")
    assert s.value("resmon_last_refresh_timestamp_seconds", collector="gpu") == stamp
    assert s.value("resmon_last_refresh_timestamp_seconds", collector="host") > stamp


def test_a_waiting_scrape_keeps_its_own_deadline(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=10s")
    exporter.wait_ready()
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 3000})
    slow: dict[str, Scrape] = {}
    first = threading.Thread(target=lambda: slow.setdefault("s", timed_scrape(exporter)[0]))
    first.start()
    time.sleep(0.3)  # bounded: lets the first scrape start the 3 s read that the second one waits on
    s, waited = timed_scrape(exporter, "1")
    first.join(20)
    assert waited < 0.5 + 1.0  # its own 1 s - 0.5 s, not the rest of the other scrape's 3 s read
    assert s.value("resmon_collector_success", collector="gpu") == 0 and gpu_ups(s) == {1.0}
    assert slow["s"].value("resmon_collector_success", collector="gpu") == 1


def test_a_tiny_deadline_cannot_make_healthy_gpus_look_down_for_others(run_exporter, machine):
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 300})
    exporter = run_exporter("--collect.cache-ttl=5s")
    exporter.wait_ready()
    time.sleep(5.1)  # bounded: let the start-up snapshot age out of the 5 s cache
    for _ in range(3):
        s, _ = timed_scrape(exporter, "0.0001")
        assert gpu_ups(s) == {1.0}
    s, _ = timed_scrape(exporter)
    assert s.value("resmon_collector_success", collector="gpu") == 1 and gpu_ups(s) == {1.0}


def test_start_up_is_outside_scrape_deadlines(run_exporter, machine):
    machine.update(**{"delay_ms.nvmlInitWithFlags": 3000})  # no persistence mode: a slow nvmlInit
    exporter = run_exporter("--collect.timeout=1s", "--collect.cache-ttl=0", ready=False)
    s, waited = timed_scrape(exporter)
    assert waited < 1.0 + 1.0
    assert s.value("resmon_collector_success", collector="gpu") == 0
    assert s.value("resmon_collector_success", collector="host") == 1 and s.has("resmon_memory_total_bytes")
    assert not s.has("resmon_gpu_devices")  # absent, never 0 (which reads as lost GPUs)
    assert not s.has("resmon_last_refresh_timestamp_seconds", collector="gpu")
    assert exporter.request("/-/ready")[0] == 503
    exporter.wait_ready()
    s = exporter.scrape()
    assert s.value("resmon_gpu_devices") == 3 and gpu_ups(s) == {1.0}
    assert "longer than --collect.timeout" not in exporter.stderr  # the 3 s init was never a "hung read"


def up_by_gpu(s: Scrape) -> dict[str, float]:
    return {labels["gpu"]: v for labels, v in s.series("resmon_gpu_up")}


def test_a_hung_gpu_is_down_alone_threads_stay_bounded_and_it_recovers(run_exporter, machine, trace):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    exporter.wait_ready()
    machine.update(**{"gpu.2.delay_ms.nvmlDeviceGetPerformanceState": 9000})
    counts = []
    for i in range(5):
        if i == 3:  # the healthy GPUs are read afresh on every refresh meanwhile
            machine.update(**{"gpu.1.memory_used": 7 * 1024**3})
        s = exporter.scrape()
        assert s.value("resmon_collector_success", collector="gpu") == 0  # a GPU was not read
        assert s.has("resmon_memory_total_bytes")
        assert up_by_gpu(s) == {"0": 1.0, "1": 1.0, "2": 0.0}, up_by_gpu(s)
        counts.append(proc_status(exporter.proc.pid, "Threads"))
    assert s.value("resmon_gpu_memory_used_bytes", gpu="1", uuid=UUID1) == 7 * 1024**3
    assert max(counts) - min(counts) <= 1, counts  # no thread per stuck refresh
    # one read in flight on the hung GPU: it is not asked again while that call runs
    assert sum(1 for sym, idx in trace.lines() if sym == "nvmlDeviceGetPowerUsage" and idx == 2) <= 2
    assert "reporting this GPU down until it returns" in exporter.stderr
    machine.update(**{"gpu.2.delay_ms.nvmlDeviceGetPerformanceState": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert gpu_ups(s) == {1.0}


def test_gpus_are_read_in_parallel(run_exporter, machine):
    # 2 s on each GPU: one after another (6 s) would pass the 4 s timeout and GPU 2 would be down
    machine.update(**{f"gpu.{i}.delay_ms.nvmlDeviceGetUtilizationRates": 2000 for i in range(3)})
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=4s")
    exporter.wait_ready()
    for _ in range(2):
        s, _ = timed_scrape(exporter)
        assert s.value("resmon_collector_success", collector="gpu") == 1
        assert gpu_ups(s) == {1.0}
    assert "longer than --collect.timeout" not in exporter.stderr


def test_a_hung_library_call_still_marks_every_gpu_down(run_exporter, machine):
    # not one GPU's call: the device count, which the whole read waits on
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    exporter.wait_ready()
    machine.update(**{"delay_ms.nvmlDeviceGetCount_v2": 9000})
    for _ in range(3):
        s = exporter.scrape()
        assert s.value("resmon_collector_success", collector="gpu") == 0
    assert gpu_ups(s) == {0.0}
    machine.update(**{"delay_ms.nvmlDeviceGetCount_v2": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert gpu_ups(s) == {1.0}


def test_flapping_device_creates_no_new_series(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()  # identities known before the flapping starts
    label_sets = set()
    for i in range(6):
        machine.update(**{"gpu.1.rc.all": GPU_IS_LOST if i % 2 == 0 else None})
        s = exporter.scrape()
        assert s.value("resmon_gpu_up", gpu="1", uuid=UUID1) == (0 if i % 2 == 0 else 1)
        label_sets |= {tuple(sorted(l.items())) for name in ("resmon_gpu_up", "resmon_gpu_info") for l, _ in s.series(name)}
    assert len(label_sets) == 6  # 3 GPUs x (up, info), the same labels throughout


def test_driver_reload_reinitialises(run_exporter, machine, trace):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    machine.update(**{"rc.nvmlDeviceGetCount_v2": 9})  # DRIVER_NOT_LOADED: the module was unloaded
    s = exporter.scrape()
    assert gpu_ups(s) == {0.0}
    machine.update(**{"rc.nvmlDeviceGetCount_v2": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert gpu_ups(s) == {1.0}
    assert trace.count("nvmlInitWithFlags") == 2
