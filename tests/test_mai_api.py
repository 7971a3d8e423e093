"""The Python API an application imports (Mai): same snapshot as /metrics, nine keys."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from fakenvml import REPO, Scrape, nvml_env
from scenarios import GPU_IS_LOST, three_gpus

GIB = 1024**3

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from prometheus_client import CollectorRegistry, generate_latest
    from exporter import ResourceCollector, ResourceMonitor

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
    # Mai's decisions follow its documented rules on these numbers
    assert out["can_load_small"] is (res["available_memory_gb"] >= 0.75)
    assert out["can_load_10"] is (res["available_memory_gb"] >= 15 and res["gpu_free_vram_gb"] >= 10)
    assert out["overloaded"] is (res["memory_percent"] > 80 or res["cpu_percent"] > 80)
    avail = res["available_memory_gb"]
    assert out["best"] == ("large" if avail >= 8 else "medium" if avail >= 4 else "small")


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
    assert out["can_load_small"] is (res["available_memory_gb"] >= 0.75)  # no GPU: RAM alone decides
