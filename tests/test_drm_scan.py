"""The DRM client scan on its own thread (exporter/backends/drm/fdinfo.py, issue 35): a scan
that blocks (a hung FUSE mount as --path.procfs) or is huge costs the process and busy series,
never the cards; one scan at a time; a late scan's result is served once, marked stale.
procfs is a fake tree (tests/fake_fdinfo.py), served through FUSE (tests/fuse_sysfs.py) where
a read must block."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator, TypeVar

import pytest

from resmon_exporter.backends import GpuOptions
from resmon_exporter.backends.drm import fdinfo
from resmon_exporter.backends.drm.fdinfo import DrmUsage
from resmon_exporter.backends.intel.backend import IntelBackend
from fake_fdinfo import Clock, FakeProc, amdgpu_client, i915_client
from fake_intel import intel_host
from fake_sysfs import FakeSysfs
from fuse_tree import FuseTree, bounded

RX = "0000:03:00.0"
A770 = "0000:03:00.0"  # intel_host's Arc A770
AMD = frozenset({"amdgpu"})
S = 10**9
T = TypeVar("T")


def wait_for(what: Callable[[], T], timeout: float = 30.0) -> T:
    """what() once it is truthy, polled until the deadline (a failure, not a hang, past it)."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout} s: last {got!r}")
        time.sleep(0.01)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


class HangingProc:
    """The fake procfs through FUSE; hang(rel) makes reads of <procfs>/<rel> block until release()."""

    def __init__(self, ft: FuseTree) -> None:
        self.ft = ft
        self.root = ft.mount

    def _rules(self, rules: dict[str, dict]) -> None:
        tmp = self.ft.rules_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rules))
        os.replace(tmp, self.ft.rules_path)

    def hang(self, rel: str) -> None:
        self._rules({rel: {"hang": True}})

    def release(self) -> None:
        self._rules({})

    def reads(self, rel: str) -> int:
        return self.ft.log.read_text().splitlines().count(rel)


@pytest.fixture
def fuse_proc(proc: FakeProc, tmp_path: Path) -> Iterator[HangingProc]:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing: this kernel or container has no FUSE (the blocked-scan tests need it)")
    base = tmp_path / "fuse"
    base.mkdir()
    ft = FuseTree(base, SimpleNamespace(root=proc.root))  # type: ignore[arg-type]  # only its root is used
    try:
        yield HangingProc(ft)
    finally:
        ft.close()


def test_a_blocked_scan_answers_unknown_within_the_wait_and_one_scan_runs_at_a_time(
        proc: FakeProc, fuse_proc: HangingProc) -> None:
    proc.add_drm_fd(100, 5, amdgpu_client(RX, 1, gfx_ns=S, vram_kib=1024))
    fuse_proc.hang("100/fdinfo/5")
    usage = DrmUsage(str(fuse_proc.root), AMD)
    started = time.monotonic()
    assert bounded(usage.read, timeout=10) is None  # unknown: no scan has finished
    assert time.monotonic() - started < 5  # the default wait (0.2 s), not the hang (120 s)
    wait_for(lambda: fuse_proc.reads("100/fdinfo/5") == 1)
    for _ in range(3):  # the stuck scan is not joined by another
        assert bounded(usage.read, timeout=10) is None
    assert fuse_proc.reads("100/fdinfo/5") == 1
    fuse_proc.release()
    # the stuck scan ends; its result (never served) or a later one's comes back
    out = wait_for(lambda: bounded(usage.read, timeout=10))
    assert [(p.pid, p.memory_bytes) for p in out[RX].processes] == [(100, 1024 * 1024)]


def test_with_a_blocked_scan_the_intel_cards_stay_up_and_their_processes_are_unknown(
        tmp_path: Path, proc: FakeProc, fuse_proc: HangingProc) -> None:
    tree = FakeSysfs(tmp_path / "sys")
    intel_host(tree)
    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=5 * S, local0_bytes=1 << 30), node="renderD129")
    clock = Clock()
    b = IntelBackend(logging.getLogger("test.drm_scan"), str(tree.root),
                     GpuOptions(procfs=str(fuse_proc.root), processes=True), pci_ids_files=("/nonexistent",), clock=clock)
    fuse_proc.hang("100/fdinfo/5")
    started = time.monotonic()
    reading = bounded(b.read, timeout=10)
    assert time.monotonic() - started < 5
    assert reading.success and len(reading.devices) == 3
    for d in reading.devices:
        assert d.up, d  # the cards do not wait for the scan
        assert d.processes is None and d.process_list is None  # unknown, not 0
        assert d.busy_seconds == () and d.utilization_ratio is None
    arc = next(d for d in reading.devices if d.identity.pci_bus_id == A770)
    assert arc.energy_joules is not None  # its sysfs values are there
    fuse_proc.release()

    def listed() -> object:
        arc = next(d for d in bounded(b.read, timeout=10).devices if d.identity.pci_bus_id == A770)
        return arc if arc.process_list else None

    arc = wait_for(listed)
    assert [(p.pid, p.memory_bytes) for p in arc.process_list] == [(100, 1 << 30)]
    assert dict(arc.busy_seconds)["render"] == 5.0
