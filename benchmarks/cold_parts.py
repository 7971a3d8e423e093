#!/usr/bin/env python3
"""Where a cold scrape goes, in process, on the fake NVML: each part timed on its own with
the CPU time of all threads (time.process_time) beside the wall time. Nothing is asserted.

    python benchmarks/cold_parts.py               # 8 and 64 GPUs, and 8 GPUs x 32 processes
    python benchmarks/cold_parts.py --gpus 8 --processes 8x4 --repeat 20

Parts: the GPU refresh on the GPU reader threads (what a scrape runs), the same GPUs read one
after another on this thread (what the hand-off to the readers costs when the driver
answers at once), the
host read, the families, the direct renderer and prometheus_client's generate_latest on the
same families (docs/performance.md, "Where a cold scrape goes"). With --processes GxP, G
GPUs with P real processes each (sleep processes this script starts) and the processes
collector on: the refresh then includes reading procfs and joining the owners.

Then the floor under a cold scrape of this design (docs/performance.md, "The floor under a
cold scrape"): the refresh's NVML calls made bare (one call through its ctypes pointer with
its arguments built once, times CALLS_PER_GPU per GPU), with processes their procfs stat
files read bare (os.open, os.read, os.close), the HTTP round trip alone (the CLI's /-/ready
on a kept-alive loopback connection, as benchmarks/run.py scrapes) and their sum with the
host read, the families and the direct renderer: what a cold scrape costs with no Python of
the exporter's own around any NVML call or file.

The fake is loaded without its call trace here: writing the trace is a system call per NVML
call, which the CLI benchmarks (benchmarks/run.py) do not pay either.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from fakenvml import Scenario, build_fake  # noqa: E402  (the test rig's builder)
from run import machine, scrape_path_latencies, start_exporter, stop  # noqa: E402  (as benchmarks/run.py runs them)

# NVML calls a steady refresh of the plain machine makes per GPU: benchmarks/run.py measures
# 15.1-15.5 on the fake's trace ("NVML calls per refresh per GPU, plain")
CALLS_PER_GPU = 15


def timed(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU ms, wall ms) per call, after one untimed call."""
    fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.process_time() - cpu) / repeat * 1000, (time.perf_counter() - wall) / repeat * 1000


def parts(root: Path, count: int, repeat: int, pids: list[int] | None = None) -> list[tuple[str, float, float]]:
    """The rows for count GPUs; pids: the processes they share out (the processes collector
    on), None for none."""
    from prometheus_client.exposition import generate_latest

    from resmon_exporter.collectors.registry import ResourceCollector
    from resmon_exporter.host import HostReader
    from resmon_exporter.monitor import ResourceMonitor
    from resmon_exporter.http.render import Renderer
    from resmon_exporter.http.routes import DEFAULT_COLLECTORS, PinnedExposition

    values = machine(count)
    for i in range(count if pids else 0):  # as benchmarks/run.py's process scenario
        mine = pids[i::count]  # type: ignore[index]
        values[f"gpu.{i}.processes"] = ",".join(f"{p}:{(j + 1) * 1048576}" for j, p in enumerate(mine))
        values[f"gpu.{i}.process_util"] = ",".join(f"{p}:{j % 100}:5:0:0" for j, p in enumerate(mine))
    scenario = Scenario(root / f"scenario-{count}-{len(pids or ())}.txt", values)
    os.environ["FAKE_NVML_SCENARIO"] = str(scenario.path)
    log = logging.getLogger("cold_parts")
    rows = []
    monitor = ResourceMonitor(cache_ttl=0, collect_timeout=5, gpu_backend="nvml", collect_host=False,
                              collect_processes=bool(pids), logger=log)
    monitor.start()
    deadline = time.monotonic() + 30
    while not monitor.ready:  # start-up answers without GPUs at once: time only real refreshes
        if time.monotonic() > deadline:
            raise SystemExit(f"cold_parts: no GPU read completed in 30 s ({count} GPUs)")
        time.sleep(0.01)
    try:
        rows.append(("GPU refresh on the reader threads", *timed(repeat, lambda: monitor.snapshot(None))))
        backend = monitor._backend  # noqa: SLF001 - the benchmark reads the same GPUs without the readers
        rows.append(("the same GPUs one after another, this thread",
                     *timed(repeat, lambda: [backend._read_one(i) for i in range(count)])))  # noqa: SLF001
        host = HostReader()
        rows.append(("host read", *timed(repeat, host.read)))
        snap = monitor.snapshot(None)
        collector = ResourceCollector(monitor)
        rows.append(("families", *timed(repeat, lambda: list(collector.families(snap)))))
        families = tuple(collector.families(snap))
        renderer = Renderer()
        rows.append(("direct renderer", *timed(repeat, lambda: renderer.text(PinnedExposition(DEFAULT_COLLECTORS, families).collect()))))
        rows.append(("prometheus_client generate_latest", *timed(repeat, lambda: generate_latest(PinnedExposition(DEFAULT_COLLECTORS, families)))))
        rows.append(("samples rendered", float(sum(len(f.samples) for f in families)), 0.0))
        bare = bare_call_ms(repeat * 100)
        rows.append(("NVML calls of one refresh, bare", bare * CALLS_PER_GPU * count, bare * CALLS_PER_GPU * count))
        if pids:  # the one file per process and scrape that procfs.py reads of a known process
            rows.append(("procfs stat files of the processes, bare", *timed(repeat, lambda: bare_stats(pids))))
    finally:
        monitor.close(drain=5.0)
    return rows


def bare_call_ms(n: int) -> float:
    """Wall ms of one NVML call with no Python around it: nvmlDeviceGetClockInfo through
    pynvml's ctypes pointer, its arguments built once (the fake answers at once)."""
    import ctypes

    import pynvml

    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetClockInfo")  # noqa: SLF001 - the bare call
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock, out = ctypes.c_uint(0), ctypes.c_uint()
    ref = ctypes.byref(out)
    for _ in range(100):
        fn(handle, clock, ref)
    start = time.perf_counter()
    for _ in range(n):
        fn(handle, clock, ref)
    return (time.perf_counter() - start) / n * 1000


def bare_stats(pids: list[int]) -> None:
    """/proc/PID/stat of each process read with no Python around it but the system calls."""
    for pid in pids:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            os.read(fd, 65536)
        finally:
            os.close(fd)


def http_round_trip_ms(root: Path, lib: Path, repeat: int) -> float:
    """p50 wall ms of GET /-/ready on the real CLI over a kept-alive loopback connection."""
    scenario = Scenario(root / "scenario-http.txt", machine(1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESMON_", "FAKE_NVML_"))}
    env.update(LD_LIBRARY_PATH=str(lib), FAKE_NVML_SCENARIO=str(scenario.path))
    proc, port, _ = start_exporter(env)
    try:
        scrape_path_latencies(port, "/-/ready", 20)
        latencies = sorted(scrape_path_latencies(port, "/-/ready", max(repeat, 20)))
    finally:
        stop(proc)
    return latencies[len(latencies) // 2]


FLOOR_PARTS = ("NVML calls of one refresh, bare", "procfs stat files of the processes, bare", "host read", "families",
               "direct renderer")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--processes", nargs="*", default=["8x32"], metavar="GxP",
                        help="G GPUs with P processes each (default 8x32; none: skip)")
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="resmon-cold-parts-"))
    lib = build_fake(root / "lib")
    os.environ.pop("FAKE_NVML_TRACE", None)  # untraced (see the module docstring)
    import ctypes

    # loaded first by full path: pynvml's dlopen("libnvidia-ml.so.1") then finds it (tests/fakenvml.py)
    ctypes.CDLL(str(lib / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    http = http_round_trip_ms(root, lib, args.repeat)
    print(f"cold scrape parts (python {sys.version.split()[0]}; {os.cpu_count()} CPUs; {args.repeat} repetitions)")
    print("| GPUs | part | CPU ms | wall ms |")
    print("|---|---|---|---|")
    cases: list[tuple[str, int, int]] = [(str(count), count, 0) for count in args.gpus]
    for case in args.processes:
        gpus, _, per_gpu = case.partition("x")
        if not (gpus.isdigit() and per_gpu.isdigit() and int(gpus) > 0 and int(per_gpu) > 0):
            parser.error(f"--processes {case}: expected GxP, e.g. 8x32")
        cases.append((case, int(gpus), int(per_gpu)))
    for label, count, per_gpu in cases:
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(count * per_gpu)]
        try:
            rows = parts(root, count, args.repeat, [p.pid for p in sleepers] if sleepers else None)
        finally:
            for p in sleepers:
                p.kill()
                p.wait()
        for name, cpu, wall in rows:
            if name == "samples rendered":
                print(f"| {label} | {name} | {cpu:.0f} | |")
            else:
                print(f"| {label} | {name} | {cpu:.2f} | {wall:.2f} |")
        print(f"| {label} | HTTP round trip alone (GET /-/ready, kept alive), p50 | | {http:.2f} |")
        floor = http + sum(wall for name, _, wall in rows if name in FLOOR_PARTS)
        print(f"| {label} | floor: HTTP + bare calls and files + host + families + direct renderer | | {floor:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
