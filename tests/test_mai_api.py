"""The Python API an application imports (Mai): same snapshot as /metrics, nine keys."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fakenvml import REPO, Scrape, nvml_env
from scenarios import GPU_IS_LOST, three_gpus

GIB = 1024**3

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from prometheus_client import CollectorRegistry, generate_latest
    from resmon_exporter import ResourceCollector, ResourceMonitor

    monitor = ResourceMonitor(cache_ttl=float(sys.argv[1]))
    registry = CollectorRegistry()
    registry.register(ResourceCollector(monitor))
    out = {"first": monitor.get_current_resources(), "text": generate_latest(registry).decode()}
    out["again"] = [monitor.get_current_resources() for _ in range(200)][-1]
    out["can_load_small"] = monitor.can_load_model(0.5)
    out["can_load_10"] = monitor.can_load_model(10)
    out["overloaded"] = monitor.is_system_overloaded()
    out["best"] = monitor.get_best_model_size()
    if len(sys.argv) > 2:  # then the machine changes: the monitor must follow, no latch
        with open(os.environ["FAKE_NVML_SCENARIO"] + ".new", "w") as f:
            f.write(sys.argv[2])
        os.replace(os.environ["FAKE_NVML_SCENARIO"] + ".new", os.environ["FAKE_NVML_SCENARIO"])
        out["after_change"] = monitor.get_current_resources()
    print(json.dumps(out))
    """
)

KEYS = {
    "memory_percent",
    "cpu_percent",
    "available_memory_gb",
    "gpu_vram_gb",
    "gpu_total_vram_gb",
    "gpu_used_vram_gb",
    "gpu_free_vram_gb",
    "gpu_utilization_percent",
    "gpu_temperature_c",
}


def run_api(lib_dir, scenario, trace, ttl: str, new_scenario: str | None = None) -> dict:
    args = [sys.executable, "-c", SCRIPT, ttl] + ([new_scenario] if new_scenario is not None else [])
    result = subprocess.run(args, env=nvml_env(lib_dir, scenario, trace), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def scenario_text(values: dict) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def test_nine_keys_from_the_same_snapshot_as_metrics(fake_libs, scenario, trace):
    values = three_gpus()
    scenario.write(values)
    out = run_api(fake_libs["current"], scenario, trace, "3600")
    res = out["first"]
    assert set(res) == KEYS and all(isinstance(v, float) for v in res.values())
    total, used, reserved = (values[f"gpu.0.memory_{k}"] for k in ("total", "used", "reserved"))
    assert res["gpu_total_vram_gb"] == total / GIB
    assert res["gpu_used_vram_gb"] == used / GIB
    assert res["gpu_free_vram_gb"] == (total - used - reserved) / GIB
    assert res["gpu_vram_gb"] == res["gpu_free_vram_gb"]  # kept for backward compatibility
    assert res["gpu_utilization_percent"] == pytest.approx(values["gpu.0.util_gpu"])
    assert res["gpu_temperature_c"] == values["gpu.0.temperature"]
    # host keys equal what /metrics served from the same snapshot
    s = Scrape(out["text"])
    mem_total = s.value("resmon_memory_total_bytes")
    assert res["memory_percent"] == pytest.approx(s.value("resmon_memory_used_bytes") / mem_total * 100)
    assert res["available_memory_gb"] == pytest.approx(s.value("resmon_memory_available_bytes") / GIB)
    assert res["cpu_percent"] == pytest.approx(s.value("resmon_cpu_utilization_ratio") * 100)
    assert s.value("resmon_gpu_memory_free_bytes", gpu="0", uuid=values["gpu.0.uuid"]) / GIB == res["gpu_free_vram_gb"]
    # warm calls reuse the snapshot: one NVML refresh for 200 calls
    assert out["again"] == res
    assert trace.count("nvmlDeviceGetUtilizationRates", device=0) == 1
    assert trace.count("nvmlInitWithFlags") == 1


def test_no_permanent_failure_latch(fake_libs, scenario, trace):
    values = three_gpus()
    scenario.write({**values, "gpu.0.rc.all": GPU_IS_LOST})
    out = run_api(fake_libs["current"], scenario, trace, "0", new_scenario=scenario_text(values))
    lost, recovered = out["first"], out["after_change"]
    assert lost["gpu_total_vram_gb"] == 0.0 and lost["gpu_temperature_c"] == 0.0
    assert lost["available_memory_gb"] > 0  # host keys still flow
    assert recovered["gpu_total_vram_gb"] == values["gpu.0.memory_total"] / GIB
    assert recovered["gpu_temperature_c"] == values["gpu.0.temperature"]


def test_without_nvml_gpu_keys_are_zero(tmp_path, scenario, trace):
    empty = tmp_path / "nolib"
    empty.mkdir()
    out = run_api(empty, scenario, trace, "1")
    res = out["first"]
    assert set(res) == KEYS
    assert all(res[k] == 0.0 for k in KEYS if k.startswith("gpu_"))
    assert res["available_memory_gb"] > 0 and 0 < res["memory_percent"] < 100


# -- decisions on fixed machines ---------------------------------------------------------
# The host is a procfs tree of the test's own (psutil.PROCFS_PATH) and GPU 0 a fake-NVML
# device, so every expected answer below is written out, not re-derived from the code.

KIB_PER_GIB = 1024 * 1024


def fake_procfs(root: Path, total_gib: float, available_kib: int, busy: int = 500, idle: int = 500) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    total_kib = int(total_gib * KIB_PER_GIB)
    (root / "meminfo").write_text(
        f"MemTotal: {total_kib} kB\nMemFree: {available_kib} kB\nMemAvailable: {available_kib} kB\n"
        "Buffers: 0 kB\nCached: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\nShmem: 0 kB\nSReclaimable: 0 kB\n"
        "Active: 0 kB\nInactive: 0 kB\n"
    )
    # since-boot CPU times: busy/(busy+idle) is the first utilization the monitor reports
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 {busy} 0 0 {idle} 0 0 0 0 0 0\n")
    (root / "vmstat").write_text("pswpin 0\npswpout 0\n")
    return root


def gpu0_with_free(free_gib: float) -> dict:
    """One GPU whose free VRAM is exactly free_gib (total - used - reserved)."""
    return {**three_gpus(), "count": 1, "gpu.0.memory_total": 16 * GIB, "gpu.0.memory_reserved": GIB // 2,
            "gpu.0.memory_used": int(16 * GIB - GIB // 2 - free_gib * GIB)}


@pytest.fixture
def machine(fake_libs, tmp_path_factory, tmp_path, monkeypatch):
    """machine(available_gib, gpu=..., **monitor kwargs) -> ResourceMonitor on that machine."""
    import psutil

    from resmon_exporter import ResourceMonitor
    from fakenvml import Scenario, load_in_process

    load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    made = []

    def make(available_kib: int, gpu: dict | None = None, total_gib: float = 64, busy: int = 500, **kwargs):
        root = fake_procfs(tmp_path / f"proc{len(made)}", total_gib, available_kib, busy=busy, idle=1000 - busy)
        monkeypatch.setattr(psutil, "PROCFS_PATH", str(root))
        scenario = Scenario(tmp_path / f"scenario{len(made)}.txt", gpu or {})
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
        kwargs.setdefault("gpu_backend", "nvml" if gpu is not None else "none")
        monitor = ResourceMonitor(cache_ttl=0, **kwargs)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.close()


def gib_kib(gib: float) -> int:
    return int(gib * KIB_PER_GIB)


def test_can_load_model_at_the_ram_boundary(machine):
    m = machine(gib_kib(12), gpu=gpu0_with_free(8))  # 12 GiB RAM available, 8 GiB VRAM free
    assert m.can_load_model(8) is True  # 12 >= 1.5 x 8 and 8 >= 8: both boundaries met
    assert m.can_load_model(8.01) is False  # 12 < 12.015: RAM refuses


def test_can_load_model_at_the_vram_boundary(machine):
    m = machine(gib_kib(30), gpu=gpu0_with_free(8))
    assert m.can_load_model(8) is True
    assert m.can_load_model(8.5) is False  # RAM would do (30 >= 12.75), 8 GiB VRAM does not


def test_no_gpu_cannot_load_on_a_gpu_and_the_cpu_rule_is_asked_for(machine):
    # issue 35 item 5: can_load_model(7.0) was True on a host without a GPU while
    # get_current_resources() said 0 free VRAM; RAM alone is now a question of its own
    m = machine(gib_kib(30))  # backend none: a host without GPUs
    assert m.get_current_resources()["gpu_free_vram_gb"] == 0.0
    assert m.can_load_model(7.0) is False
    assert m.can_load_model(7.0, device="cpu") is True
    assert m.can_load_model(20, device="cpu") is True  # 30 >= 1.5 x 20
    assert m.can_load_model(20.1, device="cpu") is False


def test_with_the_gpu_collector_off_only_the_cpu_rule_answers_true(machine):
    m = machine(gib_kib(30), gpu=gpu0_with_free(8), collect_gpu=False)
    assert m.can_load_model(1) is False  # no GPU read: none is known to fit
    assert m.can_load_model(1, device="cpu") is True


def test_the_model_fits_on_the_gpu_with_the_most_free_vram(machine):
    two = {**gpu0_with_free(2), "count": 2, **{k.replace("gpu.0.", "gpu.1.", 1): v for k, v in gpu0_with_free(8).items()
                                               if k.startswith("gpu.0.")}}
    two["gpu.1.uuid"] = "GPU-0c1c7b8e-1d2e-4c47-9b5a-00000000000f"
    two["gpu.1.pci_bus_id"] = "00000000:0F:00.0"
    m = machine(gib_kib(30), gpu=two)
    assert m.get_current_resources()["gpu_free_vram_gb"] == 2.0  # the nine keys stay GPU 0's
    assert m.can_load_model(8) is True  # GPU 1 has 8 GiB free
    assert m.can_load_model(8.5) is False  # no single GPU has 8.5 (together they have 10)


def test_can_load_model_refuses_an_unknown_device(machine):
    m = machine(gib_kib(30))
    with pytest.raises(ValueError, match="device must be 'gpu' or 'cpu'"):
        m.can_load_model(1, device="tpu")


def test_a_gpu_that_is_down_is_not_no_gpu(machine):
    m = machine(gib_kib(30), gpu={**gpu0_with_free(8), "gpu.0.rc.all": GPU_IS_LOST})
    assert m.can_load_model(1) is False
    res = m.get_current_resources()
    assert res["gpu_free_vram_gb"] == 0.0 and res["gpu_total_vram_gb"] == 0.0  # the documented zeros
    assert res["available_memory_gb"] == 30.0
    assert m.get_gpus()[0]["up"] is False


def test_a_gpu_read_that_times_out_is_not_no_gpu(machine):
    slow = {**gpu0_with_free(8), "gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 3000}
    m = machine(gib_kib(30), gpu=slow, collect_timeout=0.5)
    assert m.can_load_model(1) is False


@pytest.mark.parametrize(
    "available_kib, tier",
    [
        (gib_kib(8), "large"),
        (gib_kib(8) - 1, "medium"),
        (gib_kib(4), "medium"),
        (gib_kib(4) - 1, "small"),
        (gib_kib(0.5), "small"),
    ],
)
def test_best_model_size_tiers(machine, available_kib, tier):
    assert machine(available_kib).get_best_model_size() == tier


@pytest.mark.parametrize(
    "available_gib, busy, overloaded",
    [
        (20, 500, False),  # memory exactly 80 %, CPU 50 %: "more than 80" is not met
        (19.99, 500, True),  # memory 80.01 %
        (50, 810, True),  # CPU 81 %
        (50, 800, False),  # CPU exactly 80 %
    ],
)
def test_overload_thresholds(machine, available_gib, busy, overloaded):
    m = machine(gib_kib(available_gib), total_gib=100, busy=busy)
    assert m.is_system_overloaded() is overloaded


# -- after close() -----------------------------------------------------------------------


def test_the_api_raises_after_close_and_snapshots_mark_the_gpu_failed(machine):
    m = machine(gib_kib(30), gpu=gpu0_with_free(8))
    assert m.can_load_model(1) is True and m.snapshot().gpu_status.success
    m.close()
    m.close()  # idempotent
    calls = {
        "get_current_resources": m.get_current_resources,
        "can_load_model": lambda: m.can_load_model(1),
        "get_gpus": m.get_gpus,
        "get_gpu_processes": m.get_gpu_processes,
        "is_system_overloaded": m.is_system_overloaded,
        "get_best_model_size": m.get_best_model_size,
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="ResourceMonitor is closed"):
            call()
            pytest.fail(f"{name} answered after close()")
    # /metrics (the CLI renders a scrape that raced the shutdown): the last values, GPU failed
    snap = m.snapshot()
    assert snap.gpu is not None and snap.gpu_status is not None and snap.gpu_status.success is False


def test_a_context_manager_closes_and_the_api_then_raises(machine):
    with machine(gib_kib(30)) as m:
        assert m.get_best_model_size() == "large"
    with pytest.raises(RuntimeError, match="ResourceMonitor is closed"):
        m.get_best_model_size()


def test_close_does_not_wait_out_the_xid_watchers_wait_and_nvml_is_shut_down_after_it(
    machine, fake_libs, tmp_path_factory
):
    import time

    from fakenvml import load_in_process

    trace = load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    deadline = time.monotonic() + 30
    # a GPU worker an earlier test left inside a slow call shuts its NVML down when it returns:
    # not in this test's trace. Only the threads that call NVML count: a DRM scan another test
    # left blocked on a FUSE mount (tests run on xdist workers, file after file) never does
    nvml = ("resmon-gpu", "resmon-xid", "resmon-start")
    while any(t.name.startswith(nvml) for t in threading.enumerate()):
        assert time.monotonic() < deadline, "threads of an earlier test are still running"
        time.sleep(0.02)
    # every event wait blocks 0.8 s in the driver before its own 0.5 s timeout starts
    m = machine(gib_kib(30), gpu={**gpu0_with_free(8), "delay_ms.nvmlEventSetWait_v2": 800})
    trace.clear()
    m.get_current_resources()  # the first read hands the GPUs to the XID watcher

    def xid_alive() -> bool:
        return any(t.name == "resmon-xid" and t.is_alive() for t in threading.enumerate())

    deadline = time.monotonic() + 10
    while trace.count("nvmlEventSetWait_v2") == 0:  # polled every 10 ms: a wait just began
        assert time.monotonic() < deadline, "the XID watcher never waited"
        time.sleep(0.01)
    started = time.perf_counter()
    m.close()
    took = time.perf_counter() - started
    print(f"close() with the XID watcher inside a wait: {took * 1000:.1f} ms")
    # the wait has about 1.3 s to go: close() returned without waiting it out, and did not
    # shut NVML down under it (that can crash a real driver)
    assert xid_alive(), f"close() waited for the watcher's wait ({took:.2f} s)"
    assert trace.count("nvmlShutdown") == 0
    deadline = time.monotonic() + 10
    while xid_alive() or trace.count("nvmlShutdown") == 0:  # the watcher, on its way out, shuts NVML down
        assert time.monotonic() < deadline, f"NVML never shut down after close(): {trace.counts()}"
        time.sleep(0.01)
    symbols = [s for s, _ in trace.lines()]
    assert symbols.count("nvmlShutdown") == 1, [s for s in symbols if "Shutdown" in s or "Init" in s or "EventSet" in s]
    last_wait = len(symbols) - 1 - symbols[::-1].index("nvmlEventSetWait_v2")
    assert last_wait < symbols.index("nvmlEventSetFree") < symbols.index("nvmlShutdown")


# -- the example that serves the metrics from an application -----------------------------

SERVING_EXAMPLE = REPO / "examples" / "serve_from_python.py"


def _get(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except OSError:
        return None  # not listening yet


def _serving_url(proc: subprocess.Popen[str], deadline: float) -> str:
    """The URL the example prints once it listens (--port=0: the port the kernel picked; a port
    found free first and passed later can be taken in between by another xdist worker)."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    # readline blocks: a thread of its own, so the wait below keeps its deadline
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise AssertionError("the example printed no URL in time") from None
    match = re.fullmatch(r"serving (http://127\.0\.0\.1:(\d+)/metrics) \(Ctrl-C stops\)\n", line)
    assert match and int(match[2]) > 0, (line, proc.poll())
    return match[1]


def test_the_serving_example_serves_until_ctrl_c(fake_libs, scenario, trace):
    # issue 35 item 5: the README's start_http_server example ended as soon as it was run as
    # a script (the server is a daemon thread); the example keeps serving until Ctrl-C
    values = three_gpus()
    scenario.write(values)
    proc = subprocess.Popen([sys.executable, str(SERVING_EXAMPLE), "--port=0"], env=nvml_env(fake_libs["current"], scenario, trace),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        url = _serving_url(proc, deadline)
        answer = None
        while proc.poll() is None and time.monotonic() < deadline:
            answer = _get(url)
            if answer is not None and "resmon_gpu_memory_total_bytes" in answer[1]:
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"the example exited ({proc.returncode}) instead of serving: {proc.communicate()}"
        assert answer is not None and answer[0] == 200, answer
        scrape = Scrape(answer[1])
        assert scrape.value("resmon_gpu_memory_total_bytes", gpu="0", uuid=values["gpu.0.uuid"]) == values["gpu.0.memory_total"]
        assert _get(url) is not None  # still serving after the scrape
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0 and "stopping on SIGINT" in out, (proc.returncode, out, err)
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
