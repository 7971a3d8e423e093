"""The amdgpu backend in process, on a fake sysfs tree with the real shapes (tests/fake_sysfs.py),
and through FUSE (tests/fuse_sysfs.py) for the errnos and blocking reads of real sysfs."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from resmon_exporter import ResourceMonitor
from resmon_exporter.backends.drm import errors as sysfs
from resmon_exporter.backends import BackendError, GpuOptions, make_backend
from resmon_exporter.backends.amdgpu.sysfs import AmdgpuBackend, find_cards
from resmon_exporter.samples import GpuReading
from fake_fdinfo import CONTAINER_PID_NS, HOST_PID_NS, FakeProc, amdgpu_client
from fake_sysfs import GIB, MIB, FakeSysfs, apu, mi300x, rx7900, standard
from fuse_tree import FuseTree, bounded, mounted

HERE = Path(__file__).parent
RX, MI, APU = "0000:03:00.0", "0000:c3:00.0", "0000:05:00.0"
RX_UUID, MI_UUID = "GPU-a4e8c1b26c2f0001", "GPU-3e52f2a4b7c10d12"
HUGE = "9" * 400  # no sysfs number is that long: sysfs values are u64


def backend(root: Path, processes: bool = False, ids_file: str = "/nonexistent/amdgpu.ids", procfs: str = "/nonexistent/proc",
            clock: Callable[[], float] = time.monotonic) -> AmdgpuBackend:
    # procfs: where DRM client usage stats are read (with processes); none by default
    options = GpuOptions(processes=processes, procfs=procfs)
    return AmdgpuBackend(logging.getLogger("test.amdgpu"), str(root), options, ids_file=ids_file, clock=clock)


def by_pci(reading: GpuReading) -> dict:
    return {d.identity.pci_bus_id: d for d in reading.devices}


@pytest.fixture
def tree(tmp_path: Path) -> FakeSysfs:
    return standard(tmp_path / "sys")


# -- parsing --------------------------------------------------------------------------------


def test_pp_dpm_tables_current_and_highest_level():
    assert sysfs.dpm_levels("0: 500Mhz\n1: 1950Mhz *\n2: 2500Mhz\n") == (1950e6, 2500e6)
    # RDNA's sleep level: may be current, never the maximum
    assert sysfs.dpm_levels("S: 19Mhz *\n0: 500Mhz\n1: 2400Mhz\n") == (19e6, 2400e6)
    assert sysfs.dpm_levels("S: 2600Mhz\n0: 500Mhz\n1: 2400Mhz *\n") == (2400e6, 2400e6)  # whatever S says
    assert sysfs.dpm_levels("0: 96MHz\n1: 1249MHz\n") == (None, 1249e6)  # no level starred
    assert sysfs.dpm_levels("0: fast\n1: 1000Mhz *\n") == (None, None)  # garbage: nothing from it
    assert sysfs.dpm_levels("") == (None, None) and sysfs.dpm_levels(None) == (None, None)
    assert sysfs.dpm_levels(f"0: 500Mhz\n1: {HUGE}Mhz *\n") == (None, None)  # out of range: garbage


def test_numbers_garbage_and_out_of_range_are_absent():
    assert sysfs.integer("287000000") == 287000000
    for bad in ("", "abc", "-5", "1.5", "12 34", "\u0663", None):  # \u0663: an Arabic-Indic digit
        assert sysfs.integer(bad) is None, bad
    # sysfs numbers are u64: the largest is kept, anything past it is garbage
    assert sysfs.integer(str(2**64 - 1)) == 2**64 - 1
    for bad in (str(2**64), HUGE, "0" * 21 + "1"):
        assert sysfs.integer(bad) is None, bad
    assert sysfs.scaled(HUGE, 1e6) is None and sysfs.percent_ratio(HUGE) is None
    assert sysfs.properties(f"location_id {HUGE}\ndomain 1\n") == {"domain": 1}
    assert sysfs.percent_ratio("100") == 1.0 and sysfs.percent_ratio("0") == 0.0
    assert sysfs.percent_ratio("150") is None  # older kernels: not clamped into a false 100 %


# -- discovery and mapping ----------------------------------------------------------------


def test_discovery_takes_amdgpu_cards_by_pci_address_and_skips_the_rest(tree):
    tree.add(apu())
    cards = find_cards(str(tree.root))
    # card12 (past 9) is found; card1-DP-1, renderD*, the amdgpu_xcp partition card13, the
    # i915 card20 and the "version" file are not; ordered by PCI address, not card number
    assert [c.pci for c in cards] == [RX, APU, MI]
    assert [c.device_dir for c in cards] == [str(tree.device_dir(p)) for p in (RX, APU, MI)]
    names = sorted(os.listdir(tree.root / "class" / "drm"))
    assert {"card1-DP-1", "renderD129", "card13", "card20", "card12", "version"} <= set(names)


def test_three_boards_map_onto_the_contract_in_base_units(tree, tmp_path):
    tree.add(apu())
    ids = tmp_path / "amdgpu.ids"
    ids.write_text("# List of AMDGPU IDs\n\n1.0.0\n15D8,\tC1,\tAMD Radeon Vega 10 Graphics\n15D8,\tC1,\tsecond match\n")
    got = by_pci(backend(tree.root, ids_file=str(ids)).read())
    rx, mi, ap = got[RX], got[MI], got[APU]
    assert [d.identity.index for d in (rx, ap, mi)] == [0, 1, 2]
    # discrete card with a fan
    assert (rx.identity.uuid, rx.identity.name) == (RX_UUID, "AMD GPU [1002:744c]")  # no FRU, not in this ids file
    assert (rx.memory_total_bytes, rx.memory_used_bytes, rx.memory_free_bytes) == (24 * GIB, 3 * GIB, 21 * GIB)
    assert (rx.utilization_ratio, rx.memory_utilization_ratio) == (0.87, 0.40)
    assert (rx.temperature_celsius, rx.junction_temperature_celsius, rx.memory_temperature_celsius) == (61.0, 75.0, 70.0)
    assert (rx.power_watts, rx.power_limit_watts, rx.fan_speed_ratio) == (287.0, 355.0, 102 / 255)
    # hwmon's clocks (an average), not the starred pp_dpm level (1950 / 1249 MHz)
    assert rx.clock_hertz == (("graphics", 1948e6), ("memory", 1248e6))
    assert rx.identity.clock_max_hertz == (("graphics", 2500e6), ("memory", 1249e6))
    assert (rx.gtt_total_bytes, rx.gtt_used_bytes) == (32 * GIB, 200 * MIB)
    assert rx.energy_joules is None and rx.performance_state is None and rx.throttle_reasons is None
    # MI300X: no edge sensor (junction instead), no fan, only instantaneous power, FRU name
    assert (mi.identity.uuid, mi.identity.name) == (MI_UUID, "AMD Instinct MI300X")
    assert (mi.temperature_celsius, mi.junction_temperature_celsius, mi.memory_temperature_celsius) == (58.0, 58.0, 49.0)
    assert (mi.power_watts, mi.power_limit_watts, mi.fan_speed_ratio) == (612.0, 750.0, None)
    assert mi.memory_total_bytes == 192 * GIB
    # APU: no unique_id, name from libdrm's list (first match), no fan / mclk / mem busy / cap
    assert (ap.identity.uuid, ap.identity.name) == ("", "AMD Radeon Vega 10 Graphics")
    assert (ap.memory_total_bytes, ap.gtt_total_bytes) == (512 * MIB, 16 * GIB)
    assert ap.fan_speed_ratio is None and ap.memory_utilization_ratio is None and ap.power_limit_watts is None
    assert ap.clock_hertz == (("graphics", 201e6),) and ap.identity.clock_max_hertz == (("graphics", 1400e6),)
    assert ap.junction_temperature_celsius is None and ap.memory_temperature_celsius is None
    assert ap.power_watts == 15.0  # the package's socket power (docs/metrics.md says so)


def test_only_the_hwmon_device_named_amdgpu_is_the_gpus(tree):
    # rx7900's PCI device also has hwmon0 (name "nvme", 35 C, 9 W), listed before amdgpu's hwmon3
    assert (tree.device_dir(RX) / "hwmon" / "hwmon0" / "name").read_text() == "nvme\n"
    rx = by_pci(backend(tree.root).read())[RX]
    assert (rx.temperature_celsius, rx.power_watts) == (61.0, 287.0)


def test_driver_version_from_the_dkms_module_else_the_kernel(tree):
    assert backend(tree.root).read().driver_version == platform.release()  # in-tree driver: no version file
    tree.module_version("6.10.5")
    assert backend(tree.root).read().driver_version == "6.10.5"


def test_a_missing_driver_link_falls_back_to_uevent(tree):
    tree.other_card(pci="0000:00:04.0", card=21)  # an i915 card, its link gone too: still not amdgpu
    for pci in (RX, "0000:00:04.0"):
        (tree.device_dir(pci) / "driver").unlink()
    assert [c.pci for c in find_cards(str(tree.root))] == [RX, MI]  # DRIVER=amdgpu in uevent


def test_an_oversized_number_is_absent_and_the_card_stays_up(tree):
    tree.set(RX, "mem_info_vram_total", HUGE)  # a bytes file
    tree.set(RX, "hwmon:temp1_input", HUGE)  # a hwmon file
    tree.set(RX, "pp_dpm_mclk", f"0: 96Mhz\n1: {HUGE}Mhz *\n")  # a dpm table
    tree.set(MI, "hwmon:power1_input", str(2**64))
    got = by_pci(backend(tree.root).read())
    rx, mi = got[RX], got[MI]
    assert rx.up and mi.up
    assert rx.memory_total_bytes is None and rx.memory_used_bytes is None and rx.memory_free_bytes is None
    assert rx.temperature_celsius is None and rx.junction_temperature_celsius == 75.0
    assert rx.identity.clock_max_hertz == (("graphics", 2500e6),)  # the mclk table is garbage
    assert rx.clock_hertz == (("graphics", 1948e6), ("memory", 1248e6))  # hwmon's are fine
    assert rx.utilization_ratio == 0.87 and rx.gtt_total_bytes == 32 * GIB
    assert mi.power_watts is None and mi.memory_total_bytes == 192 * GIB


def test_pci_ids_fallback_and_clock_fallback_to_pp_dpm(tree):
    # without freq*_input the clocks come from the starred pp_dpm level
    hw = tree.device_dir(RX) / "hwmon" / "hwmon3"
    for name in ("freq1_input", "freq2_input", "power1_average"):
        (hw / name).unlink()
    tree.set(RX, "hwmon:power1_input", "199000000")  # and power from the instantaneous sensor
    rx = by_pci(backend(tree.root).read())[RX]
    assert rx.clock_hertz == (("graphics", 1950e6), ("memory", 1249e6))  # the starred levels
    assert rx.power_watts == 199.0


def test_values_change_between_refreshes_identity_does_not(tree):
    b = backend(tree.root)
    first = by_pci(b.read())[RX]
    tree.set(RX, "gpu_busy_percent", "3")
    tree.set(RX, "mem_info_vram_used", str(20 * GIB))
    tree.set(RX, "hwmon:temp1_input", "83500")
    tree.set(RX, "hwmon:pwm1", "255")
    tree.set(RX, "product_name", "renamed")  # identity is read once per card
    tree.set(RX, "pp_dpm_sclk", "0: 500Mhz *\n1: 3000Mhz\n")
    second = by_pci(b.read())[RX]
    assert (first.utilization_ratio, second.utilization_ratio) == (0.87, 0.03)
    assert (second.memory_used_bytes, second.memory_free_bytes) == (20 * GIB, 4 * GIB)
    assert (second.temperature_celsius, second.fan_speed_ratio) == (83.5, 1.0)
    assert second.identity == first.identity  # name and max clocks as first read


def test_garbage_values_are_absent_never_zero(tree):
    for name, text in (("gpu_busy_percent", "garbage"), ("mem_busy_percent", "250"), ("mem_info_vram_used", "-1"),
                       ("hwmon:temp1_input", ""), ("hwmon:power1_average", "12.5"), ("hwmon:pwm1", "300"),
                       ("hwmon:freq1_input", "\x00\x01"), ("pp_dpm_sclk", "nonsense"),
                       ("hwmon:power1_input", "199000000")):  # the board has power1_average: not used instead
        tree.set(RX, name, text)
    (tree.device_dir(RX) / "hwmon" / "hwmon3" / "temp2_input").write_bytes(b"\xff\xfe7\n")  # not ASCII
    tree.set(MI, "mem_info_vram_used", str(200 * GIB))  # more than the 192 GiB total: not believed
    got = by_pci(backend(tree.root).read())
    assert (got[MI].memory_total_bytes, got[MI].memory_used_bytes, got[MI].memory_free_bytes) == (192 * GIB, None, None)
    rx = got[RX]
    assert rx.up
    assert rx.utilization_ratio is None and rx.memory_utilization_ratio is None
    assert rx.memory_used_bytes is None and rx.memory_free_bytes is None and rx.memory_total_bytes == 24 * GIB
    assert rx.temperature_celsius is None and rx.junction_temperature_celsius is None  # no fallback for a failing edge
    assert rx.power_watts is None and rx.fan_speed_ratio is None
    assert rx.clock_hertz == (("memory", 1248e6),)  # graphics: freq1 garbage, then pp_dpm garbage


def test_card_removed_is_down_under_its_index_and_comes_back(tree):
    b = backend(tree.root)
    assert b.read().device_count == 2
    tree.remove(RX)
    reading = b.read()
    got = by_pci(reading)
    assert reading.success and reading.device_count == 1
    assert not got[RX].up and got[RX].identity.index == 0 and got[RX].identity.uuid == RX_UUID
    assert got[MI].up and got[MI].identity.index == 1  # the others are not renumbered
    tree.add(rx7900())
    got = by_pci(b.read())
    assert got[RX].up and got[RX].identity.index == 0 and got[RX].utilization_ratio == 0.87


def test_indices_never_shift_a_new_card_gets_the_next_free_one(tree):
    b = backend(tree.root)
    assert {p: d.identity.index for p, d in by_pci(b.read()).items()} == {RX: 0, MI: 1}  # PCI order at start
    tree.add(apu())  # hot-added at a lower PCI address than the MI300X
    reading = b.read()
    assert {p: d.identity.index for p, d in by_pci(reading).items()} == {RX: 0, MI: 1, APU: 2}
    assert [d.identity.index for d in reading.devices] == [0, 1, 2]  # listed by index
    tree.remove(RX)
    tree.remove(APU)
    got = by_pci(b.read())
    assert {p: (d.identity.index, d.up) for p, d in got.items()} == {RX: (0, False), MI: (1, True), APU: (2, False)}
    tree.add(apu())
    assert by_pci(b.read())[APU].identity.index == 2 and by_pci(b.read())[APU].up


def test_a_different_board_back_at_the_same_address_is_identified_again(tree):
    b = backend(tree.root)
    assert by_pci(b.read())[RX].identity.uuid == RX_UUID
    tree.remove(RX)
    assert not by_pci(b.read())[RX].up
    other = rx7900()
    other.device["unique_id"] = "a4e8c1b26c2f0099"
    other.device["product_name"] = "Radeon PRO W7900"
    tree.add(other)  # another board in the same slot
    rx = by_pci(b.read())[RX]
    assert rx.up and (rx.identity.uuid, rx.identity.name, rx.identity.index) == ("GPU-a4e8c1b26c2f0099", "Radeon PRO W7900", 0)


def test_max_clocks_unreadable_at_start_are_read_on_a_later_refresh(tree):
    tree.set(RX, "pp_dpm_sclk", "busy")  # as read() gives None for EPERM (runtime-suspended): see the FUSE test
    b = backend(tree.root)
    assert by_pci(b.read())[RX].identity.clock_max_hertz == (("memory", 1249e6),)
    tree.set(RX, "pp_dpm_sclk", "0: 500Mhz\n1: 1950Mhz *\n2: 2500Mhz\n")
    assert by_pci(b.read())[RX].identity.clock_max_hertz == (("graphics", 2500e6), ("memory", 1249e6))


def test_a_card_vanishing_mid_read_is_down(tree, monkeypatch):
    b = backend(tree.root)
    b.read()
    real = sysfs.read

    def vanishing(path: str, owner: str) -> str | None:
        if path.endswith("gpu_busy_percent") and RX in path:
            tree.remove(RX)  # unplugged between discovery and this read
        return real(path, owner)

    monkeypatch.setattr(sysfs, "read", vanishing)
    got = by_pci(b.read())
    assert not got[RX].up and got[MI].up


def test_a_hwmon_renumbered_by_a_driver_reload_is_found_again_and_logged(tree, log):
    logger, records = log
    b = AmdgpuBackend(logger, str(tree.root), GpuOptions(), ids_file="/nonexistent/amdgpu.ids")
    assert by_pci(b.read())[RX].temperature_celsius == 61.0
    tree.renumber_hwmon(RX, 9)  # a driver reload on a multi-GPU host: hwmon3 comes back as hwmon9
    for _ in range(2):
        rx = by_pci(b.read())[RX]
        assert (rx.temperature_celsius, rx.power_watts, rx.power_limit_watts) == (61.0, 287.0, 355.0)
        assert rx.fan_speed_ratio == 102 / 255 and rx.junction_temperature_celsius == 75.0
    moved = [r for r in records.records if r.getMessage() == "AMD GPU hwmon moved; reading it from its new directory"]
    assert len(moved) == 1 and moved[0].resmon_fields["hwmon"].endswith("hwmon9")  # type: ignore[attr-defined]


def test_departed_cards_follow_the_nvml_backends_rule():
    from resmon_exporter.backends.drm import tracker
    from resmon_exporter.backends.nvml import backend as nvml

    assert (tracker.DEPARTED_SECONDS, tracker.DEPARTED_PER_GPU) == (nvml.DEPARTED_SECONDS, nvml.DEPARTED_PER_GPU)


def test_replugs_at_new_addresses_do_not_grow_the_series_beyond_the_bound(tree, log):
    from resmon_exporter.backends.drm.tracker import DEPARTED_PER_GPU

    logger, records = log
    b = AmdgpuBackend(logger, str(tree.root), GpuOptions(), ids_file="/nonexistent/amdgpu.ids", forget_after=3600.0)
    assert len(b.read().devices) == 2
    pci = MI
    for i in range(50):  # the MI300X replugged 50 times, each time at a new PCI address
        tree.remove(pci)
        pci = f"0000:{0x40 + i:02x}:00.0"
        tree.add(mi300x(pci=pci, card=100 + i, gpu_id=5000 + i))
        reading = b.read()
        assert len(reading.devices) <= 2 + DEPARTED_PER_GPU * 2, len(reading.devices)
    got = by_pci(reading)
    assert len(got) == 2 + DEPARTED_PER_GPU * 2 and got[RX].up and got[RX].identity.index == 0 and got[pci].up
    assert sum(d.up for d in reading.devices) == 2
    assert len(b._cards._index) == len(got)  # type: ignore[attr-defined]  # nothing else kept of the forgotten ones
    dropped = [r for r in records.records if r.getMessage() == "AMD GPU gone for long; its series are dropped"]
    assert len(dropped) == 50 - DEPARTED_PER_GPU * 2


def test_a_departed_card_is_dropped_after_the_time_bound(tree, log):
    logger, records = log
    b = AmdgpuBackend(logger, str(tree.root), GpuOptions(), ids_file="/nonexistent/amdgpu.ids", forget_after=0.3)
    b.read()
    tree.remove(MI)
    assert not by_pci(b.read())[MI].up  # down under its index for a while
    deadline = time.monotonic() + 20
    while MI in by_pci(reading := b.read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(by_pci(reading)) == [RX] and reading.device_count == 1
    assert "AMD GPU gone for long; its series are dropped" in records.messages()
    tree.add(mi300x())  # back after it was forgotten: a new card, the next index
    assert by_pci(b.read())[MI].up and by_pci(b.read())[MI].identity.index == 2


def test_no_drm_class_fails_the_read_and_keeps_the_cards_down(tree):
    b = backend(tree.root)
    b.read()
    os.rename(tree.root / "class" / "drm", tree.root / "class" / "drm.gone")
    reading = b.read()
    assert not reading.success and [d.up for d in reading.devices] == [False, False]


def test_kfd_processes_per_gpu_with_partitions_and_queues(tree):
    tree.add(apu())
    # MI300X partitions: standard() has node id 1 ORed into location_id (gpu_id 2190); node id 2
    # at bits 31:28, as a reverted kernel patch did
    tree.kfd_partition(MI, 2, 2191, high_bits=True)
    tree.process(100, {47823: 2 * GIB, 2189: 0, 60251: 0})  # ROCm opens every GPU: VRAM 0 is not "on it"
    tree.process(101, {2189: GIB, 2190: 3 * GIB, 2191: 4 * GIB, 47823: 0})  # on three partitions: summed
    tree.process(102, {47823: 0}, queues=(47823,))  # running kernels before allocating
    (tree.kfd / "proc" / "not-a-pid").mkdir()
    got = by_pci(backend(tree.root, processes=True).read())
    assert got[RX].processes == 2 and [(p.pid, p.memory_bytes) for p in got[RX].process_list] == [(100, 2 * GIB), (102, 0)]
    assert got[MI].processes == 1 and [(p.pid, p.memory_bytes) for p in got[MI].process_list] == [(101, 8 * GIB)]
    assert got[APU].processes == 0 and got[APU].process_list == ()
    # the count is there without the processes collector; the list is not
    plain = by_pci(backend(tree.root).read())
    assert plain[RX].processes == 2 and plain[RX].process_list is None


def test_kfd_nodes_match_the_cards_domain_bus_and_device(tree):
    other = rx7900(pci="0001:03:00.0", card=30, gpu_id=7001)  # same bus and device as RX, PCI domain 1
    other.device["unique_id"] = "a4e8c1b26c2f0002"
    tree.add(other)
    tree.process(100, {7001: GIB})
    tree.process(101, {47823: 2 * GIB})
    got = by_pci(backend(tree.root, processes=True).read())
    assert [(p.pid, p.memory_bytes) for p in got["0001:03:00.0"].process_list] == [(100, GIB)]
    assert [(p.pid, p.memory_bytes) for p in got[RX].process_list] == [(101, 2 * GIB)]
    assert got[MI].processes == 0


def test_kfd_topology_is_scanned_again_when_it_appears_or_changes(tree):
    kfd, away = tree.root / "class" / "kfd", tree.root / "kfd.away"
    tree.process(100, {2189: GIB})
    os.rename(kfd, away)  # amdgpu up, KFD not yet (loaded later)
    b = backend(tree.root, processes=True)
    assert by_pci(b.read())[MI].processes is None
    os.rename(away, kfd)
    assert [p.pid for p in by_pci(b.read())[MI].process_list] == [100]
    # a compute-partition mode switch: the nodes re-created under the same names with new gpu_ids
    nodes = tree.kfd / "topology" / "nodes"
    for node in nodes.iterdir():
        gpu_id = int((node / "gpu_id").read_text())
        if gpu_id:
            tree.write(node / "gpu_id", str(gpu_id + 100000))
    tree.end_process(100)
    tree.process(101, {2189 + 100000: 2 * GIB})
    assert [(p.pid, p.memory_bytes) for p in by_pci(b.read())[MI].process_list] == [(101, 2 * GIB)]


def test_without_kfd_process_counts_are_absent_not_zero(tree):
    shutil.rmtree(tree.root / "class" / "kfd")
    got = by_pci(backend(tree.root, processes=True).read())
    assert got[RX].processes is None and got[RX].process_list is None


def test_drm_clients_add_graphics_processes_and_utilization_and_kfd_vram_wins(tree, tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.add_process(100)  # a ROCm process: KFD says 1 GiB, its render fd says 3 GiB (KFD wins)
    proc.add_drm_fd(100, 5, amdgpu_client(RX, 11, gfx_ns=0, vram_kib=3 * GIB // 1024))
    proc.add_process(200, comm="Xorg")  # a graphics client KFD does not know
    proc.add_drm_fd(200, 7, amdgpu_client(RX, 12, gfx_ns=0, vram_kib=256 * 1024))
    tree.process(100, {47823: GIB})
    now = [1000.0]
    b = backend(tree.root, processes=True, procfs=str(proc.root), clock=lambda: now[0])
    got = by_pci(b.read())[RX]
    assert [(p.pid, p.memory_bytes, p.utilization) for p in got.process_list] == [(100, GIB, ()), (200, 256 * MIB, ())]
    assert got.processes == 1  # the count stays KFD's (compute processes), with the processes collector on or off
    now[0] += 2.0
    proc.set_fdinfo(200, 7, amdgpu_client(RX, 12, gfx_ns=10**9, vram_kib=256 * 1024))
    got = by_pci(b.read())[RX]
    assert dict(got.process_list[1].utilization)["gfx"] == 0.5  # 1 s of gfx in 2 s
    # a container's own /proc: its pids are not KFD's (the host's), so nothing is merged
    proc.set_pid_namespace(1, CONTAINER_PID_NS)
    got = by_pci(b.read())[RX]
    assert [(p.pid, p.memory_bytes) for p in got.process_list] == [(100, GIB)] and got.processes == 1
    proc.set_pid_namespace(1, HOST_PID_NS)
    # without KFD the DRM clients are still listed, but their count is unknown: /proc may be a container's own
    shutil.rmtree(tree.root / "class" / "kfd")
    got = by_pci(backend(tree.root, processes=True, procfs=str(proc.root)).read())[RX]
    assert got.processes is None and [p.pid for p in got.process_list] == [100, 200]


# -- what a refresh touches ---------------------------------------------------------------

_EVENTS: list[tuple[str, tuple]] = []
_RECORDING = threading.Event()
_HOOKED: list[bool] = []
_WATCHED = ("open", "subprocess.Popen", "os.system", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec",
            "os.spawn", "pty.spawn")


def _audit(event: str, args: tuple) -> None:
    if _RECORDING.is_set() and event in _WATCHED:
        _EVENTS.append((event, args))


Recorder = Callable[[Callable[[], object]], list[tuple[str, tuple]]]


@pytest.fixture
def recorded() -> Iterator[Recorder]:
    """recorded(fn) -> the opens and process starts fn makes (this thread or any other).
    An audit hook cannot be removed once added, so it is added once per process, at the first
    test that asks, and records nothing outside recorded() calls of that test: the rest of
    the session pays one flag check per audit event."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)

    def record(fn: Callable[[], object]) -> list[tuple[str, tuple]]:
        _EVENTS.clear()
        _RECORDING.set()
        try:
            fn()
        finally:
            _RECORDING.clear()
        return list(_EVENTS)

    yield record
    _RECORDING.clear()
    _EVENTS.clear()


def test_a_refresh_spawns_nothing_and_reads_identity_once(tree, monkeypatch, recorded):
    monkeypatch.setenv("PATH", "")
    tree.process(100, {47823: GIB})
    b = backend(tree.root, processes=True)
    first = recorded(b.read)
    second = recorded(b.read)
    for events in (first, second):
        assert [e for e, _ in events if e != "open"] == []  # no process is started, ever
    opened = [str(args[0]) for e, args in second]
    assert opened and not [p for p in opened if p.endswith(("unique_id", "product_name", "uevent", "revision", "/name"))]
    assert any(p.endswith("gpu_busy_percent") for p in opened)
    # files the MI300X lacks are not tried on every refresh
    assert not any(MI in p and p.endswith(("temp1_input", "power1_average", "pwm1")) for p in opened)
    assert any(MI in p and p.endswith("power1_input") for p in opened)
    assert any(p.endswith("unique_id") for p in (str(args[0]) for _, args in first))
    # the KFD topology is scanned once; a steady refresh only lists its nodes
    assert any("topology" in str(args[0]) for _, args in first)
    assert not [p for p in opened if "topology" in p]


def test_an_unknown_gpu_id_rescans_the_topology_once(tree, recorded):
    b = backend(tree.root, processes=True)
    b.read()
    tree.process(100, {424242: GIB})  # a gpu_id no node has (a node being re-created, say)

    def topology_reads() -> int:
        return sum("topology" in str(args[0]) for _, args in recorded(b.read))

    assert topology_reads() > 0  # looked for once
    assert topology_reads() == 0  # not on every refresh


# -- the monitor, Mai API, explicit choice --------------------------------------------------


def test_mai_api_answers_the_same_shape_for_amd(tree):
    with ResourceMonitor(gpu_backend="amdgpu", sysfs=str(tree.root), collect_kubernetes=False, cache_ttl=0) as monitor:
        res = monitor.get_current_resources()
        gpus = monitor.get_gpus()
        can = monitor.can_load_model(20.0), monitor.can_load_model(0.01)
    assert set(res) == {"memory_percent", "cpu_percent", "available_memory_gb", "gpu_vram_gb", "gpu_total_vram_gb",
                        "gpu_used_vram_gb", "gpu_free_vram_gb", "gpu_utilization_percent", "gpu_temperature_c"}
    assert (res["gpu_total_vram_gb"], res["gpu_used_vram_gb"], res["gpu_free_vram_gb"], res["gpu_vram_gb"]) == (24.0, 3.0, 21.0, 21.0)
    assert (res["gpu_utilization_percent"], res["gpu_temperature_c"]) == (87.0, 61.0)
    assert [g["uuid"] for g in gpus] == [RX_UUID, MI_UUID]
    assert set(gpus[1]) == {"index", "uuid", "name", "up", "memory_total_bytes", "memory_used_bytes", "memory_free_bytes",
                            "utilization_ratio", "memory_utilization_ratio", "temperature_celsius", "power_watts"}
    assert gpus[1]["power_watts"] == 612.0 and gpus[1]["name"] == "AMD Instinct MI300X"
    assert can == (False, can[1]) and can[1] == (monitor.snapshot().host.memory_available_bytes / GIB >= 0.015)


def test_explicit_amdgpu_without_a_card_is_a_startup_error(tmp_path):
    FakeSysfs(tmp_path / "sys").other_card()
    with pytest.raises(BackendError, match="no card of the amdgpu driver"):
        make_backend("amdgpu", logging.getLogger("t"), 5.0, GpuOptions(sysfs=str(tmp_path / "sys")))
    with pytest.raises(BackendError, match="cannot list it"):
        make_backend("amdgpu", logging.getLogger("t"), 5.0, GpuOptions(sysfs=str(tmp_path / "nothing")))


# -- kernel errnos and a blocking read, through FUSE ----------------------------------------


@pytest.fixture
def fuse_tree(tree, tmp_path) -> Iterator[FuseTree]:
    yield from mounted(tree, tmp_path)


def test_kernel_errnos_are_absent_values_and_enodev_is_a_card_down(fuse_tree, log):
    ft = fuse_tree
    logger, records = log
    ft.rules({
        (RX, "hwmon:power1_average"): {"errno": "EPERM"},  # runtime-suspended: not woken, not 0
        (RX, "mem_busy_percent"): {"errno": "ENODATA"},
        (RX, "hwmon:freq2_input"): {"errno": "EOPNOTSUPP"},
        (RX, "pp_dpm_mclk"): {"errno": "EINVAL"},
        (RX, "hwmon:temp1_input"): {"errno": "EIO"},
        (RX, "gpu_busy_percent"): {"errno": "EBUSY"},
        (MI, "gpu_busy_percent"): {"errno": "ENODEV"},  # the driver: no such device
    })
    b = AmdgpuBackend(logger, str(ft.mount), GpuOptions(), ids_file="/nonexistent/amdgpu.ids")
    got = by_pci(bounded(b.read))
    rx, mi = got[RX], got[MI]
    assert rx.up and rx.memory_total_bytes == 24 * GIB and rx.junction_temperature_celsius == 75.0
    assert rx.power_watts is None and rx.memory_utilization_ratio is None and rx.utilization_ratio is None
    assert rx.temperature_celsius is None and rx.clock_hertz == (("graphics", 1948e6),)
    assert rx.identity.clock_max_hertz == (("graphics", 2500e6),)  # pp_dpm_mclk EINVAL at start
    assert not mi.up and mi.identity.uuid == MI_UUID
    for _ in range(4):  # a card that keeps answering ENODEV: down, logged once, not identified again
        assert not by_pci(bounded(b.read))[MI].up
    down = [r for r in records.records if r.getMessage() == "AMD GPU stopped answering; reporting it down"]
    assert [r.resmon_fields["pci_bus_id"] for r in down] == [MI]  # type: ignore[attr-defined]
    assert ft.reads(MI, "unique_id") == 1 and ft.reads(MI, "gpu_busy_percent") == 5  # one try a refresh
    assert records.messages().count("AMD GPUs found") == 1
    ft.rules({})  # the same backend: values back, the missing max clock read now
    got = by_pci(bounded(b.read))
    assert got[RX].power_watts == 287.0 and got[MI].up and got[MI].utilization_ratio == 1.0
    assert got[RX].identity.clock_max_hertz == (("graphics", 2500e6), ("memory", 1249e6))
    assert ft.reads(MI, "unique_id") == 1 and "AMD GPU answers again" in records.messages()


def test_a_blocked_sensor_file_downs_only_its_card_within_the_deadline(fuse_tree):
    ft = fuse_tree
    monitor = ResourceMonitor(gpu_backend="amdgpu", sysfs=str(ft.mount), collect_timeout=1.0, cache_ttl=0,
                              collect_kubernetes=False, collect_host=False)
    try:
        assert [g["up"] for g in monitor.get_gpus()] == [True, True]
        ft.rules({(RX, "gpu_busy_percent"): {"hang": True}})  # a hung SMU
        deadline = time.monotonic() + 20
        while True:  # the first refresh waits for the card up to its limit; a late one may serve the last reading
            started = time.monotonic()
            snap = monitor.snapshot()  # the scrape's deadline: --collect.timeout
            elapsed = time.monotonic() - started
            assert elapsed < 1.0 + 1.0, elapsed  # the scrape's deadline, not the hang (which never ends)
            if not by_pci(snap.gpu)[RX].up or time.monotonic() > deadline:
                break
        got = by_pci(snap.gpu)
        assert not got[RX].up and got[RX].identity.uuid == RX_UUID  # down alone, under its identity
        assert got[MI].up and got[MI].utilization_ratio == 1.0 and got[MI].power_watts == 612.0
        assert not snap.gpu_status.success  # a card not read: the collector did not succeed
        for _ in range(3):  # while the read hangs: the others fresh, no second read of the hung card
            again = monitor.snapshot()
            assert [d.up for d in again.gpu.devices] == [False, True] and not again.gpu_status.success
        assert ft.reads(RX, "gpu_busy_percent") == 2  # the first read, and the one hung read: no pile-up
        ft.rules({})  # the GPU answers again: read afresh
        deadline = time.monotonic() + 20
        # the snapshot waited for is the one asserted on: another taken after it may be a newer
        # refresh still settling (it failed so once, on Python 3.13 in a fresh-clone run)
        while not ((snap := monitor.snapshot()).gpu_status.success and [d.up for d in snap.gpu.devices] == [True, True]):
            assert time.monotonic() < deadline, (snap.gpu_status, [d.up for d in snap.gpu.devices])
            time.sleep(0.05)
    finally:
        monitor.close(drain=5.0)


def test_a_blocked_drm_listing_keeps_the_previous_cards_and_reads_them(fuse_tree, log):
    ft = fuse_tree
    logger, records = log
    b = AmdgpuBackend(logger, str(ft.mount), GpuOptions(), ids_file="/nonexistent/amdgpu.ids", device_timeout=4.0)
    assert bounded(b.read).success
    ft.rules({}, paths={"class/drm": {"hang": True}})  # the listing of /sys/class/drm blocks
    # the hang lasts until the rules are cleared: a read that returns at all did not wait for the
    # listing (bounded() fails after 10 s)
    reading = bounded(b.read, timeout=10)
    got = by_pci(reading)
    assert got[RX].up and got[MI].up and got[MI].utilization_ratio == 1.0  # the card set of the last listing
    assert reading.device_count == 2 and not reading.success
    started = time.monotonic()
    assert [d.up for d in bounded(b.read, timeout=10).devices] == [True, True]
    # the listing in flight is not waited for again (half the 4 s deadline), nor started again
    assert time.monotonic() - started < 1.0
    assert records.messages().count("listing /sys/class/drm is in flight; keeping the cards of the last listing") == 1
    ft.rules({})
    deadline = time.monotonic() + 20
    while not bounded(b.read).success and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bounded(b.read).success and "listing /sys/class/drm answers again" in records.messages()
    b.close()


def test_devices_counts_enumerated_cards_a_card_answering_enodev_included(fuse_tree, log):
    # NVML's count is nvmlDeviceGetCount (enumerated, answering or not): ResmonGpuMissing
    # compares resmon_gpu_devices with its past maximum, so a card that is there but answers
    # ENODEV must count, or the alert for a missing card fires for a card that is down
    ft = fuse_tree
    logger, _ = log
    b = AmdgpuBackend(logger, str(ft.mount), GpuOptions(), ids_file="/nonexistent/amdgpu.ids")
    assert bounded(b.read).device_count == 2
    ft.rules({(MI, "gpu_busy_percent"): {"errno": "ENODEV"}})
    reading = bounded(b.read)
    assert not by_pci(reading)[MI].up and by_pci(reading)[RX].up
    assert reading.device_count == 2, reading.device_count
    ft.rules({})
    ft.tree.remove(MI)  # gone from /sys/class/drm: no longer enumerated
    reading = bounded(b.read)
    assert reading.device_count == 1 and not by_pci(reading)[MI].up
