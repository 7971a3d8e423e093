"""Deadlines and GPU faults, end to end: what a scrape answers while a driver call hangs,
fails or recovers. Every wait is bounded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fakenvml import Scrape
from scenarios import GPU_IS_LOST, three_gpus

UUID1 = three_gpus()["gpu.1.uuid"]


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture
def machine(scenario):
    scenario.write(three_gpus())
    return scenario


# -- deadlines and faults ---------------------------------------------------------------


def test_scrape_timeout_header_bounds_the_refresh(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=20s")
    exporter.scrape()
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 30000})
    started = time.monotonic()
    status, _, body = exporter.request("/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "2"}, timeout=15)
    waited = time.monotonic() - started
    assert status == 200
    s = Scrape(body.decode())
    assert s.value("resmon_collector_success", collector="gpu") == 0
    assert s.value("resmon_collector_success", collector="host") == 1
    assert {v for _, v in s.series("resmon_gpu_up")} == {0.0}
    assert waited < 15  # answered long before the 20 s collect timeout: the header's 2 s - 0.5 s won


def test_hung_call_keeps_threads_bounded_and_recovers(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    exporter.scrape()
    machine.update(**{"gpu.2.delay_ms.nvmlDeviceGetPowerUsage": 9000})
    counts = []
    for _ in range(5):
        s = exporter.scrape()
        assert s.value("resmon_collector_success", collector="gpu") == 0
        assert s.has("resmon_memory_total_bytes")
        counts.append(proc_status(exporter.proc.pid, "Threads"))
    assert max(counts) - min(counts) <= 1, counts  # no thread per stuck refresh
    machine.update(**{"gpu.2.delay_ms.nvmlDeviceGetPowerUsage": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert {v for _, v in s.series("resmon_gpu_up")} == {1.0}


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
    exporter.scrape()
    machine.update(**{"rc.nvmlDeviceGetCount_v2": 9})  # DRIVER_NOT_LOADED: the module was unloaded
    s = exporter.scrape()
    assert {v for _, v in s.series("resmon_gpu_up")} == {0.0}
    machine.update(**{"rc.nvmlDeviceGetCount_v2": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert {v for _, v in s.series("resmon_gpu_up")} == {1.0}
    assert trace.count("nvmlInitWithFlags") == 2


