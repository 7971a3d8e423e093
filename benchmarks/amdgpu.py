#!/usr/bin/env python3
"""Refresh cost of the amdgpu backend (sysfs) against the gpu-tracker backend (amd-smi), on
the same fake AMD hardware: N MI300X-like cards in a fake sysfs tree (tests/fake_sysfs.py)
and the same N GPUs behind the fake amd-smi (tests/fake_smi). Each backend's read() is timed
in this process, wall and CPU (this process only: the CLI's own CPU is not counted, which
flatters gpu-tracker). Prints one table; nothing here asserts a timing.

    python benchmarks/amdgpu.py [--gpus 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fake_sysfs import FakeSysfs, mi300x  # noqa: E402  (the test rig's builder)

from resmon_exporter.backends import GpuOptions  # noqa: E402
from resmon_exporter.backends.amdgpu.sysfs import AmdgpuBackend  # noqa: E402

FAKE_SMI = REPO / "tests" / "fake_smi" / "fake_smi.py"


def timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    fn()  # warm: identities, imports, caches
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="few repeats (a smoke run)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="resmon-amd-bench-"))
    tree = FakeSysfs(root / "sys")
    for i in range(args.gpus):
        tree.add(mi300x(pci=f"0000:{0x11 + i * 0x10:02x}:00.0", card=8 * i, gpu_id=1000 + i))
    for i in range(args.gpus):
        tree.process(40000 + i, {1000 + i: (i + 1) << 30})
    # the same GPUs behind the fake amd-smi
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "amd-smi").symlink_to(FAKE_SMI)
    scenario = root / "smi.json"
    scenario.write_text(json.dumps({"amd": {"gpus": [
        {"uuid": f"3e52f2a4-0000-1000-80f6-{i:012x}", "total_mib": 196592, "used_mib": 153600, "util": 100}
        for i in range(args.gpus)]}}))
    os.environ.update(PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", FAKE_SMI_SCENARIO=str(scenario))

    log = logging.getLogger("bench")
    amd = AmdgpuBackend(log, str(tree.root), GpuOptions(processes=True))
    reading = amd.read()
    assert reading.device_count == args.gpus and all(d.up for d in reading.devices), reading
    rows = [("amdgpu (sysfs)", *timed(amd.read, 50 if args.quick else 1000))]
    try:
        from resmon_exporter.backends.gpu_tracker.backend import GpuTrackerBackend
    except ImportError:
        print("gpu-tracker extra not installed: its line is left out", file=sys.stderr)
    else:
        tracker = GpuTrackerBackend(log, "amd", 30.0)
        assert tracker.read().device_count == args.gpus
        rows.append(("gpu-tracker (amd-smi)", *timed(tracker.read, 3 if args.quick else 30)))

    base = statistics.median(rows[0][1])
    print(f"refresh cost, {args.gpus} MI300X-like GPUs, same fake hardware (ms; median [min-max] of the repeats)")
    print(f"{'backend':24}{'wall':28}{'CPU (this process)':28}wall vs amdgpu")
    for name, wall, cpu in rows:
        w, c = statistics.median(wall), statistics.median(cpu)
        print(f"{name:24}{f'{w:.3f} [{min(wall):.3f}-{max(wall):.3f}]':28}{f'{c:.3f} [{min(cpu):.3f}-{max(cpu):.3f}]':28}"
              f"{w / base:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
