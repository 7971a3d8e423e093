"""The test rig itself: the fake libnvidia-ml.so.1 builds against NVIDIA's header, behaves
like a strict NVML through the unmodified pynvml, and satisfies gpustat and nvitop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakenvml import build_fake, nvml_env, nvml_header_dir
from scenarios import three_gpus


def test_builds_against_the_official_nvml_header(tmp_path):
    header = nvml_header_dir()
    if header is None:
        pytest.skip("nvidia-nvml-dev is not installed (scripts/test.sh installs it when pip can)")
    # -Werror: a prototype that differs from nvml.h is a "conflicting types" error
    for old in (False, True):
        out = build_fake(tmp_path / f"hdr-{old}", old_driver=old, header_dir=header)
        assert (out / "libnvidia-ml.so.1").stat().st_size > 0


def test_soname_and_exports(fake_libs):
    lib = fake_libs["current"] / "libnvidia-ml.so.1"
    if shutil.which("readelf") is None:
        pytest.skip("readelf missing")
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in dyn
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
    for symbol in ("nvmlInitWithFlags", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
                   "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlErrorString"):
        assert f" {symbol}" in syms
    old = subprocess.run(["readelf", "--dyn-syms", "-W", str(fake_libs["old"] / "libnvidia-ml.so.1")],
                         capture_output=True, text=True).stdout
    assert " nvmlDeviceGetMemoryInfo_v2" not in old and " nvmlDeviceGetMemoryInfo" in old


STRICT = textwrap.dedent(
    """
    import ctypes, json, os, pynvml
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    out = {}
    n = ctypes.c_uint()
    out["count_before_init"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    mem = pynvml.c_nvmlMemory_v2_t(); mem.version = 0x01000028
    out["wrong_version"] = lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(mem))
    buf = ctypes.create_string_buffer(4)
    out["short_buffer"] = lib.nvmlDeviceGetName(h, buf, ctypes.c_uint(4))
    d = pynvml.c_nvmlDevice_t()
    out["bad_index"] = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(99), ctypes.byref(d))
    out["null_out"] = lib.nvmlDeviceGetPowerUsage(h, None)
    out["temp_before"] = pynvml.nvmlDeviceGetTemperatureV(h, 0)
    path = os.environ["FAKE_NVML_SCENARIO"]
    with open(path + ".n", "w") as f:
        f.write(open(path).read() + "gpu.0.temperature=91\\n")
    os.replace(path + ".n", path)
    out["temp_after_reload"] = pynvml.nvmlDeviceGetTemperatureV(h, 0)
    pynvml.nvmlShutdown()
    out["after_shutdown"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
    print(json.dumps(out))
    """
)


def test_strict_nvml_behaviour_and_live_reload(fake_libs, scenario):
    scenario.write(three_gpus())
    result = subprocess.run([sys.executable, "-c", STRICT], env=nvml_env(fake_libs["current"], scenario),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {
        "count_before_init": 1,  # UNINITIALIZED
        "wrong_version": 25,  # ARGUMENT_VERSION_MISMATCH
        "short_buffer": 7,  # INSUFFICIENT_SIZE
        "bad_index": 2,  # INVALID_ARGUMENT
        "null_out": 2,
        "temp_before": three_gpus()["gpu.0.temperature"],
        "temp_after_reload": 91,
        "after_shutdown": 1,
    }


def test_init_failure_code_reaches_pynvml(fake_libs, scenario):
    scenario.write({"init": 9})
    code = "import pynvml\ntry:\n pynvml.nvmlInit()\nexcept pynvml.NVMLError_DriverNotLoaded:\n print('driver-not-loaded')"
    result = subprocess.run([sys.executable, "-c", code], env=nvml_env(fake_libs["current"], scenario),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "driver-not-loaded", result.stderr


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} missing: the test extra installs it")
    return str(path)


def test_gpustat_runs_against_the_fake(fake_libs, scenario):
    values = three_gpus()
    scenario.write(values)
    result = subprocess.run([_tool("gpustat"), "--json"], env=nvml_env(fake_libs["current"], scenario),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert data["driver_version"] == values["driver_version"]
    assert [g["uuid"] for g in data["gpus"]] == [values[f"gpu.{i}.uuid"] for i in range(3)]
    g0 = data["gpus"][0]
    assert g0["name"] == values["gpu.0.name"]
    assert g0["memory.used"] == values["gpu.0.memory_used"] // 2**20
    assert g0["memory.total"] == values["gpu.0.memory_total"] // 2**20
    assert g0["temperature.gpu"] == values["gpu.0.temperature"]
    assert g0["fan.speed"] is None  # NOT_SUPPORTED in the scenario
    assert g0["power.draw"] == values["gpu.0.power_mw"] // 1000
    assert os.getpid() in {p["pid"] for p in g0["processes"]}


def test_nvitop_runs_against_the_fake(fake_libs, scenario):
    values = three_gpus()
    scenario.write(values)
    result = subprocess.run([_tool("nvitop"), "-1"], env={**nvml_env(fake_libs["current"], scenario), "COLUMNS": "120"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert "550.54.15" in result.stdout
    for short in ("H100 80GB HBM3", "A100-SXM4-40GB", "L4"):
        assert short in result.stdout
    assert f"{os.getpid()}" in result.stdout  # our PID in its process table
    assert "00000000:07:00.0" in result.stdout
