"""The Intel backend (xe and i915): in process on a fake sysfs tree (tests/fake_intel.py) and a
fake procfs with DRM fdinfo (tests/fake_fdinfo.py), through FUSE (tests/fuse_sysfs.py) for the
kernel's errnos, and end to end: the real CLI scraped over HTTP, promtool, auto."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from resmon_exporter.backends import BackendError, GpuOptions, make_backend
from resmon_exporter.backends.intel.backend import IntelBackend, find_cards
from resmon_exporter.samples import GpuReading
from fake_fdinfo import Clock, FakeProc, amdgpu_client, i915_client, xe_client
from fake_intel import IntelBoard, add_intel, arc_a770, battlemage, flex_170_dkms, intel_host, max_1550, meteor_lake, set_card
from fake_sysfs import GIB, MIB, FakeSysfs, rx7900
from fakenvml import REPO, sysfs_exporters
from fuse_tree import FuseTree, bounded, mounted

HERE = Path(__file__).parent
MTL, A770, MAX = "0000:00:02.0", "0000:03:00.0", "0000:3a:00.0"
BMG = "0000:5c:00.0"  # a Battlemage a test adds after the three: index 3
AMD = "0000:05:00.0"  # an amdgpu card next to the Intel ones (A770 sits at rx7900's default address)
HUGE = "9" * 400  # no sysfs number is that long: sysfs values are u64
NO_IDS = ("/nonexistent/pci.ids",)


def backend(root: Path, clock: Clock | None = None, procfs: Path | str = "/nonexistent/proc", processes: bool = False,
            pci_ids: tuple[str, ...] = NO_IDS, log: logging.Logger | None = None) -> IntelBackend:
    return IntelBackend(log or logging.getLogger("test.intel"), str(root), GpuOptions(procfs=str(procfs), processes=processes),
                        pci_ids_files=pci_ids, clock=clock or Clock())


def by_pci(reading: GpuReading) -> dict:
    return {d.identity.pci_bus_id: d for d in reading.devices}


def hwmon_dir(tree: FakeSysfs, pci: str) -> Path:
    return tree.device_dir(pci) / "hwmon" / f"hwmon{tree.boards[pci].hwmon_index}"


@pytest.fixture
def tree(tmp_path: Path) -> FakeSysfs:
    t = FakeSysfs(tmp_path / "sys")
    intel_host(t)
    return t


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    p = FakeProc(tmp_path / "proc")
    p.add_process(1, "init", uid=0)
    return p


# -- discovery and identity -----------------------------------------------------------------


def test_discovery_takes_xe_and_i915_cards_by_pci_address(tree):
    tree.add(rx7900(pci=AMD, card=5))  # an amdgpu card: not Intel's
    cards = find_cards(str(tree.root))
    assert [(c.pci, c.driver) for c in cards] == [(MTL, "xe"), (A770, "i915"), (MAX, "xe")]
    assert [c.device_dir for c in cards] == [str(tree.device_dir(p)) for p in (MTL, A770, MAX)]
    assert [os.path.basename(c.card_dir) for c in cards] == ["card0", "card1", "card2"]
    # connectors, render nodes, the amdgpu card and the "version" file are in the class, not taken
    names = set(os.listdir(tree.root / "class" / "drm"))
    assert {"card1-DP-1", "renderD128", "renderD130", "card5", "version"} <= names
    reading = backend(tree.root).read()
    assert reading.success and reading.backend == "intel" and reading.device_count == 3
    assert [(d.identity.index, d.identity.pci_bus_id, d.up) for d in reading.devices] == [
        (0, MTL, True), (1, A770, True), (2, MAX, True)]


def test_a_missing_driver_link_falls_back_to_uevent(tree):
    (tree.device_dir(A770) / "driver").unlink()
    assert [(c.pci, c.driver) for c in find_cards(str(tree.root))] == [(MTL, "xe"), (A770, "i915"), (MAX, "xe")]


def test_identity_uuid_is_the_pci_address_and_names_come_from_the_pci_id(tree, tmp_path):
    add_intel(tree, IntelBoard("0000:07:00.0", 7, "8086:ABCD", "0x01", 0, driver="xe", hwmon={"name": "xe"}))
    add_intel(tree, IntelBoard("0000:08:00.0", 8, "8086:ABCE", "0x01", 0, driver="i915", hwmon={"name": "i915"}))
    ids = tmp_path / "pci.ids"
    ids.write_text("# pci.ids\n1002  Advanced Micro Devices, Inc. [AMD/ATI]\n\tabce  not Intel's\n"
                   "8086  Intel Corporation\n\t0041  Xeon E3-1200\n\tabcd  DG2 [Arc Test]\n\t\t8086 1020  a subsystem\n"
                   "8087  Intel Corp.\n\tabce  not this vendor either\n")
    got = by_pci(backend(tree.root, pci_ids=("/nonexistent/pci.ids", str(ids))).read())
    for pci, d in got.items():
        assert d.identity.uuid == d.identity.pci_bus_id == pci
    assert got[A770].identity.name == "Intel Arc A770 Graphics"
    assert got[MAX].identity.name == "Intel Data Center GPU Max 1550"
    assert got[MTL].identity.name == "Intel Arc Graphics (Meteor Lake)"
    assert got["0000:07:00.0"].identity.name == "Intel DG2 [Arc Test]"  # from the pci.ids file given
    assert got["0000:08:00.0"].identity.name == "Intel GPU [8086:abce]"  # in no table
    # without a pci.ids file the first one is unknown too
    assert by_pci(backend(tree.root).read())["0000:07:00.0"].identity.name == "Intel GPU [8086:abcd]"
    assert [got[p].identity.index for p in (MTL, A770, "0000:07:00.0", "0000:08:00.0", MAX)] == [0, 1, 2, 3, 4]


def test_driver_version_from_the_module_else_the_kernel(tree):
    assert backend(tree.root).read().driver_version == platform.release()  # in-tree drivers: no version file
    tree.write(tree.root / "module" / "xe" / "version", "1.2.3-dkms")
    assert backend(tree.root).read().driver_version == "1.2.3-dkms"


# -- values -----------------------------------------------------------------------------------


def test_three_boards_map_onto_the_contract_in_base_units(tree):
    got = by_pci(backend(tree.root).read())
    mtl, arc, mx = got[MTL], got[A770], got[MAX]
    assert all(d.up for d in (mtl, arc, mx))
    # A770 (i915): card energy, PL1, no temperature file, no VRAM file, one GT under the card
    assert arc.energy_joules == 123456.789 and arc.power_limit_watts == 190.0
    assert arc.temperature_celsius is None and arc.memory_temperature_celsius is None  # absent, not 0
    assert arc.clock_hertz == (("graphics", 2100e6),)
    assert arc.identity.clock_max_hertz == (("graphics", 2400e6),)
    assert arc.memory_total_bytes is None
    # Max 1550 (xe): two tiles' VRAM summed, package and VRAM temperatures, tile 0's GT only
    assert mx.energy_joules == 500000.0 and mx.power_limit_watts == 600.0
    assert (mx.temperature_celsius, mx.memory_temperature_celsius) == (48.0, 55.0)
    assert mx.clock_hertz == (("graphics", 1550e6),)  # not tile 1's 1200 MHz
    assert mx.identity.clock_max_hertz == (("graphics", 1600e6),)
    assert mx.memory_total_bytes == 128 * GIB
    # Meteor Lake (integrated xe): no hwmon (discrete cards only), the media GT asleep
    assert mtl.energy_joules is None and mtl.power_limit_watts is None
    assert mtl.temperature_celsius is None and mtl.memory_total_bytes is None
    assert mtl.clock_hertz == (("graphics", 1900e6), ("video", 0.0))
    assert dict(mtl.clock_hertz)["video"] == 0.0  # stopped: 0 exactly, not absent
    assert mtl.identity.clock_max_hertz == (("graphics", 2250e6), ("video", 1100e6))
    for d in (mtl, arc, mx):
        # nothing in sysfs says VRAM used; no instantaneous power on the first refresh
        assert d.memory_used_bytes is None and d.memory_free_bytes is None and d.power_watts is None
        assert d.junction_temperature_celsius is None and d.fan_speed_ratio is None


def test_only_the_hwmon_named_i915_or_xe_is_the_cards(tree):
    # the A770's per-GT hwmon3 (i915_gt0, 99 J) is not the card's hwmon2
    assert (tree.device_dir(A770) / "hwmon" / "hwmon3" / "name").read_text() == "i915_gt0\n"
    tree.set(A770, "hwmon:energy1_input", "5000000")
    assert by_pci(backend(tree.root).read())[A770].energy_joules == 5.0


def test_a_per_gt_hwmon_listed_first_is_not_the_cards(tree):
    # i915's per-GT hwmons are named i915_gt<N>: one numbered before the card's is skipped too
    tree.write(tree.device_dir(A770) / "hwmon" / "hwmon1" / "name", "i915_gt1")
    tree.write(tree.device_dir(A770) / "hwmon" / "hwmon1" / "energy1_input", "77000000")
    tree.write(tree.device_dir(A770) / "hwmon" / "hwmon1" / "power1_max", "35000000")
    arc = by_pci(backend(tree.root).read())[A770]
    assert (arc.energy_joules, arc.power_limit_watts) == (123456.789, 190.0)


def test_the_card_and_package_files_win_over_the_fallbacks(tree):
    # a board with both: energy1 (card) over energy2 (package), power1_max over power2_max,
    # temp2 (package) over temp1
    for name, text in (("energy2_input", "1000000"), ("power2_max", "5000000"), ("temp1_input", "30000")):
        tree.set(MAX, f"hwmon:{name}", text)
    mx = by_pci(backend(tree.root).read())[MAX]
    assert (mx.energy_joules, mx.power_limit_watts, mx.temperature_celsius) == (500000.0, 600.0, 48.0)
    (hwmon_dir(tree, MAX) / "temp2_input").unlink()
    (hwmon_dir(tree, MAX) / "energy1_input").unlink()
    (hwmon_dir(tree, MAX) / "power1_max").unlink()
    mx = by_pci(backend(tree.root).read())[MAX]
    assert (mx.energy_joules, mx.power_limit_watts, mx.temperature_celsius) == (1.0, 5.0, 30.0)


def test_a_power_limit_of_zero_is_absent(tree):
    add_intel(tree, battlemage(pci=BMG, card=5))  # package files only: power2_max
    assert by_pci(backend(tree.root).read())[BMG].power_limit_watts == 150.0
    tree.set(A770, "hwmon:power1_max", "0")  # PL1 disabled
    tree.set(BMG, "hwmon:power2_max", "0")
    got = by_pci(backend(tree.root).read())
    assert got[A770].power_limit_watts is None and got[BMG].power_limit_watts is None
    assert got[A770].up and got[MAX].power_limit_watts == 600.0


def test_power_is_the_energy_counters_growth_over_the_clock(tree):
    add_intel(tree, battlemage(pci=BMG, card=5))  # the package's energy2_input only
    clock = Clock()
    b = backend(tree.root, clock)
    first = by_pci(b.read())
    assert first[A770].power_watts is None and first[BMG].power_watts is None  # no previous refresh yet
    assert first[BMG].energy_joules == 7000.0 and first[MTL].energy_joules is None
    clock.advance(2.0)
    tree.set(A770, "hwmon:energy1_input", str(123456789000 + 50_000_000))  # +50 J
    tree.set(BMG, "hwmon:energy2_input", str(7000000000 + 50_000_000))
    got = by_pci(b.read())
    assert got[A770].power_watts == pytest.approx(25.0, rel=1e-9) and got[BMG].power_watts == 25.0
    assert got[MTL].power_watts is None
    assert got[MAX].power_watts == 0.0 and got[A770].energy_joules == 123506.789
    # a smaller counter: the driver was reloaded: no power this refresh, never a negative one
    clock.advance(2.0)
    tree.set(A770, "hwmon:energy1_input", "1000000")
    got = by_pci(b.read())
    # and the counter served goes on from where it was (Prometheus would read a drop as a reset)
    assert got[A770].power_watts is None and got[A770].energy_joules == 123506.789 + 1.0 and got[A770].up
    # and the next refresh measures from the new value
    clock.advance(4.0)
    tree.set(A770, "hwmon:energy1_input", "9000000")
    assert by_pci(b.read())[A770].power_watts == 2.0
    # no time passed: no division by zero, no power
    tree.set(A770, "hwmon:energy1_input", "19000000")
    assert by_pci(b.read())[A770].power_watts is None


def test_values_change_between_refreshes_identity_does_not(tree):
    b = backend(tree.root)
    first = by_pci(b.read())
    tree.set(MAX, "hwmon:temp2_input", "71500")
    tree.set(MAX, "tile0/gt0/freq0/act_freq", "900")
    tree.set(MAX, "tile0/gt0/freq0/rp0_freq", "2000")  # the maximum is read once, with the identity
    set_card(tree, A770, "gt/gt0/rps_act_freq_mhz", "300")
    tree.set(MTL, "tile0/gt1/freq0/act_freq", "1050")  # the media GT wakes up
    second = by_pci(b.read())
    assert second[MAX].temperature_celsius == 71.5 and second[MAX].clock_hertz == (("graphics", 900e6),)
    assert second[A770].clock_hertz == (("graphics", 300e6),)
    assert second[MTL].clock_hertz == (("graphics", 1900e6), ("video", 1050e6))
    assert [d.identity for d in second.values()] == [d.identity for d in first.values()]


def test_i915_gt_directory_wins_and_legacy_card_files_are_the_fallback(tree):
    set_card(tree, A770, "gt_act_freq_mhz", "1800")  # differs from gt/gt0/rps_act_freq_mhz (2100)
    set_card(tree, A770, "gt_RP0_freq_mhz", "2350")
    arc = by_pci(backend(tree.root).read())[A770]
    assert arc.clock_hertz == (("graphics", 2100e6),) and arc.identity.clock_max_hertz == (("graphics", 2400e6),)
    shutil.rmtree(tree.device_dir(A770) / "drm" / "card1" / "gt")  # a kernel before 5.17: card-level files only
    arc = by_pci(backend(tree.root).read())[A770]
    assert arc.up and arc.clock_hertz == (("graphics", 1800e6),)
    assert arc.identity.clock_max_hertz == (("graphics", 2350e6),)


def test_garbage_and_oversized_numbers_are_absent_never_zero(tree):
    tree.set(A770, "hwmon:energy1_input", HUGE)
    tree.set(A770, "hwmon:power1_max", "abc")
    set_card(tree, A770, "gt/gt0/rps_act_freq_mhz", str(2**64))  # one past u64
    tree.set(MAX, "hwmon:temp2_input", "-5")
    tree.set(MAX, "hwmon:temp3_input", "12.5")
    tree.set(MAX, "tile0/gt0/freq0/rp0_freq", "fast")  # at identification: no maximum, the rest known
    tree.set(MAX, "tile1/physical_vram_size_bytes", HUGE)  # one tile unknown: the total is unknown, not 64 GiB
    add_intel(tree, battlemage(pci=BMG, card=5))
    tree.set(BMG, "hwmon:energy2_input", "")
    (tree.device_dir(MTL) / "tile0" / "gt0" / "freq0" / "act_freq").write_bytes(b"\xff\xfe7\n")  # not ASCII
    b = backend(tree.root)
    for _ in range(2):  # the second refresh has a previous one: still no power from garbage
        got = by_pci(b.read())
        arc, mx, mtl, bmg = got[A770], got[MAX], got[MTL], got[BMG]
        assert arc.up and mx.up and mtl.up and bmg.up
        assert arc.energy_joules is None and arc.power_watts is None and arc.power_limit_watts is None
        assert arc.clock_hertz == () and arc.identity.clock_max_hertz == (("graphics", 2400e6),)
        assert mx.temperature_celsius is None and mx.memory_temperature_celsius is None
        assert mx.identity.clock_max_hertz == () and mx.clock_hertz == (("graphics", 1550e6),)
        assert mx.memory_total_bytes is None and mx.energy_joules == 500000.0
        assert bmg.energy_joules is None and bmg.power_watts is None and bmg.power_limit_watts == 150.0
        assert mtl.clock_hertz == (("video", 0.0),)


def test_a_card_without_its_hwmon_has_those_values_absent(tree):
    shutil.rmtree(hwmon_dir(tree, MAX))
    shutil.rmtree(tree.device_dir(A770) / "hwmon" / "hwmon2")  # only the per-GT i915_gt0 is left
    b = backend(tree.root)
    for _ in range(2):
        got = by_pci(b.read())
        mx, arc = got[MAX], got[A770]
        assert mx.up and arc.up
        for d in (mx, arc):
            assert d.energy_joules is None and d.power_watts is None and d.power_limit_watts is None
            assert d.temperature_celsius is None and d.memory_temperature_celsius is None
        assert mx.clock_hertz == (("graphics", 1550e6),) and mx.memory_total_bytes == 128 * GIB
        assert arc.clock_hertz == (("graphics", 2100e6),)
        assert got[MTL].clock_hertz == (("graphics", 1900e6), ("video", 0.0))


# -- cards leaving and coming back -------------------------------------------------------------


def test_a_removed_card_is_down_under_its_index_and_comes_back(tree, log):
    logger, records = log
    b = backend(tree.root, log=logger)
    assert b.read().device_count == 3
    tree.remove(A770)
    reading = b.read()
    got = by_pci(reading)
    assert reading.success and reading.device_count == 2
    assert not got[A770].up and got[A770].identity.index == 1 and got[A770].identity.uuid == A770
    assert got[A770].identity.name == "Intel Arc A770 Graphics"  # the identity stays
    assert (got[MTL].up, got[MTL].identity.index, got[MAX].up, got[MAX].identity.index) == (True, 0, True, 2)
    assert "Intel GPU disappeared; reporting it down" in records.messages()
    add_intel(tree, arc_a770())
    reading = b.read()
    got = by_pci(reading)
    assert reading.device_count == 3 and [d.identity.index for d in reading.devices] == [0, 1, 2]
    assert got[A770].up and got[A770].identity.index == 1 and got[A770].energy_joules == 123456.789


def test_a_new_card_gets_the_next_free_index(tmp_path):
    tree = FakeSysfs(tmp_path / "sys")
    add_intel(tree, arc_a770())
    add_intel(tree, max_1550())
    b = backend(tree.root)
    assert {p: d.identity.index for p, d in by_pci(b.read()).items()} == {A770: 0, MAX: 1}
    add_intel(tree, meteor_lake())  # hot-added at a lower PCI address
    assert {p: d.identity.index for p, d in by_pci(b.read()).items()} == {A770: 0, MAX: 1, MTL: 2}


def test_no_drm_class_fails_the_read_and_keeps_the_cards_down(tree):
    b = backend(tree.root)
    b.read()
    os.rename(tree.root / "class" / "drm", tree.root / "class" / "drm.gone")
    reading = b.read()
    assert not reading.success and [(d.identity.index, d.up) for d in reading.devices] == [(0, False), (1, False), (2, False)]


def test_explicit_intel_without_a_card_is_a_startup_error(tmp_path):
    FakeSysfs(tmp_path / "sys").add(rx7900())
    with pytest.raises(BackendError, match="no card of the xe or i915 driver"):
        make_backend("intel", logging.getLogger("t"), 5.0, GpuOptions(sysfs=str(tmp_path / "sys")))
    with pytest.raises(BackendError, match="cannot list it"):
        make_backend("intel", logging.getLogger("t"), 5.0, GpuOptions(sysfs=str(tmp_path / "nothing")))


# -- DRM client usage stats: busy time, utilization, processes --------------------------------


def test_busy_time_utilization_and_processes_from_fdinfo(tree, proc):
    arc_vram, max_vram = 3 * GIB + 12345, 768 * MIB  # printed in bytes and in MiB
    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=5_000_000_000, local0_bytes=arc_vram), node="renderD129")
    proc.add_fd(100, 6, "socket:[4242]")
    proc.add_process(200, "infer")
    proc.add_drm_fd(200, 9, xe_client(MAX, 3, rcs_cycles=1000, rcs_total=10_000, vram0_bytes=max_vram), node="renderD130")
    proc.add_process(300, "media")
    proc.add_drm_fd(300, 4, xe_client(MTL, 1, rcs_cycles=0, rcs_total=500), node="renderD128")  # integrated: no VRAM
    clock = Clock()
    b = backend(tree.root, clock, procfs=proc.root, processes=True)
    got = by_pci(b.read())
    arc, mx, mtl = got[A770], got[MAX], got[MTL]
    # first sight of an i915 client: all the time it was busy; xe cycles: a baseline only
    assert dict(arc.busy_seconds) == {"compute": 0.0, "copy": 0.0, "render": 5.0, "video": 0.0, "video-enhance": 0.0}
    assert dict(mx.busy_seconds) == {"compute": 0.0, "copy": 0.0, "render": 0.0, "video": 0.0, "video-enhance": 0.0}
    assert arc.utilization_ratio is None and mx.utilization_ratio is None  # no previous refresh
    assert [(p.pid, p.memory_bytes) for p in arc.process_list] == [(100, arc_vram)]  # drm-total-local0, exact
    assert [(p.pid, p.memory_bytes) for p in mx.process_list] == [(200, max_vram)]  # drm-total-vram0
    assert [(p.pid, p.memory_bytes) for p in mtl.process_list] == [(300, None)]  # no VRAM region: unknown, not 0
    assert (arc.processes, mx.processes, mtl.processes) == (1, 1, 1)
    assert all(p.utilization == () for d in (arc, mx, mtl) for p in d.process_list)
    clock.advance(2.0)
    proc.set_fdinfo(100, 5, i915_client(A770, 7, render_ns=6_000_000_000, copy_ns=200_000_000, local0_bytes=arc_vram))
    proc.set_fdinfo(200, 9, xe_client(MAX, 3, rcs_cycles=1300, rcs_total=11_000, vram0_bytes=max_vram))
    got = by_pci(b.read())
    arc, mx = got[A770], got[MAX]
    assert dict(arc.busy_seconds)["render"] == 6.0 and dict(arc.busy_seconds)["copy"] == 0.2
    assert arc.utilization_ratio == 0.5  # render: 1 s of 2 s, the busiest engine
    assert dict(mx.busy_seconds)["render"] == pytest.approx(0.6)  # 300 / 1000 cycles busy over 2 s
    assert mx.utilization_ratio == pytest.approx(0.3)
    assert dict(arc.process_list[0].utilization)["render"] == 0.5
    assert dict(mx.process_list[0].utilization)["render"] == pytest.approx(0.3)
    assert arc.process_list[0].memory_bytes == arc_vram
    # with no more growth: utilization 0, busy time kept
    clock.advance(2.0)
    got = by_pci(b.read())
    assert got[A770].utilization_ratio == 0.0 and dict(got[A770].busy_seconds)["render"] == 6.0


def test_an_engine_that_appears_does_not_bring_its_past_into_the_utilization(tree, proc):
    def client(client_id: int, **engines: int) -> dict[str, str]:
        return {"drm-driver": "i915", "drm-client-id": str(client_id), "drm-pdev": A770,
                **{f"drm-engine-{name}": f"{ns} ns" for name, ns in engines.items()}}

    proc.add_process(100, "player")
    proc.add_drm_fd(100, 5, client(7, render=1_000_000_000), node="renderD129")
    clock = Clock()
    b = backend(tree.root, clock, procfs=proc.root)
    b.read()
    clock.advance(2.0)
    proc.set_fdinfo(100, 5, client(7, render=1_500_000_000))
    proc.add_process(200, "compute")  # a new client with 100 s of compute behind it
    proc.add_drm_fd(200, 6, client(8, compute=100_000_000_000), node="renderD129")
    arc = by_pci(b.read())[A770]
    assert dict(arc.busy_seconds) == {"compute": 100.0, "render": 1.5}
    assert arc.utilization_ratio == 0.25  # render's 0.5 s of 2 s; compute's past is not this interval's
    clock.advance(2.0)
    proc.set_fdinfo(200, 6, client(8, compute=101_000_000_000))
    assert by_pci(b.read())[A770].utilization_ratio == 0.5  # compute: 1 s of 2 s, counted from now on


def test_without_the_processes_collector_the_list_is_absent_but_busy_time_is_there(tree, proc):
    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=5_000_000_000, local0_bytes=GIB), node="renderD129")
    arc = by_pci(backend(tree.root, procfs=proc.root, processes=False).read())[A770]
    assert arc.process_list is None
    assert dict(arc.busy_seconds)["render"] == 5.0 and arc.processes == 1


def test_a_process_whose_fds_cannot_be_read_makes_the_count_busy_time_and_utilization_unknown(tree, proc, monkeypatch):
    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=5_000_000_000, local0_bytes=GIB), node="renderD129")
    proc.add_process(200, "other-user")
    proc.add_drm_fd(200, 5, i915_client(A770, 8, render_ns=3_000_000_000, local0_bytes=GIB), node="renderD129")
    (proc.root / "300").mkdir()  # exited between the listing and the scan: no fd dir (ENOENT), not a refusal
    clock = Clock()
    b = backend(tree.root, clock, procfs=proc.root, processes=True)
    got = by_pci(b.read())
    assert got[A770].processes == 2 and got[MAX].processes == 0  # every fd dir read (or gone): known
    refused = str(proc.root / "200" / "fd")
    real = os.scandir

    def scandir(path="."):  # the fd directory is read with os.scandir (drm/fdinfo.py)
        if os.fspath(path) == refused:  # another user's process, no ptrace access: EACCES
            raise PermissionError(13, "Permission denied", refused)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    # the refused process is the busy one: what is visible would read as idle
    proc.set_fdinfo(200, 5, i915_client(A770, 8, render_ns=9_000_000_000, local0_bytes=GIB))
    clock.advance(10)  # 6 s of growth takes time: faster than the wall clock is a glitch
    got = by_pci(b.read())
    arc = got[A770]
    assert arc.up and arc.processes is None and got[MAX].processes is None and got[MTL].processes is None
    assert [p.pid for p in arc.process_list] == [100]  # the visible clients are still listed
    assert arc.busy_seconds == () and arc.utilization_ratio is None  # a part is not the whole: absent, not idle
    monkeypatch.setattr(os, "scandir", real)
    got = by_pci(b.read())
    assert got[A770].processes == 2 and dict(got[A770].busy_seconds)["render"] == 14.0  # nothing lost meanwhile


def test_a_procfs_that_is_not_the_hosts_makes_the_count_busy_time_and_utilization_unknown(tree, proc):
    from fake_fdinfo import CONTAINER_PID_NS

    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=5_000_000_000, local0_bytes=GIB), node="renderD129")
    proc.set_pid_namespace(1, CONTAINER_PID_NS)  # a container's own /proc: no hostPID
    arc = by_pci(backend(tree.root, procfs=proc.root, processes=True).read())[A770]
    assert arc.processes is None and got_none(arc) and [p.pid for p in arc.process_list] == [100]
    assert by_pci(backend(tree.root, procfs=proc.root).read())[MAX].processes is None  # not 0: unknown


def got_none(sample) -> bool:
    return sample.busy_seconds == () and sample.utilization_ratio is None


def test_a_card_without_clients_has_no_processes_and_no_busy_time(tree, proc):
    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=1_000_000), node="renderD129")
    got = by_pci(backend(tree.root, procfs=proc.root, processes=True).read())
    assert got[MAX].processes == 0 and got[MAX].process_list == () and got[MAX].busy_seconds == ()
    assert got[MAX].utilization_ratio is None


def test_without_procfs_busy_time_and_process_count_are_absent(tree, tmp_path):
    got = by_pci(backend(tree.root, procfs=tmp_path / "no-proc", processes=True).read())
    for d in got.values():
        assert d.up and d.busy_seconds == () and d.processes is None and d.process_list is None
        assert d.utilization_ratio is None
    assert got[A770].energy_joules == 123456.789  # the sysfs values are there


def test_clients_of_another_driver_are_not_counted_on_intel_cards(tree, proc):
    tree.add(rx7900(pci=AMD, card=5))
    proc.add_process(300, "rocm")
    proc.add_drm_fd(300, 3, amdgpu_client(AMD, 1, gfx_ns=9_000_000_000, vram_kib=1024), node="renderD133")
    # an amdgpu fdinfo naming an Intel card's address: not an i915 / xe client either
    proc.add_drm_fd(300, 4, amdgpu_client(A770, 2, gfx_ns=9_000_000_000, vram_kib=1024), node="renderD129")
    proc.add_process(100, "trainer")
    proc.add_drm_fd(100, 5, i915_client(A770, 7, render_ns=5_000_000_000, local0_bytes=GIB), node="renderD129")
    reading = backend(tree.root, procfs=proc.root, processes=True).read()
    got = by_pci(reading)
    assert AMD not in got and reading.device_count == 3
    arc = got[A770]
    assert [p.pid for p in arc.process_list] == [100] and arc.processes == 1
    assert "gfx" not in dict(arc.busy_seconds) and dict(arc.busy_seconds)["render"] == 5.0
    for pci in (MTL, MAX):
        assert got[pci].process_list == () and got[pci].busy_seconds == ()


# -- kernel errnos, through FUSE ---------------------------------------------------------------


@pytest.fixture
def fuse_tree(tree, tmp_path) -> Iterator[FuseTree]:
    yield from mounted(tree, tmp_path)


A770_ACT = "drm/card1/gt/gt0/rps_act_freq_mhz"  # i915 keeps its GT frequencies under the DRM card


def test_enodev_and_eio_take_that_card_down_alone(fuse_tree, log):
    ft = fuse_tree
    logger, records = log
    ft.rules({
        (MAX, "hwmon:energy1_input"): {"errno": "ENODEV"},  # the driver: no such device
        (A770, A770_ACT): {"errno": "EIO"},  # a wedged GPU: i915 answers EIO for everything
    })
    b = IntelBackend(logger, str(ft.mount), GpuOptions(procfs="/nonexistent/proc"), pci_ids_files=NO_IDS, clock=Clock())
    reading = bounded(b.read)
    got = by_pci(reading)
    assert not got[MAX].up and got[MAX].identity.uuid == MAX and got[MAX].identity.index == 2
    assert not got[A770].up and got[A770].identity.index == 1
    mtl = got[MTL]
    assert mtl.up
    assert mtl.clock_hertz == (("graphics", 1900e6), ("video", 0.0))
    assert reading.device_count == 3  # enumerated, answering or not
    for _ in range(3):  # still down, each refresh tries again; logged once per card
        got = by_pci(bounded(b.read))
        assert (got[MAX].up, got[A770].up, got[MTL].up) == (False, False, True)
    down = [r for r in records.records if r.getMessage() == "Intel GPU stopped answering; reporting it down"]
    assert sorted(r.resmon_fields["pci_bus_id"] for r in down) == [A770, MAX]  # type: ignore[attr-defined]
    assert ft.reads(MAX, "hwmon:energy1_input") == 4 and ft.reads(A770, A770_ACT) == 4
    ft.rules({})  # answering again: up with values, not identified again
    got = by_pci(bounded(b.read))
    assert got[MAX].up and got[MAX].energy_joules == 500000.0 and got[MAX].memory_total_bytes == 128 * GIB
    assert got[A770].up and got[A770].clock_hertz == (("graphics", 2100e6),)
    assert records.messages().count("Intel GPUs found") == 1 and "Intel GPU answers again" in records.messages()


def test_a_blocked_hwmon_file_downs_only_its_card_within_the_deadline(fuse_tree, log):
    ft = fuse_tree
    logger, records = log
    b = IntelBackend(logger, str(ft.mount), GpuOptions(procfs="/nonexistent/proc"), pci_ids_files=NO_IDS, clock=Clock(),
                     device_timeout=3.0)
    assert bounded(b.read).success
    ft.rules({(MAX, "hwmon:energy1_input"): {"hang": True}})  # a sensor file that never answers
    # the hang lasts until the rules are cleared: a read that returns at all was bounded by the
    # card's deadline (bounded() fails after 10 s)
    reading = bounded(b.read, timeout=10)
    got = by_pci(reading)
    assert not got[MAX].up and got[MAX].identity.uuid == MAX and got[MAX].identity.index == 2  # down alone
    assert got[A770].up and got[A770].clock_hertz == (("graphics", 2100e6),) and got[MTL].up
    assert not reading.success and reading.device_count == 3
    for _ in range(3):  # the hung read is not waited for again (that would take its 2.9 s deadline), nor started again
        started = time.monotonic()
        again = bounded(b.read, timeout=10)
        assert time.monotonic() - started < 1.5 and [d.up for d in again.devices] == [True, True, False]
    assert ft.reads(MAX, "hwmon:energy1_input") == 2
    assert records.messages().count("Intel GPU read in flight longer than --collect.timeout; reporting it down") == 1
    ft.rules({})
    deadline = time.monotonic() + 20
    while not (reading := bounded(b.read)).success and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reading.success and by_pci(reading)[MAX].up and "Intel GPU read returned" in records.messages()
    b.close()


def test_a_card_wedged_from_the_start_is_down_under_its_index(fuse_tree):
    ft = fuse_tree
    ft.rules({(A770, "uevent"): {"errno": "EIO"}})  # i915 answers EIO for every file of a wedged GPU
    b = IntelBackend(logging.getLogger("test.intel"), str(ft.mount), GpuOptions(procfs="/nonexistent/proc"),
                     pci_ids_files=NO_IDS, clock=Clock())
    reading = bounded(b.read)
    assert reading.device_count == 3
    got = by_pci(reading)
    assert [(d.identity.index, d.up) for d in reading.devices] == [(0, True), (1, False), (2, True)]
    assert got[A770].identity.uuid == A770 and got[A770].identity.drm_card == "card1"  # known without reading the card
    ft.rules({})
    got = by_pci(bounded(b.read))
    assert got[A770].up and got[A770].identity.index == 1 and got[A770].identity.name == "Intel Arc A770 Graphics"


def test_eacces_and_eopnotsupp_on_one_file_are_that_value_absent(fuse_tree):
    ft = fuse_tree
    ft.rules({
        (MAX, "hwmon:temp2_input"): {"errno": "EACCES"},
        (MAX, "hwmon:power1_max"): {"errno": "EOPNOTSUPP"},
        (A770, "hwmon:energy1_input"): {"errno": "EPERM"},  # runtime-suspended: not woken, not 0
        (A770, "hwmon:power1_max"): {"errno": "ENXIO"},  # the power firmware refuses: that value, not the card
    })
    b = IntelBackend(logging.getLogger("test.intel"), str(ft.mount), GpuOptions(procfs="/nonexistent/proc"),
                     pci_ids_files=NO_IDS, clock=Clock())
    got = by_pci(bounded(b.read))
    mx, arc = got[MAX], got[A770]
    assert mx.up and mx.temperature_celsius is None and mx.memory_temperature_celsius == 55.0
    assert mx.energy_joules == 500000.0 and mx.power_limit_watts is None
    assert arc.up and arc.energy_joules is None and arc.power_limit_watts is None
    assert arc.clock_hertz == (("graphics", 2100e6),)
    ft.rules({})
    got = by_pci(bounded(b.read))
    assert got[MAX].temperature_celsius == 48.0 and got[MAX].power_limit_watts == 600.0
    assert got[A770].energy_joules == 123456.789 and got[A770].power_limit_watts == 190.0


# -- end to end: the real CLI ------------------------------------------------------------------


@pytest.fixture
def intel(tmp_path: Path):
    """intel(*flags, root=...) -> a ready exporter on the fake sysfs, NVML absent."""
    yield from sysfs_exporters(tmp_path)


ARC_VRAM = 3 * GIB + 12345
TRAINER, INFER = 4242, 4343


def _clients(proc: FakeProc, render_ns: int = 7_000_000_000) -> None:
    proc.add_process(TRAINER, "trainer")
    proc.add_drm_fd(TRAINER, 5, i915_client(A770, 11, render_ns=render_ns, local0_bytes=ARC_VRAM), node="renderD129")
    proc.add_process(INFER, "infer")
    proc.add_drm_fd(INFER, 6, xe_client(MAX, 12, rcs_cycles=100, rcs_total=1000, vram0_bytes=2 * GIB), node="renderD130")


def test_scrape_maps_the_cards_busy_time_and_processes(intel, tree, proc):
    _clients(proc)
    before = time.monotonic()  # before any scan of the exporter's
    exporter = intel("--gpu.backend=intel", f"--path.procfs={proc.root}", "--collector.processes",
                     "--collect.cache-ttl=0", root=tree.root)
    s = exporter.scrape()
    mtl, arc, mx = ({"gpu": str(i), "uuid": p} for i, p in enumerate((MTL, A770, MAX)))
    assert s.value("resmon_gpu_backend_info", backend="intel") == 1 and s.value("resmon_gpu_devices") == 3
    names = {}
    for labels, value in s.series("resmon_gpu_info"):
        assert value == 1 and labels["backend"] == "intel" and labels["driver_version"]
        assert labels["uuid"] == labels["pci_bus_id"]
        names[labels["gpu"]] = labels["name"]
    assert names == {"0": "Intel Arc Graphics (Meteor Lake)", "1": "Intel Arc A770 Graphics", "2": "Intel Data Center GPU Max 1550"}
    assert [s.value("resmon_gpu_up", **d) for d in (mtl, arc, mx)] == [1, 1, 1]
    assert s.value("resmon_gpu_energy_joules_total", **arc) == 123456.789
    assert not s.has("resmon_gpu_energy_joules_total", **mtl)  # integrated: no hwmon, absent (not 0)
    assert s.value("resmon_gpu_power_limit_watts", **arc) == 190.0 and not s.has("resmon_gpu_power_limit_watts", **mtl)
    assert s.value("resmon_gpu_temperature_celsius", **mx) == 48.0 and s.value("resmon_gpu_memory_temperature_celsius", **mx) == 55.0
    assert not s.has("resmon_gpu_temperature_celsius", **arc)  # no sensor: absent, not 0
    assert s.value("resmon_gpu_memory_total_bytes", **mx) == 128 * GIB and not s.has("resmon_gpu_memory_total_bytes", **arc)
    assert not s.series("resmon_gpu_memory_used_bytes")
    assert s.value("resmon_gpu_clock_hertz", clock="video", **mtl) == 0.0
    assert s.value("resmon_gpu_clock_max_hertz", clock="graphics", **arc) == 2400e6
    assert s.value("resmon_gpu_busy_seconds_total", engine="render", **arc) == 7.0
    assert s.value("resmon_gpu_processes", **arc) == 1 and s.value("resmon_gpu_processes", **mtl) == 0
    # the fdinfo's VRAM to the byte
    assert s.value("resmon_gpu_process_memory_used_bytes", pid=str(TRAINER), **arc) == ARC_VRAM
    assert s.value("resmon_gpu_process_memory_used_bytes", pid=str(INFER), **mx) == 2 * GIB
    (labels, _), = s.series("resmon_gpu_process_memory_used_bytes", pid=str(TRAINER))
    assert labels["process"] == "trainer"
    assert s.value("resmon_collector_success", collector="gpu") == 1
    # a refresh with a previous one: per-process utilization per engine
    s = exporter.scrape()
    assert s.has("resmon_gpu_process_utilization_ratio", pid=str(TRAINER), engine="render", **arc)
    assert s.has("resmon_gpu_utilization_ratio", **arc) and s.has("resmon_gpu_power_watts", **arc)
    # the render engine busy far longer than the time between refreshes (drm/fdinfo.py, glitches):
    # held back a refresh (not added, no rate), then, as it stays, counted up to the wall time
    proc.set_fdinfo(TRAINER, 5, i915_client(A770, 11, render_ns=7_000_000_000 + 10**15, local0_bytes=ARC_VRAM))
    s = exporter.scrape()
    assert not s.has("resmon_gpu_process_utilization_ratio", pid=str(TRAINER), engine="render", **arc)
    assert s.value("resmon_gpu_busy_seconds_total", engine="render", **arc) == 7.0
    s = exporter.scrape()
    assert s.value("resmon_gpu_process_utilization_ratio", pid=str(TRAINER), engine="render", **arc) == 1.0
    assert s.value("resmon_gpu_utilization_ratio", **arc) == 1.0
    assert 7.0 < s.value("resmon_gpu_busy_seconds_total", engine="render", **arc) <= 7.0 + time.monotonic() - before
    # a card that leaves: down under its index
    tree.remove(MAX)
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", **mx) == 0 and s.value("resmon_gpu_devices") == 2 and s.value("resmon_gpu_up", **arc) == 1


def test_promtool_check_metrics_is_clean(intel, tree, proc):
    _clients(proc)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: scripts/test.sh installs Debian's prometheus package")
    exporter = intel("--gpu.backend=intel", f"--path.procfs={proc.root}", "--collector.processes",
                     "--collect.cache-ttl=0", root=tree.root)
    exporter.scrape()  # a second refresh: power and utilization series are there too
    status, _, body = exporter.request("/metrics")
    assert status == 200 and b"resmon_gpu_busy_seconds_total" in body and b"resmon_gpu_process_utilization_ratio{" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""


def test_auto_chooses_intel_when_only_intel_cards_are_there(intel, tree, proc):
    _clients(proc)
    exporter = intel(f"--path.procfs={proc.root}", root=tree.root)  # --gpu.backend=auto, no processes collector
    s = exporter.scrape()
    assert s.value("resmon_gpu_backend_info", backend="intel") == 1 and s.value("resmon_gpu_devices") == 3
    # busy time comes from the DRM clients without --collector.processes; no process series
    assert s.value("resmon_gpu_busy_seconds_total", gpu="1", engine="render") == 7.0
    assert not s.series("resmon_gpu_process_memory_used_bytes")
    line = next(l for l in exporter.stderr_lines if "GPU backend selected" in l)
    assert "backend=intel" in line and "nvml:" in line and "amdgpu: no amdgpu card" in line  # why the others were skipped


def test_auto_prefers_amdgpu_over_intel(intel, tmp_path):
    tree = FakeSysfs(tmp_path / "sys")
    tree.add(rx7900(pci=AMD, card=5))
    add_intel(tree, arc_a770())
    s = intel(root=tree.root).scrape()
    assert s.value("resmon_gpu_backend_info", backend="amdgpu") == 1 and not s.has("resmon_gpu_backend_info", backend="intel")
    assert s.value("resmon_gpu_devices") == 1


@pytest.mark.e2e
def test_explicit_intel_without_cards_exits_2_with_one_line(tmp_path):
    FakeSysfs(tmp_path / "sys").add(rx7900())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESMON_")}
    result = subprocess.run([sys.executable, "-m", "resmon_exporter", "--gpu.backend=intel", f"--path.sysfs={tmp_path / 'sys'}",
                             "--web.listen-address=127.0.0.1:0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("resmon-exporter: error: --gpu.backend=intel: no card of the xe or i915 driver under ")


def test_the_out_of_tree_i915_gives_local_memory_total_and_used(tree):
    flex = add_intel(tree, flex_170_dkms())
    b = backend(tree.root)
    got = by_pci(b.read())[flex.pci]
    assert got.identity.name == "Intel Data Center GPU Flex 170"
    assert (got.memory_total_bytes, got.memory_used_bytes, got.memory_free_bytes) == (16 * GIB, 6 * GIB, 10 * GIB)
    set_card(tree, flex.pci, "lmem_avail_bytes", str(4 * GIB))
    assert by_pci(b.read())[flex.pci].memory_used_bytes == 12 * GIB  # read on every refresh
    set_card(tree, flex.pci, "lmem_avail_bytes", str(17 * GIB))  # more free than there is: garbage
    got = by_pci(b.read())[flex.pci]
    assert got.memory_total_bytes == 16 * GIB and got.memory_used_bytes is None and got.memory_free_bytes is None
    assert by_pci(b.read())[A770].memory_used_bytes is None  # upstream i915: no local memory file


def test_benchmark_prints_the_refresh_cost_with_and_without_processes():
    result = subprocess.run([sys.executable, str(HERE.parent / "benchmarks" / "intel.py"), "--quick", "--gpus", "2",
                             "--processes", "20", "--fds", "5"], cwd=HERE.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("refresh cost, 2 Data Center GPU Max")
    assert [l.split()[0] for l in lines[2:]] == ["sysfs", "20", "the"] and lines[2].endswith("1x")


def test_an_i915_discrete_card_with_two_tiles_has_no_media_gt(tree):
    # i915 on a Data Center GPU Max numbers its tiles gt0 and gt1: gt1 is no media GT
    set_card(tree, A770, "gt/gt1/rps_act_freq_mhz", "1400")
    set_card(tree, A770, "gt/gt1/rps_RP0_freq_mhz", "1600")
    arc = by_pci(backend(tree.root).read())[A770]
    assert arc.clock_hertz == (("graphics", 2100e6),) and arc.identity.clock_max_hertz == (("graphics", 2400e6),)


def test_an_integrated_i915_gpu_has_its_media_gt_as_video(tmp_path):
    tree = FakeSysfs(tmp_path / "sys")
    board = arc_a770(pci=MTL, card=0)  # Meteor Lake on i915: gt1 is the media GT
    board.hwmon, board.other_hwmon = {}, {}
    board.card_files.update({"gt/gt1/rps_act_freq_mhz": "900", "gt/gt1/rps_RP0_freq_mhz": "1100"})
    add_intel(tree, board)
    got = by_pci(backend(tree.root).read())[MTL]
    assert got.clock_hertz == (("graphics", 2100e6), ("video", 900e6))
    assert got.identity.clock_max_hertz == (("graphics", 2400e6), ("video", 1100e6))


def test_a_hwmon_renumbered_by_a_driver_reload_is_found_again(tree, log):
    logger, records = log
    b = backend(tree.root, log=logger)
    assert by_pci(b.read())[MAX].energy_joules == 500000.0
    tree.renumber_hwmon(MAX, 9)  # reloaded between two refreshes: the card never left
    for _ in range(2):
        mx = by_pci(b.read())[MAX]
        assert mx.energy_joules == 500000.0 and mx.temperature_celsius == 48.0 and mx.power_limit_watts == 600.0
    assert records.messages().count("Intel GPU hwmon moved; reading it from its new directory") == 1


def test_replugs_at_new_addresses_do_not_grow_the_series_beyond_the_bound(tree, log):
    from resmon_exporter.backends.drm.tracker import DEPARTED_PER_GPU

    logger, records = log
    b = IntelBackend(logger, str(tree.root), GpuOptions(procfs="/nonexistent/proc"), pci_ids_files=NO_IDS, clock=Clock(),
                     forget_after=3600.0)
    assert len(b.read().devices) == 3
    pci = A770
    for i in range(50):  # the Arc replugged 50 times, each time at a new PCI address
        tree.remove(pci)
        pci = f"0000:{0x60 + i:02x}:00.0"
        add_intel(tree, arc_a770(pci=pci, card=100 + i))
        reading = b.read()
        assert len(reading.devices) <= 3 + DEPARTED_PER_GPU * 3, len(reading.devices)
    got = by_pci(reading)
    assert len(got) == 3 + DEPARTED_PER_GPU * 3 and sum(d.up for d in reading.devices) == 3 and got[pci].up
    assert got[MAX].identity.index == 2 and got[MTL].identity.index == 0  # the others keep theirs
    # nothing else is kept of the forgotten ones: their energy counters go too
    assert {k[0] for k in b._counters._state} <= set(got)  # type: ignore[attr-defined]
    dropped = [r for r in records.records if r.getMessage() == "Intel GPU gone for long; its series are dropped"]
    assert len(dropped) == 50 - DEPARTED_PER_GPU * 3


def test_intel_plugin_ids_and_process_pods_resolve_to_these_gpus(intel, tree, proc, kubelet, tmp_path):
    from fake_kubelet import Container, Device, Pod
    from workloads import CID, UID, container_logs, pod_logs, systemd_containerd

    _clients(proc)
    (proc.pid_dir(TRAINER) / "cgroup").write_text(systemd_containerd(UID, CID))  # the trainer runs in pod train-0
    logs = pod_logs(tmp_path / "pods", [("ml", "train-0", UID, ["trainer"])])
    links = container_logs(tmp_path / "containers", logs, [("ml", "train-0", UID, "trainer", CID)])
    kubelet.pods = [
        Pod("ml", "train-0", [Container("trainer", [Device("gpu.intel.com/i915", ["card1-0"])])]),  # the A770
        Pod("ml", "serve-0", [Container("server", [Device("gpu.intel.com/xe", ["card2-1"])])]),  # the Max, a share
        Pod("ml", "other", [Container("c", [Device("gpu.intel.com/i915", ["card9-0"])])]),  # not on this host
        Pod("ml", "fpga", [Container("c", [Device("example.com/fpga", ["card1-0"])])]),  # not a GPU resource
    ]
    kubelet.start()
    exporter = intel("--gpu.backend=intel", f"--path.procfs={proc.root}", "--collector.processes",
                     f"--kubernetes.pod-logs-dir={logs}", f"--kubernetes.container-logs-dir={links}",
                     f"--kubernetes.pod-resources-socket={kubelet.socket_path}", root=tree.root)
    s = exporter.wait_for(lambda s: [v for _, v in s.series("resmon_collector_success", collector="kubernetes")] == [1]
                          and len(s.series("resmon_gpu_allocation_info")) == 2
                          and s.series("resmon_gpu_process_memory_used_bytes", pod="train-0"))
    alloc = {(l["gpu"], l["uuid"], l["pod"], l["resource"], l["device_id"]) for l, _ in s.series("resmon_gpu_allocation_info")}
    assert alloc == {("1", A770, "train-0", "gpu.intel.com/i915", "card1-0"), ("2", MAX, "serve-0", "gpu.intel.com/xe", "card2-1")}
    (labels, value), = s.series("resmon_gpu_process_memory_used_bytes", pid=str(TRAINER))
    assert (labels["gpu"], labels["namespace"], labels["pod"], labels["container"], value) == ("1", "ml", "train-0", "trainer", ARC_VRAM)
