#!/usr/bin/env python3
"""Refresh cost of the intel backend (sysfs, hwmon and DRM client usage stats), in process, on
fake trees (tests/fake_sysfs.py, tests/fake_intel.py, tests/fake_fdinfo.py): N two-tile
Data Center GPU Max cards, and a procfs of P processes with F fds each, one in ten of them
holding an xe client, then the same with one more process holding 65536 fds (the per-process
cap, 4096, bounds what it costs). Each read() is timed, wall and CPU (this process). Prints one
table; nothing here asserts a timing.

    python benchmarks/intel.py [--gpus 4] [--processes 300] [--fds 30] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fake_fdinfo import FakeProc, xe_client  # noqa: E402  (the test rig's builders)
from fake_intel import add_intel, max_1550  # noqa: E402
from fake_sysfs import GIB, FakeSysfs  # noqa: E402

from resmon_exporter.backends import GpuOptions  # noqa: E402
from resmon_exporter.backends.intel.backend import IntelBackend  # noqa: E402

from amdgpu import timed  # noqa: E402  (benchmarks/amdgpu.py: the same warm-then-time loop)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--fds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="few repeats (a smoke run)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="resmon-intel-bench-"))
    tree = FakeSysfs(root / "sys")
    cards = [add_intel(tree, max_1550(pci=f"0000:{0x1a + i * 0x10:02x}:00.0", card=i)) for i in range(args.gpus)]
    empty = FakeProc(root / "proc-empty")
    empty.add_process(1, comm="systemd", uid=0)
    busy = FakeProc(root / "proc")
    for p in range(args.processes):
        pid = 1000 + p
        busy.add_process(pid)
        for fd in range(args.fds):
            if fd == 3 and p % 10 == 0:
                card = cards[(p // 10) % len(cards)]
                busy.add_drm_fd(pid, fd, xe_client(card.pci, p, rcs_cycles=p, rcs_total=10**6, vram0_bytes=GIB))
            else:
                busy.add_fd(pid, fd, f"socket:[{pid * 100 + fd}]")
    log = logging.getLogger("bench")
    repeats = 5 if args.quick else 100
    rows = []
    for name, procfs in (("sysfs only (no process)", empty.root),
                         (f"{args.processes} processes x {args.fds} fds", busy.root)):
        backend = IntelBackend(log, str(tree.root), GpuOptions(sysfs=str(tree.root), procfs=str(procfs), processes=True))
        reading = backend.read()
        assert reading.device_count == args.gpus and all(d.up for d in reading.devices), reading
        rows.append((name, *timed(backend.read, repeats)))
    wide = 100_000
    busy.add_process(wide)
    busy.add_drm_fd(wide, 3, xe_client(cards[0].pci, 99_999, vram0_bytes=GIB))
    for fd in range(4, 65536):
        os.symlink(f"socket:[{fd}]", busy.root / str(wide) / "fd" / str(fd))
    backend = IntelBackend(log, str(tree.root), GpuOptions(sysfs=str(tree.root), procfs=str(busy.root), processes=True))
    backend.read()
    rows.append(("the same + one process with 65536 fds", *timed(backend.read, repeats)))

    base = statistics.median(rows[0][2])
    print(f"refresh cost, {args.gpus} Data Center GPU Max (xe, two tiles) cards (ms; median [min-max] of {repeats} reads)")
    print(f"{'procfs':44}{'wall':28}{'CPU (this process)':28}CPU vs sysfs only")
    for name, wall, cpu in rows:
        w, c = statistics.median(wall), statistics.median(cpu)
        print(f"{name:44}{f'{w:.3f} [{min(wall):.3f}-{max(wall):.3f}]':28}{f'{c:.3f} [{min(cpu):.3f}-{max(cpu):.3f}]':28}"
              f"{c / base if base else 0:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
