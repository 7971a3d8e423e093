"""The DRM client usage stats reader (exporter/backends/drm/fdinfo.py) on fake procfs trees
(tests/fake_fdinfo.py) with the fdinfo shapes of amdgpu, i915 and xe."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from resmon_exporter.backends.drm import fdinfo
from resmon_exporter.backends.drm.fdinfo import XE_ENGINES, DeviceUsage, DrmUsage
from resmon_exporter.samples import GpuProcess
from fake_fdinfo import GENERIC, Clock, KIB, MIB, FakeProc, amdgpu_client, i915_client, kernel_size, xe_client

RX, MI = "0000:03:00.0", "0000:c3:00.0"  # amdgpu cards
IGPU, ARC = "0000:00:02.0", "0000:04:00.0"  # i915 integrated, xe discrete
AMD = frozenset({"amdgpu"})
INTEL = frozenset({"i915", "xe"})
S = 10**9  # ns in a second


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def clock() -> Clock:
    return Clock()


# a scan of these trees takes milliseconds; a reader waits for it up to this (a loaded machine
# must not make a read late: tests/test_drm_scan.py tests the default wait and a late scan)
WAIT = 60.0


def reader(proc: FakeProc, clock: Clock, drivers: frozenset[str] = AMD, **kw: int) -> DrmUsage:
    return DrmUsage(str(proc.root), drivers, clock=clock, wait=WAIT, **kw)


def read(usage: DrmUsage) -> dict[str, DeviceUsage]:
    out = usage.read()
    assert out is not None
    return out


def busy(device: DeviceUsage) -> dict[str, float]:
    return dict(device.busy_seconds)


def only(device: DeviceUsage) -> GpuProcess:
    assert len(device.processes) == 1, device.processes
    return device.processes[0]


# -- the drivers' formats ---------------------------------------------------------------


def test_amdgpu_modern_vram_in_kib_and_engine_ns(proc: FakeProc, clock: Clock) -> None:
    text = amdgpu_client(RX, 5, gfx_ns=3 * S, vram_kib=1536)
    assert "drm-total-vram:\t1536 KiB" in text and "drm-total-gtt:\t2 MiB" in text
    proc.add_process(100)
    proc.add_drm_fd(100, 7, text)
    out = read(reader(proc, clock))
    assert list(out) == [RX]
    assert only(out[RX]) == GpuProcess(100, 1536 * KIB, ())  # first sight: no rate yet
    assert out[RX].busy_seconds == (("gfx", 3.0),)  # gtt and cpu are not VRAM; compute not printed


def test_amdgpu_legacy_drm_memory(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 7, amdgpu_client(RX, 5, vram_kib=3000, gtt_kib=999, legacy=True))
    assert only(read(reader(proc, clock))[RX]).memory_bytes == 3000 * KIB


def test_vram_prefers_total_then_resident_then_legacy_and_sums_regions(proc: FakeProc, clock: Clock) -> None:
    common = {"drm-driver": "amdgpu", "drm-pdev": RX}
    # total wins over resident and legacy
    proc.add_drm_fd(100, 3, {**common, "drm-client-id": "1", "drm-total-vram": "8 MiB",
                             "drm-resident-vram": "2 MiB", "drm-memory-vram": "1 KiB"})
    # resident where there is no total, legacy where neither, bytes without a unit; over regions
    proc.add_drm_fd(200, 3, {**common, "drm-client-id": "2", "drm-resident-vram0": "4096",
                             "drm-memory-vram1": "3 KiB", "drm-total-gtt": "64 MiB"})
    # a client with regions but none of them VRAM: unknown, not 0
    proc.add_drm_fd(300, 3, {**common, "drm-client-id": "3", "drm-total-gtt": "64 MiB", "drm-total-cpu": "1 MiB"})
    # VRAM that is really 0 is 0
    proc.add_drm_fd(400, 3, {**common, "drm-client-id": "4", "drm-total-vram": "0"})
    got = {p.pid: p.memory_bytes for p in read(reader(proc, clock))[RX].processes}
    assert got == {100: 8 * MIB, 200: 4096 + 3 * KIB, 300: None, 400: 0}


def test_i915_local_memory_and_capacity(proc: FakeProc, clock: Clock) -> None:
    text = i915_client(ARC, 11, render_ns=0, video_ns=0, local0_bytes=256 * MIB)
    assert "drm-total-local0:\t256 MiB" in text and "drm-total-stolen-local0:\t4 MiB" in text
    proc.add_drm_fd(100, 4, text)
    proc.add_drm_fd(200, 4, i915_client(IGPU, 12, render_ns=S))  # integrated: system0 only
    usage = reader(proc, clock, INTEL)
    out = read(usage)
    assert only(out[ARC]).memory_bytes == 256 * MIB  # system0, stolen-local0 are not VRAM
    assert only(out[IGPU]).memory_bytes is None
    assert busy(out[IGPU]) == {"render": 1.0, "copy": 0.0, "video": 0.0, "video-enhance": 0.0, "compute": 0.0}

    clock.advance(1)
    proc.set_fdinfo(100, 4, i915_client(ARC, 11, render_ns=S // 2, video_ns=S, local0_bytes=256 * MIB))
    out = read(usage)
    # video: 1 s busy in 1 s over two engines; copy idle is 0.0, not absent
    assert only(out[ARC]).utilization == (
        ("compute", 0.0), ("copy", 0.0), ("render", 0.5), ("video", 0.5), ("video-enhance", 0.0))
    assert busy(out[ARC])["video"] == 0.5  # per engine of the class (capacity 2): rate() is the class utilization
    assert only(out[IGPU]).utilization == (
        ("compute", 0.0), ("copy", 0.0), ("render", 0.0), ("video", 0.0), ("video-enhance", 0.0))


def test_xe_cycles_engine_names_and_vram(proc: FakeProc, clock: Clock) -> None:
    vram = 5 * MIB + 3
    text = xe_client(ARC, 3, rcs_cycles=10_000, rcs_total=50_000, ccs_cycles=7, ccs_total=50_000,
                     vram0_bytes=vram, ccs_capacity=2)
    assert f"drm-total-vram0:\t{vram}\n" in text and "drm-total-system:\t16 MiB" in text
    proc.add_drm_fd(100, 5, text + "drm-cycles-other:\t0\ndrm-total-cycles-other:\t50000\n", node="card1")
    usage = reader(proc, clock, INTEL)
    out = read(usage)
    assert only(out[ARC]) == GpuProcess(100, vram, ())
    # cycles start anywhere: first sight adds nothing; an engine class the map lacks is dropped
    assert busy(out[ARC]) == {name: 0.0 for name in XE_ENGINES.values()}  # xe's "other" (the GSC) is no engine of the contract

    clock.advance(2)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=10_300, rcs_total=51_000, ccs_cycles=807,
                                      ccs_total=51_000, vram0_bytes=vram, ccs_capacity=2))
    out = read(usage)
    util = dict(only(out[ARC]).utilization)
    assert util["render"] == pytest.approx(0.3)
    assert util["compute"] == pytest.approx(0.4)  # 800 of 1000 ticks over two engines
    assert util["copy"] == util["video"] == util["video-enhance"] == 0.0
    assert "other" not in util
    got = busy(out[ARC])
    assert got["render"] == pytest.approx(0.6)  # busy 30% of 2 s
    assert got["compute"] == pytest.approx(0.8)  # 0.8 of 2 engines busy for 2 s: 0.4 of the class, per engine


def test_xe_timestamp_restart_is_a_new_baseline(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 5, xe_client(ARC, 3, rcs_cycles=900, rcs_total=100_000))
    usage = reader(proc, clock, INTEL)
    read(usage)
    clock.advance(1)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=950, rcs_total=1_000))  # GT reset: timestamp restarts
    out = read(usage)
    assert "render" not in dict(only(out[ARC]).utilization)
    assert busy(out[ARC])["render"] == 0.0
    clock.advance(1)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=1_450, rcs_total=2_000))
    out = read(usage)
    assert dict(only(out[ARC]).utilization)["render"] == pytest.approx(0.5)
    assert busy(out[ARC])["render"] == pytest.approx(0.5)


def test_xe_share_over_capacity_is_held_back_then_clamped(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 5, xe_client(ARC, 3, rcs_cycles=0, rcs_total=1_000))
    usage = reader(proc, clock, INTEL)
    read(usage)
    clock.advance(2)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=5_000, rcs_total=2_000))  # more busy than elapsed
    out = read(usage)
    assert "render" not in dict(only(out[ARC]).utilization)  # held back: a glitch unless it stays
    assert busy(out[ARC])["render"] == 0.0
    clock.advance(2)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=5_500, rcs_total=3_000))  # it stayed: real
    out = read(usage)
    assert dict(only(out[ARC]).utilization)["render"] == 1.0
    assert busy(out[ARC])["render"] == 4.0  # at most the wall time x one engine


def test_time_wins_over_cycles_for_one_engine(proc: FakeProc, clock: Clock) -> None:
    # panfrost-style: drm-engine- and drm-cycles- of one engine; counting both would be twice
    def text(ns: int, cycles: int, total: int) -> dict[str, str]:
        return {"drm-driver": "amdgpu", "drm-pdev": RX, "drm-client-id": "1", "drm-engine-gfx": f"{ns} ns",
                "drm-cycles-gfx": str(cycles), "drm-total-cycles-gfx": str(total)}

    proc.add_drm_fd(100, 3, text(2 * S, 5, 10))
    usage = reader(proc, clock)
    read(usage)
    clock.advance(2)
    proc.set_fdinfo(100, 3, text(3 * S, 15, 20))
    out = read(usage)
    assert busy(out[RX]) == {"gfx": 3.0}
    assert only(out[RX]).utilization == (("gfx", 0.5),)


def test_only_the_drivers_asked_for(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=S, vram_kib=1024))
    proc.add_drm_fd(100, 4, i915_client(IGPU, 1, render_ns=S))
    proc.add_drm_fd(200, 3, xe_client(ARC, 1, vram0_bytes=MIB))
    proc.add_drm_fd(300, 3, {"drm-driver": "nouveau", "drm-pdev": MI, "drm-client-id": "1", "drm-engine-gr": "5 ns"})
    assert set(read(reader(proc, clock, AMD))) == {RX}
    assert set(read(reader(proc, clock, INTEL))) == {IGPU, ARC}
    both = read(reader(proc, clock, AMD | INTEL))
    assert set(both) == {RX, IGPU, ARC}
    assert [p.pid for p in both[RX].processes] == [100] and [p.pid for p in both[IGPU].processes] == [100]


def test_fdinfo_without_identity_is_not_a_client(proc: FakeProc, clock: Clock) -> None:
    full = {"drm-driver": "amdgpu", "drm-pdev": RX, "drm-client-id": "1", "drm-engine-gfx": "5 ns", "drm-total-vram": "1"}
    for pid, drop in ((100, "drm-driver"), (200, "drm-pdev"), (300, "drm-client-id")):
        proc.add_drm_fd(pid, 3, {k: v for k, v in full.items() if k != drop})
    proc.add_drm_fd(400, 3, {**full, "drm-client-id": "x1"})
    proc.add_drm_fd(500, 3, "this is not an fdinfo\n\x00\xff")
    assert read(reader(proc, clock)) == {}


def test_pdev_is_lower_case_and_devices_are_apart(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX.upper(), 1, vram_kib=1024))
    proc.add_drm_fd(100, 4, amdgpu_client(MI.upper(), 2, vram_kib=4096), node="renderD129")
    proc.add_drm_fd(200, 3, amdgpu_client(MI, 3, vram_kib=8), node="card1")
    out = read(reader(proc, clock))
    assert set(out) == {RX, MI}
    assert out[RX].processes == (GpuProcess(100, 1024 * KIB, ()),)
    assert out[MI].processes == (GpuProcess(100, 4096 * KIB, ()), GpuProcess(200, 8 * KIB, ()))


# -- dedupe ------------------------------------------------------------------------------


def test_one_client_through_several_fds_counts_once(proc: FakeProc, clock: Clock) -> None:
    for fd in (5, 6, 7):  # dup'd, or one handle per thread
        proc.add_drm_fd(100, fd, amdgpu_client(RX, 42, gfx_ns=2 * S, vram_kib=1024))
    proc.add_drm_fd(100, 9, amdgpu_client(RX, 43, gfx_ns=S, vram_kib=512), node="card0")
    out = read(reader(proc, clock))
    assert only(out[RX]).memory_bytes == 1536 * KIB
    assert busy(out[RX]) == {"gfx": 3.0}


def test_fds_of_one_client_read_a_moment_apart_keep_the_larger(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 5, amdgpu_client(RX, 42, gfx_ns=3 * S))
    proc.add_drm_fd(100, 6, amdgpu_client(RX, 42, gfx_ns=2 * S))
    assert busy(read(reader(proc, clock))[RX]) == {"gfx": 3.0}


def test_a_client_shared_across_fork_is_listed_by_each_and_counted_once(proc: FakeProc, clock: Clock) -> None:
    for pid in (200, 201):
        proc.add_drm_fd(pid, 3, amdgpu_client(RX, 9, gfx_ns=4 * S, vram_kib=2048))
    usage = reader(proc, clock)
    out = read(usage)
    # its VRAM once, under the lowest pid; the other holds none of its own
    assert out[RX].processes == (GpuProcess(200, 2048 * KIB, ()), GpuProcess(201, 0, ()))
    assert busy(out[RX]) == {"gfx": 4.0}
    clock.advance(2)
    for pid in (200, 201):
        proc.set_fdinfo(pid, 3, amdgpu_client(RX, 9, gfx_ns=5 * S, vram_kib=2048))
    out = read(usage)
    assert [p.utilization for p in out[RX].processes] == [(("gfx", 0.5),), (("gfx", 0.5),)]
    assert busy(out[RX]) == {"gfx": 5.0}


# -- rates and counters ----------------------------------------------------------------


def test_rate_since_the_previous_read(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=7 * S))
    usage = reader(proc, clock)
    assert only(read(usage)[RX]).utilization == ()
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=8 * S, compute_ns=S // 2))
    out = read(usage)
    # compute appeared: amdgpu prints an engine once used, so it was 0 at the previous read
    assert only(out[RX]).utilization == (("compute", 0.25), ("gfx", 0.5))
    assert busy(out[RX]) == {"compute": 0.5, "gfx": 8.0}
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=18 * S, compute_ns=S // 2))
    out = read(usage)
    assert only(out[RX]).utilization == (("compute", 0.0),)  # 10 s in 2 s: held back, no rate
    assert busy(out[RX]) == {"compute": 0.5, "gfx": 8.0}
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=19 * S, compute_ns=S // 2))
    out = read(usage)
    assert only(out[RX]).utilization == (("compute", 0.0), ("gfx", 1.0))  # it stayed: clamped
    assert busy(out[RX]) == {"compute": 0.5, "gfx": 12.0}  # 4 s since 8 s was counted, not 11


def test_a_process_sums_its_clients_and_new_ones_wait_a_read(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=0))
    usage = reader(proc, clock)
    read(usage)
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=S // 2))
    proc.add_drm_fd(100, 4, amdgpu_client(RX, 2, gfx_ns=9 * S))  # new: no rate yet, however busy
    proc.add_drm_fd(200, 3, amdgpu_client(RX, 3, gfx_ns=S))  # a process none of whose clients was seen
    out = read(usage)
    assert [(p.pid, p.utilization) for p in out[RX].processes] == [(100, (("gfx", 0.25),)), (200, ())]
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=S))
    proc.set_fdinfo(100, 4, amdgpu_client(RX, 2, gfx_ns=10 * S))
    out = read(usage)
    assert out[RX].processes[0].utilization == (("gfx", 0.75),)  # 0.25 + 0.5
    assert busy(out[RX]) == {"gfx": 12.0}


def test_a_counter_stepping_back_reads_zero_and_busy_never_decreases(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=10 * S))
    usage = reader(proc, clock)
    assert busy(read(usage)[RX]) == {"gfx": 10.0}
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=8 * S))
    out = read(usage)
    assert only(out[RX]).utilization == (("gfx", 0.0),)
    assert busy(out[RX]) == {"gfx": 10.0}
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=9 * S))  # still under the larger value
    out = read(usage)
    assert only(out[RX]).utilization == (("gfx", 0.0),)
    assert busy(out[RX]) == {"gfx": 10.0}
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=13 * S))
    out = read(usage)
    # 3 s of growth past the larger value, over the 6 s since it was seen
    assert only(out[RX]).utilization == (("gfx", 0.5),)
    assert busy(out[RX]) == {"gfx": 13.0}


def test_an_exited_client_keeps_its_busy_time(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=3 * S))
    proc.add_drm_fd(200, 3, amdgpu_client(MI, 2, gfx_ns=S))
    usage = reader(proc, clock)
    read(usage)
    proc.remove_process(100)
    clock.advance(1)
    out = read(usage)
    assert out[RX] == DeviceUsage((), (("gfx", 3.0),))  # no clients left: still reported
    proc.remove_process(200)
    clock.advance(1)
    out = read(usage)
    assert out == {RX: DeviceUsage((), (("gfx", 3.0),)), MI: DeviceUsage((), (("gfx", 1.0),))}
    proc.add_drm_fd(300, 3, amdgpu_client(RX, 7, gfx_ns=S // 2))
    assert busy(read(usage)[RX]) == {"gfx": 3.5}


def test_a_client_missing_from_one_scan_is_not_counted_twice(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=3 * S))
    usage = reader(proc, clock)
    read(usage)
    proc.remove_fd(100, 3)  # in flight over a socket, say
    clock.advance(1)
    read(usage)
    proc.add_drm_fd(100, 4, amdgpu_client(RX, 1, gfx_ns=4 * S))
    clock.advance(1)
    out = read(usage)
    assert busy(out[RX]) == {"gfx": 4.0}
    assert only(out[RX]).utilization == ()  # the previous read did not see it


# -- what is skipped -------------------------------------------------------------------


def test_fds_that_are_not_drm_nodes_are_not_read(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, vram_kib=1024))
    # fdinfo files that would count if read: only the readlink target decides
    decoys = {4: "socket:[123]", 5: "/dev/null", 6: "/dev/dri/by-path/pci-0000:c3:00.0-render",
              7: "/dev/dri/renderD128 (deleted)", 8: "anon_inode:[eventfd]", 9: "/dev/dri/renderD",
              10: "/tmp/dev/dri/renderD128"}
    for fd, target in decoys.items():
        proc.add_fd(100, fd, target)
        proc.set_fdinfo(100, fd, amdgpu_client(MI, fd, vram_kib=1))
    out = read(reader(proc, clock))
    assert set(out) == {RX}
    assert only(out[RX]).memory_bytes == 1024 * KIB


def test_processes_and_fds_that_fail_are_skipped(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, vram_kib=1))
    proc.add_fd(100, 4, "/dev/dri/renderD128")  # fdinfo gone between the listing and the read
    proc.add_fd(100, 5, "/dev/dri/card0")
    (proc.pid_dir(100) / "fdinfo" / "5").mkdir()  # EISDIR on read
    proc.add_process(200)
    os.rmdir(proc.pid_dir(200) / "fd")  # no fd directory (a zombie, a kernel thread's)
    proc.add_process(300)
    os.rmdir(proc.pid_dir(300) / "fd")
    (proc.pid_dir(300) / "fd").write_text("")  # ENOTDIR, as EACCES would fail (tests may run as root)
    proc.add_process(400)
    os.rmdir(proc.pid_dir(400) / "fd")
    os.symlink("nowhere", proc.pid_dir(400) / "fd")  # dangling: ENOENT
    proc.add_process(500)
    os.rmdir(proc.pid_dir(500) / "fdinfo")  # fds but no fdinfo
    proc.add_fd(500, 3, "/dev/dri/renderD128")
    (proc.root / "600").write_text("")  # a pid that is not a directory
    proc.add_drm_fd(700, 3, amdgpu_client(RX, 2, vram_kib=2))
    out = read(reader(proc, clock))
    assert out[RX].processes == (GpuProcess(100, KIB, ()), GpuProcess(700, 2 * KIB, ()))


def test_entries_that_are_not_pids_are_not_scanned(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(300, 3, amdgpu_client(RX, 1, vram_kib=1))
    (proc.root / "self").unlink()
    os.symlink("300", proc.root / "self")  # self would list pid 300 a second time
    os.symlink("300", proc.root / "thread-self")
    proc.add_drm_fd(12, 3, amdgpu_client(MI, 2, vram_kib=1))
    os.rename(proc.pid_dir(12), proc.root / "\u0661\u0662")  # Arabic-Indic "12": isdigit(), int() == 12
    out = read(reader(proc, clock))
    assert set(out) == {RX}
    assert [p.pid for p in out[RX].processes] == [300]


def test_garbage_numbers_drop_the_key_not_read_as_zero(proc: FakeProc, clock: Clock) -> None:
    base = {"drm-driver": "amdgpu", "drm-pdev": RX}
    garbage = ("12x ns", "-5 ns", "5 ms", "5", "1 2 ns", "9" * 21 + " ns", f"{2**64} ns", "", "0x10 ns")
    for i, value in enumerate(garbage):
        proc.add_drm_fd(100 + i, 3, {**base, "drm-client-id": str(i + 1), "drm-engine-gfx": value,
                                     "drm-total-vram": value.replace("ns", "KiB") if "ns" in value else f"{value} B",
                                     "drm-engine-capacity-gfx": "0"})
    # a garbage total falls back to resident; a garbage capacity is 1
    proc.add_drm_fd(200, 3, {**base, "drm-client-id": "50", "drm-total-vram": "1 GiB", "drm-resident-vram": "7 KiB",
                             "drm-engine-compute": f"{2**64 - 1} ns", "drm-engine-capacity-compute": "lots"})
    # zero capacity is not allowed: 1, not a division by zero
    zero = {**base, "drm-client-id": "51", "drm-engine-dma": "0 ns", "drm-engine-capacity-dma": "0"}
    proc.add_drm_fd(201, 3, zero)
    usage = reader(proc, clock)
    out = read(usage)
    assert [p.memory_bytes for p in out[RX].processes] == [None] * len(garbage) + [7 * KIB, None]
    assert busy(out[RX]) == {"compute": (2**64 - 1) / 1e9, "dma": 0.0}  # the largest u64 is a number
    clock.advance(1)
    proc.set_fdinfo(201, 3, {**zero, "drm-engine-dma": f"{S // 4} ns"})
    out = read(usage)
    assert [p.utilization for p in out[RX].processes] == (
        [()] * len(garbage) + [(("compute", 0.0),), (("dma", 0.25),)])


def test_a_line_cut_at_the_size_limit_is_not_read(proc: FakeProc, clock: Clock) -> None:
    head = f"drm-driver:\tamdgpu\ndrm-pdev:\t{RX}\ndrm-client-id:\t1\ndrm-total-vram0:\t5 KiB\n"
    line = "drm-total-vram1:\t123456789\n"  # bytes: cut after "1234", it would read as 1234
    pad = 64 * KIB - len(GENERIC) - len(head) - len("drm-total-vram1:\t1234")
    text = head + "x-pad:\t" + "p" * (pad - len("x-pad:\t\n")) + "\n" + line
    assert (GENERIC + text).index(line) + len("drm-total-vram1:\t1234") == 64 * KIB
    proc.add_drm_fd(100, 3, text)
    assert only(read(reader(proc, clock))[RX]).memory_bytes == 5 * KIB


def test_procfs_missing_is_none(tmp_path: Path, clock: Clock) -> None:
    assert DrmUsage(str(tmp_path / "absent"), AMD, clock=clock).read() is None
    (tmp_path / "file").write_text("")
    assert DrmUsage(str(tmp_path / "file"), AMD, clock=clock).read() is None
    assert DrmUsage(str(tmp_path), AMD, clock=clock).read() == {}


def test_max_fds_must_be_positive(proc: FakeProc) -> None:
    with pytest.raises(ValueError):
        DrmUsage(str(proc.root), AMD, max_fds_per_process=0)


def test_a_process_with_64k_fds_costs_at_most_the_cap(proc: FakeProc, clock: Clock,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pid, cap, fds = 100, 4096, 65536
    proc.add_process(pid)
    fd_dir = proc.pid_dir(pid) / "fd"
    proc.add_drm_fd(pid, 3, amdgpu_client(RX, 1, vram_kib=1))
    proc.add_drm_fd(pid, 60_000, amdgpu_client(MI, 2, vram_kib=1), node="renderD129")
    for fd in range(fds):
        if fd not in (3, 60_000):
            os.symlink(f"socket:[{70_000 + fd}]" if fd % 2 else "/dev/null", fd_dir / str(fd))
    proc.add_drm_fd(200, 3, amdgpu_client(RX, 3, vram_kib=2))
    calls: dict[str, int] = {"mine": 0, "other": 0}
    real = os.readlink

    def counting(path: str, *args: object, **kw: object) -> str:
        if os.sep + "ns" + os.sep in str(path):
            return real(path, *args, **kw)  # type: ignore[arg-type]  # /proc/1/ns/pid: whose procfs
        calls["mine" if str(path).startswith(str(fd_dir) + os.sep) else "other"] += 1
        return real(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fdinfo.os, "readlink", counting)
    out = read(reader(proc, clock, max_fds_per_process=cap))
    # which 4096 of the 65536 this tree lists first is its file system's order (procfs's is
    # ascending: test_procfs_lists_a_process_fds_lowest_first); pid 200 is found whole
    assert 200 in {p.pid for p in out[RX].processes}
    assert calls["mine"] == cap  # 4096 readlinks, not 65536
    assert calls["other"] == 1
    # and it is the cap that leaves the rest out
    out = read(reader(proc, clock, max_fds_per_process=fds))
    assert set(out) == {RX, MI} and [p.pid for p in out[RX].processes] == [100, 200]


def test_procfs_lists_a_process_fds_lowest_first() -> None:
    # what "the first max_fds_per_process entries are the lowest fds" rests on: Linux's
    # /proc/PID/fd lists the fd table from 0 up, gaps and all
    opened = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(600)]
    try:
        for fd in opened[100:500:3]:
            os.close(fd)
        with os.scandir(f"/proc/{os.getpid()}/fd") as entries:
            listed = [int(e.name) for e in entries]
        assert len(listed) > 400 and listed == sorted(listed)
    finally:
        for fd in opened:
            try:
                os.close(fd)
            except OSError:
                pass  # closed above


def test_an_unchanged_fd_listing_is_not_readlinked_again_and_a_reused_fd_number_is_found_within_ten_reads(
        proc: FakeProc, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, vram_kib=1024))
    for fd in range(4, 40):
        proc.add_fd(100, fd, f"socket:[{fd}]")
    proc.add_fd(101, 7, "/dev/null")  # its fd 7 becomes a DRM fd under the same number below
    calls = {"n": 0}
    real = os.readlink

    def counting(path: str, *args: object, **kw: object) -> str:
        calls["n"] += os.sep + "fd" + os.sep in str(path)  # fd links, not /proc/1/ns/pid
        return real(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fdinfo.os, "readlink", counting)
    usage = reader(proc, clock)
    assert [p.pid for p in read(usage)[RX].processes] == [100]
    assert calls["n"] == 38  # the first read looks at every fd: 37 of pid 100, 1 of pid 101
    calls["n"] = 0
    assert only(read(usage)[RX]).memory_bytes == 1024 * 1024  # the DRM fd's fdinfo read again
    assert calls["n"] == 0  # unchanged listings, and neither pid's turn to be looked at whole (read 2)
    proc.add_drm_fd(100, 40, amdgpu_client(RX, 2, vram_kib=1024))  # a new fd: the listing changed
    assert only(read(usage)[RX]).memory_bytes == 2 * 1024 * 1024
    os.unlink(proc.pid_dir(101) / "fd" / "7")  # closed and reopened on a render node: the same listing
    proc.add_drm_fd(101, 7, amdgpu_client(RX, 3, vram_kib=4))
    found = []
    for _ in range(10):
        found.append(101 in {p.pid for p in read(usage)[RX].processes})
    assert found[-1] and not found[0]  # not seen at once (the listing did not change), found within ten reads


# -- threads -----------------------------------------------------------------------------


def test_concurrent_reads_while_counters_grow(proc: FakeProc) -> None:
    growth = 1000  # ns of busy time a client gains per write (see write())
    pids = (100, 101, 102)
    values = {pid: (pid - 99) * S for pid in pids}
    for pid in pids:
        proc.add_drm_fd(pid, 3, amdgpu_client(RX, pid, gfx_ns=values[pid], compute_ns=values[pid] // 2))
    proc.add_drm_fd(103, 3, xe_client(ARC, 1, rcs_cycles=0, rcs_total=0))
    usage = DrmUsage(str(proc.root), AMD | INTEL, wait=WAIT)  # the real clock
    results: list[dict[str, DeviceUsage]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        step = 0
        try:
            while not stop.is_set():
                step += 1
                # a counter cannot grow faster than the wall clock (growth beyond it is held back
                # as a glitch and clamped: fdinfo.py's policy), and a real one is computed when it
                # is read. A file holds a value until rewritten, so growth by the wall time since
                # a clock sample jumps when the writer stalls between the sample and the write
                # (a loaded machine): seen by two quick scans, that jump is clamped and the sum
                # below misses it. A fixed microsecond a write keeps every jump far under the time
                # the writes themselves take (four files, each a write and a rename), stall or not.
                for pid in pids:
                    values[pid] += growth
                    proc.set_fdinfo(pid, 3, amdgpu_client(RX, pid, gfx_ns=values[pid], compute_ns=values[pid] // 2))
                proc.set_fdinfo(103, 3, xe_client(ARC, 1, rcs_cycles=step * 300, rcs_total=step * 1000))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def scan() -> None:
        try:
            for _ in range(40):
                out = usage.read()
                assert out is not None
                results.append(out)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writer = threading.Thread(target=write)
    readers = [threading.Thread(target=scan) for _ in range(4)]
    writer.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join(60)
    stop.set()
    writer.join(60)
    assert not errors, errors
    assert len(results) == 160

    assert all(values[pid] > (pid - 99) * S for pid in pids)  # the counters grew while read

    def series(out: dict[str, DeviceUsage]) -> dict[tuple[str, str], float]:
        return {(pdev, e): s for pdev, d in out.items() for e, s in d.busy_seconds}

    # reads happen one at a time, so their counters are totally ordered: sorted by their sum,
    # each series must be at least what it was in every earlier result
    ordered = sorted((series(r) for r in results), key=lambda s: sum(s.values()))
    for earlier, later in zip(ordered, ordered[1:]):
        for key, seconds in earlier.items():
            assert later[key] >= seconds, (key, earlier, later)
    # and nothing was counted twice: each client's whole busy time, once (the first read waits
    # for a scan that may have begun before the last write; the second is a scan begun after it)
    read(usage)
    final = series(read(usage))
    assert final[(RX, "gfx")] == sum(values.values()) / 1e9
    assert final[(RX, "compute")] == sum(v // 2 for v in values.values()) / 1e9


def test_one_scan_at_a_time_and_a_late_one_is_served_once_stale(
        proc: FakeProc, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=S))
    usage = DrmUsage(str(proc.root), AMD, clock=clock, wait=0.05)
    assert busy(wait_read(usage)[RX]) == {"gfx": 1.0} and not usage.stale
    entered = threading.Semaphore(0)
    release = threading.Event()
    real = os.listdir

    def listdir(path: str) -> list[str]:
        if str(path) == str(proc.root):  # a scan starts by listing procfs
            entered.release()
            assert release.wait(30)
        return real(path)

    monkeypatch.setattr(fdinfo.os, "listdir", listdir)
    scans = usage.scans
    clock.advance(2)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=2 * S))
    try:
        assert usage.read() is None  # late, and the last finished scan was served already
        assert entered.acquire(timeout=30)
        results = [usage.read() for _ in range(3)]
        assert results == [None] * 3
        assert not entered.acquire(timeout=0.3)  # the reads waited for the stuck scan, started none
    finally:
        release.set()
    deadline = time.monotonic() + 30
    while usage.scans == scans:  # the late scan ends on its own thread
        assert time.monotonic() < deadline, "the released scan did not finish"
        time.sleep(0.01)
    release.clear()  # the next scan blocks: the late one's result is served, once, marked stale
    clock.advance(2)
    try:
        out = usage.read()
        assert out is not None and usage.stale
        assert busy(out[RX]) == {"gfx": 2.0} and only(out[RX]).utilization == (("gfx", 0.5),)
        assert usage.read_at == 1002.0  # its scan's time: its rates end there
        assert usage.read() is None  # served once
    finally:
        release.set()


def wait_read(usage: DrmUsage) -> dict[str, DeviceUsage]:
    """usage.read() until it answers, polled until a deadline (a reader with a short wait)."""
    deadline = time.monotonic() + 30
    while (out := usage.read()) is None:
        assert time.monotonic() < deadline, "no scan finished"
    return out


def test_helpers_write_realistic_sizes() -> None:
    assert [kernel_size(n) for n in (0, 1000, 1024, 1536 * KIB, 3 * MIB, 2**40)] == [
        "0", "1000", "1 KiB", "1536 KiB", "3 MiB", f"{2**20} MiB"]


# -- issue 35: forked workers, glitches, retired clients, the listing's bound ------------


def test_a_client_shared_across_fork_has_its_memory_under_the_lowest_pid_once(proc: FakeProc, clock: Clock) -> None:
    # a 4 GiB trainer (pid 200) and its DataLoader workers: one drm_file under three pids
    for pid in (200, 201, 202):
        proc.add_drm_fd(pid, 3, amdgpu_client(RX, 9, gfx_ns=4 * S, vram_kib=4 * MIB))
    proc.add_drm_fd(201, 4, amdgpu_client(RX, 10, vram_kib=16), node="card0")  # a worker's own client
    # an integrated GPU's client shared the same way reports no VRAM: unknown under each pid
    for pid in (300, 301):
        proc.add_drm_fd(pid, 3, {"drm-driver": "amdgpu", "drm-pdev": MI, "drm-client-id": "11",
                                 "drm-total-gtt": "1 MiB"}, node="renderD129")
    out = read(reader(proc, clock))
    assert [(p.pid, p.memory_bytes) for p in out[RX].processes] == [(200, 4 * MIB * KIB), (201, 16 * KIB), (202, 0)]
    assert sum(p.memory_bytes or 0 for p in out[RX].processes) == 4 * MIB * KIB + 16 * KIB  # the pod's sum: once
    assert [(p.pid, p.memory_bytes) for p in out[MI].processes] == [(300, None), (301, None)]
    assert busy(out[RX]) == {"gfx": 4.0}


def test_a_glitched_value_is_not_added_and_the_client_is_counted_afterwards(proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=2 * S))
    usage = reader(proc, clock)
    assert busy(read(usage)[RX]) == {"gfx": 2.0}
    clock.advance(1)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=2**63))  # 9.2e9 s in 1 s: a glitch
    out = read(usage)
    assert busy(out[RX]) == {"gfx": 2.0}
    assert only(out[RX]).utilization == ()  # no measurement this read
    clock.advance(1)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=3 * S))  # back below it: it was a glitch
    out = read(usage)
    assert busy(out[RX]) == {"gfx": 3.0}
    assert only(out[RX]).utilization == (("gfx", 0.5),)  # 1 s over the 2 s since the last good value
    clock.advance(1)
    proc.set_fdinfo(100, 3, amdgpu_client(RX, 1, gfx_ns=3 * S + S // 2))
    out = read(usage)
    assert busy(out[RX]) == {"gfx": 3.5} and only(out[RX]).utilization == (("gfx", 0.5),)


def test_growth_that_stays_beyond_wall_time_counts_at_most_wall_time_times_capacity(
        proc: FakeProc, clock: Clock) -> None:
    def text(ns: int) -> dict[str, str]:
        return {"drm-driver": "amdgpu", "drm-pdev": RX, "drm-client-id": "1", "drm-engine-dec": f"{ns} ns",
                "drm-engine-capacity-dec": "2"}

    proc.add_drm_fd(100, 3, text(0))
    usage = reader(proc, clock)
    read(usage)
    clock.advance(1)
    proc.set_fdinfo(100, 3, text(5 * S))  # 5 s of two engines in 1 s: held back
    assert busy(read(usage)[RX]) == {"dec": 0.0}
    clock.advance(1)
    proc.set_fdinfo(100, 3, text(6 * S))  # it did not go back: counted, up to 2 s x 2 engines
    out = read(usage)
    assert busy(out[RX]) == {"dec": 2.0}  # per engine of the class: at most the wall time
    assert only(out[RX]).utilization == (("dec", 1.0),)
    clock.advance(1)
    proc.set_fdinfo(100, 3, text(7 * S))
    out = read(usage)
    assert busy(out[RX]) == {"dec": 2.5} and only(out[RX]).utilization == (("dec", 0.5),)


def test_a_glitched_xe_cycle_count_is_not_added_and_the_client_is_counted_afterwards(
        proc: FakeProc, clock: Clock) -> None:
    proc.add_drm_fd(100, 5, xe_client(ARC, 3, rcs_cycles=0, rcs_total=1_000))
    usage = reader(proc, clock, INTEL)
    read(usage)
    clock.advance(1)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=10**15, rcs_total=2_000))  # a glitch
    assert busy(read(usage)[ARC])["render"] == 0.0
    clock.advance(1)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=500, rcs_total=3_000))
    out = read(usage)
    assert busy(out[ARC])["render"] == pytest.approx(0.5)  # 500 of 2000 ticks over the 2 s since the good value
    clock.advance(1)
    proc.set_fdinfo(100, 5, xe_client(ARC, 3, rcs_cycles=1_000, rcs_total=4_000))
    out = read(usage)
    assert dict(only(out[ARC]).utilization)["render"] == pytest.approx(0.5)
    assert busy(out[ARC])["render"] == pytest.approx(1.0)


def test_a_client_back_after_its_memory_was_evicted_does_not_add_its_lifetime_twice(
        proc: FakeProc, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fdinfo, "_RETIRED_MAX", 2)
    proc.add_drm_fd(100, 3, amdgpu_client(RX, 1, gfx_ns=3 * S))
    usage = reader(proc, clock)
    assert busy(read(usage)[RX]) == {"gfx": 3.0}
    proc.remove_fd(100, 3)  # in flight over a socket, say
    for client in (2, 3, 4):  # more clients come and go than the reader remembers
        clock.advance(1)
        proc.add_drm_fd(200 + client, 3, amdgpu_client(RX, client, gfx_ns=0))
        read(usage)
        proc.remove_process(200 + client)
    clock.advance(1)
    read(usage)
    clock.advance(1)
    proc.add_drm_fd(100, 4, amdgpu_client(RX, 1, gfx_ns=4 * S))  # client 1 again: an older id than those
    assert busy(read(usage)[RX]) == {"gfx": 3.0}  # not 3 + 4: its lifetime was counted; a new baseline
    clock.advance(1)
    proc.set_fdinfo(100, 4, amdgpu_client(RX, 1, gfx_ns=4 * S + S // 2))
    out = read(usage)
    assert busy(out[RX]) == {"gfx": 3.5} and only(out[RX]).utilization == (("gfx", 0.5),)
    proc.add_drm_fd(100, 5, amdgpu_client(RX, 9, gfx_ns=S))  # a newer id is a new client: its whole lifetime
    assert busy(read(usage)[RX]) == {"gfx": 4.5}


class _CountingScandir:
    """os.scandir of one directory, counting the entries taken from it."""

    def __init__(self, it: object, counts: dict[str, int]) -> None:
        self._it = it
        self._counts = counts

    def __enter__(self) -> "_CountingScandir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._it.close()  # type: ignore[attr-defined]

    def __iter__(self) -> "_CountingScandir":
        return self

    def __next__(self) -> os.DirEntry:
        entry = next(self._it)  # type: ignore[call-overload]
        self._counts["entries"] += 1
        return entry


def test_the_fd_listing_stops_at_the_bound_and_keeps_no_names(proc: FakeProc, clock: Clock,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import tracemalloc

    pid, cap, fds = 100, 500, 10_000
    proc.add_process(pid)
    fd_dir = proc.pid_dir(pid) / "fd"
    for fd in range(fds):
        os.symlink("/dev/null", fd_dir / str(fd))
    counts = {"entries": 0}
    real = os.scandir

    def scandir(path: str = ".") -> object:
        it = real(path)
        return _CountingScandir(it, counts) if os.fspath(path) == str(fd_dir) else it

    monkeypatch.setattr(fdinfo.os, "scandir", scandir)
    usage = reader(proc, clock, max_fds_per_process=cap)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert read(usage) == {}
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < counts["entries"] <= cap  # the listing itself stops at the bound
    assert kept < 256 * KIB, kept  # what is remembered of the process is not its 10,000 fd names
