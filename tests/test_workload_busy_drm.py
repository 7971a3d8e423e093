"""Per-process busy time from DRM client usage stats (exporter/backends/drm/fdinfo.py) on fake
procfs trees: each process's counter starts at 0 when first seen, grows by its clients' busy
time per engine of the class, and a client shared through fork counts once (its lowest pid)."""

from __future__ import annotations

from pathlib import Path

import pytest

from resmon_exporter.backends.drm.fdinfo import DeviceUsage, DrmUsage
from fake_fdinfo import Clock, FakeProc, amdgpu_client, i915_client, xe_client

RX = "0000:03:00.0"
ARC = "0000:04:00.0"
S = 10**9


def _read(usage: DrmUsage) -> dict[str, DeviceUsage]:
    out = usage.read()
    assert out is not None
    return out


def _busy(device: DeviceUsage) -> dict[int, dict[str, float]]:
    return {p.pid: dict(p.busy_seconds) for p in device.processes}


def test_amdgpu_process_busy_seconds_from_its_clients(tmp_path: Path) -> None:
    proc, clock = FakeProc(tmp_path / "proc"), Clock()
    proc.add_process(100)
    proc.add_drm_fd(100, 4, amdgpu_client(RX, 1, gfx_ns=50 * S, compute_ns=0))  # 50 s before the exporter
    proc.add_process(200)
    proc.add_drm_fd(200, 4, amdgpu_client(RX, 2, gfx_ns=S))
    proc.add_process(201)  # 200's fork: the same client, counted once, for 200
    proc.add_drm_fd(201, 4, amdgpu_client(RX, 2, gfx_ns=S))
    usage = DrmUsage(str(proc.root), frozenset({"amdgpu"}), clock=clock, wait=60.0)
    first = _busy(_read(usage)[RX])
    assert first == {100: {}, 200: {}, 201: {}}  # first sight: its past is not this exporter's interval
    clock.advance(10)
    proc.set_fdinfo(100, 4, amdgpu_client(RX, 1, gfx_ns=54 * S, compute_ns=2 * S))
    proc.set_fdinfo(200, 4, amdgpu_client(RX, 2, gfx_ns=7 * S))
    proc.set_fdinfo(201, 4, amdgpu_client(RX, 2, gfx_ns=7 * S))
    proc.add_drm_fd(100, 5, amdgpu_client(RX, 3, gfx_ns=3 * S))  # a new client of 100: not its past
    assert _busy(_read(usage)[RX]) == {100: {"gfx": 4.0, "compute": 2.0}, 200: {"gfx": 6.0}, 201: {}}
    clock.advance(10)
    proc.set_fdinfo(100, 5, amdgpu_client(RX, 3, gfx_ns=4 * S))
    proc.remove_process(200)  # 201 holds the client now: its growth from here is 201's
    proc.set_fdinfo(201, 4, amdgpu_client(RX, 2, gfx_ns=8 * S))
    assert _busy(_read(usage)[RX]) == {100: {"gfx": 5.0, "compute": 2.0}, 201: {"gfx": 1.0}}


def test_i915_capacity_and_xe_cycles_per_process(tmp_path: Path) -> None:
    proc, clock = FakeProc(tmp_path / "proc"), Clock()
    proc.add_process(300)
    proc.add_drm_fd(300, 4, i915_client(RX, 1, render_ns=0, video_ns=0), node="card0")
    proc.add_process(400)
    proc.add_drm_fd(400, 4, xe_client(ARC, 7, rcs_cycles=1000, rcs_total=10_000), node="card1")
    usage = DrmUsage(str(proc.root), frozenset({"i915", "xe"}), clock=clock, wait=60.0)
    _read(usage)
    clock.advance(4)
    proc.set_fdinfo(300, 4, i915_client(RX, 1, render_ns=S, video_ns=2 * S))  # video: 2 engines
    proc.set_fdinfo(400, 4, xe_client(ARC, 7, rcs_cycles=3500, rcs_total=20_000))  # 25 % of 4 s
    out = _read(usage)
    i915 = _busy(out[RX])[300]
    assert i915["render"] == pytest.approx(1.0) and i915["video"] == pytest.approx(1.0)
    assert _busy(out[ARC])[400]["render"] == pytest.approx(1.0)
