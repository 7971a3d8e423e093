"""--metrics.include / --metrics.exclude name a counter as the text format writes it (issue 35
item 2): `resmon_gpu_energy_joules_total`, `process_cpu_seconds_total`; the bare name
(OpenMetrics' `# TYPE` line) selects it too. One matcher (config.FamilyFilter.keeps) decides for
the scrape, prometheus_client's own families and NVML's skipped reads. Every backend: the real
CLI scraped over loopback, one exporter each, an exact include and an exact exclude of a counter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import scenarios as sc
from fake_fdinfo import FakeProc, i915_client
from fake_intel import intel_host
from fake_sysfs import FakeSysfs, standard
from fakenvml import Exporter, Scrape, nvml_env, sysfs_exporters
from resmon_exporter.backends.nvml.wanted import Wanted
from resmon_exporter.collectors.registry import FAMILIES
from resmon_exporter.config import FamilyFilter

FAKE_SMI = Path(__file__).parent / "fake_smi" / "fake_smi.py"
HOPPER = {"count": 2, **sc.hopper_board(0), **sc.hopper_board(1)}
OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}


def families(scrape: Scrape) -> set[str]:
    """The families as the text format's # TYPE lines name them (a counter's with _total)."""
    return set(re.findall(r"^# TYPE (\S+) ", scrape.text, re.M))


# -- the rule --------------------------------------------------------------------------------


def test_a_counter_answers_to_its_total_name_and_its_bare_name():
    for pattern in ("resmon_gpu_energy_joules_total", "resmon_gpu_energy_joules"):
        assert FamilyFilter(include=pattern).keeps("resmon_gpu_energy_joules_total"), pattern
        assert not FamilyFilter(exclude=pattern).keeps("resmon_gpu_energy_joules_total"), pattern
        assert "energy" in Wanted.of(FamilyFilter(include=pattern))  # the read-side skip agrees
        assert "energy" not in Wanted.of(FamilyFilter(exclude=pattern))
    # still anchored: a longer or shorter name is another family
    assert not FamilyFilter(include="resmon_gpu_energy_joules_tot").keeps("resmon_gpu_energy_joules_total")
    assert not FamilyFilter(include="resmon_gpu_energy").keeps("resmon_gpu_energy_joules_total")
    # a gauge has one name only
    assert not FamilyFilter(include="resmon_gpu_memory_total").keeps("resmon_gpu_memory_total_bytes")
    assert FamilyFilter(exclude=".*_total").keeps("resmon_gpu_memory_total_bytes")
    assert not FamilyFilter(exclude=".*_total").keeps("resmon_cpu_seconds_total")


def test_total_is_on_counters_only():
    # the matcher tells a counter by its _total (the contract's naming rule): hold every family to it
    assert {n for n, kind in FAMILIES.items() if kind == "counter"} == {n for n in FAMILIES if n.endswith("_total")}


# -- every backend, by the real CLI ----------------------------------------------------------


def test_nvml_counter_include_and_exclude(run_exporter, scenario, trace):
    scenario.write(HOPPER)
    exporter = run_exporter(
        "--collect.cache-ttl=0",
        "--metrics.include=resmon_gpu_energy_joules_total|resmon_gpu_pcie_.*|process_.*",
        "--metrics.exclude=resmon_gpu_pcie_replays_total|process_cpu_seconds_total",
    )
    for path in ("/metrics", "/metrics?collect[]=gpu"):
        scrape = exporter.scrape(path)
        served = families(scrape)
        assert scrape.value("resmon_gpu_energy_joules_total", gpu="0") > 0, path  # exact include
        assert scrape.has("resmon_gpu_pcie_bytes_total", gpu="1", direction="receive"), path  # by the pattern
        assert "resmon_gpu_pcie_replays_total" not in served, path  # exact exclude
        assert "process_cpu_seconds_total" not in served and "process_open_fds" in served, path
        assert "resmon_gpu_temperature_celsius" not in served and "python_info" not in served, path
    trace.clear()
    exporter.scrape()
    assert trace.count("nvmlDeviceGetPcieReplayCounter") == 0  # the excluded counter is not read
    # OpenMetrics writes the counter's # TYPE without _total: the same families are served
    status, _, body = exporter.request("/metrics", headers=OPENMETRICS)
    text = body.decode()
    assert status == 200 and "# TYPE resmon_gpu_energy_joules counter" in text, text[:300]
    assert "resmon_gpu_energy_joules_total{" in text
    assert "resmon_gpu_pcie_replays" not in text and "process_cpu_seconds" not in text


@pytest.fixture
def sysfs_exporter(tmp_path: Path):
    yield from sysfs_exporters(tmp_path)


def test_amdgpu_counter_include_and_exclude(sysfs_exporter, tmp_path):
    tree = standard(tmp_path / "sys")
    # no amdgpu family is a counter: the host's and the client library's are
    exporter = sysfs_exporter(
        "--gpu.backend=amdgpu",
        "--metrics.include=resmon_cpu_seconds_total|resmon_gpu_memory_.*|python_gc_.*",
        "--metrics.exclude=python_gc_objects_collected_total",
        root=tree.root,
    )
    for path in ("/metrics", "/metrics?collect[]=host&collect[]=gpu"):
        scrape = exporter.scrape(path)
        served = families(scrape)
        assert scrape.value("resmon_cpu_seconds_total", mode="user") > 0, path  # exact include
        assert scrape.has("resmon_gpu_memory_total_bytes", gpu="0"), path
        assert "python_gc_objects_collected_total" not in served, path  # exact exclude
        assert "python_gc_collections_total" in served, path
        assert "resmon_memory_total_bytes" not in served and "resmon_gpu_utilization_ratio" not in served, path


def test_intel_counter_include_and_exclude(sysfs_exporter, tmp_path):
    tree = FakeSysfs(tmp_path / "sys")
    intel_host(tree)
    proc = FakeProc(tmp_path / "proc")
    proc.add_process(1, "init", uid=0)
    proc.add_process(4242, "trainer")
    proc.add_drm_fd(4242, 5, i915_client("0000:03:00.0", 11, render_ns=7_000_000_000), node="renderD129")
    exporter = sysfs_exporter(
        "--gpu.backend=intel", f"--path.procfs={proc.root}",
        "--metrics.include=resmon_gpu_energy_joules_total|resmon_gpu_busy_seconds_total|resmon_cpu_.*",
        "--metrics.exclude=resmon_cpu_seconds_total",
        root=tree.root,
    )
    scrape = exporter.scrape()
    served = families(scrape)
    arc = {"gpu": "1", "uuid": "0000:03:00.0"}
    assert scrape.value("resmon_gpu_energy_joules_total", **arc) == 123456.789  # exact includes
    assert scrape.value("resmon_gpu_busy_seconds_total", engine="render", **arc) == 7.0
    assert "resmon_cpu_seconds_total" not in served and "resmon_cpu_logical_cores" in served  # exact exclude
    assert "resmon_gpu_power_limit_watts" not in served and "resmon_gpu_utilization_ratio" not in served


def test_gpu_tracker_counter_include_and_exclude(tmp_path, scenario, trace):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE_SMI)
    machine = tmp_path / "smi.json"
    machine.write_text('{"nvidia": {"gpus": [{"uuid": "GPU-11111111-2222-3333-4444-000000000000",'
                       ' "total_mib": 81559, "used_mib": 20480, "util": 87}]}}')
    no_nvml = tmp_path / "no-nvml"
    no_nvml.mkdir()
    env = nvml_env(no_nvml, scenario, trace)
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", FAKE_SMI_SCENARIO=str(machine),
               FAKE_SMI_TRACE=str(tmp_path / "smi-trace.txt"))
    exporter = Exporter([
        "--gpu.backend=gpu-tracker",
        "--metrics.include=resmon_cpu_seconds_total|resmon_gpu_memory_.*|process_.*",
        "--metrics.exclude=process_cpu_seconds_total",
    ], env)
    try:
        exporter.wait_listening()
        exporter.wait_ready()
        for path in ("/metrics", "/metrics?collect[]=host"):
            scrape = exporter.scrape(path)
            served = families(scrape)
            assert scrape.value("resmon_cpu_seconds_total", mode="system") > 0, path  # exact include
            assert "process_cpu_seconds_total" not in served and "process_resident_memory_bytes" in served, path
            assert "resmon_cpu_utilization_ratio" not in served, path
        assert exporter.scrape().value("resmon_gpu_memory_total_bytes", gpu="0") == 81559 * 1048576
    finally:
        exporter.stop()
