"""Intel boards for the fake sysfs tree (tests/fake_sysfs.py), in the kernel's shapes.

arc_a770(): discrete Arc A770 on i915 — hwmon "i915" (energy1_input µJ, power1_max PL1 µW,
power1_rated_max, power1_crit, curr1_crit, in0_input) and a per-GT hwmon "i915_gt0" that is not
the card's; GT frequencies under the DRM card (card<N>/gt/gt0/rps_*_freq_mhz, and the legacy
card<N>/gt_*_freq_mhz), no temperature file, no VRAM file.
max_1550(): Data Center GPU Max 1550 on xe, two tiles — tile<t>/physical_vram_size_bytes
(64 GiB each), tile0/gt0 and tile1/gt1 with freq0/{act,cur,rp0,rpn,min,max}_freq (MHz), hwmon
"xe" with energy1_input (card), power1_max, temp2_input (package) and temp3_input (VRAM).
meteor_lake(): integrated Xe (Meteor Lake) on xe — tile0 with gt0 (graphics) and gt1 (media),
no VRAM file, no hwmon (the drivers register one on discrete cards only).
battlemage(): Arc B580 on xe with the package's energy2_input and power2_max only.
flex_170_dkms(): Data Center GPU Flex 170 on Intel's out-of-tree i915, with local memory in
card<N>/lmem_total_bytes and lmem_avail_bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fake_sysfs import GIB, Board, FakeSysfs


@dataclass
class IntelBoard(Board):
    card_files: dict[str, str] = field(default_factory=dict)  # files under /sys/class/drm/card<N>


def arc_a770(pci: str = "0000:03:00.0", card: int = 1) -> IntelBoard:
    gt = {f"gt/gt0/rps_{k}_freq_mhz": v for k, v in
          {"act": "2100", "cur": "2150", "RP0": "2400", "RPn": "300", "max": "2400", "min": "300", "boost": "2400"}.items()}
    legacy = {"gt_act_freq_mhz": "2100", "gt_cur_freq_mhz": "2150", "gt_RP0_freq_mhz": "2400", "gt_RPn_freq_mhz": "300"}
    return IntelBoard(pci, card, "8086:56A0", "0x08", 0, driver="i915", hwmon={
        "name": "i915", "energy1_input": "123456789000", "power1_max": "190000000", "power1_rated_max": "225000000",
        "power1_crit": "400000000", "curr1_crit": "0", "in0_input": "950", "power1_max_interval": "28",
    }, hwmon_index=2, other_hwmon={3: {"name": "i915_gt0", "energy1_input": "99000000"}},
        card_files={**gt, **legacy})


def max_1550(pci: str = "0000:3a:00.0", card: int = 2) -> IntelBoard:
    device: dict[str, str] = {}
    for tile, gt in ((0, 0), (1, 1)):
        device[f"tile{tile}/physical_vram_size_bytes"] = str(64 * GIB)
        freq = {"act": "1550" if tile == 0 else "1200", "cur": "1600", "rp0": "1600", "rpn": "300", "min": "300", "max": "1600"}
        device.update({f"tile{tile}/gt{gt}/freq0/{k}_freq": v for k, v in freq.items()})
        device[f"tile{tile}/gt{gt}/gtidle/idle_residency_ms"] = "1000"
    return IntelBoard(pci, card, "8086:0BD5", "0x2f", 0, driver="xe", device=device, hwmon={
        "name": "xe", "energy1_input": "500000000000", "power1_max": "600000000", "power1_rated_max": "600000000",
        "power1_crit": "0", "curr1_crit": "0", "in1_input": "830", "temp2_input": "48000", "temp3_input": "55000",
    }, hwmon_index=4)


def meteor_lake(pci: str = "0000:00:02.0", card: int = 0) -> IntelBoard:
    device = {}
    for gt, (act, rp0) in enumerate((("1900", "2250"), ("0", "1100"))):  # the media GT asleep: act_freq 0
        device.update({f"tile0/gt{gt}/freq0/{k}_freq": v for k, v in {"act": act, "cur": act, "rp0": rp0, "rpn": "100"}.items()})
    # no hwmon: xe and i915 register one on discrete cards only
    return IntelBoard(pci, card, "8086:7D55", "0x08", 0, driver="xe", device=device)


def battlemage(pci: str = "0000:08:00.0", card: int = 4) -> IntelBoard:
    """Arc B580 on xe, a board with the package's files only: energy2_input, power2_max (PL1),
    and package and VRAM temperatures."""
    device = {"tile0/physical_vram_size_bytes": str(12 * GIB)}
    for gt, (act, rp0) in enumerate((("2850", "2850"), ("1400", "1600"))):
        device.update({f"tile0/gt{gt}/freq0/{k}_freq": v for k, v in {"act": act, "rp0": rp0}.items()})
    return IntelBoard(pci, card, "8086:E20B", "0x00", 0, driver="xe", device=device, hwmon={
        "name": "xe", "energy2_input": "7000000000", "power2_max": "150000000", "power2_rated_max": "190000000",
        "temp2_input": "41000", "temp3_input": "46000",
    }, hwmon_index=6)


def add_intel(tree: FakeSysfs, board: IntelBoard) -> IntelBoard:
    tree.add(board)
    d = tree.device_dir(board.pci)
    tree.write(d / "vendor", "0x8086")
    for name, text in board.card_files.items():
        tree.write(d / "drm" / f"card{board.card}" / name, text)
    return board


def set_card(tree: FakeSysfs, pci: str, name: str, text: str) -> None:
    """A file under the DRM card (i915's GT frequencies)."""
    board = tree.boards[pci]
    tree.write(tree.device_dir(pci) / "drm" / f"card{board.card}" / name, text)


def intel_host(tree: FakeSysfs) -> tuple[IntelBoard, IntelBoard, IntelBoard]:
    """The three boards on one host (card0 integrated, card1 Arc, card2 Max)."""
    return add_intel(tree, meteor_lake()), add_intel(tree, arc_a770()), add_intel(tree, max_1550())


def flex_170_dkms(pci: str = "0000:4d:00.0", card: int = 3) -> IntelBoard:
    """Data Center GPU Flex 170 on Intel's out-of-tree i915 (DKMS): local memory under the DRM
    card (lmem_total_bytes, lmem_avail_bytes), GT frequencies as upstream i915."""
    gt = {f"gt/gt0/rps_{k}_freq_mhz": v for k, v in {"act": "1950", "cur": "2050", "RP0": "2050", "RPn": "300"}.items()}
    return IntelBoard(pci, card, "8086:56C0", "0x08", 0, driver="i915", hwmon={
        "name": "i915", "energy1_input": "9000000000", "power1_max": "120000000",
    }, hwmon_index=5, card_files={**gt, "lmem_total_bytes": str(16 * GIB), "lmem_avail_bytes": str(10 * GIB),
                                  "prelim_uapi_version": "1.0"})
