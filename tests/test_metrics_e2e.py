"""End to end: the real CLI on the fake libnvidia-ml, scraped over loopback HTTP."""

from __future__ import annotations

import gzip
import shutil
import subprocess

import pytest

from fakenvml import Scrape
from scenarios import GPU_IS_LOST, UNKNOWN, gpu_field, three_gpus

REASONS = {
    "gpu_idle": 0x001,
    "applications_clocks_setting": 0x002,
    "sw_power_cap": 0x004,
    "hw_slowdown": 0x008,
    "sync_boost": 0x010,
    "sw_thermal_slowdown": 0x020,
    "hw_thermal_slowdown": 0x040,
    "hw_power_brake_slowdown": 0x080,
    "display_clock_setting": 0x100,
}
CLOCKS = ("graphics", "sm", "memory", "video")


@pytest.fixture
def machine(scenario):
    values = three_gpus()
    scenario.write(values)
    return values


def labels_of(values, i):
    return {"gpu": str(i), "uuid": gpu_field(values, i, "uuid")}


def test_every_gpu_family_and_value(run_exporter, machine):
    s = run_exporter().scrape()
    assert s.value("resmon_gpu_devices") == 3
    assert s.value("resmon_gpu_backend_info", backend="nvml") == 1
    for i in range(3):
        lab = labels_of(machine, i)
        f = lambda key, i=i: gpu_field(machine, i, key)  # noqa: E731
        info = s.series("resmon_gpu_info", **lab)
        assert info == [
            (
                {**lab, "name": f("name"), "pci_bus_id": f("pci_bus_id"), "driver_version": "550.54.15", "backend": "nvml"},
                1.0,
            )
        ]
        assert s.value("resmon_gpu_up", **lab) == 1
        total, used, reserved = f("memory_total"), f("memory_used"), f("memory_reserved")
        assert s.value("resmon_gpu_memory_total_bytes", **lab) == total
        assert s.value("resmon_gpu_memory_used_bytes", **lab) == used  # v2: reserved not included
        assert s.value("resmon_gpu_memory_reserved_bytes", **lab) == reserved
        assert s.value("resmon_gpu_memory_free_bytes", **lab) == total - used - reserved
        assert s.value("resmon_gpu_temperature_celsius", **lab) == f("temperature")
        assert s.value("resmon_gpu_power_limit_watts", **lab) == f("power_limit_mw") / 1000
        assert s.value("resmon_gpu_performance_state", **lab) == f("pstate")
        for clock in CLOCKS:
            if f"gpu.{i}.clock.{clock}" in machine:
                assert s.value("resmon_gpu_clock_hertz", clock=clock, **lab) == f(f"clock.{clock}") * 1e6
                assert s.value("resmon_gpu_clock_max_hertz", clock=clock, **lab) == f(f"max_clock.{clock}") * 1e6
        mask = f("clocks_event_reasons")
        for reason, bit in REASONS.items():
            assert s.value("resmon_gpu_throttle_active", reason=reason, **lab) == (1 if mask & bit else 0)
    for i in (0, 1):
        lab = labels_of(machine, i)
        assert s.value("resmon_gpu_utilization_ratio", **lab) == pytest.approx(gpu_field(machine, i, "util_gpu") / 100)
        assert s.value("resmon_gpu_memory_utilization_ratio", **lab) == pytest.approx(
            gpu_field(machine, i, "util_memory") / 100
        )
        assert s.value("resmon_gpu_power_watts", **lab) == gpu_field(machine, i, "power_mw") / 1000
        assert s.value("resmon_gpu_energy_joules_total", **lab) == gpu_field(machine, i, "energy_mj") / 1000
    assert s.families["resmon_gpu_energy_joules"].type == "counter"
    assert s.value("resmon_gpu_fan_speed_ratio", **labels_of(machine, 1)) == pytest.approx(0.45)
    assert s.value("resmon_gpu_fan_speed_ratio", **labels_of(machine, 2)) == 0  # a real 0 %, not unsupported
    # process lists through the two-call protocol; one PID in both lists counts once
    assert s.value("resmon_gpu_processes", **labels_of(machine, 0)) == 2
    assert s.value("resmon_gpu_processes", **labels_of(machine, 1)) == 0


def test_unsupported_values_are_absent_not_zero(run_exporter, machine):
    s = run_exporter().scrape()
    l0, l2 = labels_of(machine, 0), labels_of(machine, 2)
    assert not s.has("resmon_gpu_fan_speed_ratio", **l0)
    for name in (
        "resmon_gpu_utilization_ratio",
        "resmon_gpu_memory_utilization_ratio",
        "resmon_gpu_power_watts",
        "resmon_gpu_energy_joules_total",
    ):
        assert not s.has(name, **l2), name
    # the device itself is fine
    assert s.value("resmon_gpu_up", **l0) == 1
    assert s.value("resmon_gpu_up", **l2) == 1
    assert "NaN" not in s.text


def test_no_family_without_samples_on_an_nvidia_host(run_exporter, machine):
    # issue 22 item 9: AMD-only families (junction temperature, GTT) and values no board here
    # has are left out, not served as HELP/TYPE with no sample; only identity, collector status
    # and the families whose empty state is an answer (no XID yet) may be empty
    s = run_exporter().scrape()
    declared_when_empty = {"resmon_gpu_xid_errors", "resmon_gpu_xid_last_timestamp_seconds"}
    empty = {f.name for f in s.families.values() if f.name.startswith("resmon_") and not f.samples}
    assert empty <= declared_when_empty, empty - declared_when_empty
    for amd_only in ("resmon_gpu_junction_temperature_celsius", "resmon_gpu_gtt_total_bytes", "resmon_gpu_gtt_used_bytes"):
        assert amd_only not in s.families and f"# HELP {amd_only}" not in s.text


def test_host_families(run_exporter, machine):
    s = run_exporter().scrape()
    import psutil

    assert s.value("resmon_cpu_logical_cores") == psutil.cpu_count(logical=True)
    ratio = s.value("resmon_cpu_utilization_ratio")
    assert 0.0 <= ratio <= 1.0
    modes = {l["mode"] for l, _ in s.series("resmon_cpu_seconds_total")}
    assert modes == {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}
    total = s.value("resmon_memory_total_bytes")
    available = s.value("resmon_memory_available_bytes")
    assert total == psutil.virtual_memory().total
    assert 0 < available <= total
    assert s.value("resmon_memory_used_bytes") == total - available
    assert s.value("resmon_swap_total_bytes") >= s.value("resmon_swap_used_bytes")
    for name in ("resmon_load1", "resmon_load5", "resmon_load15"):
        assert s.has(name)  # values against /proc/loadavg: tests/test_host.py


def test_exporter_families(run_exporter, machine):
    exporter = run_exporter()
    s = exporter.scrape()
    import platform

    from resmon_exporter.version import __version__

    assert s.value("resmon_build_info", version=__version__, python_version=platform.python_version()) == 1
    for collector in ("gpu", "host"):
        assert s.value("resmon_collector_success", collector=collector) == 1
        assert 0 < s.value("resmon_collector_duration_seconds", collector=collector) < 5  # measured, within --collect.timeout
        assert s.value("resmon_last_refresh_timestamp_seconds", collector=collector) > 1.6e9
    # client library defaults stay
    assert s.has("process_resident_memory_bytes")
    assert s.has("python_info")


def test_lost_gpu_goes_to_zero_and_back_while_others_flow(run_exporter, scenario, machine):
    exporter = run_exporter("--collect.cache-ttl=0")
    l0, l1, l2 = (labels_of(machine, i) for i in range(3))
    assert exporter.scrape().value("resmon_gpu_up", **l1) == 1

    scenario.update(**{"gpu.1.rc.all": GPU_IS_LOST})
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", **l1) == 0
    assert s.has("resmon_gpu_info", **l1)  # identity stays visible
    assert not s.has("resmon_gpu_memory_used_bytes", **l1)
    assert not s.has("resmon_gpu_temperature_celsius", **l1)
    assert s.value("resmon_gpu_up", **l0) == 1 and s.value("resmon_gpu_up", **l2) == 1
    assert s.value("resmon_gpu_memory_used_bytes", **l0) == gpu_field(machine, 0, "memory_used")
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert s.value("resmon_collector_success", collector="host") == 1
    assert s.has("resmon_memory_total_bytes")

    scenario.update(**{"gpu.1.rc.all": None})
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", **l1) == 1
    assert s.value("resmon_gpu_temperature_celsius", **l1) == gpu_field(machine, 1, "temperature")
    assert "GPU not answering" in exporter.stderr and "GPU answering again" in exporter.stderr


def test_unknown_error_on_one_call_marks_only_that_device_down(run_exporter, scenario, machine):
    scenario.update(**{"gpu.2.rc.nvmlDeviceGetTemperatureV": UNKNOWN})
    s = run_exporter().scrape()
    assert s.value("resmon_gpu_up", **labels_of(machine, 2)) == 0
    assert s.value("resmon_gpu_up", **labels_of(machine, 0)) == 1


def test_gpu_lost_at_handle_from_start_is_visible(run_exporter, scenario, machine):
    scenario.update(**{"gpu.1.rc.nvmlDeviceGetHandleByIndex_v2": GPU_IS_LOST})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.scrape()
    # never answered, so its UUID is unknown; the index alone identifies it
    assert s.series("resmon_gpu_up", gpu="1") == [({"gpu": "1", "uuid": ""}, 0.0)]
    assert s.value("resmon_gpu_up", **labels_of(machine, 0)) == 1
    assert s.value("resmon_gpu_devices") == 3

    scenario.update(**{"gpu.1.rc.nvmlDeviceGetHandleByIndex_v2": None})
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", **labels_of(machine, 1)) == 1


def test_removed_gpu_stays_as_down(run_exporter, scenario, machine):
    exporter = run_exporter("--collect.cache-ttl=0")
    assert exporter.scrape().value("resmon_gpu_devices") == 3
    scenario.update(count=2)
    s = exporter.scrape()
    assert s.value("resmon_gpu_devices") == 2
    assert s.value("resmon_gpu_up", **labels_of(machine, 2)) == 0
    assert s.value("resmon_gpu_up", **labels_of(machine, 1)) == 1


def test_process_list_two_call_protocol(run_exporter, trace, machine):
    exporter = run_exporter("--collect.cache-ttl=1h")
    exporter.scrape()
    # GPU 0 has processes: a size query (INSUFFICIENT_SIZE) then the real call; GPU 1 has none: one call
    assert trace.count("nvmlDeviceGetComputeRunningProcesses_v3", device=0) == 2
    assert trace.count("nvmlDeviceGetComputeRunningProcesses_v3", device=1) == 1
    assert trace.count("nvmlDeviceGetGraphicsRunningProcesses_v3", device=0) == 2


def test_promtool_check_metrics_is_clean(run_exporter, machine):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: scripts/test.sh installs Debian's prometheus package")
    status, headers, body = run_exporter().request("/metrics")  # text 0.0.4 by default
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"resmon_gpu_throttle_active" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert result.stdout == b"" and result.stderr == b"", (result.stdout, result.stderr)
    assert result.returncode == 0


def test_openmetrics_negotiation_and_gzip(run_exporter, machine):
    exporter = run_exporter()
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    status, headers, body = exporter.request("/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert headers["content-encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert text.rstrip().endswith("# EOF")
    assert "# TYPE resmon_gpu_energy_joules counter" in text
    assert "resmon_gpu_energy_joules_total{" in text
    assert Scrape(exporter.request("/metrics")[2].decode()).value("resmon_gpu_devices") == 3


def test_rendered_exposition_is_reused_within_the_cache_window(run_exporter, scenario, trace, machine):
    exporter = run_exporter("--collect.cache-ttl=1h")
    exporter.wait_ready()
    first = exporter.request("/metrics")[2]
    assert exporter.request("/metrics")[2] == first  # same snapshot: the same rendered bytes
    om = {"Accept": "application/openmetrics-text;version=1.0.0"}
    assert exporter.request("/metrics", headers=om)[2] != first  # each format rendered on its own
    assert exporter.request("/metrics", headers=om)[2].rstrip().endswith(b"# EOF")
    assert trace.count("nvmlDeviceGetUtilizationRates", device=0) == 1

    fresh = run_exporter("--collect.cache-ttl=0")
    fresh.wait_ready()
    scenario.update(**{"gpu.0.temperature": 77})
    assert Scrape(fresh.request("/metrics")[2].decode()).value(
        "resmon_gpu_temperature_celsius", **labels_of(machine, 0)) == 77
