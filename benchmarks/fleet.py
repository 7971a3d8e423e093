#!/usr/bin/env python3
"""The fleet benchmark (issue 12): N real exporters on their own fake GPUs (1, 2, 4 or 8 per
node, as tests/test_fleet.py runs them), scraped every second by a real Prometheus through
file-based service discovery, with the real rules file loaded. Over a measured window it
prints each exporter's CPU (user + system, from /proc/PID/stat) and RSS, Prometheus' RSS and
CPU, the scrape durations Prometheus recorded, the samples per scrape by kind of node, and
Prometheus' time for every query of the Fleet dashboard. Nothing here asserts a timing.

    python benchmarks/fleet.py                       # 24 exporters, 120 s measured
    python benchmarks/fleet.py --quick               # 4 exporters, 10 s: a smoke run for CI
    python benchmarks/fleet.py --nodes 48 --duration 300 --json fleet.json
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from fakenvml import MIB, build_fake  # noqa: E402  (the test rig)
from fleet import JOB, Fleet, Node, cpu_seconds, fleet_nodes, rss_bytes, wait_fleet_up  # noqa: E402
from promstack import RULES, panel_targets  # noqa: E402

FLEET_DASHBOARD = REPO / "dashboards" / "resmon-fleet.json"


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (a timeout, a CI runner cancelling) as SystemExit, so measure()'s finally
    stops the exporters, Prometheus and the fake kubelet instead of orphaning them."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not interrupt the clean-up
    raise SystemExit(128 + signum)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def kind(node: Node) -> str:
    gpus = len(node.gpus)
    if node.pods:
        return f"{gpus} GPUs, processes + kubernetes collectors"
    if any(g.health for g in node.gpus):
        return f"{gpus} H100 boards answering every health family"
    return f"{gpus} plain GPU(s)"


def timed_query(port: int, expr: str, instant: bool, window: float) -> tuple[float, float | None, int]:
    """(wall ms at the client, Prometheus' own execTotalTime in ms or None, series returned)."""
    now = time.time()
    if instant:
        path, params = "/api/v1/query", {"query": expr, "time": f"{now:.3f}", "stats": "all"}
    else:  # a timeseries panel: a range query over the measured window, Grafana-like resolution
        step = max(1, int(window / 250))
        path, params = "/api/v1/query_range", {"query": expr, "start": f"{now - window:.3f}", "end": f"{now:.3f}",
                                                 "step": str(step), "stats": "all"}
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.load(resp)
    wall = (time.perf_counter() - started) * 1000
    assert body["status"] == "success", body
    stats = body["data"].get("stats", {}).get("timings", {})
    exec_ms = stats["execTotalTime"] * 1000 if "execTotalTime" in stats else None
    return wall, exec_ms, len(body["data"]["result"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="resmon-fleet-") as tmp:
        root = Path(tmp)
        lib = build_fake(root / "lib")
        started = time.monotonic()
        fleet = Fleet(root, lib, fleet_nodes(args.nodes), rules=RULES, interval=args.interval)
        try:
            wait_fleet_up(fleet, args.nodes, timeout=180)
            start_s = time.monotonic() - started
            pids = fleet.exporter_pids()
            prom = fleet.prometheus.pid
            cpu0 = {pid: cpu_seconds(pid) for pid in pids}
            prom0, t0 = cpu_seconds(prom), time.monotonic()
            time.sleep(args.duration)
            cpu1 = {pid: cpu_seconds(pid) for pid in pids}
            prom1, t1 = cpu_seconds(prom), time.monotonic()
            window = t1 - t0
            scrapes = {r["metric"]["instance"]: float(r["value"][1]) for r in fleet.query(
                f'count_over_time(up{{job="{JOB}"}}[{int(window)}s])')}
            per_exporter = []
            for m in fleet.members:
                pid = m.exporter.proc.pid
                used = cpu1[pid] - cpu0[pid]
                per_exporter.append({"node": m.node.name, "kind": kind(m.node), "cpu_percent": 100 * used / window,
                                     "cpu_ms_per_scrape": 1000 * used / max(1.0, scrapes.get(m.instance, 0)),
                                     "rss_mib": rss_bytes(pid) / MIB})
            durations = [float(r["value"][1]) * 1000 for r in fleet.query(
                f'max_over_time(scrape_duration_seconds{{job="{JOB}"}}[{int(window)}s])')]
            latest = [float(r["value"][1]) * 1000 for r in fleet.query(f'scrape_duration_seconds{{job="{JOB}"}}')]
            samples: dict[str, list[float]] = {}
            by_instance = {m.instance: m for m in fleet.members}
            for r in fleet.query(f'scrape_samples_scraped{{job="{JOB}"}}'):
                samples.setdefault(kind(by_instance[r["metric"]["instance"]].node), []).append(float(r["value"][1]))
            queries = {}
            for title, ref, expr, instant in panel_targets(FLEET_DASHBOARD):
                runs = [timed_query(fleet.prom_port, expr, instant, window) for _ in range(args.repeats)]
                walls = [w for w, _, _ in runs]
                execs = [e for _, e, _ in runs if e is not None]
                queries[f"{title} / {ref}"] = {
                    "instant": instant, "series": runs[-1][2], "p50_ms": percentile(walls, 0.5),
                    "p99_ms": percentile(walls, 0.99), "exec_p50_ms": percentile(execs, 0.5) if execs else None}
            return {
                "exporters": args.nodes, "gpus": sum(len(n.gpus) for n in (m.node for m in fleet.members)),
                "interval": args.interval, "window_s": window, "start_to_all_up_s": start_s,
                "scrapes_per_target_min": min(scrapes.values()), "per_exporter": per_exporter,
                "prometheus_cpu_percent": 100 * (prom1 - prom0) / window, "prometheus_rss_mib": rss_bytes(prom) / MIB,
                "scrape_duration_ms_p50": percentile(latest, 0.5), "scrape_duration_ms_max": max(durations),
                "samples_per_scrape": {k: statistics.median(v) for k, v in sorted(samples.items())},
                "head_series": (fleet.prom.api("/api/v1/status/tsdb") or {}).get("headStats", {}).get("numSeries"),
                "queries": queries,
            }
        finally:
            fleet.stop()


def report(f: dict[str, Any]) -> dict[str, Any]:
    rows: list[tuple[str, str]] = []
    exporters = f["per_exporter"]
    cpu = [e["cpu_percent"] for e in exporters]
    per_scrape = [e["cpu_ms_per_scrape"] for e in exporters]
    rss = [e["rss_mib"] for e in exporters]
    rows.append(("exporters / GPUs / scrape interval", f"{f['exporters']} / {f['gpus']} / {f['interval']}"))
    rows.append(("measured window", f"{f['window_s']:.0f} s, at least {f['scrapes_per_target_min']:.0f} scrapes a target"))
    rows.append(("start to every target up", f"{f['start_to_all_up_s']:.1f} s"))
    rows.append(("exporter CPU, % of one core, median (min, max)",
                 f"{statistics.median(cpu):.2f} % ({min(cpu):.2f}, {max(cpu):.2f}); fleet total {sum(cpu):.1f} %"))
    rows.append(("exporter CPU per scrape, median (min, max)",
                 f"{statistics.median(per_scrape):.2f} ms ({min(per_scrape):.2f}, {max(per_scrape):.2f})"))
    for k in sorted({e["kind"] for e in exporters}):
        of = [e for e in exporters if e["kind"] == k]
        rows.append((f"  {k}: CPU per scrape / RSS",
                     f"{statistics.median(e['cpu_ms_per_scrape'] for e in of):.2f} ms / "
                     f"{statistics.median(e['rss_mib'] for e in of):.1f} MiB ({len(of)} nodes)"))
    rows.append(("exporter RSS, median / max", f"{statistics.median(rss):.1f} / {max(rss):.1f} MiB"))
    rows.append(("Prometheus CPU, % of one core", f"{f['prometheus_cpu_percent']:.1f} %"))
    rows.append(("Prometheus RSS", f"{f['prometheus_rss_mib']:.1f} MiB"))
    if f["head_series"] is not None:
        rows.append(("Prometheus head series (the fleet's cardinality)", f"{f['head_series']:.0f}"))
    rows.append(("scrape_duration_seconds p50 (latest) / max over the window",
                 f"{f['scrape_duration_ms_p50']:.1f} / {f['scrape_duration_ms_max']:.1f} ms"))
    for k, v in f["samples_per_scrape"].items():
        rows.append((f"samples per scrape, {k}", f"{v:.0f}"))
    for name, q in f["queries"].items():
        exec_text = f", Prometheus exec p50 {q['exec_p50_ms']:.2f} ms" if q["exec_p50_ms"] is not None else ""
        rows.append((f"query {name} ({'instant' if q['instant'] else 'range'}, {q['series']} series)",
                     f"p50 {q['p50_ms']:.2f} / p99 {q['p99_ms']:.2f} ms{exec_text}"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"| {'measure'.ljust(w0)} | {'value'.ljust(w1)} |")
    print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|")
    for name, text in rows:
        print(f"| {name.ljust(w0)} | {text.ljust(w1)} |")
    return {
        "exporters": f["exporters"], "exporter_cpu_percent_median": statistics.median(cpu),
        "exporter_cpu_ms_per_scrape_median": statistics.median(per_scrape),
        "exporter_rss_mib_median": statistics.median(rss), "exporter_rss_mib_max": max(rss),
        "prometheus_rss_mib": f["prometheus_rss_mib"], "prometheus_cpu_percent": f["prometheus_cpu_percent"],
        "scrape_duration_ms_p50": f["scrape_duration_ms_p50"], "scrape_duration_ms_max": f["scrape_duration_ms_max"],
        "samples_per_scrape": f["samples_per_scrape"], "head_series": f["head_series"],
        "queries": {k: {"p50_ms": q["p50_ms"], "p99_ms": q["p99_ms"], "exec_p50_ms": q["exec_p50_ms"]}
                    for k, q in f["queries"].items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 exporters, 10 s, 3 query repetitions")
    parser.add_argument("--nodes", type=int, help="exporters (default 24)")
    parser.add_argument("--duration", type=float, help="measured window in seconds (default 120)")
    parser.add_argument("--repeats", type=int, help="repetitions of each dashboard query (default 20)")
    parser.add_argument("--interval", default="1s", help="scrape and evaluation interval (default 1s)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    defaults = (4, 10.0, 3) if args.quick else (24, 120.0, 20)
    args.nodes = args.nodes or defaults[0]
    args.duration = args.duration or defaults[1]
    args.repeats = args.repeats or defaults[2]
    figures = report(measure(args))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
