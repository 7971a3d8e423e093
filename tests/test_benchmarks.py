"""The benchmark's quick mode runs (a smoke test: no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from fakenvml import REPO


def test_quick_benchmark_prints_every_figure(tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", f"--json={out}"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    table = result.stdout
    for needle in ("COLD scrape 8 GPUs, TTL 0, p50", "COLD scrape 8 GPUs, default TTL, spaced", "nvitop-exporter",
                   "COLD scrape 64 GPUs, TTL 0, p99", "8 GPUs x 32 processes", "8 GPUs x 7 MIG instances",
                   "every v2 collector answering", "refresh with simulated latency, 8 GPUs / 1 GPU",
                   "+ prometheus_client", "warm scrape 8 GPU(s) text p99", "warm scrape 64 GPU(s) OpenMetrics+gzip p50",
                   "cold scrape 64 GPU(s) text p99", "cold refresh 8 GPU(s), CPU", "NVML calls per refresh, 8 GPU(s)",
                   "exposition share", "get_current_resources() warm", "get_current_resources() cold",
                   "seed Mai approach per call", "start to /-/ready", "RSS after start", "RSS after 1000 scrapes",
                   "CPU over 5 s idle", "wakeups", "XID watcher on", "--no-collector.xid",
                   "8 H100-class GPUs, every v2 family", "200 processes, --collector.processes",
                   "processes collector on / off", "RSS with the kubelet socket present",
                   "the exporter's own (less the fake NVML's)", "of which the fake libnvidia-ml.so.1"):
        assert needle in table, needle
    figures = json.loads(out.read_text())
    for needle in ("CPU per 5 s scrape interval, 8 GPUs, defaults (all threads)", "CPU per refresh, 8 plain GPUs",
                   "NVML calls per refresh per GPU, H100-class, refresh every 5 s", "MIG + GPM",
                   "refresh, one 1 ms call per GPU, 8 GPUs / 1 GPU"):
        assert needle in table, needle
    # the headline comes first: CPU per scrape interval, then calls, then cold latency
    assert table.index("CPU per 5 s scrape interval") < table.index("NVML calls per refresh per GPU") < table.index(
        "COLD scrape 8 GPUs, TTL 0, p50")
    # the nvitop-exporter ratios are there only where nvitop-exporter is installed
    assert set(figures) - {"scrape_cold_8_vs_nvitop", "cpu_interval_5s_vs_nvitop"} == {
        "calls_plain", "calls_health", "calls_mig_gpm", "refresh_one_blocking_ratio",
        "scrape_cold_64_p99", "scrape_cold_processes_p99", "refresh_delayed_ratio",
        "scrape_warm_8_p99", "scrape_warm_64_p99", "refresh_cold_8", "api_warm", "rss_start", "idle_wakeups"}
    # the headline comes first: cold, then warm
    assert table.index("COLD scrape 8 GPUs, TTL 0, p50") < table.index("warm scrape 8 GPU(s) text p99")
    # units as the table prints them: ms, MiB, a count; a figure that was never measured is 0
    assert all(5 < figures[k] < 40 for k in ("calls_plain", "calls_health", "calls_mig_gpm"))  # calls per GPU
    assert all(figures[k] > 0 for k in ("refresh_one_blocking_ratio", "scrape_cold_64_p99", "scrape_cold_processes_p99", "refresh_delayed_ratio",
                                        "scrape_warm_8_p99", "scrape_warm_64_p99", "refresh_cold_8", "api_warm"))
    assert 10 < figures["rss_start"] < 1024  # MiB: a live Python process, not bytes or kB
    assert figures["idle_wakeups"] == int(figures["idle_wakeups"]) >= 0  # a count of context switches


def test_cold_parts_prints_every_part():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cold_parts.py"), "--gpus", "2", "--processes", "2x16",
                             "--repeat", "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows: dict[str, dict[str, tuple[str, str]]] = {"2": {}, "2x16": {}}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in rows:
            rows[cells[0]][cells[1]] = (cells[2], cells[3])
    http = "HTTP round trip alone (GET /-/ready, kept alive), p50"
    floor = "floor: HTTP + bare calls and files + host + families + direct renderer"
    parts = ["NVML calls of one refresh, bare", "host read", "families", "direct renderer"]
    procfs = "procfs stat files of the processes, bare"
    common = {"GPU refresh on the reader threads", "the same GPUs one after another, this thread",
              "prometheus_client generate_latest", "samples rendered", http, floor, *parts}
    assert set(rows["2"]) == common
    assert set(rows["2x16"]) == common | {procfs}  # the processes' files: only where there are processes
    # two fake GPUs read for real: their families render to a few dozen samples; with sixteen
    # processes each, their memory and utilization series too (16 files: the floor counts them)
    assert 40 < int(rows["2"]["samples rendered"][0]) < int(rows["2x16"]["samples rendered"][0]) - 6
    for case, case_parts in (("2", parts), ("2x16", [*parts, procfs])):
        measured = {k: float(wall) for k, (_, wall) in rows[case].items() if k != "samples rendered"}
        assert all(v > 0 for v in measured.values()), measured
        assert all(float(cpu) > 0 for k, (cpu, _) in rows[case].items() if k not in (http, floor))
        # the floor is the sum of its parts (each printed rounded to 0.01 ms)
        assert abs(measured[floor] - measured[http] - sum(measured[k] for k in case_parts)) <= 0.04, measured
        # bare calls: 2 GPUs x 15 calls of a few us each, well under a millisecond, not seconds
        assert measured["NVML calls of one refresh, bare"] < 5
