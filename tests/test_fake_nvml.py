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


HEALTH_SYMBOLS = (
    "nvmlDeviceGetFieldValues", "nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetSamples",
)


def test_soname_and_exports(fake_libs):
    lib = fake_libs["current"] / "libnvidia-ml.so.1"
    if shutil.which("readelf") is None:
        pytest.skip("readelf missing")
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "Library soname: [libnvidia-ml.so.1]" in dyn
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
    for symbol in ("nvmlInitWithFlags", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
                   "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlErrorString", *HEALTH_SYMBOLS):
        assert f" {symbol}" in syms
    old = subprocess.run(["readelf", "--dyn-syms", "-W", str(fake_libs["old"] / "libnvidia-ml.so.1")],
                         capture_output=True, text=True).stdout
    assert " nvmlDeviceGetMemoryInfo_v2" not in old and " nvmlDeviceGetMemoryInfo" in old
    for symbol in HEALTH_SYMBOLS:  # all of them predate R535: the old driver has them too
        assert f" {symbol}" in old


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


# -- health features (issue 10), in-process through the real pynvml ------------------------
# The fake is loaded into this process once (fakenvml.load_in_process); every test points
# $FAKE_NVML_SCENARIO at its own file, so the fake re-reads it on the next call.

import ctypes
import struct
import time

import pynvml

import scenarios as sc
from fakenvml import Scenario, load_in_process

SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 2, 3, 6, 7
DOUBLE, UINT, ULONGLONG = 0, 1, 3


@pytest.fixture
def nvml(fake_libs, tmp_path_factory, tmp_path, monkeypatch):
    """nvml(values) -> handles of that machine, NVML initialised (shut down afterwards)."""
    trace = load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    path = tmp_path / "health-scenario.txt"
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    inited = []

    def machine(values: dict) -> list:
        Scenario(path, values)
        if not inited:
            pynvml.nvmlInit()
            inited.append(True)
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    machine.trace = trace
    yield machine
    if inited:
        pynvml.nvmlShutdown()


def lib() -> ctypes.CDLL:
    return ctypes.CDLL("libnvidia-ml.so.1")  # the fake, already loaded under that soname


def raises(code: int, fn, *args) -> None:
    with pytest.raises(pynvml.NVMLError) as err:
        fn(*args)
    assert err.value.value == code, (fn.__name__, args, err.value)


def fields(handle, *requests) -> dict:
    """{(id, scope): entry} through pynvml; the call itself must succeed."""
    entries = pynvml.nvmlDeviceGetFieldValues(handle, list(requests))
    return {(e.fieldId, e.scopeId): e for e in entries}


def ok(entry, value_type: int):
    assert entry.nvmlReturn == SUCCESS, (entry.fieldId, entry.scopeId, entry.nvmlReturn)
    assert entry.valueType == value_type, (entry.fieldId, entry.valueType)
    return {DOUBLE: entry.value.dVal, UINT: entry.value.uiVal, ULONGLONG: entry.value.ullVal}[value_type]


def mono_us() -> int:
    return time.monotonic_ns() // 1000  # CLOCK_MONOTONIC, the sample buffers' clock


ALL_HEALTH_CALLS = (
    ("nvmlDeviceGetEccMode", ()), ("nvmlDeviceGetTotalEccErrors", (0, 0)), ("nvmlDeviceGetTotalEccErrors", (1, 1)),
    ("nvmlDeviceGetRetiredPages", (0,)), ("nvmlDeviceGetRetiredPages_v2", (1,)),
    ("nvmlDeviceGetRetiredPagesPendingStatus", ()), ("nvmlDeviceGetRemappedRows", ()),
    ("nvmlDeviceGetNvLinkState", (0,)), ("nvmlDeviceGetNvLinkErrorCounter", (0, 0)),
    ("nvmlDeviceGetCurrPcieLinkGeneration", ()), ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    ("nvmlDeviceGetGpuMaxPcieLinkGeneration", ()), ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("nvmlDeviceGetMaxPcieLinkWidth", ()), ("nvmlDeviceGetPcieReplayCounter", ()),
    *(("nvmlDeviceGetViolationStatus", (p,)) for p in range(6)),
    *(("nvmlDeviceGetSamples", (t, 0)) for t in range(1, 5)),
)


def test_every_health_call_is_not_supported_on_the_default_machine(nvml):
    (h,) = nvml({})
    for name, args in ALL_HEALTH_CALLS:
        raises(NOT_SUPPORTED, getattr(pynvml, name), h, *args)
    got = fields(h, 82, 74, 76, 269, 270, 271, 77, 78, 79, 197, 198, 230, 138, 139, 140, 141, (138, sc.ALL_LINKS))
    assert {k: e.nvmlReturn for k, e in got.items()} == {k: NOT_SUPPORTED for k in got}  # overall call: SUCCESS
    assert ok(fields(h, 91)[(91, 0)], UINT) == 0  # the link count answers, also with no links
    # what existed before stays as it was
    assert pynvml.nvmlDeviceGetEncoderUtilization(h) == [0, 167000]
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0


def test_each_health_symbol_has_an_id_for_rc_and_trace(nvml):
    (h,) = nvml({f"rc.{name}": 15 for name in HEALTH_SYMBOLS})
    nvml.trace.clear()
    for name, args in ALL_HEALTH_CALLS:
        raises(15, getattr(pynvml, name), h, *args)  # GPU_IS_LOST from the override
    raises(15, pynvml.nvmlDeviceGetFieldValues, h, [82])
    called = set(nvml.trace.counts())
    assert set(HEALTH_SYMBOLS) <= called, set(HEALTH_SYMBOLS) - called
    (h,) = nvml({"gpu.0.rc.nvmlDeviceGetEccMode": 999, "gpu.0.ecc": "on"})  # per device too
    raises(999, pynvml.nvmlDeviceGetEccMode, h)
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0) == 0


def test_field_values_of_the_hopper_board(nvml):
    h = nvml(sc.health_machine())[0]
    clock = list(sc.HOPPER_CLOCK_EVENT_NS)
    before = time.time_ns() // 1000
    got = fields(h, 82, 91, *clock, 197, 198, 230, (138, 0), (139, 17), (140, 5), (141, 5),
                 (138, sc.ALL_LINKS), (139, sc.ALL_LINKS), (138, 18), 9999)
    after = time.time_ns() // 1000
    assert ok(got[(82, 0)], UINT) == sc.HOPPER_MEMORY_TEMP == 54
    assert ok(got[(91, 0)], UINT) == sc.HOPPER_NVLINKS
    for fid, ns in sc.HOPPER_CLOCK_EVENT_NS.items():
        assert ok(got[(fid, 0)], ULONGLONG) == ns
    assert len(set(sc.HOPPER_CLOCK_EVENT_NS.values())) == 8  # distinct, so a mix-up shows
    assert ok(got[(197, 0)], ULONGLONG) == sc.HOPPER_PCIE_TX_BYTES
    assert ok(got[(198, 0)], ULONGLONG) == sc.HOPPER_PCIE_RX_BYTES
    assert ok(got[(230, 0)], UINT) == 0
    assert ok(got[(138, 0)], ULONGLONG) == sc.HOPPER_NVLINK_TX_KIB[0]
    assert ok(got[(139, 17)], ULONGLONG) == sc.HOPPER_NVLINK_RX_KIB[17]
    assert ok(got[(140, 5)], ULONGLONG) == sc.HOPPER_NVLINK_TX_KIB[5]  # RAW: the same counters
    assert ok(got[(141, 5)], ULONGLONG) == sc.HOPPER_NVLINK_RX_KIB[5]
    assert ok(got[(138, sc.ALL_LINKS)], ULONGLONG) == sum(sc.HOPPER_NVLINK_TX_KIB)
    assert ok(got[(139, sc.ALL_LINKS)], ULONGLONG) == sum(sc.HOPPER_NVLINK_RX_KIB)
    assert got[(138, 18)].nvmlReturn == INVALID_ARGUMENT  # link past the last one
    assert got[(9999, 0)].nvmlReturn == NOT_SUPPORTED
    for entry in got.values():  # every entry, answered or not, is stamped
        assert before <= entry.timestamp <= after and entry.latencyUsec == 0


def test_field_values_of_the_volta_and_consumer_boards(nvml):
    _, volta, consumer = nvml(sc.health_machine())
    clock = list(sc.CLOCK_EVENT_FIELDS.values())
    got = fields(volta, 82, 91, *(fid for fid, _ in clock), 197, 198, 230, (139, 5), (139, sc.ALL_LINKS))
    assert ok(got[(82, 0)], UINT) == sc.VOLTA_MEMORY_TEMP
    assert ok(got[(91, 0)], UINT) == sc.VOLTA_NVLINKS
    for fid in (*(fid for fid, _ in clock), 197, 198, 230):  # the older driver knows none of them
        assert got[(fid, 0)].nvmlReturn == NOT_SUPPORTED, fid
    assert ok(got[(139, 5)], ULONGLONG) == sc.VOLTA_NVLINK_RX_KIB[5]
    assert ok(got[(139, sc.ALL_LINKS)], ULONGLONG) == sum(sc.VOLTA_NVLINK_RX_KIB)

    got = fields(consumer, 82, 91, *sc.CONSUMER_CLOCK_EVENT_NS, 138, (139, sc.ALL_LINKS), 197, 230)
    assert got[(82, 0)].nvmlReturn == NOT_SUPPORTED  # GDDR6X: the entry says so, the call succeeded
    assert ok(got[(91, 0)], UINT) == 0
    for fid, ns in sc.CONSUMER_CLOCK_EVENT_NS.items():
        assert ok(got[(fid, 0)], ULONGLONG) == ns
    for key in ((138, 0), (139, sc.ALL_LINKS), (197, 0), (230, 0)):
        assert got[key].nvmlReturn == NOT_SUPPORTED, key


def test_field_value_keys_scopes_types_and_returns(nvml):
    (h,) = nvml({
        "gpu.0.field.300": 7, "gpu.0.field.300@2": 9, "gpu.0.field.300@0xFFFFFFFF": 11,
        "gpu.0.field_double.301": 1.5, "gpu.0.field_double.301@1": -2.25,
        "gpu.0.field.82": 54, "gpu.0.field_type.82": 0,  # r545: written as uiVal, labelled DOUBLE
        "gpu.0.field.302": 5, "gpu.0.field_rc.302": 4,  # the entry's own return wins
        "gpu.0.field_type.303": 1,  # a type alone is no value
        "gpu.0.field.305": 8, "gpu.0.field_rc.305@1": 15,
        "gpu.0.field.306": 2**40 + 3, "gpu.0.field_type.306@4": 4,
        "gpu.0.field.230": 2, "gpu.0.nvlinks": 2, "gpu.0.field.91": 4,  # field.91 overrides the derived count
        "gpu.0.field_rc.138@1": 3, "gpu.0.nvlink.1.tx_kib": 77, "gpu.0.nvlink.0.tx_kib": 5,
    })
    got = fields(h, (300, 0), (300, 2), (300, 3), (300, sc.ALL_LINKS), (301, 0), (301, 1), 82, 302, 303,
                 (305, 0), (305, 1), (306, 0), (306, 4), 230, 91, (138, 0), (138, 1), (138, sc.ALL_LINKS))
    assert ok(got[(300, 0)], ULONGLONG) == 7 and ok(got[(300, 3)], ULONGLONG) == 7
    assert ok(got[(300, 2)], ULONGLONG) == 9
    assert ok(got[(300, sc.ALL_LINKS)], ULONGLONG) == 11
    assert ok(got[(301, 0)], DOUBLE) == 1.5 and ok(got[(301, 1)], DOUBLE) == -2.25
    mislabelled = got[(82, 0)]
    assert mislabelled.nvmlReturn == SUCCESS and mislabelled.valueType == DOUBLE
    assert mislabelled.value.uiVal == 54 and mislabelled.value.ullVal == 54  # stored as UINT, upper half 0
    assert mislabelled.value.dVal == struct.unpack("<d", struct.pack("<Q", 54))[0]  # a denormal as a double
    assert got[(302, 0)].nvmlReturn == 4
    assert got[(303, 0)].nvmlReturn == NOT_SUPPORTED
    assert ok(got[(305, 0)], ULONGLONG) == 8 and got[(305, 1)].nvmlReturn == 15
    assert ok(got[(306, 0)], ULONGLONG) == 2**40 + 3
    relabelled = got[(306, 4)]
    assert relabelled.valueType == 4 and relabelled.value.ullVal == 2**40 + 3
    assert ok(got[(230, 0)], UINT) == 2
    assert ok(got[(91, 0)], UINT) == 4
    assert ok(got[(138, 0)], ULONGLONG) == 5 and got[(138, 1)].nvmlReturn == NOT_SUPPORTED
    assert ok(got[(138, sc.ALL_LINKS)], ULONGLONG) == 82


def test_field_values_call_level_errors(nvml):
    (h,) = nvml(sc.hopper_board(0))
    fn = lib().nvmlDeviceGetFieldValues
    arr = (pynvml.c_nvmlFieldValue_t * 2)()
    arr[0].fieldId, arr[1].fieldId = 82, 9999
    assert fn(h, ctypes.c_int(2), None) == INVALID_ARGUMENT
    assert fn(h, ctypes.c_int(0), arr) == INVALID_ARGUMENT
    assert fn(h, ctypes.c_int(-1), arr) == INVALID_ARGUMENT
    assert fn(h, ctypes.c_int(1), arr) == SUCCESS  # only the first entry is touched
    assert (arr[0].nvmlReturn, arr[0].value.uiVal, arr[1].timestamp) == (SUCCESS, 54, 0)
    bogus = ctypes.c_void_p(12345)
    assert fn(bogus, ctypes.c_int(2), arr) == INVALID_ARGUMENT


def test_violation_status_is_the_older_drivers_clock_event_time(nvml):
    hopper, volta, consumer = nvml(sc.health_machine())
    for policy, ns in sc.VOLTA_VIOLATION_NS.items():
        before = time.time_ns() // 1000
        v = pynvml.nvmlDeviceGetViolationStatus(volta, policy)
        assert v.violationTime == ns
        assert before <= v.referenceTime <= time.time_ns() // 1000
    assert len(set(sc.VOLTA_VIOLATION_NS.values())) == 6
    for policy in (10, 11):
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetViolationStatus, volta, policy)
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetViolationStatus, volta, 12)
    for h in (hopper, consumer):  # the boards whose driver answers the field ids instead
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetViolationStatus, h, 0)


def test_ecc_mode_and_counters(nvml):
    hopper, volta, consumer = nvml(sc.health_machine())
    assert pynvml.nvmlDeviceGetEccMode(hopper) == [1, 1]
    for board, counts in ((hopper, sc.HOPPER_ECC), (volta, sc.VOLTA_ECC)):
        for key, count in counts.items():
            error_type, counter = key.split(".")
            got = pynvml.nvmlDeviceGetTotalEccErrors(board, ("corrected", "uncorrected").index(error_type),
                                                     ("volatile", "aggregate").index(counter))
            assert got == count, key
    assert sc.HOPPER_ECC["corrected.aggregate"] > 0 and sc.HOPPER_ECC["uncorrected.aggregate"] == 0
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetEccMode, consumer)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetTotalEccErrors, consumer, 0, 0)
    out = ctypes.c_ulonglong()
    assert lib().nvmlDeviceGetTotalEccErrors(hopper, ctypes.c_uint(2), ctypes.c_uint(0), ctypes.byref(out)) == INVALID_ARGUMENT

    (h,) = nvml({"gpu.0.ecc": "off", "gpu.0.ecc_pending": 1, "gpu.0.ecc.corrected.volatile": 4})
    assert pynvml.nvmlDeviceGetEccMode(h) == [0, 1]  # enabled after the next reboot
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetTotalEccErrors, h, 0, 0)  # counters need ECC on
    (h,) = nvml({"gpu.0.ecc": "on", "gpu.0.ecc_pending": 0, "gpu.0.ecc.uncorrected.aggregate": 6})
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 0]
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 1) == 6 and pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0) == 0


def test_retired_pages_and_their_size_protocol(nvml):
    hopper, volta, consumer = nvml(sc.health_machine())
    assert pynvml.nvmlDeviceGetRetiredPages(volta, 0) == [1 << 36]  # one page, multiple single-bit
    assert pynvml.nvmlDeviceGetRetiredPages(volta, 1) == []  # SUCCESS on the size query: none
    assert pynvml.nvmlDeviceGetRetiredPages_v2(volta, 0) == [{"address": 1 << 36, "timestamp": 1700000000}]
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(volta) == sc.VOLTA_RETIRED["pending"] == 0
    for board in (hopper, consumer):  # row-remapping / no-ECC parts
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetRetiredPages, board, 0)
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetRetiredPages_v2, board, 0)
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetRetiredPagesPendingStatus, board)

    (h,) = nvml({"gpu.0.page_retirement": 1, "gpu.0.retired.double_bit": 3, "gpu.0.retired_pending": 1})
    fn = lib().nvmlDeviceGetRetiredPages
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.c_uint(1), ctypes.byref(count), None) == INSUFFICIENT_SIZE and count.value == 3
    buf = (ctypes.c_ulonglong * 8)()
    count.value = 2
    assert fn(h, ctypes.c_uint(1), ctypes.byref(count), buf) == INSUFFICIENT_SIZE and count.value == 3
    count.value = 8
    assert fn(h, ctypes.c_uint(1), ctypes.byref(count), buf) == SUCCESS and count.value == 3
    assert list(buf[:3]) == [(2 << 36) | (j << 12) for j in range(3)]
    count.value = 0
    assert fn(h, ctypes.c_uint(0), ctypes.byref(count), None) == SUCCESS and count.value == 0
    assert fn(h, ctypes.c_uint(0), None, None) == INVALID_ARGUMENT
    assert fn(h, ctypes.c_uint(2), ctypes.byref(count), None) == INVALID_ARGUMENT  # no such cause
    count.value = 4
    assert fn(h, ctypes.c_uint(1), ctypes.byref(count), None) == INVALID_ARGUMENT  # a size but no buffer
    pages = pynvml.nvmlDeviceGetRetiredPages_v2(h, 1)
    assert [p["timestamp"] for p in pages] == [1700000000, 1700000001, 1700000002]
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1


def test_remapped_rows(nvml):
    hopper, volta, consumer = nvml(sc.health_machine())
    r = sc.HOPPER_REMAPPED
    assert pynvml.nvmlDeviceGetRemappedRows(hopper) == (r["correctable"], r["uncorrectable"], r["pending"], r["failed"])
    assert r["correctable"] == 2
    for board in (volta, consumer):
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetRemappedRows, board)
    (h,) = nvml({"gpu.0.row_remapping": 1, "gpu.0.remapped.uncorrectable": 5, "gpu.0.remap_pending": 1,
                 "gpu.0.remap_failed": 1})
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 5, 1, 1)


def test_nvlink_state_and_error_counters(nvml):
    hopper, volta, consumer = nvml(sc.health_machine())
    assert [pynvml.nvmlDeviceGetNvLinkState(hopper, link) for link in range(sc.HOPPER_NVLINKS)] == [1] * 18
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetNvLinkState, hopper, 18)
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetNvLinkState, volta, sc.VOLTA_NVLINKS)
    for link in range(sc.HOPPER_NVLINKS):
        for counter, name in enumerate(sc.NVLINK_ERROR_COUNTERS):
            expected = sc.HOPPER_NVLINK_ERRORS.get((link, name), 0)
            assert pynvml.nvmlDeviceGetNvLinkErrorCounter(hopper, link, counter) == expected, (link, name)
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(volta, 2, 0) == 1
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetNvLinkErrorCounter, hopper, 0, 5)
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetNvLinkErrorCounter, hopper, 18, 0)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetNvLinkState, consumer, 0)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetNvLinkErrorCounter, consumer, 0, 0)
    (h,) = nvml({"gpu.0.nvlinks": 4, "gpu.0.nvlink.2.active": 0})
    assert [pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(4)] == [1, 1, 0, 1]


def test_pcie_link_and_replays(nvml):
    boards = zip(nvml(sc.health_machine()), (sc.HOPPER_PCIE, sc.VOLTA_PCIE, sc.CONSUMER_PCIE))
    for h, pcie in boards:
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == pcie["gen"]
        assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == pcie["gen_max"]
        assert pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == pcie["gen_max"]
        assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == pcie["width"]
        assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) == pcie["width_max"]
        assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == pcie["replays"]
    assert (sc.HOPPER_PCIE["gen"], sc.HOPPER_PCIE["replays"]) == (5, 3)
    assert (sc.CONSUMER_PCIE["width"], sc.CONSUMER_PCIE["width_max"]) == (8, 16)
    (h,) = nvml({"gpu.0.pcie_width": 4})  # each key on its own
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == 4
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)


def check_sequence(samples, period_us: int, pattern) -> None:
    """Consecutive samples, oldest first, each on its slot, each value from the pattern."""
    stamps = [s.timeStamp for s in samples]
    assert all(ts % period_us == 0 for ts in stamps)
    assert all(b - a == period_us for a, b in zip(stamps, stamps[1:])), stamps
    assert [s.sampleValue.uiVal for s in samples] == [pattern[(ts // period_us) % len(pattern)] for ts in stamps]


def test_samples_full_buffer_oldest_first_following_the_pattern(nvml):
    hopper, _, consumer = nvml(sc.health_machine())
    period = sc.HOPPER_SAMPLES_PERIOD_MS * 1000
    before = mono_us()
    value_type, gpu = pynvml.nvmlDeviceGetSamples(hopper, 1, 0)
    after = mono_us()
    assert value_type == UINT
    assert len(gpu) == sc.HOPPER_SAMPLES_CAPACITY == 50
    check_sequence(gpu, period, sc.HOPPER_SAMPLES_GPU)
    assert before - period < gpu[-1].timeStamp <= after  # the newest is the latest slot, on CLOCK_MONOTONIC
    # the integral over a full buffer (ten whole cycles of the pattern) is known exactly
    assert sum(s.sampleValue.uiVal for s in gpu) * sc.HOPPER_SAMPLES_PERIOD_MS == 25 * 50 * 20  # 0.25 s busy in 1 s
    _, memory = pynvml.nvmlDeviceGetSamples(hopper, 2, 0)
    check_sequence(memory, period, sc.HOPPER_SAMPLES_MEMORY)
    assert sum(s.sampleValue.uiVal for s in memory) == 20 * 50
    # no pattern: the constant utilization of that engine
    _, enc = pynvml.nvmlDeviceGetSamples(hopper, 3, 0)
    _, dec = pynvml.nvmlDeviceGetSamples(hopper, 4, 0)
    assert {s.sampleValue.uiVal for s in enc} == {sc.HOPPER_ENCODER_UTIL}
    assert {s.sampleValue.uiVal for s in dec} == {sc.HOPPER_DECODER_UTIL}
    _, flat = pynvml.nvmlDeviceGetSamples(consumer, 1, 0)
    assert len(flat) == sc.CONSUMER_SAMPLES_CAPACITY
    check_sequence(flat, sc.CONSUMER_SAMPLES_PERIOD_MS * 1000, sc.CONSUMER_SAMPLES_GPU)
    for sampling_type in (0, 5, 6, 7, 8, 9):  # power, clocks, module power, JPEG, OFA
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetSamples, hopper, sampling_type, 0)


def test_samples_newer_than_last_seen_and_not_found(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.samples.capacity": 7})
    period = sc.HOPPER_SAMPLES_PERIOD_MS * 1000
    _, first = pynvml.nvmlDeviceGetSamples(h, 1, 0)
    assert len(first) == 7  # limited by the capacity
    last_seen = first[2].timeStamp
    _, newer = pynvml.nvmlDeviceGetSamples(h, 1, last_seen)
    assert newer[0].timeStamp == last_seen + period and len(newer) >= 4
    check_sequence(newer, period, sc.HOPPER_SAMPLES_GPU)
    time.sleep(3 * period / 1e6)
    _, later = pynvml.nvmlDeviceGetSamples(h, 1, first[-1].timeStamp)  # the next refresh
    assert later[0].timeStamp == first[-1].timeStamp + period and len(later) >= 3
    check_sequence([*first, *later], period, sc.HOPPER_SAMPLES_GPU)  # one unbroken sequence
    raises(NOT_FOUND, pynvml.nvmlDeviceGetSamples, h, 1, 2**64 - 1)
    # nothing newer than the newest: a period of a minute makes a new slot between the calls improbable
    (h,) = nvml({"gpu.0.samples.period_ms": 60000, "gpu.0.util_gpu": 42})
    for _ in range(3):
        _, got = pynvml.nvmlDeviceGetSamples(h, 1, 0)
        assert {s.sampleValue.uiVal for s in got} == {42}
        try:
            pynvml.nvmlDeviceGetSamples(h, 1, got[-1].timeStamp)
        except pynvml.NVMLError_NotFound:
            break
    else:
        pytest.fail("never NOT_FOUND with lastSeen = the newest sample")


def test_samples_of_one_type_can_answer_their_own_code(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.samples.rc.encoder": NOT_SUPPORTED})
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetSamples, h, 3, 0)
    _, dec = pynvml.nvmlDeviceGetSamples(h, 4, 0)  # the other types answer as before
    assert {s.sampleValue.uiVal for s in dec} == {sc.HOPPER_DECODER_UTIL}


def test_samples_two_call_protocol(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.samples.period_ms": 1000, "gpu.0.samples.capacity": 10})
    fn = lib().nvmlDeviceGetSamples
    value_type, count = ctypes.c_uint(99), ctypes.c_uint(0)
    assert fn(h, ctypes.c_uint(1), ctypes.c_ulonglong(0), ctypes.byref(value_type), ctypes.byref(count), None) == SUCCESS
    assert value_type.value == UINT
    available = count.value
    assert 1 <= available <= 10 and available == min(10, mono_us() // 1_000_000)
    buf = (pynvml.c_nvmlSample_t * 10)()
    count.value = 3
    assert fn(h, ctypes.c_uint(1), ctypes.c_ulonglong(0), ctypes.byref(value_type), ctypes.byref(count), buf) == SUCCESS
    assert count.value == min(3, available)
    newest_slot = mono_us() // 1_000_000
    assert buf[0].timeStamp // 1_000_000 in (newest_slot - available + 1, newest_slot - available + 2)  # the oldest
    check_sequence(buf[: count.value], 1_000_000, sc.HOPPER_SAMPLES_GPU)
    assert buf[3].timeStamp == 0  # nothing past *sampleCount
    count.value = 0
    assert fn(h, ctypes.c_uint(1), ctypes.c_ulonglong(0), ctypes.byref(value_type), ctypes.byref(count), buf) == INVALID_ARGUMENT
    assert fn(h, ctypes.c_uint(1), ctypes.c_ulonglong(0), None, ctypes.byref(count), None) == INVALID_ARGUMENT
    count.value = 5
    rc = fn(h, ctypes.c_uint(1), ctypes.c_ulonglong(2**64 - 1), ctypes.byref(value_type), ctypes.byref(count), None)
    assert (rc, count.value) == (NOT_FOUND, 0)


def test_health_presets_are_distinct_boards(nvml, capfd):
    values = sc.health_machine()
    handles = nvml(values)
    assert values["count"] == 3 and values["driver_version"] == sc.HEALTH_DRIVER_VERSION
    assert pynvml.nvmlSystemGetDriverVersion() == sc.HEALTH_DRIVER_VERSION
    names = [pynvml.nvmlDeviceGetName(h) for h in handles]
    assert names == [sc.HOPPER_NAME, sc.VOLTA_NAME, sc.CONSUMER_NAME]
    uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
    buses = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
    assert uuids == [sc.board_uuid(b, i) for i, b in enumerate(("hopper", "volta", "consumer"))]
    assert buses == [sc.board_pci_bus_id(b, i) for i, b in enumerate(("hopper", "volta", "consumer"))]
    every = {sc.board_uuid(b, i) for b in ("hopper", "volta", "consumer") for i in range(8)}
    assert len(every) == 24 and len({sc.board_pci_bus_id(b, i) for b in ("hopper", "volta", "consumer") for i in range(8)}) == 24
    assert values["gpu.0.xid_supported"] == 1 and values["gpu.2.xid_supported"] == 0  # read by fake_events.c
    # every key the presets write is one the fake understands (xid_supported: fake_events.c)
    assert "ignoring unknown scenario key" not in capfd.readouterr().err


def test_malformed_health_keys_are_reported(nvml, capfd):
    capfd.readouterr()
    (h,) = nvml({"gpu.0.ecc": "maybe", "gpu.0.field.abc": 1, "gpu.0.field.82@x": 1, "gpu.0.nvlink.40.tx_kib": 1,
                 "gpu.0.samples.power": "1,2", "gpu.0.violation.12": 5, "gpu.0.nvlink.0.errors.bogus": 1})
    err = capfd.readouterr().err
    for key in ("ecc", "field.abc", "field.82@x", "nvlink.40.tx_kib", "samples.power", "violation.12",
                "nvlink.0.errors.bogus"):
        assert f"ignoring unknown scenario key gpu.0.{key}\n" in err, key
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetEccMode, h)  # a bad value leaves the default


# -- processes, per-process utilization, MIG (issue 11), in-process through the real pynvml --

import collections

from fakenvml import GIB

NA = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as usedGpuMemory
MIG_A = "MIG-3f8e1b2c-5d4a-5e6f-9a0b-1c2d3e4f5a6b"
MIG_B = "MIG-77aa0c1d-2b3c-5d4e-8f90-a1b2c3d4e5f6"
PROCESS_SYMBOLS = ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
                   "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceIsMigDeviceHandle",
                   "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")


def address(handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value


def procs(found) -> list:
    return [(p.pid, p.usedGpuMemory) for p in found]


def utils(samples) -> list:
    return [(s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil) for s in samples]


def epoch_us() -> int:
    return time.time_ns() // 1000


def test_process_and_mig_symbols_are_exported_by_both_builds(fake_libs):
    if shutil.which("readelf") is None:
        pytest.skip("readelf missing")
    for build in ("current", "old"):  # all of them predate R535
        syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(fake_libs[build] / "libnvidia-ml.so.1")],
                              capture_output=True, text=True).stdout
        for symbol in PROCESS_SYMBOLS:
            assert f" {symbol}\n" in syms, (build, symbol)


def test_process_lists_with_unknown_memory(nvml):
    (h,) = nvml({"gpu.0.processes": f"101:{GIB},102:na,103:0,104", "gpu.0.graphics_processes": "201:na,202:7"})
    want = [(101, GIB), (102, None), (103, 0), (104, 0)]
    assert procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h)) == want  # _v3
    assert procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)) == want
    assert procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)) == [(201, None), (202, 7)]
    count = ctypes.c_uint(8)
    buf = (pynvml.c_nvmlProcessInfo_v2_t * 8)()
    assert lib().nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), buf) == SUCCESS
    assert count.value == 4 and buf[1].usedGpuMemory == NA  # the raw sentinel pynvml turned into None
    assert (buf[1].gpuInstanceId, buf[1].computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)



def test_three_hundred_processes_through_the_two_call_protocol(nvml, capfd):
    entries = [(1000 + i, (i + 1) * 1024**2) for i in range(300)]
    line = ",".join(f"{pid}:{mem}" for pid, mem in entries)
    assert len(line) > 4096  # longer than the fake's old line buffer, too
    capfd.readouterr()
    (h,) = nvml({"gpu.0.processes": line, "gpu.0.graphics_processes": line})
    assert procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h)) == entries
    assert procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(h)) == entries
    fn = lib().nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == INSUFFICIENT_SIZE and count.value == 300
    buf = (pynvml.c_nvmlProcessInfo_v2_t * 300)()
    count.value = 299
    assert fn(h, ctypes.byref(count), buf) == INSUFFICIENT_SIZE and count.value == 300
    assert fn(h, ctypes.byref(count), buf) == SUCCESS and count.value == 300
    assert (buf[299].pid, buf[299].usedGpuMemory) == entries[-1]
    assert "ignoring unknown scenario key" not in capfd.readouterr().err

    (h,) = nvml({"gpu.0.processes": ",".join(f"{5000 + i}:na" for i in range(600))})  # past the cap
    got = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [p.pid for p in got] == [5000 + i for i in range(512)] and {p.usedGpuMemory for p in got} == {None}
    assert "ignoring unknown scenario key gpu.0.processes\n" in capfd.readouterr().err


def test_process_util_returns_what_is_newer_than_last_seen(nvml):
    values = {"gpu.0.process_util": "11:10:20:30:40, 12:150:5:0:0, 11:30:0:0:1"}
    before = epoch_us()
    (h,) = nvml(values)  # the scenario is loaded by this first call
    after = epoch_us()
    first = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert utils(first) == [(11, 10, 20, 30, 40), (12, 150, 5, 0, 0), (11, 30, 0, 0, 1)]  # as given, > 100 too
    assert collections.Counter(s.pid for s in first) == {11: 2, 12: 1}
    stamps = [s.timeStamp for s in first]
    assert before <= stamps[0] <= after and stamps == [stamps[0], stamps[0] + 1, stamps[0] + 2]
    assert utils(pynvml.nvmlDeviceGetProcessUtilization(h, stamps[0])) == utils(first[1:])
    newest = max(stamps)
    raises(NOT_FOUND, pynvml.nvmlDeviceGetProcessUtilization, h, newest)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 2**64 - 1)

    for _ in range(2):  # a rewrite stamps every sample past the newest so far
        nvml(values)
        again = pynvml.nvmlDeviceGetProcessUtilization(h, newest)
        assert utils(again) == utils(first)
        assert min(s.timeStamp for s in again) > newest
        assert [s.timeStamp for s in again] == [again[0].timeStamp + i for i in range(3)]
        newest = max(s.timeStamp for s in again)
        raises(NOT_FOUND, pynvml.nvmlDeviceGetProcessUtilization, h, newest)

    # 1024 samples span 1023 µs past the load: a rewrite sooner than that still answers newer ones
    many = {"gpu.0.process_util": ",".join(f"{i}:1:0:0:0" for i in range(1024))}
    (h,) = nvml(many)
    newest = max(s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0))
    for _ in range(3):
        (h,) = nvml(many)
        again = pynvml.nvmlDeviceGetProcessUtilization(h, newest)
        assert len(again) == 1024 and again[0].timeStamp > newest
        newest = again[-1].timeStamp


def test_process_util_explicit_timestamps(nvml):
    (h,) = nvml({"gpu.0.process_util": "5:1:2:3:4@1000,6:7:8:9:10@3000,7:0:0:0:0@2000,8:1:1:1:1"})
    every = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert [s.timeStamp for s in every[:3]] == [1000, 3000, 2000]  # in the scenario's order
    auto = every[3]
    assert (auto.pid, auto.smUtil) == (8, 1) and abs(auto.timeStamp - 3 - epoch_us()) < 60_000_000
    assert [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 1500)] == [6, 7, 8]
    assert [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 2000)] == [6, 8]
    assert [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 999)] == [5, 6, 7, 8]
    (h,) = nvml({"gpu.0.process_util": "5:1:2:3:4@1000,6:7:8:9:10@3000"})
    raises(NOT_FOUND, pynvml.nvmlDeviceGetProcessUtilization, h, 3000)
    assert utils(pynvml.nvmlDeviceGetProcessUtilization(h, 2999)) == [(6, 7, 8, 9, 10)]


def test_process_util_size_protocol(nvml):
    (h,) = nvml({"gpu.0.process_util": "21:1:0:0:0@100,22:2:0:0:0@200,23:3:0:0:0@300"})
    fn = lib().nvmlDeviceGetProcessUtilization
    count = ctypes.c_uint(0)
    assert fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0)) == INSUFFICIENT_SIZE and count.value == 3
    count.value = 0
    assert fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(150)) == INSUFFICIENT_SIZE and count.value == 2
    buf = (pynvml.c_nvmlProcessUtilizationSample_t * 4)()
    count.value = 1
    assert fn(h, buf, ctypes.byref(count), ctypes.c_ulonglong(150)) == INSUFFICIENT_SIZE and count.value == 2
    assert buf[0].pid == 0  # nothing written on a short buffer
    count.value = 4
    assert fn(h, buf, ctypes.byref(count), ctypes.c_ulonglong(150)) == SUCCESS and count.value == 2
    assert [(buf[i].pid, buf[i].timeStamp, buf[i].smUtil) for i in range(2)] == [(22, 200, 2), (23, 300, 3)]
    assert buf[2].pid == 0
    raw = bytes(buf)[:32]  # the header's layout: pid @0, timeStamp @8, sm @16 ... dec @28
    assert struct.unpack("<I4xQIIII", raw) == (22, 200, 2, 0, 0, 0)
    count.value = 5
    assert fn(h, buf, ctypes.byref(count), ctypes.c_ulonglong(300)) == NOT_FOUND and count.value == 0
    assert fn(h, buf, None, ctypes.c_ulonglong(0)) == INVALID_ARGUMENT


def test_process_util_not_supported_unset_and_malformed(nvml, capfd):
    (h,) = nvml({"gpu.0.process_util": "1:2:3:4:5", "gpu.0.process_util_supported": 0})
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    (h,) = nvml({"gpu.0.process_util": "1:2:3:4:5", "gpu.0.process_util_supported": 1})
    assert utils(pynvml.nvmlDeviceGetProcessUtilization(h, 0)) == [(1, 2, 3, 4, 5)]
    (h,) = nvml({})  # unset: no samples, as before
    count = ctypes.c_uint(9)
    assert lib().nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(count), ctypes.c_ulonglong(0)) == NOT_FOUND
    assert count.value == 0
    capfd.readouterr()
    for bad in ("1:2:3:4", "1:2:3:4:5@", "1:2:3:4:5;2:1:1:1:1", "x"):
        (h,) = nvml({"gpu.0.process_util": bad})
        raises(NOT_FOUND, pynvml.nvmlDeviceGetProcessUtilization, h, 0)  # the whole key ignored
        assert "ignoring unknown scenario key gpu.0.process_util\n" in capfd.readouterr().err, bad


def test_mig_devices_handles_uuids_and_parent(nvml):
    h0, h1 = nvml({"count": 2, "gpu.0.mig_uuids": f"{MIG_A},{MIG_B}"})
    assert pynvml.nvmlDeviceGetMigMode(h0) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h0) == 2
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h0, i) for i in range(2)]
    addresses = {address(m) for m in migs}
    assert len(addresses) == 2 and not addresses & {address(h0), address(h1)}
    assert address(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h0, 1)) == address(migs[1])  # stable
    assert [pynvml.nvmlDeviceGetUUID(m) for m in migs] == [MIG_A, MIG_B]
    assert [pynvml.nvmlDeviceIsMigDeviceHandle(m).value for m in migs] == [1, 1]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(h0).value == 0
    for m in migs:
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        assert address(parent) == address(h0)
        assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(h0) != MIG_A
    raises(NOT_FOUND, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h0, 2)
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h0)
    # the second GPU has no MIG
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMigMode, h1)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMaxMigDeviceCount, h1)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h1, 0)
    # MIG calls are traced as the parent GPU
    nvml.trace.clear()
    pynvml.nvmlDeviceGetUUID(migs[1])
    assert ("nvmlDeviceGetUUID", 0) in nvml.trace.lines()


def test_other_calls_on_a_mig_handle_are_invalid_argument(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.mig_uuids": MIG_A, "gpu.0.processes": "7:na",
                 "gpu.0.process_util": "7:1:1:1:1"})
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    calls = (
        ("nvmlDeviceGetName", ()), ("nvmlDeviceGetIndex", ()), ("nvmlDeviceGetSerial", ()),
        ("nvmlDeviceGetPciInfo", ()), ("nvmlDeviceGetMemoryInfo", ()), ("nvmlDeviceGetUtilizationRates", ()),
        ("nvmlDeviceGetTemperature", (0,)), ("nvmlDeviceGetPowerUsage", ()),
        ("nvmlDeviceGetComputeRunningProcesses", ()), ("nvmlDeviceGetGraphicsRunningProcesses", ()),
        ("nvmlDeviceGetProcessUtilization", (0,)), ("nvmlDeviceGetMigMode", ()),
        ("nvmlDeviceGetMaxMigDeviceCount", ()), ("nvmlDeviceGetMigDeviceHandleByIndex", (0,)),
        ("nvmlDeviceGetEccMode", ()), ("nvmlDeviceGetSamples", (1, 0)), ("nvmlDeviceGetFieldValues", ([82],)),
        ("nvmlDeviceGetSupportedEventTypes", ()),
    )
    for name, args in calls:
        raises(INVALID_ARGUMENT, getattr(pynvml, name), mig, *args)
    for name, args in calls[:4]:  # the parent still answers
        getattr(pynvml, name)(h, *args)
    assert pynvml.nvmlDeviceGetUUID(mig) == MIG_A  # and so does the MIG device


def test_mig_handles_after_a_reload_and_overrides(nvml):
    (h,) = nvml({"gpu.0.mig_uuids": f"{MIG_A},{MIG_B}"})
    a, b = (pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(2))
    (h,) = nvml({"gpu.0.mig_uuids": MIG_B})  # one instance destroyed: the other is index 0 now
    assert pynvml.nvmlDeviceGetUUID(a) == MIG_B
    for call in (pynvml.nvmlDeviceGetUUID, pynvml.nvmlDeviceIsMigDeviceHandle,
                 pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle):
        raises(INVALID_ARGUMENT, call, b)
    (h,) = nvml({"gpu.0.mig_uuids": ""})  # MIG on, no instance
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1] and pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    raises(NOT_FOUND, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetUUID, a)
    (h,) = nvml({"gpu.0.mig_uuids": MIG_A, "gpu.0.rc.nvmlDeviceGetUUID": 15})
    raises(15, pynvml.nvmlDeviceGetUUID, a)  # the parent's overrides reach its MIG devices
    raises(15, pynvml.nvmlDeviceGetUUID, h)
    (h,) = nvml({"gpu.0.mig_uuids": MIG_A, "gpu.1.rc.nvmlDeviceGetUUID": 15})
    assert pynvml.nvmlDeviceGetUUID(a) == MIG_A  # another GPU's are not its own
    (h,) = nvml({"gpu.0.mig_uuids": MIG_A, "rc.nvmlDeviceGetMigDeviceHandleByIndex": 999,
                 "rc.nvmlDeviceGetDeviceHandleFromMigDeviceHandle": 999})
    raises(999, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
    raises(999, pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, a)
    assert nvml({"gpu.0.mig_uuids": MIG_A, "count": 0}) == []  # the parent is gone
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetUUID, a)


def test_without_the_new_keys_every_answer_is_as_before(nvml, capfd):
    capfd.readouterr()
    values = sc.three_gpus()
    handles = nvml(values)
    for h in handles:
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMigMode, h)
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
        raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)
        raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h)
        raises(NOT_FOUND, pynvml.nvmlDeviceGetProcessUtilization, h, 0)
        assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 0
    me = os.getpid()
    assert procs(pynvml.nvmlDeviceGetComputeRunningProcesses(handles[0])) == [(me, 2 * GIB), (sc.OTHER_PID, GIB)]
    assert procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handles[0])) == [(me, GIB)]
    assert pynvml.nvmlDeviceGetUUID(handles[1]) == values["gpu.1.uuid"]
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetUUID, ctypes.c_void_p(12345))  # a bogus handle, as before
    assert "ignoring unknown scenario key" not in capfd.readouterr().err


# -- GPM and MIG instances (issue 13), in-process through the real pynvml ---------------------


def gpm_metrics(first, second, ids):
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, mid in enumerate(ids):
        request.metrics[i].metricId = mid
    pynvml.nvmlGpmMetricsGet(request)
    return {request.metrics[i].metricId: (request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(len(ids))}


def test_gpm_support_samples_and_exact_deltas(nvml):
    h0, h1 = nvml({"count": 2, "gpu.0.gpm": 1, "gpu.0.gpm.2": 37.5, "gpu.0.gpm.20": 1234.5, "gpu.0.gpm.3": "nan",
                   "gpu.0.gpm.5": 40, "gpu.0.gpm_rc.5": 999, "gpu.0.gpm.21": "window"})
    assert pynvml.nvmlGpmQueryDeviceSupport(h0).isSupportedDevice == 1
    assert pynvml.nvmlGpmQueryDeviceSupport(h1).isSupportedDevice == 0  # pre-Hopper: SUCCESS with 0
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    before = nvml.trace.counts()
    raises(NOT_SUPPORTED, pynvml.nvmlGpmSampleGet, h1, a)
    pynvml.nvmlGpmSampleGet(h0, a)
    raises(INVALID_ARGUMENT, gpm_metrics, a, a, [2])  # no time between the two
    time.sleep(0.05)
    pynvml.nvmlGpmSampleGet(h0, b)
    got = gpm_metrics(a, b, [2, 20, 3, 5, 21, 1, 400])
    assert got[2] == (SUCCESS, 37.5) and got[20] == (SUCCESS, 1234.5)  # exact, whatever the window
    assert got[3][0] == SUCCESS and got[3][1] != got[3][1]  # NaN
    assert got[5][0] == 999 and got[1][0] == NOT_SUPPORTED and got[400][0] == NOT_SUPPORTED
    assert 0.05 <= got[21][1] < 5  # the window in seconds
    # a rate change mid-window: each part at its own rate (the counters ran at the old one until the reload)
    nvml({"count": 2, "gpu.0.gpm": 1, "gpu.0.gpm.2": 80})
    time.sleep(0.05)
    pynvml.nvmlGpmSampleGet(h0, a)
    mixed = gpm_metrics(b, a, [2])[2][1]
    assert 37.5 < mixed < 80
    for s in (a, b):
        pynvml.nvmlGpmSampleFree(s)
    after = nvml.trace.counts()
    assert after["nvmlGpmSampleAlloc"] - before["nvmlGpmSampleAlloc"] == 0
    assert after["nvmlGpmSampleFree"] - before["nvmlGpmSampleFree"] == 2
    raises(INVALID_ARGUMENT, pynvml.nvmlGpmSampleGet, h0, ctypes.cast(ctypes.c_void_p(0), pynvml.c_nvmlGpmSample_t))


def test_gpm_samples_die_with_the_init_that_allocated_them(nvml, capfd):
    (h0,) = nvml({"count": 1, "gpu.0.gpm": 1, "gpu.0.gpm.2": 50})
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h0, a)
    capfd.readouterr()
    pynvml.nvmlShutdown()  # the last one: a and b belong to a dead init now (real NVML may crash on them)
    assert "GPM samples still allocated at nvmlShutdown" in capfd.readouterr().err
    pynvml.nvmlInit()
    fresh = pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h0, fresh)
    raises(INVALID_ARGUMENT, pynvml.nvmlGpmSampleGet, h0, b)
    raises(INVALID_ARGUMENT, gpm_metrics, a, fresh, [2])
    raises(INVALID_ARGUMENT, pynvml.nvmlGpmSampleFree, a)
    err = capfd.readouterr().err
    for fn in ("nvmlGpmSampleGet", "nvmlGpmMetricsGet", "nvmlGpmSampleFree"):
        assert f"fake-nvml: GPM sample used after free: {fn} of a sample allocated before nvmlShutdown" in err, fn
    pynvml.nvmlGpmSampleFree(fresh)  # this init's sample is fine
    assert "used after free" not in capfd.readouterr().err


def test_mig_devices_with_instances_profiles_memory_and_empty_slots(nvml):
    values = {**sc.profiling_machine(), "gpu.0.rc.nvmlGpmSampleGet": None}
    values = {k: v for k, v in values.items() if v is not None}
    h0, h1, h2 = nvml(values)
    assert pynvml.nvmlDeviceGetMigMode(h0) == [1, 1] and pynvml.nvmlDeviceGetMigMode(h2) == [0, 0]
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetMigMode, h1)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h0) == 5 and pynvml.nvmlDeviceGetMaxMigDeviceCount(h2) == 0
    raises(NOT_FOUND, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h0, 1)  # the empty slot
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h0, 3)  # the invalid one
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h0, i) for i in (0, 2, 4)]
    got = {(pynvml.nvmlDeviceGetGpuInstanceId(m), pynvml.nvmlDeviceGetComputeInstanceId(m)): m for m in migs}
    assert {k: pynvml.nvmlDeviceGetUUID(m) for k, m in got.items()} == sc.MIG_UUIDS
    for (gi, ci), m in got.items():
        assert pynvml.nvmlDeviceGetName(m) == f"{sc.HOPPER_NAME} MIG {sc.MIG_PROFILES[(gi, ci)]}"
        memory = pynvml.nvmlDeviceGetMemoryInfo(m, version=pynvml.nvmlMemory_v2)
        assert (memory.total, memory.used, memory.free) == (*sc.MIG_MEMORY[gi], sc.MIG_MEMORY[gi][0] - sc.MIG_MEMORY[gi][1])
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetGpuInstanceId, h0)  # a GPU is no MIG device
    # MIG-mode refusals on the parent; the rest still answers
    for name, args in (("nvmlDeviceGetUtilizationRates", ()), ("nvmlDeviceGetEncoderUtilization", ()),
                       ("nvmlDeviceGetDecoderUtilization", ()), ("nvmlDeviceGetSamples", (1, 0)),
                       ("nvmlDeviceGetProcessUtilization", (0,))):
        raises(NOT_SUPPORTED, getattr(pynvml, name), h0, *args)
    assert pynvml.nvmlDeviceGetUtilizationRates(h2).gpu == 33 and pynvml.nvmlDeviceGetTemperature(h0, 0) > 0
    # GPM per GPU instance on the parent; an unknown instance is NOT_FOUND
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    raises(NOT_FOUND, pynvml.nvmlGpmMigSampleGet, h0, 5, a)
    pynvml.nvmlGpmMigSampleGet(h0, 1, a)
    time.sleep(0.02)
    pynvml.nvmlGpmMigSampleGet(h0, 1, b)
    assert gpm_metrics(a, b, [2])[2] == (SUCCESS, 70.0)
    pynvml.nvmlGpmMigSampleGet(h0, 2, b)
    raises(INVALID_ARGUMENT, gpm_metrics, a, b, [2])  # two GPU instances' samples do not diff
    for s in (a, b):
        pynvml.nvmlGpmSampleFree(s)


@pytest.mark.parametrize("tool", ["gpustat", "nvitop"])
def test_gpustat_and_nvitop_accept_the_mig_machine(fake_libs, scenario, tool):
    scenario.write(sc.profiling_machine())
    command = [_tool("gpustat"), "--json"] if tool == "gpustat" else [_tool("nvitop"), "-1"]
    result = subprocess.run(command, env={**nvml_env(fake_libs["current"], scenario), "COLUMNS": "160"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    if tool == "gpustat":
        assert result.stderr == ""
        data = json.loads(result.stdout)
        assert [g["name"] for g in data["gpus"]] == [sc.HOPPER_NAME, sc.H200_NAME, sc.A100_NAME]
        assert data["gpus"][0]["utilization.gpu"] is None  # refused in MIG mode
        assert data["gpus"][1]["utilization.gpu"] == 90
    else:
        assert "ERROR" not in result.stdout + result.stderr
        assert "MIG" in result.stdout  # nvitop shows the MIG mode / devices
        for short in ("H100 80GB HBM3", "H200", "A100-SXM4-80GB"):
            assert short in result.stdout


GPM_SYMBOLS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
               "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet")


def test_gpm_symbols_only_in_the_current_build_mig_instance_ids_in_both(fake_libs):
    if shutil.which("readelf") is None:
        pytest.fail("readelf missing (binutils)")
    for build in ("current", "old"):
        syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(fake_libs[build] / "libnvidia-ml.so.1")],
                              capture_output=True, text=True).stdout
        for symbol in GPM_SYMBOLS:
            assert (f" {symbol}\n" in syms) == (build == "current"), (build, symbol)
        for symbol in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
            assert f" {symbol}\n" in syms, (build, symbol)


# -- field ids answered from the state of their direct call ----------------------------------
# A real driver serves nvmlDeviceGetFieldValues and the direct calls from the same data, so
# the fake does too: each modeled id must equal its call, value or error, on every board.

ECC_FIELDS = {(0, 0): 3, (1, 0): 4, (0, 1): 5, (1, 1): 6}  # (errorType, counterType) -> id
RETIRED_FIELDS = {0: 29, 1: 30}  # nvmlPageRetirementCause_t -> id
REMAPPED_FIELDS = (142, 143, 144, 145)  # the outputs of nvmlDeviceGetRemappedRows, in order
NVLINK_DL_FIELDS = {161: 0, 162: 1, 163: 2}  # id (scopeId = link) -> nvmlNvLinkErrorCounter_t
LEGACY_NVLINK_FIELDS = {2: (32, 96), 3: (39, 102), 0: (46, 108), 1: (53, 114)}  # counter -> id of link 0, of link 6


def legacy_nvlink_field(counter: int, link: int) -> int:
    low, high = LEGACY_NVLINK_FIELDS[counter]
    return low + link if link < 6 else high + link - 6


LEGACY_NVLINK_IDS = {legacy_nvlink_field(c, link) for c in LEGACY_NVLINK_FIELDS for link in range(12)}


def answer(call):
    """A direct call's value, or ("rc", its NVML error code)."""
    try:
        return call()
    except pynvml.NVMLError as err:
        return ("rc", err.value)


def entry_answer(entry, value_type: int):
    """An entry's value in the union member of value_type, or ("rc", its nvmlReturn)."""
    if entry.nvmlReturn != SUCCESS:
        return ("rc", entry.nvmlReturn)
    return ok(entry, value_type)


def modeled_pairs(h, links=(0,)) -> list:
    """(request, valueType, direct call) for every modeled id; the NVLink ones for `links`."""
    return [
        ((1, 0), UINT, lambda: pynvml.nvmlDeviceGetEccMode(h)[0]),
        ((2, 0), UINT, lambda: pynvml.nvmlDeviceGetEccMode(h)[1]),
        *(((fid, 0), ULONGLONG, lambda t=t, c=c: pynvml.nvmlDeviceGetTotalEccErrors(h, t, c))
          for (t, c), fid in ECC_FIELDS.items()),
        *(((fid, 0), ULONGLONG, lambda cause=cause: len(pynvml.nvmlDeviceGetRetiredPages(h, cause)))
          for cause, fid in RETIRED_FIELDS.items()),
        ((31, 0), UINT, lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        *(((fid, 0), UINT, lambda i=i: pynvml.nvmlDeviceGetRemappedRows(h)[i]) for i, fid in enumerate(REMAPPED_FIELDS)),
        *(((165, link), UINT, lambda link=link: pynvml.nvmlDeviceGetNvLinkState(h, link)) for link in links),
        *(((fid, link), ULONGLONG, lambda link=link, c=c: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, c))
          for fid, c in NVLINK_DL_FIELDS.items() for link in links),
        *(((legacy_nvlink_field(c, link), 0), ULONGLONG,
           lambda link=link, c=c: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, c))
          for c in LEGACY_NVLINK_FIELDS for link in links if link < 12),
        ((83, 0), ULONGLONG, lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h)),
        ((185, 0), UINT, lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
        ((186, 0), UINT, lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
        ((190, 0), UINT, lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h)),
        ((94, 0), UINT, lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h)),
    ]


def agree(h, pairs) -> dict:
    """Read every request in one batch and assert each entry answers what its call answers:
    {request: that common answer}."""
    got = fields(h, *(request for request, _, _ in pairs))
    answers = {}
    for request, value_type, call in pairs:
        answers[request] = answer(call)
        assert entry_answer(got[request], value_type) == answers[request], request
    return answers


def test_ecc_fields_equal_the_ecc_calls(nvml):
    hopper, volta, _ = nvml(sc.health_machine())
    for board, counts in ((hopper, sc.HOPPER_ECC), (volta, sc.VOLTA_ECC)):
        got = agree(board, modeled_pairs(board)[:6])
        assert (got[(1, 0)], got[(2, 0)]) == (1, 1)
        assert got[(5, 0)] == counts["corrected.aggregate"] > 0
    # distinct counts, so a swapped errorType / counterType shows
    (h,) = nvml({"gpu.0.ecc": "on", "gpu.0.ecc_pending": 0, "gpu.0.ecc.corrected.volatile": 11,
                 "gpu.0.ecc.uncorrected.volatile": 22, "gpu.0.ecc.corrected.aggregate": 33,
                 "gpu.0.ecc.uncorrected.aggregate": 44})
    got = agree(h, modeled_pairs(h)[:6])
    assert [got[(fid, 0)] for fid in range(1, 7)] == [1, 0, 11, 22, 33, 44]
    # off, on after the next reboot: the mode answers, the counters do not (as their call)
    (h,) = nvml({"gpu.0.ecc": "off", "gpu.0.ecc_pending": 1, "gpu.0.ecc.corrected.volatile": 4})
    got = agree(h, modeled_pairs(h)[:6])
    assert [got[(fid, 0)] for fid in range(1, 7)] == [0, 1, *[("rc", NOT_SUPPORTED)] * 4]


def test_retired_page_fields_equal_the_retirement_calls(nvml):
    _, volta, _ = nvml(sc.health_machine())
    pairs = [p for p in modeled_pairs(volta) if p[0][0] in (29, 30, 31)]
    got = agree(volta, pairs)
    assert got == {(29, 0): sc.VOLTA_RETIRED["multiple_single_bit"], (30, 0): sc.VOLTA_RETIRED["double_bit"],
                   (31, 0): sc.VOLTA_RETIRED["pending"]}
    (h,) = nvml({"gpu.0.page_retirement": 1, "gpu.0.retired.multiple_single_bit": 2, "gpu.0.retired.double_bit": 5,
                 "gpu.0.retired_pending": 1})
    got = agree(h, [p for p in modeled_pairs(h) if p[0][0] in (29, 30, 31)])
    assert got == {(29, 0): 2, (30, 0): 5, (31, 0): 1}


def test_remapped_row_fields_equal_the_remapped_rows_call(nvml):
    hopper, _, _ = nvml(sc.health_machine())
    r = sc.HOPPER_REMAPPED
    got = agree(hopper, [p for p in modeled_pairs(hopper) if p[0][0] in REMAPPED_FIELDS])
    assert [got[(fid, 0)] for fid in REMAPPED_FIELDS] == [r["correctable"], r["uncorrectable"], r["pending"], r["failed"]]
    for rows in ((7, 9, 1, 0), (0, 3, 0, 1)):  # each output on its own id
        (h,) = nvml({"gpu.0.row_remapping": 1, "gpu.0.remapped.correctable": rows[0],
                     "gpu.0.remapped.uncorrectable": rows[1], "gpu.0.remap_pending": rows[2],
                     "gpu.0.remap_failed": rows[3]})
        got = agree(h, [p for p in modeled_pairs(h) if p[0][0] in REMAPPED_FIELDS])
        assert tuple(got[(fid, 0)] for fid in REMAPPED_FIELDS) == rows


def test_nvlink_state_and_error_fields_equal_the_nvlink_calls(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.nvlink.4.active": 0})
    links = range(sc.HOPPER_NVLINKS)
    pairs = [p for p in modeled_pairs(h, links) if p[0][0] in (165, *NVLINK_DL_FIELDS)]
    got = agree(h, pairs)
    assert [got[(165, link)] for link in links] == [0 if link == 4 else 1 for link in links]
    for (link, name), count in sc.HOPPER_NVLINK_ERRORS.items():
        fid = {0: 161, 1: 162, 2: 163}.get(sc.NVLINK_ERROR_COUNTERS.index(name))
        if fid is not None:
            assert got[(fid, link)] == count, (link, name)
    assert (got[(161, 3)], got[(163, 3)], got[(162, 7)]) == (5, 2, 1)
    # a link past the last one, and the all-links scope: INVALID_ARGUMENT, as the calls say
    got = agree(h, [p for p in modeled_pairs(h, (18, sc.ALL_LINKS)) if p[0][0] in (165, *NVLINK_DL_FIELDS)])
    assert set(got.values()) == {("rc", INVALID_ARGUMENT)}


def test_legacy_per_link_nvlink_fields_equal_the_error_counter_call(nvml):
    errors = {f"gpu.0.nvlink.{link}.errors.{sc.NVLINK_ERROR_COUNTERS[c]}": 1000 * (c + 1) + link
              for link in range(12) for c in LEGACY_NVLINK_FIELDS}
    (h,) = nvml({"gpu.0.nvlinks": 12, **errors})
    pairs = [p for p in modeled_pairs(h, range(12)) if p[0][0] in LEGACY_NVLINK_IDS]
    assert len(pairs) == len(LEGACY_NVLINK_IDS) == 48
    got = agree(h, pairs)
    for c in LEGACY_NVLINK_FIELDS:
        for link in range(12):
            assert got[(legacy_nvlink_field(c, link), 0)] == 1000 * (c + 1) + link, (c, link)
    assert legacy_nvlink_field(2, 0) == 32 and legacy_nvlink_field(1, 11) == 119
    # the scopeId is ignored; the totals and the ids between the ranges are not modeled
    scoped = fields(h, (32, 7), (101, 3), 38, 45, 52, 59, 95, 120)
    assert ok(scoped[(32, 7)], ULONGLONG) == 3000 and ok(scoped[(101, 3)], ULONGLONG) == 3011
    for fid in (38, 45, 52, 59, 95, 120):
        assert scoped[(fid, 0)].nvmlReturn == NOT_SUPPORTED, fid
    # fewer links: the ids past the last one INVALID_ARGUMENT, as the call for that link
    (h,) = nvml({"gpu.0.nvlinks": 4, **errors})
    got = agree(h, [p for p in modeled_pairs(h, range(12)) if p[0][0] in LEGACY_NVLINK_IDS])
    assert got[(legacy_nvlink_field(0, 3), 0)] == 1003
    assert {got[(legacy_nvlink_field(c, link), 0)] for c in LEGACY_NVLINK_FIELDS for link in range(4, 12)} == {
        ("rc", INVALID_ARGUMENT)}


def test_power_energy_and_pcie_replay_fields_equal_their_calls(nvml):
    values = sc.three_gpus()
    h0, h1, h2 = nvml(values)
    power = [p for p in modeled_pairs(h0) if p[0][0] in (83, 185, 186, 190, 94)]
    got = agree(h0, power)
    assert got == {(83, 0): values["gpu.0.energy_mj"], (185, 0): values["gpu.0.power_mw"],
                   (186, 0): values["gpu.0.power_mw"], (190, 0): values["gpu.0.power_limit_mw"],
                   (94, 0): ("rc", NOT_SUPPORTED)}  # no pcie_replays key: the call is NOT_SUPPORTED
    got = agree(h1, [p for p in modeled_pairs(h1) if p[0][0] in (83, 185, 190)])
    assert got == {(83, 0): 5000, (185, 0): 60000, (190, 0): 400000}
    # the L4 whose power and energy calls are NOT_SUPPORTED (rc overrides): so are the fields
    got = agree(h2, [p for p in modeled_pairs(h2) if p[0][0] in (83, 185, 186, 190)])
    assert got == {(83, 0): ("rc", NOT_SUPPORTED), (185, 0): ("rc", NOT_SUPPORTED),
                   (186, 0): ("rc", NOT_SUPPORTED), (190, 0): values["gpu.2.power_limit_mw"]}
    assert fields(h0, (185, 1))[(185, 1)].nvmlReturn == NOT_SUPPORTED  # module power: not modeled
    # the same live state: a reload changes both
    (h,) = nvml({"gpu.0.power_mw": 123456, "gpu.0.energy_mj": 2**40 + 7, "gpu.0.pcie_replays": 9})
    got = agree(h, [p for p in modeled_pairs(h) if p[0][0] in (83, 185, 94)])
    assert got == {(83, 0): 2**40 + 7, (185, 0): 123456, (94, 0): 9}
    hopper, _, _ = nvml(sc.health_machine())
    assert agree(hopper, [p for p in modeled_pairs(hopper) if p[0][0] == 94]) == {(94, 0): sc.HOPPER_PCIE["replays"]}


def test_the_gpu_temperature_field_is_the_temperature_call_as_a_double(nvml):
    values = {**sc.three_gpus(), "gpu.1.rc.nvmlDeviceGetTemperatureV": 999}
    h0, h1, _ = nvml(values)
    entry = fields(h0, (308, 0))[(308, 0)]
    assert (entry.nvmlReturn, entry.valueType) == (SUCCESS, DOUBLE)
    assert entry.value.dVal == pynvml.nvmlDeviceGetTemperatureV(h0, 0) == values["gpu.0.temperature"]
    assert fields(h1, (308, 0))[(308, 0)].nvmlReturn == 999  # the call's override
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.temperature": 61, "gpu.0.field.308": 62})
    entry = fields(h, (308, 0))[(308, 0)]
    assert (entry.valueType, entry.value.dVal) == (DOUBLE, 62.0)  # a plain key, in the id's own type


def test_modeled_fields_are_not_supported_where_their_calls_are(nvml):
    hopper, volta, consumer = nvml(sc.health_machine())
    got = agree(consumer, modeled_pairs(consumer))  # no ECC, retirement, remapping or NVLink
    unsupported = {request for request, value in got.items() if value == ("rc", NOT_SUPPORTED)}
    assert unsupported == {request for request in got if request[0] not in (83, 185, 186, 190, 94)}
    assert len(unsupported) == 21
    got = agree(hopper, modeled_pairs(hopper))  # row remapping, no page retirement
    assert {r for r, v in got.items() if v == ("rc", NOT_SUPPORTED)} == {(29, 0), (30, 0), (31, 0)}
    got = agree(volta, modeled_pairs(volta))  # page retirement, no row remapping
    assert {r for r, v in got.items() if v == ("rc", NOT_SUPPORTED)} == {(fid, 0) for fid in REMAPPED_FIELDS}


def test_rc_overrides_of_the_direct_call_reach_the_field_entries(nvml, monkeypatch):
    values = {"count": 2, **sc.hopper_board(0), **sc.hopper_board(1),
              "gpu.0.rc.nvmlDeviceGetPowerUsage": NOT_SUPPORTED, "gpu.0.rc.nvmlDeviceGetTotalEccErrors": 999,
              "rc.nvmlDeviceGetRemappedRows": 15, "gpu.1.rc.nvmlDeviceGetNvLinkErrorCounter": 4,
              "gpu.1.rc.nvmlDeviceGetTotalEnergyConsumption": 999, "gpu.1.rc.nvmlDeviceGetRetiredPages": 4,
              "gpu.1.rc.nvmlDeviceGetRetiredPagesPendingStatus": 999, "gpu.1.rc.nvmlDeviceGetPcieReplayCounter": 999,
              "gpu.0.delay_ms.nvmlDeviceGetEnforcedPowerLimit": 3000}  # a delay stays with its own call
    h0, h1 = nvml(values)
    started = time.monotonic()
    got0 = fields(h0, *(request for request, _, _ in modeled_pairs(h0, (0, 3))))
    assert time.monotonic() - started < 1.5
    assert ok(got0[(190, 0)], UINT) == 700000  # the delayed call's field answers at once
    assert {got0[(fid, 0)].nvmlReturn for fid in (185, 186)} == {NOT_SUPPORTED}
    assert {got0[(fid, 0)].nvmlReturn for fid in ECC_FIELDS.values()} == {999}
    assert ok(got0[(1, 0)], UINT) == 1  # GetEccMode is not overridden
    assert {got0[(fid, 0)].nvmlReturn for fid in REMAPPED_FIELDS} == {15}  # global: every GPU
    assert ok(got0[(161, 3)], ULONGLONG) == 5  # GPU 1's override is its own
    got1 = agree(h1, modeled_pairs(h1, (0, 3)))  # each entry answers as its overridden call
    assert {got1[(fid, 3)] for fid in NVLINK_DL_FIELDS} == {("rc", 4)}
    assert {got1[(legacy_nvlink_field(c, 3), 0)] for c in LEGACY_NVLINK_FIELDS} == {("rc", 4)}
    assert got1[(165, 3)] == 1 and got1[(185, 0)] == 70000 and got1[(83, 0)] == ("rc", 999)
    assert {got1[(fid, 0)] for fid in REMAPPED_FIELDS} == {("rc", 15)}
    # an override beats NOT_SUPPORTED (no page retirement here), each id taking its own call's
    assert (got1[(29, 0)], got1[(30, 0)], got1[(31, 0)]) == (("rc", 4), ("rc", 4), ("rc", 999))
    assert got1[(94, 0)] == ("rc", 999) and got1[(1, 0)] == 1
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetPowerUsage, h0)  # the calls say the same
    raises(999, pynvml.nvmlDeviceGetTotalEccErrors, h0, 0, 1)
    raises(15, pynvml.nvmlDeviceGetRemappedRows, h1)
    raises(4, pynvml.nvmlDeviceGetNvLinkErrorCounter, h1, 3, 0)
    # gpu.<i>.rc.all still fails the whole call (its DEV_ENTER), not entry by entry
    Scenario(Path(os.environ["FAKE_NVML_SCENARIO"]), {**values, "gpu.0.rc.all": 15})
    raises(15, pynvml.nvmlDeviceGetFieldValues, h0, [185, 1])


def test_explicit_field_keys_win_over_the_modeled_values(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.field.185": 12345, "gpu.0.field_rc.3": 4,
                 "gpu.0.field.165@2": 0, "gpu.0.field_double.83": 2.5, "gpu.0.field_type.1": ULONGLONG,
                 "gpu.0.field.142": 77, "gpu.0.rc.nvmlDeviceGetRemappedRows": 15,
                 "gpu.0.field.29": 6, "gpu.0.field_rc.94": NOT_FOUND})
    got = fields(h, 185, 186, 3, 4, (165, 2), (165, 1), 83, 1, 142, 143, 29, 94)
    assert ok(got[(185, 0)], UINT) == 12345 != pynvml.nvmlDeviceGetPowerUsage(h)  # still labelled UINT
    assert ok(got[(186, 0)], UINT) == pynvml.nvmlDeviceGetPowerUsage(h)  # its own id is still modeled
    assert got[(3, 0)].nvmlReturn == 4 and ok(got[(4, 0)], ULONGLONG) == 0
    assert ok(got[(165, 2)], UINT) == 0 and ok(got[(165, 1)], UINT) == 1 == pynvml.nvmlDeviceGetNvLinkState(h, 2)
    assert ok(got[(83, 0)], DOUBLE) == 2.5
    relabelled = got[(1, 0)]  # a type alone relabels the modeled value, stored as UINT
    assert relabelled.nvmlReturn == SUCCESS and relabelled.valueType == ULONGLONG and relabelled.value.uiVal == 1
    assert ok(got[(142, 0)], UINT) == 77 and got[(143, 0)].nvmlReturn == 15  # the value key beats the rc override
    assert ok(got[(29, 0)], ULONGLONG) == 6  # hopper has no page retirement: the key answers anyway
    assert got[(94, 0)].nvmlReturn == NOT_FOUND


def test_a_batch_of_modeled_fields_is_one_traced_call(nvml):
    (h,) = nvml({**sc.hopper_board(0), "gpu.0.rc.nvmlDeviceGetPowerUsage": 15,
                 "rc.nvmlDeviceGetNvLinkErrorCounter": 999})  # looked up, yet not traced either
    requests = [request for request, _, _ in modeled_pairs(h, range(sc.HOPPER_NVLINKS))]
    nvml.trace.clear()
    got = fields(h, *requests)
    assert nvml.trace.lines() == [("nvmlDeviceGetFieldValues", 0)]
    assert got[(185, 0)].nvmlReturn == 15 and got[(161, 0)].nvmlReturn == 999  # the overrides were applied
    assert ok(got[(5, 0)], ULONGLONG) == sc.HOPPER_ECC["corrected.aggregate"]


def test_modeled_fields_follow_their_calls_in_mig_mode(nvml):
    h0, _, _ = nvml(sc.profiling_machine())  # GPU 0: an H100 in MIG mode with MIG devices
    assert pynvml.nvmlDeviceGetMigMode(h0) == [1, 1]
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetUtilizationRates, h0)  # what MIG mode refuses
    got = agree(h0, modeled_pairs(h0, (0, 3)))  # none of these calls refuses in MIG mode
    assert got[(5, 0)] == sc.HOPPER_ECC["corrected.aggregate"] and got[(142, 0)] == sc.HOPPER_REMAPPED["correctable"]
    assert got[(161, 3)] == 5 and got[(185, 0)] == 70000
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h0, 0)
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetFieldValues, mig, [185])  # as every call on a MIG handle
    raises(INVALID_ARGUMENT, pynvml.nvmlDeviceGetPowerUsage, mig)


def test_minor_numbers_and_gpu_instance_placements(nvml):
    """What NVIDIA's DRA driver names GPUs by (issue 38): minor=, and mig_devices entries ending
    in :<GI profile id>:<placement start>[:<size>]."""
    h0, h1 = nvml({
        "count": 2, "gpu.0.uuid": "GPU-a", "gpu.1.uuid": "GPU-b", "gpu.0.minor": 3,
        "gpu.1.mig_devices": "1:0:1g.10gb:MIG-x:10:1:19:6,2:0:3g.40gb:MIG-y:40:1:9:0:4,3:0:1g.10gb:MIG-z:10:1",
    })
    assert pynvml.nvmlDeviceGetMinorNumber(h0) == 3 and pynvml.nvmlDeviceGetMinorNumber(h1) == 1  # default: the index
    info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(h1, 1))
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (1, 19, 6, 1)
    info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(h1, 2))
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (2, 9, 0, 4)
    raises(NOT_SUPPORTED, pynvml.nvmlGpuInstanceGetInfo, pynvml.nvmlDeviceGetGpuInstanceById(h1, 3))  # not given
    raises(NOT_FOUND, pynvml.nvmlDeviceGetGpuInstanceById, h1, 7)
    raises(NOT_SUPPORTED, pynvml.nvmlDeviceGetGpuInstanceById, h0, 1)  # MIG off
    stale = pynvml.nvmlDeviceGetGpuInstanceById(h1, 2)
    nvml({"count": 2, "gpu.0.uuid": "GPU-a", "gpu.1.uuid": "GPU-b", "gpu.1.mig_devices": "1:0:1g.10gb:MIG-x:10:1:19:6"})
    raises(INVALID_ARGUMENT, pynvml.nvmlGpuInstanceGetInfo, stale)  # the instance was destroyed
