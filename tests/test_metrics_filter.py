"""Choosing metrics (issue 26 part 1): --metrics.include / --metrics.exclude over family names,
an excluded family's NVML calls not made, and node_exporter's collect[] URL parameter. The real
CLI against the fake NVML, scraped over loopback."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import scenarios as sc
from fakenvml import Scrape
from resmon_exporter.backends.nvml.fields import NVLINK_GET_STATE
from resmon_exporter.backends.nvml.wanted import HEALTH_READS, MIG_FAMILIES, NVLINK_READS, READS, gpm_families
from resmon_exporter.collectors.registry import FAMILIES, REGISTRY
from resmon_exporter.config import ALWAYS_SERVED, FamilyFilter

HOPPER = {"count": 2, **sc.hopper_board(0), **sc.hopper_board(1)}
STATUS = ("resmon_collector_success", "resmon_collector_duration_seconds", "resmon_last_refresh_timestamp_seconds")
NVLINK_CALLS = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter")


def families(scrape: Scrape) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", scrape.text, re.M))


def collectors_reported(scrape: Scrape) -> set[str]:
    return {labels["collector"] for labels, _ in scrape.series("resmon_collector_success")}


def calls_per_refresh(exporter, trace, symbols: tuple[str, ...], scrapes: int = 3) -> int:
    """NVML calls of symbols over a few fresh refreshes (--collect.cache-ttl=0)."""
    exporter.scrape()
    trace.clear()
    for _ in range(scrapes):
        exporter.scrape()
    return sum(trace.count(s) for s in symbols)


# -- flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--metrics.include=resmon_gpu_(", "--metrics.exclude=*"])
def test_a_bad_pattern_is_one_line_and_exit_2(flag):
    run = subprocess.run([sys.executable, "-m", "resmon_exporter", flag], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "pattern" in lines[0] and "Traceback" not in run.stderr, run.stderr


def test_patterns_match_the_whole_name():
    f = FamilyFilter(include="resmon_gpu_memory")  # a prefix: anchored, so no family matches it
    assert not f.keeps("resmon_gpu_memory_used_bytes")
    assert f.keeps("resmon_gpu_up") and f.keeps("resmon_collector_success")  # never removed
    g = FamilyFilter(exclude="resmon_gpu_nvlink_.*")
    assert not g.keeps("resmon_gpu_nvlink_errors_total") and not g.keeps("resmon_gpu_nvlink_bandwidth_bytes_per_second")
    assert g.keeps("resmon_gpu_sm_active_ratio") and g.keeps("resmon_gpu_temperature_celsius")


def test_every_read_names_real_families_and_every_nvml_family_has_a_read():
    named = {f for families in READS.values() for f in families} | set(gpm_families("resmon_gpu_"))
    named |= set(gpm_families("resmon_gpu_mig_")) | set(MIG_FAMILIES)
    assert named <= set(FAMILIES), named - set(FAMILIES)
    # the families an NVML read feeds, but no read of their own: identity (read once per
    # init), amdgpu-only gauges, the backend's own and the exporter's own
    unread = {
        "resmon_gpu_clock_max_hertz", "resmon_gpu_junction_temperature_celsius", "resmon_gpu_gtt_total_bytes",
        "resmon_gpu_gtt_used_bytes", "resmon_gpu_backend_info", "resmon_gpu_devices", "resmon_build_info",
    }
    host = {n for r in REGISTRY if r.spec.name == "host" for n in r.families}
    assert set(FAMILIES) - named - set(ALWAYS_SERVED) - unread - host == set()
    assert set(HEALTH_READS) | set(NVLINK_READS) <= set(READS)


# -- include / exclude, and the calls they save ----------------------------------------------


def test_excluding_the_nvlink_families_drops_them_and_their_calls(run_exporter, scenario, trace):
    scenario.write(HOPPER)
    plain = run_exporter("--collect.cache-ttl=0", "--collect.slow-interval=0")
    before = plain.scrape()
    assert {"resmon_gpu_nvlink_active", "resmon_gpu_nvlink_errors_total", "resmon_gpu_nvlink_bytes_total"} <= families(before)
    batches = calls_per_refresh(plain, trace, ("nvmlDeviceGetFieldValues",))
    scenario.update(**{f"gpu.{i}.field_rc.{NVLINK_GET_STATE}": sc.NOT_SUPPORTED for i in (0, 1)})
    assert calls_per_refresh(plain, trace, NVLINK_CALLS) > 0  # each link's state: its call where the field fails
    plain.stop()

    exporter = run_exporter("--collect.cache-ttl=0", "--collect.slow-interval=0", "--metrics.exclude=resmon_gpu_nvlink_.*")
    scrape = exporter.scrape()
    served = families(scrape)
    assert not {f for f in served if f.startswith("resmon_gpu_nvlink_")}
    # the NVLink bandwidth of GPM is a profiling family, not matched by the pattern
    assert {"resmon_gpu_up", "resmon_gpu_info", "resmon_gpu_ecc_errors_total", "resmon_gpu_temperature_celsius"} <= served
    assert "nvlink" not in collectors_reported(scrape) and {"gpu", "health"} <= collectors_reported(scrape)
    assert calls_per_refresh(exporter, trace, NVLINK_CALLS) == 0
    # the link counters were the batch's largest part: it is still one call per GPU and refresh
    assert calls_per_refresh(exporter, trace, ("nvmlDeviceGetFieldValues",)) == batches == 3 * 2


def test_include_serves_only_the_named_families_and_reads_only_what_they_need(run_exporter, scenario, trace):
    scenario.write(HOPPER)
    exporter = run_exporter(
        "--collect.cache-ttl=0", "--collect.slow-interval=0",
        "--metrics.include=resmon_gpu_(memory_used_bytes|temperature_celsius)",
    )
    scrape = exporter.scrape()
    resmon = {f for f in families(scrape) if f.startswith("resmon_")}
    assert resmon == {"resmon_gpu_up", "resmon_gpu_info", "resmon_gpu_memory_used_bytes",
                      "resmon_gpu_temperature_celsius", *STATUS}, resmon
    assert scrape.value("resmon_gpu_temperature_celsius", gpu="0") > 0
    assert not any(line.startswith(("process_", "python_")) for line in scrape.text.splitlines())
    counts = trace.counts()
    trace.clear()
    for _ in range(3):
        exporter.scrape()
    counts = trace.counts()
    for symbol in ("nvmlDeviceGetClockInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples",
                   "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetPerformanceState",
                   "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetTotalEccErrors",
                   "nvmlDeviceGetRemappedRows", "nvmlDeviceGetFanSpeed", "nvmlDeviceGetCurrPcieLinkGeneration",
                   "nvmlDeviceGetMigMode", "nvmlDeviceGetCurrentClocksEventReasons", *NVLINK_CALLS):
        assert counts[symbol] == 0, (symbol, counts)
    assert counts["nvmlDeviceGetMemoryInfo_v2"] == 3 * 2
    assert counts["nvmlDeviceGetFieldValues"] == 3 * 2  # the temperature's field, alone in the batch


def test_a_call_two_families_share_is_made_while_one_of_them_is_served(run_exporter, scenario, trace):
    scenario.write(HOPPER)
    exporter = run_exporter("--collect.cache-ttl=0", "--metrics.exclude=resmon_gpu_utilization_ratio|resmon_gpu_.*_hertz")
    scrape = exporter.scrape()
    assert "resmon_gpu_utilization_ratio" not in families(scrape)
    assert scrape.value("resmon_gpu_memory_utilization_ratio", gpu="0") == pytest.approx(0.20)
    assert calls_per_refresh(exporter, trace, ("nvmlDeviceGetUtilizationRates",)) == 3 * 2
    assert calls_per_refresh(exporter, trace, ("nvmlDeviceGetClockInfo",)) == 0


def test_identity_up_and_the_collector_status_are_never_removed(run_exporter, scenario):
    scenario.write(HOPPER)
    exporter = run_exporter("--metrics.exclude=resmon_.*|process_.*")
    scrape = exporter.scrape()
    resmon = {f for f in families(scrape) if f.startswith("resmon_")}
    assert resmon == {"resmon_gpu_up", "resmon_gpu_info", *STATUS}, resmon
    assert scrape.value("resmon_gpu_up", gpu="1") == 1
    assert scrape.value("resmon_collector_success", collector="gpu") == 1
    assert not any(line.startswith("process_") for line in scrape.text.splitlines())
    assert any(line.startswith("python_info") for line in scrape.text.splitlines())  # not matched: kept


# -- collect[] -------------------------------------------------------------------------------


def test_collect_serves_only_the_collectors_asked_for(run_exporter, scenario):
    scenario.write(HOPPER)
    exporter = run_exporter()
    scrape = exporter.scrape("/metrics?collect[]=gpu&collect[]=host")
    served = families(scrape)
    assert {"resmon_gpu_temperature_celsius", "resmon_memory_total_bytes"} <= served
    assert not {f for f in served if f.startswith(("resmon_gpu_ecc", "resmon_gpu_nvlink_", "resmon_gpu_mig_"))}
    assert collectors_reported(scrape) == {"gpu", "host"}
    full = exporter.scrape()
    assert {"health", "nvlink"} <= collectors_reported(full), collectors_reported(full)


def test_a_host_only_scrape_reads_no_gpu(run_exporter, scenario, trace):
    scenario.write(HOPPER)
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.scrape()
    trace.clear()
    for _ in range(3):
        scrape = exporter.scrape("/metrics?collect[]=host")
        assert collectors_reported(scrape) == {"host"}
        assert scrape.value("resmon_memory_total_bytes") > 0 and "resmon_gpu_up" not in families(scrape)
    assert trace.counts()["nvmlDeviceGetMemoryInfo_v2"] == 0
    exporter.scrape("/metrics?collect[]=gpu")
    assert trace.counts()["nvmlDeviceGetMemoryInfo_v2"] == 2  # a GPU scrape still reads them


@pytest.mark.parametrize("query, why", [
    ("collect[]=gpus", "unknown collector 'gpus'"),
    ("collect[]=gpu&collect[]=processes", "collector 'processes' in collect[] is disabled (--collector.processes turns it on)"),
])
def test_a_bad_collect_parameter_is_a_400(run_exporter, scenario, query, why):
    scenario.write(HOPPER)
    exporter = run_exporter()
    status, _, body = exporter.request(f"/metrics?{query}")
    assert status == 400 and why in body.decode(), body


def test_docs_name_every_read_with_its_families():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    section = text.split("## Choosing metrics", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = tuple(re.findall(r"`(resmon_[a-z0-9_]+)`", cells[2]))
    assert rows == READS
