#!/usr/bin/env python3
"""Where a cold scrape goes, in process, on the fake NVML: each part timed on its own with
the CPU time of all threads (time.process_time) beside the wall time. Nothing is asserted.

    python benchmarks/cold_parts.py               # 8 and 64 GPUs, 100 repetitions each
    python benchmarks/cold_parts.py --gpus 8 --repeat 20

Parts: the GPU refresh on the GPU reader threads (what a scrape runs), the same GPUs read one
after another on this thread (what the hand-off to the readers costs when the driver
answers at once), the
host read, the families, the direct renderer and prometheus_client's generate_latest on the
same families (docs/performance.md, "Where a cold scrape goes").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from fakenvml import Scenario, build_fake, load_in_process  # noqa: E402  (the test rig's builder)
from run import machine  # noqa: E402  (the same fake machines as benchmarks/run.py)


def timed(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU ms, wall ms) per call, after one untimed call."""
    fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.process_time() - cpu) / repeat * 1000, (time.perf_counter() - wall) / repeat * 1000


def parts(root: Path, count: int, repeat: int) -> list[tuple[str, float, float]]:
    from prometheus_client.exposition import generate_latest

    from resmon_exporter.collectors.registry import ResourceCollector
    from resmon_exporter.host import HostReader
    from resmon_exporter.monitor import ResourceMonitor
    from resmon_exporter.http.render import Renderer
    from resmon_exporter.http.routes import DEFAULT_COLLECTORS, PinnedExposition

    scenario = Scenario(root / f"scenario-{count}.txt", machine(count))
    os.environ["FAKE_NVML_SCENARIO"] = str(scenario.path)
    log = logging.getLogger("cold_parts")
    rows = []
    monitor = ResourceMonitor(cache_ttl=0, collect_timeout=5, gpu_backend="nvml", collect_host=False, logger=log)
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
    finally:
        monitor.close(drain=5.0)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="resmon-cold-parts-"))
    load_in_process(build_fake(root / "lib"), root / "trace.txt")
    print(f"cold scrape parts (python {sys.version.split()[0]}; {os.cpu_count()} CPUs; {args.repeat} repetitions)")
    print("| GPUs | part | CPU ms | wall ms |")
    print("|---|---|---|---|")
    for count in args.gpus:
        for name, cpu, wall in parts(root, count, args.repeat):
            if name == "samples rendered":
                print(f"| {count} | {name} | {cpu:.0f} | |")
            else:
                print(f"| {count} | {name} | {cpu:.2f} | {wall:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
