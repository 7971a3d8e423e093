#!/usr/bin/env python3
"""resmon-exporter benchmarks on the fake NVML. Prints one table; every figure is the median
of repeated runs with min and max. Nothing here asserts a timing.

The headline is what the exporter costs the node: CPU per scrape interval (every thread of the
process, /proc/<pid>/stat) against nvitop-exporter with both on defaults, then CPU and NVML
calls per refresh per GPU on three machines. Then the cold scrape: what Prometheus gets when it scrapes every 15 s against the
1 s render/snapshot cache (a full NVML refresh, host read and render), measured at TTL 0 and
at the default TTL with scrapes spaced past it; warm (cache-hit) scrapes follow as a
secondary figure. nvitop-exporter runs side by side on the same fake when it is installed
(NVITOP_EXPORTER=/path/to/nvitop-exporter, or on PATH). The fake answers at once unless a
per-call delay is set: the "simulated NVML latency" rows assume DELAY_US per call and
PROCESS_DELAY_US per process-list call (see below), figures in the range NVML takes on a
datacenter driver with persistence mode on.

    python benchmarks/run.py            # full run (a few minutes)
    python benchmarks/run.py --quick    # smoke run for CI (seconds; figures are rough)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from fakenvml import Scenario, build_fake, gpu_keys  # noqa: E402  (the test rig's builder)

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
# simulated NVML latency (microseconds): every call, and the process lists on top
DELAY_US = 50
PROCESS_DELAY_US = 300
TARGETS = {
    "cpu_interval_5s_vs_nvitop": ("CPU per 5 s scrape interval, 8 GPUs, / nvitop-exporter's", 0.25, "x"),
    "calls_plain": ("NVML calls per refresh per plain GPU, 5 s refresh", 16.0, ""),
    "calls_health": ("NVML calls per refresh per H100-class GPU, 5 s refresh", 24.0, ""),
    "calls_mig_gpm": ("NVML calls per refresh per MIG + GPM GPU, 5 s refresh", 24.0, ""),
    "refresh_one_blocking_ratio": ("refresh, one 1 ms call per GPU, 8 GPUs / 1 GPU", 3.0, "x"),
    "scrape_cold_8_vs_nvitop": ("cold scrape p50, 8 GPUs, / nvitop-exporter p50", 0.5, "x"),
    "scrape_cold_64_p99": ("cold scrape, 64 GPUs, p99", 10.0, "ms"),
    "scrape_cold_processes_p99": ("cold scrape, 8 GPUs x 32 processes, p99", 10.0, "ms"),
    "refresh_delayed_ratio": ("refresh with simulated latency, 8 GPUs / 1 GPU", 2.0, "x"),
    "scrape_warm_8_p99": ("warm scrape, 8 GPUs, p99", 5.0, "ms"),
    "scrape_warm_64_p99": ("warm scrape, 64 GPUs, p99", 25.0, "ms"),
    "refresh_cold_8": ("cold refresh, 8 GPUs, CPU", 3.0, "ms"),
    "api_warm": ("warm get_current_resources()", 0.1, "ms"),
    "rss_start": ("RSS after start (NVML path)", 40.0, "MiB"),
    "idle_wakeups": ("wakeups over the idle window without the XID watcher", 0.0, ""),
}


def machine(count: int) -> dict[str, Any]:
    """count plain GPUs (PCIe cards: no ECC, no NVLink), with the driver's utilization sample
    buffers (one sample per 1/6 s, as current drivers keep them) and a process each."""
    values: dict[str, Any] = {"count": count}
    for i in range(count):
        values.update(gpu_keys(i, util_gpu=(i * 7) % 100, temperature=40 + i % 40, power_mw=100000 + i,
                               processes=f"{os.getpid()}:1048576"))
        values.update({f"gpu.{i}.samples.period_ms": 167, f"gpu.{i}.samples.capacity": 100})
    return values


def mig_gpm_machine(count: int) -> dict[str, Any]:
    """count H100-class boards in MIG mode (two GPU instances, three MIG devices) with GPM per instance."""
    from scenarios import MIG_GPM, MIG_UUIDS, NOT_SUPPORTED, gpm_keys, hopper_board, mig_slots

    values: dict[str, Any] = {"count": count}
    for i in range(count):
        uuids = {slot: f"{uuid[:-2]}{i:02d}" for slot, uuid in MIG_UUIDS.items()}
        values.update(hopper_board(i))
        values.update({f"gpu.{i}.gpm": 1, f"gpu.{i}.rc.nvmlGpmSampleGet": NOT_SUPPORTED,
                       f"gpu.{i}.mig_devices": mig_slots(uuids=uuids)})
        values.update({k: v for gi, gpm in MIG_GPM.items() for k, v in gpm_keys(f"gpu.{i}.gi.{gi}.", gpm).items()})
    return values


def delayed(values: dict[str, Any]) -> dict[str, Any]:
    """The machine with simulated NVML latency on every call (the fake sleeps outside its lock)."""
    out = {**values, "delay_us.all": DELAY_US}
    for symbol in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"):
        out[f"delay_us.{symbol}"] = PROCESS_DELAY_US
    out["delay_us.nvmlEventSetWait_v2"] = 0  # the XID watcher's wait blocks on its own
    return out


def mig_machine(count: int) -> dict[str, Any]:
    """count A100-class GPUs in MIG mode with 7 instances each."""
    values = machine(count)
    for i in range(count):
        values[f"gpu.{i}.mig_devices"] = ",".join(
            f"{gi}:{gi}:1g.5gb:MIG-{i:02d}{gi:02d}0000-0000-0000-0000-000000000000:5000000000:{gi * 100000000}"
            for gi in range(1, 8))
    return values


def summary(samples: list[float]) -> tuple[float, float, float]:
    return statistics.median(samples), min(samples), max(samples)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Env:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.lib = build_fake(root / "lib")
        self.trace = root / "trace.txt"

    def scenario(self, count: int) -> Scenario:
        return Scenario(self.root / f"scenario-{count}.txt", machine(count))

    def named(self, name: str, values: dict[str, Any]) -> Scenario:
        return Scenario(self.root / f"{name}.txt", values)

    def health_scenario(self, count: int) -> Scenario:
        """count H100-class boards answering every v2 family (ECC, remapping, 18 NVLinks, fields, samples)."""
        from scenarios import hopper_board

        values: dict[str, Any] = {"count": count}
        for i in range(count):
            values.update(hopper_board(i))
        return Scenario(self.root / f"health-{count}.txt", values)

    def process_scenario(self, count: int, pids: list[int]) -> Scenario:
        """count plain GPUs sharing out the given real PIDs, each with a utilization sample."""
        values: dict[str, Any] = machine(count)
        for i in range(count):
            mine = pids[i::count]
            values[f"gpu.{i}.processes"] = ",".join(f"{p}:{(j + 1) * 1048576}" for j, p in enumerate(mine))
            values[f"gpu.{i}.process_util"] = ",".join(f"{p}:{j % 100}:5:0:0" for j, p in enumerate(mine))
        return Scenario(self.root / f"processes-{count}.txt", values)

    def env(self, scenario: Scenario, trace: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RESMON_", "FAKE_NVML_"))}
        env.update(LD_LIBRARY_PATH=str(self.lib), FAKE_NVML_SCENARIO=str(scenario.path), PYTHONUNBUFFERED="1")
        if trace:
            env["FAKE_NVML_TRACE"] = str(self.trace)
        return env


def start_exporter(env: dict[str, str], *flags: str) -> tuple[subprocess.Popen, int, float]:
    """Start the CLI; return the process, its port and seconds from start to /-/ready."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "resmon_exporter", "--web.listen-address=127.0.0.1:0", *flags],
                            env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    port = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if "msg=listening" in line:
            port = int(line.split("address=")[1].split()[0].rsplit(":", 1)[1])
            break
    assert port, "exporter did not start"
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/-/ready")
        if conn.getresponse().status == 200:
            conn.close()
            return proc, port, time.perf_counter() - t0
        conn.close()
        time.sleep(0.002)


def start_nvitop(env: dict[str, str]) -> tuple[subprocess.Popen, int] | None:
    """nvitop-exporter on the same fake, or None where it is not installed."""
    import shutil
    import socket

    binary = os.environ.get("NVITOP_EXPORTER") or shutil.which("nvitop-exporter")
    if not binary:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--bind-address=127.0.0.1", f"--port={port}", "--interval=1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            if resp.status == 200 and b"nvitop" in body:
                time.sleep(1.5)  # its first collection done
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    stop(proc)
    return None


def spaced_latencies(port: int, n: int, spacing: float) -> list[float]:
    """n scrapes spaced past the cache TTL: each one cold, as Prometheus' 15 s interval makes them."""
    out = []
    for _ in range(n):
        time.sleep(spacing)
        out.extend(scrape_latencies(port, 1, None, False))
    return out


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(20)


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def fake_nvml_kb(pid: int) -> int:
    """Resident memory of the fake libnvidia-ml.so.1 itself: its file mappings and the
    anonymous mapping right after them (its .bss, the static tables for 256 GPUs that
    every reload resets). A real driver's library has its own, different cost, so the
    exporter's figure leaves this out (and the table shows it)."""
    total, previous_fake, counting = 0, False, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
            name = head[5] if len(head) > 5 else ""
            fake = name.endswith("/libnvidia-ml.so.1")
            counting = fake or (previous_fake and not name)
            previous_fake = fake
        elif line.startswith("Rss:") and counting:
            total += int(line.split()[1])
    return total


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def scrape_latencies(port: int, n: int, accept: str | None, gz: bool) -> list[float]:
    headers = {}
    if accept:
        headers["Accept"] = accept
    if gz:
        headers["Accept-Encoding"] = "gzip"
    return scrape_path_latencies(port, "/metrics", n, headers)


def scrape_path_latencies(port: int, path: str, n: int, headers: dict[str, str] | None = None) -> list[float]:
    """Wall ms of n GETs of path on one kept-alive connection (cold_parts.py: /-/ready, the
    HTTP round trip without a refresh or a render)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        out.append((time.perf_counter() - t0) * 1000)
        assert resp.status == 200 and body
    conn.close()
    return out


# -- in-process measurements (run in a child with LD_LIBRARY_PATH set) ------------------------


def inner(kind: str, count: int, repeats: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    from resmon_exporter import ResourceCollector, ResourceMonitor
    from resmon_exporter.collectors.registry import snapshot_families
    from resmon_exporter.http.render import Renderer

    if kind in ("refresh", "refresh-processes", "refresh-every"):
        # the XID watcher is not part of a refresh (its waits would count as refresh calls);
        # refresh-every: the slow values too on every refresh (--collect.slow-interval=0)
        monitor = ResourceMonitor(cache_ttl=0, collect_xid=False, collect_processes=kind == "refresh-processes",
                                  slow_interval=0.0 if kind == "refresh-every" else 30.0)
        monitor.snapshot()  # init, static facts
        trace = Path(os.environ["FAKE_NVML_TRACE"])
        before = len(trace.read_text().splitlines())
        cpu, wall = [], []
        for _ in range(repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            monitor.snapshot()
            cpu.append((time.process_time() - c0) * 1000)
            wall.append((time.perf_counter() - w0) * 1000)
        calls = (len(trace.read_text().splitlines()) - before) / repeats
        registry = CollectorRegistry()
        registry.register(ResourceCollector(monitor))
        snap = monitor.snapshot()
        build, render = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            families = list(snapshot_families(snap))
            build.append((time.perf_counter() - t0) * 1000)
        warm = ResourceMonitor(cache_ttl=3600, collect_xid=False, collect_processes=kind == "refresh-processes")
        warm_registry = CollectorRegistry()
        warm_registry.register(ResourceCollector(warm))
        renderer = Renderer()  # what /metrics renders with (prometheus_client's encoder: "render_client")
        renderer.text(warm_registry.collect())
        client = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            renderer.text(warm_registry.collect())
            render.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            generate_latest(warm_registry)
            client.append((time.perf_counter() - t0) * 1000)
        return {"cpu": cpu, "wall": wall, "calls": calls, "build": build, "render_total": render, "render_client": client,
                "series": sum(len(f.samples) for f in families)}
    if kind == "api":
        warm = ResourceMonitor(cache_ttl=3600)
        warm.get_current_resources()
        t0 = time.perf_counter()
        for _ in range(repeats * 100):
            warm.get_current_resources()
        warm_ms = (time.perf_counter() - t0) * 1000 / (repeats * 100)
        cold = ResourceMonitor(cache_ttl=0)
        cold.get_current_resources()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            cold.get_current_resources()
            times.append((time.perf_counter() - t0) * 1000)
        return {"warm": warm_ms, "cold": statistics.median(times)}
    if kind == "seed":
        # The earlier Mai monitor: NVML init/shutdown on every call and a blocking 50 ms CPU read.
        import psutil
        import pynvml

        def seed_call() -> dict[str, float]:
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            pynvml.nvmlShutdown()
            vm = psutil.virtual_memory()
            return {"cpu": psutil.cpu_percent(interval=0.05), "mem": vm.percent, "vram": mem.free, "u": util.gpu, "t": temp}

        wall, cpu = [], []
        for _ in range(repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            seed_call()
            cpu.append((time.process_time() - c0) * 1000)
            wall.append((time.perf_counter() - w0) * 1000)
        return {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}
    raise ValueError(kind)


def run_inner(env: Env, kind: str, count: int, repeats: int, scenario: Scenario | None = None) -> dict[str, Any]:
    scenario = scenario or env.scenario(count)
    out = subprocess.run([sys.executable, __file__, "--inner", kind, str(count), str(repeats)],
                         env=env.env(scenario, trace=True), cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# -- the table -------------------------------------------------------------------------------


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.values: dict[str, float] = {}

    def add(self, name: str, stats: tuple[float, float, float] | float, unit: str, key: str | None = None) -> None:
        if isinstance(stats, tuple):
            med, lo, hi = stats
            text = f"{med:.3f} {unit} (min {lo:.3f}, max {hi:.3f})"
        else:
            med = stats
            text = f"{med:.3f} {unit}".rstrip()
        target = ""
        if key:
            self.values[key] = med
            label, limit, _ = TARGETS[key]
            target = f"<= {limit:g} {unit}".rstrip() + ("  ok" if med <= limit else "  MISSED")
        self.rows.append((name, text, target))

    def print(self) -> None:
        w0 = max(len(r[0]) for r in self.rows)
        w1 = max(len(r[1]) for r in self.rows)
        print(f"| {'measure'.ljust(w0)} | {'median (min, max)'.ljust(w1)} | target |")
        print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|--------|")
        for name, text, target in self.rows:
            print(f"| {name.ljust(w0)} | {text.ljust(w1)} | {target} |")


def import_costs() -> dict[str, float]:
    """RSS of a fresh python, then after each import in turn (what the imports cost)."""
    code = ("import importlib, json\n"
            "def rss():\n"
            "    for line in open('/proc/self/status'):\n"
            "        if line.startswith('VmRSS:'): return int(line.split()[1]) / 1024\n"
            "out = {'python': rss()}\n"
            "for m, k in (('prometheus_client', 'prometheus_client'), ('pynvml', 'pynvml'), ('resmon_exporter.cli', 'exporter')):\n"
            "    importlib.import_module(m); out[k] = rss()\n"
            "print(json.dumps(out))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def cold_p(env: Env, scenario: Scenario, runs: int, n: int, *flags: str, accept: str | None = None) -> tuple[list[float], list[float]]:
    p50s, p99s = [], []
    for _ in range(runs):
        proc, port, _ = start_exporter(env.env(scenario), "--collect.cache-ttl=0", *flags)
        try:
            scrape_latencies(port, 10, accept, False)
            lat = scrape_latencies(port, n, accept, False)
        finally:
            stop(proc)
        p50s.append(percentile(lat, 0.5))
        p99s.append(percentile(lat, 0.99))
    return p50s, p99s


def interval_cpu(proc: subprocess.Popen, scrape: Any, interval: float, n: int) -> float:
    """CPU (ms, every thread of the process) per scrape interval: n intervals, one scrape at
    the start of each, as Prometheus scrapes."""
    time.sleep(1.0)
    c0 = cpu_seconds(proc.pid)
    start = time.monotonic()
    for k in range(n):
        scrape()
        time.sleep(max(0.0, start + (k + 1) * interval - time.monotonic()))
    return (cpu_seconds(proc.pid) - c0) * 1000 / n


def interval_lines(env: Env, table: Table, quick: bool) -> None:
    """The headline: what the exporter costs the node per scrape interval, against
    nvitop-exporter (which polls on its own every second), both with defaults."""
    # the fake's event wait re-reads its scenario every 10 ms by default; a real driver
    # blocks for the whole wait, which a 5 s slice (the watcher's wait) reproduces (the XID watcher is on)
    eight = {**env.env(env.scenario(8)), "FAKE_NVML_EVENT_POLL_MS": "5000"}
    for interval in ((5.0,) if quick else (5.0, 15.0)):
        n = 2 if quick else max(4, int(60 / interval))
        proc, port, _ = start_exporter(eight)
        try:
            scrape_latencies(port, 1, None, False)
            mine = interval_cpu(proc, lambda: scrape_latencies(port, 1, None, False), interval, n)
        finally:
            stop(proc)
        table.add(f"CPU per {interval:g} s scrape interval, 8 GPUs, defaults (all threads)", mine, "ms")
        started = start_nvitop(eight)
        if started is None:
            table.add("nvitop-exporter: not installed (NVITOP_EXPORTER or PATH), no CPU ratio", 0.0, "")
            continue
        nv_proc, nv_port = started
        try:
            theirs = interval_cpu(nv_proc, lambda: scrape_latencies(nv_port, 1, None, False), interval, n)
        finally:
            stop(nv_proc)
        table.add(f"nvitop-exporter CPU per {interval:g} s scrape interval, same fake (polls every 1 s)", theirs, "ms")
        table.add(f"CPU per {interval:g} s scrape interval, resmon / nvitop-exporter", mine / theirs if theirs else 0.0, "x",
                  "cpu_interval_5s_vs_nvitop" if interval == 5.0 else None)


def calls_lines(env: Env, table: Table, quick: bool, runs: int) -> None:
    """CPU per refresh and NVML calls per refresh per GPU on the plain, H100-class and MIG +
    GPM machines: back to back (the slow part read once per GPU), with the slow part on every
    refresh, and what a refresh every 5 s costs (the slow part every 30 s: one refresh in six)."""
    repeats = 20 if quick else 200
    machines = (("plain", env.scenario(8), "calls_plain"), ("H100-class", env.health_scenario(8), "calls_health"),
                ("MIG + GPM", env.named("mig-gpm-8", mig_gpm_machine(8)), "calls_mig_gpm"))
    for name, scenario, key in machines:
        steady = [run_inner(env, "refresh", 8, repeats, scenario) for _ in range(runs)]
        every = run_inner(env, "refresh-every", 8, repeats, scenario)
        table.add(f"CPU per refresh, 8 {name} GPUs (all threads)", summary([statistics.median(r["cpu"]) for r in steady]), "ms")
        table.add(f"CPU per refresh, 8 {name} GPUs, slow part included", statistics.median(every["cpu"]), "ms")
        fast, slow = steady[0]["calls"] / 8, every["calls"] / 8
        table.add(f"NVML calls per refresh per GPU, {name}, fast refresh", fast, "")
        table.add(f"NVML calls per refresh per GPU, {name}, refresh with the slow part", slow, "")
        table.add(f"NVML calls per refresh per GPU, {name}, refresh every 5 s (slow part every 30 s)",
                  fast + (slow - fast) * 5 / 30, "", key)


def cold_lines(env: Env, table: Table, quick: bool, runs: int, scrapes: int) -> None:
    """The headline: cold scrapes (every scrape a full refresh and render)."""
    n = scrapes // 2
    eight = env.scenario(8)
    p50s, p99s = cold_p(env, eight, runs, n)
    table.add("COLD scrape 8 GPUs, TTL 0, p50", summary(p50s), "ms")
    table.add("COLD scrape 8 GPUs, TTL 0, p99", summary(p99s), "ms")
    resmon_p50 = statistics.median(p50s)
    # the default 1 s TTL, scrapes spaced past it (Prometheus' 15 s interval, compressed)
    spaced = []
    for _ in range(runs):
        proc, port, _ = start_exporter(env.env(eight))
        try:
            spaced.append(percentile(spaced_latencies(port, 3 if quick else 15, 1.05), 0.5))
        finally:
            stop(proc)
    table.add("COLD scrape 8 GPUs, default TTL, spaced 1.05 s, p50", summary(spaced), "ms")
    nv_p50s = []
    for _ in range(runs):
        started = start_nvitop(env.env(eight))
        if started is None:
            break
        proc, port = started
        try:
            scrape_latencies(port, 10, None, False)
            nv_p50s.append(percentile(scrape_latencies(port, n, None, False), 0.5))
        finally:
            stop(proc)
    if nv_p50s:
        table.add("nvitop-exporter scrape 8 GPUs, same fake, p50", summary(nv_p50s), "ms")
        table.add("COLD resmon p50 / nvitop-exporter p50, 8 GPUs", resmon_p50 / statistics.median(nv_p50s), "x",
                  "scrape_cold_8_vs_nvitop")
    else:
        table.add("nvitop-exporter: not installed (NVITOP_EXPORTER or PATH), no ratio", 0.0, "")
    p50s, p99s = cold_p(env, env.scenario(64), runs, n)
    table.add("COLD scrape 64 GPUs, TTL 0, p50", summary(p50s), "ms")
    table.add("COLD scrape 64 GPUs, TTL 0, p99", summary(p99s), "ms", "scrape_cold_64_p99")
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(8 * 32)]
    try:
        busy = env.process_scenario(8, [p.pid for p in sleepers])
        p50s, p99s = cold_p(env, busy, runs, n, "--collector.processes")
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    table.add("COLD scrape 8 GPUs x 32 processes, --collector.processes, p50", summary(p50s), "ms")
    table.add("COLD scrape 8 GPUs x 32 processes, --collector.processes, p99", summary(p99s), "ms", "scrape_cold_processes_p99")
    p50s, p99s = cold_p(env, env.named("mig-8", mig_machine(8)), runs, n)
    table.add("COLD scrape 8 GPUs x 7 MIG instances, p50", summary(p50s), "ms")
    table.add("COLD scrape 8 GPUs x 7 MIG instances, p99", summary(p99s), "ms")
    p50s, p99s = cold_p(env, env.health_scenario(8), runs, n)
    table.add("COLD scrape 8 H100-class GPUs, every v2 collector answering, p50", summary(p50s), "ms")
    table.add("COLD scrape 8 H100-class GPUs, every v2 collector answering, p99", summary(p99s), "ms")
    # simulated NVML latency: the refresh of 8 GPUs against 1 (GPUs read in parallel)
    walls = {}
    for count in (1, 8):
        results = [run_inner(env, "refresh", count, 10 if quick else 50, env.named(f"delayed-{count}", delayed(machine(count))))
                   for _ in range(runs)]
        walls[count] = statistics.median([statistics.median(r["wall"]) for r in results])
        table.add(f"refresh {count} GPU(s), {DELAY_US} us/call + {PROCESS_DELAY_US} us/process list, wall",
                  summary([statistics.median(r["wall"]) for r in results]), "ms")
    table.add("refresh with simulated latency, 8 GPUs / 1 GPU", walls[8] / walls[1] if walls[1] else 0.0, "x",
              "refresh_delayed_ratio")
    # a driver where one call per GPU waits 1 ms (the relay must judge it blocking)
    for count in (1, 8):
        one = {**machine(count), "delay_us.nvmlDeviceGetMemoryInfo_v2": 1000}
        results = [run_inner(env, "refresh", count, 10 if quick else 50, env.named(f"one-blocking-{count}", one)) for _ in range(runs)]
        walls[count] = statistics.median([statistics.median(r["wall"]) for r in results])
        table.add(f"refresh {count} GPU(s), one 1 ms call per GPU, wall", summary([statistics.median(r["wall"]) for r in results]), "ms")
    table.add("refresh, one 1 ms call per GPU, 8 GPUs / 1 GPU", walls[8] / walls[1] if walls[1] else 0.0, "x",
              "refresh_one_blocking_ratio")
    p50s, p99s = cold_p(env, env.named("delayed-scrape-8", delayed(machine(8))), runs, n)
    table.add(f"COLD scrape 8 GPUs, simulated latency ({DELAY_US} us/call), p50", summary(p50s), "ms")
    imports = import_costs()
    table.add("RSS of a bare python", imports["python"], "MiB")
    table.add("  + prometheus_client", imports["prometheus_client"] - imports["python"], "MiB")
    table.add("  + pynvml", imports["pynvml"] - imports["prometheus_client"], "MiB")
    table.add("  + the exporter (cli and what it imports)", imports["exporter"] - imports["pynvml"], "MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--inner", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(inner(args.inner[0], int(args.inner[1]), int(args.inner[2]))))
        return 0

    quick = args.quick
    runs = 1 if quick else 3
    scrapes = 50 if quick else 500
    table = Table()
    with tempfile.TemporaryDirectory(prefix="resmon-bench-") as tmp:
        env = Env(Path(tmp))
        interval_lines(env, table, quick)
        calls_lines(env, table, quick, runs)
        cold_lines(env, table, quick, runs, scrapes)
        # warm scrapes (secondary): the snapshot is cached (TTL 1 h), so this is HTTP + exposition
        for count in (1, 8, 64):
            scenario = env.scenario(count)
            for label, accept, gz in (("text", None, False), ("text+gzip", None, True),
                                      ("OpenMetrics", OPENMETRICS, False), ("OpenMetrics+gzip", OPENMETRICS, True)):
                p50s, p99s = [], []
                for _ in range(runs):
                    proc, port, _ = start_exporter(env.env(scenario), "--collect.cache-ttl=1h")
                    try:
                        scrape_latencies(port, 20, accept, gz)  # warm-up
                        lat = scrape_latencies(port, scrapes, accept, gz)
                    finally:
                        stop(proc)
                    p50s.append(percentile(lat, 0.5))
                    p99s.append(percentile(lat, 0.99))
                key = {8: "scrape_warm_8_p99", 64: "scrape_warm_64_p99"}.get(count) if label == "text" else None
                table.add(f"warm scrape {count} GPU(s) {label} p50", summary(p50s), "ms")
                table.add(f"warm scrape {count} GPU(s) {label} p99", summary(p99s), "ms", key)
        # cold scrapes: TTL 0, so every scrape refreshes NVML and renders (Prometheus scraping
        # every 15 s against the default 1 s TTL sees this, not the warm figure)
        for count in (1, 8, 64):
            scenario = env.scenario(count)
            for label, accept in (("text", None), ("OpenMetrics", OPENMETRICS)):
                p50s, p99s = [], []
                for _ in range(runs):
                    proc, port, _ = start_exporter(env.env(scenario), "--collect.cache-ttl=0")
                    try:
                        scrape_latencies(port, 10, accept, False)
                        lat = scrape_latencies(port, scrapes // 2, accept, False)
                    finally:
                        stop(proc)
                    p50s.append(percentile(lat, 0.5))
                    p99s.append(percentile(lat, 0.99))
                table.add(f"cold scrape {count} GPU(s) {label} p50", summary(p50s), "ms")
                table.add(f"cold scrape {count} GPU(s) {label} p99", summary(p99s), "ms")
        # cold refresh cost, NVML calls per refresh, exposition vs collection
        for count in (1, 8, 64):
            results = [run_inner(env, "refresh", count, 20 if quick else 200) for _ in range(runs)]
            table.add(f"cold refresh {count} GPU(s), CPU", summary([statistics.median(r["cpu"]) for r in results]), "ms",
                      "refresh_cold_8" if count == 8 else None)
            table.add(f"cold refresh {count} GPU(s), wall", summary([statistics.median(r["wall"]) for r in results]), "ms")
            table.add(f"NVML calls per refresh, {count} GPU(s)", results[0]["calls"], "")
            build = statistics.median([statistics.median(r["build"]) for r in results])
            total = statistics.median([statistics.median(r["render_total"]) for r in results])
            refresh = statistics.median([statistics.median(r["wall"]) for r in results])
            table.add(f"{count} GPU(s): families from a snapshot", build, "ms")
            client = statistics.median([statistics.median(r["render_client"]) for r in results])
            table.add(f"{count} GPU(s): exposition share of a cold scrape",
                      100 * total / (total + refresh), "%")
            table.add(f"{count} GPU(s): render time, direct renderer / prometheus_client", total / client if client else 0.0, "x")
        # the same 8 GPUs as datacenter boards answering every health family, side by side
        plain = [run_inner(env, "refresh", 8, 20 if quick else 200) for _ in range(runs)]
        health = [run_inner(env, "refresh", 8, 20 if quick else 200, env.health_scenario(8)) for _ in range(runs)]
        plain_cpu = statistics.median([statistics.median(r["cpu"]) for r in plain])
        health_cpu = statistics.median([statistics.median(r["cpu"]) for r in health])
        table.add("cold refresh 8 H100-class GPUs, every v2 family, CPU", summary([statistics.median(r["cpu"]) for r in health]), "ms")
        table.add("NVML calls per refresh, 8 H100-class GPUs", health[0]["calls"], "")
        table.add("series per scrape, 8 H100-class GPUs", float(health[0]["series"]), "")
        table.add("series per scrape, 8 plain GPUs", float(plain[0]["series"]), "")
        table.add("refresh CPU ratio, H100-class / plain", health_cpu / plain_cpu if plain_cpu else 0.0, "x")
        # the processes collector: 200 real processes over 8 GPUs, the same machine with it off and on
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(200)]
        try:
            busy = env.process_scenario(8, [p.pid for p in sleepers])
            off = [run_inner(env, "refresh", 8, 20 if quick else 200, busy) for _ in range(runs)]
            on = [run_inner(env, "refresh-processes", 8, 20 if quick else 200, busy) for _ in range(runs)]
        finally:
            for p in sleepers:
                p.kill()
                p.wait()
        off_cpu = statistics.median([statistics.median(r["cpu"]) for r in off])
        on_cpu = statistics.median([statistics.median(r["cpu"]) for r in on])
        table.add("cold refresh 8 GPUs, 200 processes, --collector.processes, CPU", summary([statistics.median(r["cpu"]) for r in on]), "ms")
        table.add("NVML calls per refresh, 200 processes, --collector.processes", on[0]["calls"], "")
        table.add("series per scrape, 200 processes, --collector.processes", float(on[0]["series"]), "")
        table.add("refresh CPU ratio, processes collector on / off (same 200 processes)", on_cpu / off_cpu if off_cpu else 0.0, "x")
        # Python API
        api = [run_inner(env, "api", 1, 20 if quick else 200) for _ in range(runs)]
        table.add("get_current_resources() warm", summary([r["warm"] for r in api]), "ms", "api_warm")
        table.add("get_current_resources() cold", summary([r["cold"] for r in api]), "ms")
        seed = [run_inner(env, "seed", 1, 5 if quick else 40) for _ in range(runs)]
        table.add("seed Mai approach per call, wall", summary([r["wall"] for r in seed]), "ms")
        table.add("seed Mai approach per call, CPU", summary([r["cpu"] for r in seed]), "ms")
        # start-up, memory, idle
        scenario = env.scenario(8)
        ready, rss_start, rss_fake, rss_after, idle_cpu, idle_switches = [], [], [], [], [], []
        many = 1000 if quick else 10000
        idle = 5.0 if quick else 60.0
        # the fake's event wait re-reads its scenario every 10 ms by default; a real driver
        # blocks for the whole wait, which a 5 s slice (the watcher's wait) reproduces
        blocking = {**env.env(scenario), "FAKE_NVML_EVENT_POLL_MS": "5000"}
        for i in range(runs):
            proc, port, seconds = start_exporter(blocking)
            try:
                ready.append(seconds * 1000)
                time.sleep(0.5)
                rss_start.append(status_kb(proc.pid, "VmRSS") / 1024)
                rss_fake.append(fake_nvml_kb(proc.pid) / 1024)
                if i == 0:
                    scrape_latencies(port, many, None, False)
                    rss_after.append(status_kb(proc.pid, "VmRSS") / 1024)
                time.sleep(1.0)
                c0, s0 = cpu_seconds(proc.pid), switches(proc.pid)
                time.sleep(idle)
                idle_cpu.append((cpu_seconds(proc.pid) - c0) * 1000)
                idle_switches.append(switches(proc.pid) - s0)
            finally:
                stop(proc)
        # a Kubernetes node: the kubelet socket exists, so the collector loads grpc and protobuf
        from fake_kubelet import Container, Device, FakeKubelet, Pod, short_socket_dir

        kubelet = FakeKubelet(os.path.join(short_socket_dir(), "kubelet.sock"))
        kubelet.pods = [Pod("ns", f"pod-{i}", [Container("c", [Device("nvidia.com/gpu", [f"{i}"])])]) for i in range(8)]
        kubelet.start()
        rss_kube = []
        try:
            for _ in range(runs):
                proc, port, _ = start_exporter(blocking, f"--kubernetes.pod-resources-socket={kubelet.socket_path}")
                try:
                    scrape_latencies(port, 20, None, False)
                    rss_kube.append(status_kb(proc.pid, "VmRSS") / 1024)
                finally:
                    stop(proc)
        finally:
            kubelet.stop()
        table.add("start to /-/ready, 8 GPUs", summary(ready), "ms")
        table.add("RSS after start, 8 GPUs, the exporter's own (less the fake NVML's)",
                  summary([a - b for a, b in zip(rss_start, rss_fake)]), "MiB", "rss_start")
        table.add("RSS after start, 8 GPUs, the whole process", summary(rss_start), "MiB")
        table.add("  of which the fake libnvidia-ml.so.1 (its static 256-GPU tables)", summary(rss_fake), "MiB")
        table.add("RSS with the kubelet socket present (grpc, protobuf loaded)", summary(rss_kube), "MiB")
        table.add(f"RSS after {many} scrapes", summary(rss_after), "MiB")
        table.add(f"CPU over {idle:g} s idle", summary(idle_cpu), "ms")
        table.add(f"wakeups (context switches) over {idle:g} s idle, XID watcher on", summary([float(s) for s in idle_switches]), "")
        table.add("  of which per second (the watcher's 0.5 s waits: about 2)", summary([s / idle for s in idle_switches]), "")
        # the XID watcher is the one periodic waker: the same idle window without it is silent
        quiet = []
        for _ in range(runs):
            proc, port, _ = start_exporter(blocking, "--no-collector.xid")
            try:
                time.sleep(1.0)
                s0 = switches(proc.pid)
                time.sleep(idle)
                quiet.append(float(switches(proc.pid) - s0))
            finally:
                stop(proc)
        table.add(f"wakeups (context switches) over {idle:g} s idle, --no-collector.xid", summary(quiet), "", "idle_wakeups")
    print(f"resmon-exporter benchmarks ({'quick' if quick else 'full'}; {runs} run(s) each; python {sys.version.split()[0]}; "
          f"{os.cpu_count()} CPUs)")
    table.print()
    if args.json:
        Path(args.json).write_text(json.dumps(table.values, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
