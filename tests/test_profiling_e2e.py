"""The profiling (GPM) and mig collectors end to end: the real CLI on the fake NVML, one
machine with an H100 in MIG mode (two GPU instances, three compute instances, an empty and an
invalid slot), an H200 without MIG (every GPM family; one clamped, one NaN, one per-metric
error) and an A100 (no GPM, MIG off). Values are exact: the fake's counters grow at the
configured rates, so any window gives exactly the configured value."""

from __future__ import annotations

import subprocess
import time

import pytest

import scenarios as sc
from fakenvml import MIB, Scrape
from scenarios import board_uuid, profiling_machine

H100 = {"gpu": "0", "uuid": board_uuid("hopper", 0)}
H200 = {"gpu": "1", "uuid": board_uuid("h200", 1)}
A100 = {"gpu": "2", "uuid": board_uuid("a100", 2)}
RATIOS = ("graphics_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active", "fp16_active")
PROFILING = {f"resmon_gpu_{r}_ratio" for r in RATIOS} | {"resmon_gpu_pcie_bandwidth_bytes_per_second", "resmon_gpu_nvlink_bandwidth_bytes_per_second"}
MIG_PROFILING = {n.replace("resmon_gpu_", "resmon_gpu_mig_") for n in PROFILING}
MIG = {"resmon_gpu_mig_mode_enabled", "resmon_gpu_mig_info", "resmon_gpu_mig_memory_total_bytes", "resmon_gpu_mig_memory_used_bytes",
       "resmon_gpu_mig_memory_free_bytes"} | MIG_PROFILING
SOURCES = 3  # GPM sample sources: the H200 and the two GPU instances
BUFFERS = 3  # sample buffers per source, each allocated on first need
REFUSED = 1  # the one buffer of the H100's parent, whose sample is refused in MIG mode


@pytest.fixture
def machine(scenario):
    scenario.write(profiling_machine())
    return scenario


def has_window(s: Scrape) -> bool:
    return s.has("resmon_gpu_sm_active_ratio", **H200) and len(s.series("resmon_gpu_mig_sm_active_ratio")) == 2


def assert_machine(s: Scrape) -> None:
    # H200: exact ratios (dram clamped to 1), fp64 NaN and fp16's own error absent; bandwidths MiB/s x 1048576
    for name, value in sc.H200_RATIOS.items():
        assert s.value(f"resmon_gpu_{name}_ratio", **H200) == value, name
    for name in ("fp64_active", "fp16_active"):
        assert not s.series(f"resmon_gpu_{name}_ratio", **H200), name
    for (link, direction), value in sc.H200_BANDWIDTHS.items():
        assert s.value(f"resmon_gpu_{link}_bandwidth_bytes_per_second", direction=direction, **H200) == value
    # the H100's parent refuses GPM in MIG mode, the A100 has none: absent, never 0
    for name in PROFILING:
        assert not s.series(name, **H100) and not s.series(name, **A100), name
    # MIG: one info series per MIG device, the empty and invalid slots skipped
    info = {(l["gpu_instance_id"], l["compute_instance_id"], l["mig_uuid"], l["profile"]): (l["gpu"], l["uuid"], v)
            for l, v in s.series("resmon_gpu_mig_info")}
    assert info == {(str(gi), str(ci), uuid, sc.MIG_PROFILES[(gi, ci)]): (H100["gpu"], H100["uuid"], 1)
                    for (gi, ci), uuid in sc.MIG_UUIDS.items()}
    for gi, (total, used) in sc.MIG_MEMORY.items():  # once per GPU instance, not per compute instance
        labels = {**H100, "gpu_instance_id": str(gi)}
        assert s.value("resmon_gpu_mig_memory_total_bytes", **labels) == total
        assert s.value("resmon_gpu_mig_memory_used_bytes", **labels) == used
        assert s.value("resmon_gpu_mig_memory_free_bytes", **labels) == total - used
        for name, value in sc.MIG_RATIOS[gi].items():
            assert s.value(f"resmon_gpu_mig_{name}_ratio", **labels) == value, (gi, name)
        assert {n for n in MIG_PROFILING if s.series(n, **labels)} == (
            {f"resmon_gpu_mig_{n}_ratio" for n in sc.MIG_RATIOS[gi]}
            | ({"resmon_gpu_mig_pcie_bandwidth_bytes_per_second"} if gi in (1, 2) else set()))
    assert len(s.series("resmon_gpu_mig_memory_total_bytes")) == 2
    assert s.value("resmon_gpu_mig_pcie_bandwidth_bytes_per_second", direction="transmit", gpu_instance_id="1", **H100) == 100 * MIB
    # MIG mode: on for the H100, off for the A100, absent on the H200 (no MIG)
    assert s.value("resmon_gpu_mig_mode_enabled", mode="current", **H100) == 1
    assert s.value("resmon_gpu_mig_mode_enabled", mode="pending", **H100) == 1
    assert s.value("resmon_gpu_mig_mode_enabled", mode="current", **A100) == 0
    assert not s.series("resmon_gpu_mig_mode_enabled", **H200)
    # MIG instances are not GPUs: three GPUs in every per-GPU family, profiling ones included
    gpus = {H100["uuid"], H200["uuid"], A100["uuid"]}
    assert {l["uuid"] for l, _ in s.series("resmon_gpu_info")} == gpus
    assert {l["uuid"] for l, _ in s.series("resmon_gpu_memory_total_bytes")} == gpus
    for name, rows in s.samples.items():
        if name.startswith("resmon_gpu_") and not name.startswith("resmon_gpu_mig_"):
            assert {l["uuid"] for l, _ in rows if "uuid" in l} <= gpus, name
            assert {l.get("gpu") for l, _ in rows if "gpu" in l} <= {"0", "1", "2"}, name
    assert s.value("resmon_gpu_devices") == 3
    # the parent keeps what NVML answers in MIG mode, and loses what it refuses
    assert s.value("resmon_gpu_temperature_celsius", **H100) > 0 and s.has("resmon_gpu_power_watts", **H100)
    for name in ("resmon_gpu_utilization_ratio", "resmon_gpu_encoder_utilization_ratio", "resmon_gpu_decoder_utilization_ratio"):
        assert not s.series(name, **H100), name
    assert s.value("resmon_gpu_utilization_ratio", **H200) == 0.9 and s.value("resmon_gpu_utilization_ratio", **A100) == 0.33
    assert not s.series("resmon_gpu_busy_seconds_total", engine="gpu", **H100)
    for collector in ("profiling", "mig"):
        assert s.value("resmon_collector_success", collector=collector) == 1, collector
        assert s.has("resmon_collector_duration_seconds", collector=collector)


def test_exact_values_once_a_window_exists(run_exporter, machine):
    s = run_exporter().wait_for(has_window)
    assert_machine(s)


def test_scrapes_faster_than_a_second_keep_the_window(run_exporter, machine, trace):
    # GPU instance 2's PCIe receive metric answers the window itself, in seconds
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_for(has_window)
    windows = []
    for _ in range(12):  # back to back, far faster than 1 s apart
        s = exporter.scrape()
        assert_machine(s)
        windows.append(s.value("resmon_gpu_mig_pcie_bandwidth_bytes_per_second", direction="receive", gpu_instance_id="2", **H100) / MIB)
    # the fake times its samples inside the call, the exporter its 1 s minimum after it
    # returns: a preempted return can make the fake's window a hair shorter than the exporter's
    assert min(windows) >= 0.99, windows
    # the buffers were allocated once per source and reused ever since; nothing was freed yet
    assert trace.count("nvmlGpmSampleAlloc") == SOURCES * BUFFERS + REFUSED
    assert trace.count("nvmlGpmSampleFree") == 0
    assert trace.count("nvmlGpmMigSampleGet") > 12 * 2


def test_the_first_refresh_serves_none_of_the_gpm_families(run_exporter, machine):
    # a cache longer than start-up: the first scrape serves the start-up refresh, one sample only
    s = run_exporter("--collect.cache-ttl=1h").scrape()
    for name in PROFILING | MIG_PROFILING:
        assert not s.series(name), name
    assert len(s.series("resmon_gpu_mig_info")) == 3  # the rest of the mig collector is there at once
    assert s.value("resmon_collector_success", collector="profiling") == 1


def live(trace) -> tuple[int, int]:
    counts = trace.counts()
    return counts["nvmlGpmSampleAlloc"], counts["nvmlGpmSampleFree"]


def test_a_reconfiguration_changes_the_series_and_never_diffs_two_instances(run_exporter, machine, scenario, trace):
    # the MIG layout is a slow value: a reconfiguration shows within the slow interval
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.slow-interval=1s")
    exporter.wait_for(has_window)
    for _ in range(3):  # every source up to its three buffers
        exporter.scrape()
    assert live(trace) == (SOURCES * BUFFERS + REFUSED, 0)
    # GPU instance 2 destroyed and made again under the same id (a new MIG device, another rate),
    # and a third GPU instance created; GPU instance 1 unchanged
    uuids = {**sc.MIG_UUIDS, (2, 0): "MIG-4a1b0000-0000-5000-8000-0000000000f2", (3, 0): "MIG-4a1b0000-0000-5000-8000-0000000000f3"}
    profiles = {**sc.MIG_PROFILES, (2, 0): "2g.20gb", (3, 0): "1g.10gb"}
    memory = {**sc.MIG_MEMORY, 2: (20 * 1024**3, 1024**3), 3: (10 * 1024**3, 0)}
    scenario.update(**{"gpu.0.mig_devices": sc.mig_slots(uuids, profiles, memory), "gpu.0.gi.2.gpm.2": 90, "gpu.0.gi.3.gpm.2": 10})
    changed_at = time.time()  # the file is replaced: a read that starts from now sees the new layout
    seen = []
    new = {"gpu_instance_id": "2", **H100}
    deadline = time.monotonic() + 30  # the slow interval is 1 s; the deadline only bounds a failure
    while True:
        assert time.monotonic() < deadline, f"the new MIG layout was not served within 30 s: {seen}"
        s = exporter.scrape()
        mig_uuids = {l["mig_uuid"] for l, _ in s.series("resmon_gpu_mig_info")}
        read_at = s.value("resmon_last_refresh_timestamp_seconds", collector="mig")
        # the mig collector's time is when its oldest slow read began: one that began after the
        # change must serve the new layout (a late read would pass a deadline, not this)
        assert read_at < changed_at or uuids[(2, 0)] in mig_uuids, (read_at, changed_at, mig_uuids)
        if uuids[(2, 0)] in mig_uuids:
            assert mig_uuids == set(uuids.values())  # the destroyed device's series is gone, no restart
            assert s.value("resmon_gpu_mig_memory_total_bytes", **new) == 20 * 1024**3
            value = s.series("resmon_gpu_mig_sm_active_ratio", **new)
            seen.append(value[0][1] if value else None)
            assert seen[-1] in (None, 0.9), seen  # never a mix of the old instance and the new one
            assert s.value("resmon_gpu_mig_sm_active_ratio", gpu_instance_id="1", **H100) == 0.7  # its window kept
            if seen[-1] == 0.9 and s.has("resmon_gpu_mig_sm_active_ratio", gpu_instance_id="3", **H100):
                break
        time.sleep(0.1)
    assert seen and seen[0] is None and seen[-1] == 0.9, seen
    assert s.value("resmon_gpu_mig_sm_active_ratio", gpu_instance_id="3", **H100) == 0.1
    assert s.value("resmon_collector_success", collector="mig") == 1
    for _ in range(3):
        exporter.scrape()
    # the recreated instance 2 reused its three buffers; only the new instance 3 took three more
    assert live(trace) == ((SOURCES + 1) * BUFFERS + REFUSED, 0)
    # instance 3 destroyed: its buffers go back to NVML at once, not at shutdown
    del uuids[(3, 0)]
    scenario.update(**{"gpu.0.mig_devices": sc.mig_slots(uuids, profiles, memory)})
    exporter.wait_for(lambda s: not s.has("resmon_gpu_mig_info", gpu_instance_id="3"))
    exporter.scrape()
    assert live(trace) == ((SOURCES + 1) * BUFFERS + REFUSED, BUFFERS)
    assert exporter.stop() == 0
    assert live(trace)[0] == live(trace)[1] and "GPM sample" not in exporter.stderr


def test_sample_buffers_are_freed_before_shutdown(run_exporter, machine, trace):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_for(has_window)
    assert exporter.stop() == 0
    calls = [symbol for symbol, _ in trace.lines()]
    allocs, frees = calls.count("nvmlGpmSampleAlloc"), calls.count("nvmlGpmSampleFree")
    assert allocs == frees and SOURCES * 2 + REFUSED <= allocs <= SOURCES * BUFFERS + REFUSED, (allocs, frees)
    last_free = max(i for i, c in enumerate(calls) if c == "nvmlGpmSampleFree")
    assert last_free < max(i for i, c in enumerate(calls) if c == "nvmlShutdown")
    assert "GPM samples still allocated" not in exporter.stderr


def test_a_driver_without_gpm_has_no_profiling(run_exporter, machine, trace):
    # the old build lacks every GPM symbol (and the MIG GPU-instance calls answer as before)
    exporter = run_exporter("--collect.cache-ttl=0", lib="old")
    exporter.scrape()
    s = exporter.scrape()
    for name in PROFILING | MIG_PROFILING:
        assert not s.series(name), name
    assert not s.has("resmon_collector_success", collector="profiling")
    assert s.value("resmon_gpu_up", **H200) == 1


def test_collectors_off_serve_nothing_and_ask_nothing(run_exporter, machine, trace):
    s = run_exporter("--no-collector.profiling", "--no-collector.mig", "--no-collector.kubernetes", "--collect.cache-ttl=0").scrape()
    for name in PROFILING | MIG:
        assert not s.series(name), name
    for collector in ("profiling", "mig"):
        assert not s.has("resmon_collector_success", collector=collector)
    assert not [c for c, _ in trace.lines() if c.startswith("nvmlGpm") or c == "nvmlDeviceGetGpuInstanceId"]
    assert s.value("resmon_gpu_up", **H100) == 1


def test_promtool_check_metrics_is_clean(run_exporter, machine):
    from test_stack import need

    text = run_exporter().wait_for(has_window).text
    result = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result.stdout + result.stderr


def assert_no_leak(exporter, trace) -> None:
    assert exporter.stop() == 0
    allocs, frees = live(trace)
    assert allocs == frees and allocs > 0, (allocs, frees)
    assert "GPM samples still allocated" not in exporter.stderr
    assert "GPM sample used after free" not in exporter.stderr


def test_a_library_fault_inside_a_sample_call_keeps_every_buffer(run_exporter, machine, scenario, trace):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_for(has_window)
    # the H200's sample (and then a GPU instance's) answers UNINITIALIZED: NVML is shut down and initialised again
    for rc in ({"gpu.1.rc.nvmlGpmSampleGet": 1}, {"gpu.0.rc.nvmlGpmMigSampleGet": 9}):
        shutdowns = trace.count("nvmlShutdown")
        scenario.update(**rc)
        exporter.wait_for(lambda s: trace.count("nvmlShutdown") > shutdowns)
        scenario.update(**dict.fromkeys(rc))
        assert_machine(exporter.wait_for(has_window))  # the new init's samples, never the old ones
    assert_no_leak(exporter, trace)


def test_a_reinit_with_gpm_active_uses_no_sample_of_the_old_init(run_exporter, machine, scenario, trace):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_for(has_window)
    scenario.update(**{"rc.nvmlDeviceGetCount_v2": 1})  # UNINITIALIZED: the driver went away
    exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 0)
    scenario.update(**{"rc.nvmlDeviceGetCount_v2": None})
    s = exporter.wait_for(has_window)
    assert_machine(s)
    assert trace.count("nvmlShutdown") >= 1 and trace.count("nvmlInitWithFlags") >= 2
    assert_no_leak(exporter, trace)


def test_a_driver_without_mig_samples_keeps_whole_gpu_profiling(run_exporter, machine, scenario):
    # R520 has GPM but not nvmlGpmMigSampleGet (R525): FUNCTION_NOT_FOUND turns off that call only
    scenario.update(**{"gpu.0.rc.nvmlGpmMigSampleGet": 13})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.wait_for(lambda s: s.has("resmon_gpu_sm_active_ratio", **H200))
    for _ in range(3):
        s = exporter.scrape()
        assert s.value("resmon_gpu_sm_active_ratio", **H200) == sc.H200_RATIOS["sm_active"]
        assert not [n for n in MIG_PROFILING if s.series(n)]
        assert s.value("resmon_collector_success", collector="profiling") == 1
        assert len(s.series("resmon_gpu_mig_info")) == 3


def test_no_data_once_is_no_value_this_refresh_only(run_exporter, machine, scenario):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_for(has_window)
    # NO_DATA (the whole GPU) and NOT_FOUND (a GPU instance) for a moment: no value then, and the
    # next windows right after (not a minute later, as a remembered NOT_SUPPORTED would be)
    scenario.update(**{"gpu.1.rc.nvmlGpmSampleGet": 21, "gpu.0.rc.nvmlGpmMigSampleGet": 6})
    exporter.wait_for(lambda s: not s.has("resmon_gpu_sm_active_ratio", **H200) and not s.series("resmon_gpu_mig_sm_active_ratio"))
    scenario.update(**{"gpu.1.rc.nvmlGpmSampleGet": None, "gpu.0.rc.nvmlGpmMigSampleGet": None})
    assert_machine(exporter.wait_for(has_window))
    # and NO_DATA from the metrics call itself, for every source
    scenario.update(**{"rc.nvmlGpmMetricsGet": 21})
    exporter.wait_for(lambda s: not s.has("resmon_gpu_sm_active_ratio", **H200) and not s.series("resmon_gpu_mig_sm_active_ratio"))
    scenario.update(**{"rc.nvmlGpmMetricsGet": None})
    assert_machine(exporter.wait_for(has_window))


def test_a_gpu_back_from_down_starts_a_fresh_window(run_exporter, machine, scenario):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_for(has_window)
    scenario.update(**{"gpu.1.rc.all": sc.GPU_IS_LOST})
    assert exporter.scrape().value("resmon_gpu_up", **H200) == 0
    scenario.update(**{"gpu.1.rc.all": None})
    s = exporter.scrape()
    # answering again: its first sample after the gap, never diffed against one from before it
    assert s.value("resmon_gpu_up", **H200) == 1 and not s.has("resmon_gpu_sm_active_ratio", **H200)
    assert exporter.wait_for(lambda s: s.has("resmon_gpu_sm_active_ratio", **H200)).value(
        "resmon_gpu_sm_active_ratio", **H200) == sc.H200_RATIOS["sm_active"]


def test_gpu_instance_gpm_reads_count_as_profiling_time(run_exporter, machine, scenario):
    # each GPU instance's sample takes 200 ms: the profiling collector's duration holds both
    scenario.update(**{"gpu.0.delay_ms.nvmlGpmMigSampleGet": 200})
    s = run_exporter("--collect.cache-ttl=0").scrape()
    assert s.value("resmon_collector_duration_seconds", collector="profiling") >= 0.4
    # and not the mig collector's, which only enumerates (milliseconds, far under the 0.4 s injected)
    assert s.value("resmon_collector_duration_seconds", collector="mig") < 0.4


def a100_alone(mode: str) -> dict:
    return {"count": 2,
            **sc.gpu_keys(0, name=sc.A100_NAME, uuid=A100["uuid"], pci_bus_id=sc.board_pci_bus_id("a100", 0),
                          memory_total=80 * sc.GIB, cuda_cc="8.0", mig_mode=mode),
            **sc.gpu_keys(1, name=sc.H200_NAME, uuid=H200["uuid"], pci_bus_id=sc.board_pci_bus_id("h200", 1), memory_total=141 * sc.GIB)}


def test_mig_mode_is_shown_on_every_mig_capable_gpu_on_or_off(run_exporter, scenario, trace):
    # an A100 with MIG off and an enable pending (the next reset turns it on), next to a GPU without MIG
    scenario.write(a100_alone("0:1"))
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.slow-interval=0")  # MIG mode read every refresh
    s = exporter.scrape()
    a100 = {"gpu": "0", "uuid": A100["uuid"]}
    assert s.value("resmon_gpu_mig_mode_enabled", mode="current", **a100) == 0
    assert s.value("resmon_gpu_mig_mode_enabled", mode="pending", **a100) == 1
    assert not s.series("resmon_gpu_mig_mode_enabled", gpu="1")  # no MIG: absent, not 0
    assert not s.series("resmon_gpu_mig_info") and not s.series("resmon_gpu_mig_memory_total_bytes")
    assert s.value("resmon_collector_success", collector="mig") == 1
    assert s.has("resmon_collector_duration_seconds", collector="mig")
    # one GetMigMode per MIG-capable GPU and refresh (the kubernetes collector reads the same
    # answer); the GPU without MIG is not asked again within a minute
    trace.clear()
    for _ in range(3):
        exporter.scrape()
    assert trace.count("nvmlDeviceGetMigMode", 0) == 3 and trace.count("nvmlDeviceGetMigMode", 1) == 0
    # MIG turned off (the pending enable cancelled): 0, not gone
    scenario.update(**{"gpu.0.mig_mode": "0:0"})
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_mig_mode_enabled", mode="pending", **a100) == 0)
    assert s.value("resmon_gpu_mig_mode_enabled", mode="current", **a100) == 0


def test_no_mig_capable_gpu_no_mig_collector(run_exporter, scenario):
    scenario.write({"count": 1, **sc.gpu_keys(0, name=sc.H200_NAME, uuid=H200["uuid"], memory_total=141 * sc.GIB)})
    s = run_exporter("--collect.cache-ttl=0").scrape()
    assert not s.series("resmon_gpu_mig_mode_enabled")
    assert not s.has("resmon_collector_success", collector="mig")
    assert s.value("resmon_gpu_up", gpu="0") == 1
