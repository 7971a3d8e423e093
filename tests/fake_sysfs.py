"""A fake sysfs tree with the real shapes, for the amdgpu backend (--path.sysfs=<root>).

Like the kernel's: /class/drm/cardN are relative symlinks into the PCI device tree
(devices/pci0000:00/<bridge>/<bdf>/drm/cardN), each card's ``device`` links back to its PCI
device, whose ``driver`` links to bus/pci/drivers/<driver> and whose ``uevent`` says
DRIVER= and PCI_ID=; connectors (cardN-DP-1) and render nodes (renderD128) sit next to the
cards; hwmon lives in <bdf>/hwmon/hwmonM with name=amdgpu (rx7900 also has another hwmon
device, numbered first, that is not the GPU's); compute partitions are extra cards under
devices/platform/amdgpu_xcp.N and extra KFD nodes whose location_id has the partition's
node id ORed in, as the kernel does (kfd_partition); the KFD topology
(class/kfd/kfd/topology/nodes, location_id = bus << 8 | devfn, and the PCI domain) and proc
(class/kfd/kfd/proc/<pid>/vram_<gpu_id>) are there. Writes are atomic (rename), as a sysfs
read never sees half a value.

Boards: rx7900() a discrete card with a fan, mi300x() (no edge sensor, no fan, power1_input
only, FRU product name), apu() (no fan, no memory clock, small VRAM, large GTT, no unique_id).
The hwmon clocks (freq*_input, an average) differ from the starred pp_dpm level, as on real
boards, so a test can tell which one was used.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1024**3
MIB = 1024**2


@dataclass
class Board:
    pci: str  # 0000:03:00.0
    card: int  # the DRM minor: card<N>
    pci_id: str  # 1002:744C
    revision: str  # 0xc8
    gpu_id: int  # KFD
    device: dict[str, str] = field(default_factory=dict)  # files in the PCI device directory
    hwmon: dict[str, str] = field(default_factory=dict)  # files in hwmon/hwmonM
    hwmon_index: int = 0
    driver: str = "amdgpu"
    other_hwmon: dict[int, dict[str, str]] = field(default_factory=dict)  # hwmonM -> files: not amdgpu's


def rx7900(pci: str = "0000:03:00.0", card: int = 1, gpu_id: int = 47823) -> Board:
    return Board(pci, card, "1002:744C", "0xc8", gpu_id, device={
        "unique_id": "a4e8c1b26c2f0001",
        "mem_info_vram_total": str(24 * GIB), "mem_info_vram_used": str(3 * GIB),
        "mem_info_vis_vram_total": str(24 * GIB), "mem_info_vis_vram_used": str(GIB),
        "mem_info_gtt_total": str(32 * GIB), "mem_info_gtt_used": str(200 * MIB),
        "mem_info_vram_vendor": "hynix",
        "gpu_busy_percent": "87", "mem_busy_percent": "40",
        "pp_dpm_sclk": "0: 500Mhz\n1: 1950Mhz *\n2: 2500Mhz\n",
        "pp_dpm_mclk": "0: 96Mhz\n1: 456Mhz\n2: 772Mhz\n3: 1249Mhz *\n",
        "power_dpm_force_performance_level": "auto",
        "current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16",
    }, hwmon={
        "name": "amdgpu",
        "temp1_input": "61000", "temp1_label": "edge", "temp2_input": "75000", "temp2_label": "junction",
        "temp3_input": "70000", "temp3_label": "mem", "temp1_crit": "100000",
        "power1_average": "287000000", "power1_cap": "355000000", "power1_cap_max": "402000000",
        "pwm1": "102", "pwm1_enable": "2", "fan1_input": "1450",
        "freq1_input": "1948000000", "freq1_label": "sclk", "freq2_input": "1248000000", "freq2_label": "mclk",
        "in0_input": "900",
    }, hwmon_index=3, other_hwmon={0: {"name": "nvme", "temp1_input": "35000", "power1_average": "9000000"}})


def mi300x(pci: str = "0000:c3:00.0", card: int = 12, gpu_id: int = 2189) -> Board:
    return Board(pci, card, "1002:74A1", "0x00", gpu_id, device={
        "unique_id": "3e52f2a4b7c10d12", "product_name": "AMD Instinct MI300X", "serial_number": "692251001124",
        "mem_info_vram_total": str(192 * GIB), "mem_info_vram_used": str(150 * GIB),
        "mem_info_gtt_total": str(1024 * GIB), "mem_info_gtt_used": str(64 * MIB),
        "gpu_busy_percent": "100", "mem_busy_percent": "63",
        "pp_dpm_sclk": "0: 500Mhz\n1: 1300Mhz *\n2: 2100Mhz\n",
        "pp_dpm_mclk": "0: 900Mhz\n1: 1300Mhz *\n",
    }, hwmon={  # GC 9.4.3: no edge sensor, no fan, no average power
        "name": "amdgpu", "temp2_input": "58000", "temp2_label": "junction", "temp3_input": "49000", "temp3_label": "mem",
        "power1_input": "612000000", "power1_cap": "750000000",
        "freq1_input": "1302000000", "freq2_input": "1299000000",
    }, hwmon_index=7)


def apu(pci: str = "0000:05:00.0", card: int = 0, gpu_id: int = 60251) -> Board:
    return Board(pci, card, "1002:15D8", "0xc1", gpu_id, device={
        "mem_info_vram_total": str(512 * MIB), "mem_info_vram_used": str(300 * MIB),
        "mem_info_gtt_total": str(16 * GIB), "mem_info_gtt_used": str(3 * GIB),
        "gpu_busy_percent": "12",
        "pp_dpm_sclk": "0: 200Mhz *\n1: 1400Mhz\n",
    }, hwmon={  # no fan, no mclk, only the edge sensor; power1_average is the whole package
        "name": "amdgpu", "temp1_input": "48000", "temp1_label": "edge",
        "power1_average": "15000000", "freq1_input": "201000000", "in0_input": "700", "in1_input": "800",
    }, hwmon_index=1)


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.boards: dict[str, Board] = {}
        (root / "class" / "drm").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "drivers" / "amdgpu").mkdir(parents=True, exist_ok=True)
        (root / "module" / "amdgpu").mkdir(parents=True, exist_ok=True)
        (root / "class" / "drm" / "version").write_text("drm 1.1.0 20060810\n")
        self.kfd = root / "class" / "kfd" / "kfd"
        (self.kfd / "proc").mkdir(parents=True, exist_ok=True)
        self._node("0", 0, {"cpu_cores_count": 64, "simd_count": 0, "location_id": 0, "domain": 0})

    # -- shapes -------------------------------------------------------------------------

    def device_dir(self, pci: str) -> Path:
        domain, bus = pci.split(":")[:2]
        return self.root / "devices" / f"pci{domain}:00" / f"{domain}:00:{int(bus, 16) % 32:02x}.1" / pci

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))

    def write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text if text.endswith("\n") else text + "\n")
        os.replace(tmp, path)

    def _node(self, name: str, gpu_id: int, props: dict[str, int]) -> None:
        node = self.kfd / "topology" / "nodes" / name
        self.write(node / "gpu_id", str(gpu_id))
        self.write(node / "properties", "".join(f"{k} {v}\n" for k, v in props.items()))

    def add(self, board: Board) -> Board:
        self.boards[board.pci] = board
        d = self.device_dir(board.pci)
        d.mkdir(parents=True, exist_ok=True)
        driver = self.root / "bus" / "pci" / "drivers" / board.driver
        driver.mkdir(parents=True, exist_ok=True)
        self._link(d / "driver", driver)
        self.write(d / "uevent", f"DRIVER={board.driver}\nPCI_CLASS=38000\nPCI_ID={board.pci_id}\n"
                   f"PCI_SUBSYS_ID=1002:0B36\nPCI_SLOT_NAME={board.pci}\nMODALIAS=pci:v00001002d0000{board.pci_id[5:]}\n")
        self.write(d / "revision", board.revision)
        self.write(d / "vendor", "0x1002")
        for name, text in board.device.items():
            self.write(d / name, text)
        card = d / "drm" / f"card{board.card}"
        render = d / "drm" / f"renderD{128 + board.card}"
        for node in (card, render):
            node.mkdir(parents=True, exist_ok=True)
            self._link(node / "device", d)
            self.write(node / "uevent", f"MAJOR=226\nMINOR={board.card}\nDEVNAME=dri/{node.name}\n")
        connector = card / f"card{board.card}-DP-1"
        connector.mkdir(exist_ok=True)
        self.write(connector / "status", "disconnected")
        drm = self.root / "class" / "drm"
        for node in (card, render, connector):
            self._link(drm / node.name, node)
        for index, files in ((board.hwmon_index, board.hwmon), *board.other_hwmon.items()):
            if not files:
                continue
            hw = d / "hwmon" / f"hwmon{index}"
            for name, text in files.items():
                self.write(hw / name, text)
            self._link(hw / "device", d)
        if board.driver != "amdgpu":
            return board
        self.kfd_node(board.pci, board.gpu_id, render_minor=128 + board.card)
        return board

    def kfd_node(self, pci: str, gpu_id: int, location_or: int = 0, render_minor: int = 0) -> None:
        """A KFD topology node of a GPU: location_id = bus << 8 | devfn (| location_or), domain."""
        domain, bus, rest = pci.split(":")
        dev, fn = rest.split(".")
        location = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)
        self._node(str(len(list((self.kfd / "topology" / "nodes").iterdir()))), gpu_id,
                   {"cpu_cores_count": 0, "simd_count": 304, "location_id": location | location_or,
                    "domain": int(domain, 16), "drm_render_minor": render_minor})

    def kfd_partition(self, pci: str, node_id: int, gpu_id: int, high_bits: bool = False) -> None:
        """The KFD node of compute partition node_id (1..) of a card in CPX/DPX mode: the kernel
        ORs node_id into location_id (a reverted patch put it at bits 31:28: high_bits)."""
        self.kfd_node(pci, gpu_id, location_or=node_id << 28 if high_bits else node_id)

    def module_version(self, text: str) -> None:
        """/sys/module/amdgpu/version: a DKMS build of the driver (the in-tree one has none)."""
        self.write(self.root / "module" / "amdgpu" / "version", text)

    def add_partition(self, index: int, card: int) -> None:
        """An MI300 compute partition: a DRM card on a platform device without amdgpu's files."""
        d = self.root / "devices" / "platform" / f"amdgpu_xcp.{index}"
        self.write(d / "uevent", "")
        node = d / "drm" / f"card{card}"
        node.mkdir(parents=True, exist_ok=True)
        self._link(node / "device", d)
        self._link(self.root / "class" / "drm" / f"card{card}", node)

    def other_card(self, pci: str = "0000:00:02.0", card: int = 20, driver: str = "i915") -> None:
        """A card of another driver (an Intel iGPU): to be ignored."""
        self.add(Board(pci, card, "8086:4680", "0x0c", 0, driver=driver))

    # -- changes ------------------------------------------------------------------------

    def set(self, pci: str, name: str, text: str) -> None:
        """A device file ("gpu_busy_percent") or hwmon file ("hwmon:temp1_input")."""
        board = self.boards[pci]
        if name.startswith("hwmon:"):
            self.write(self.device_dir(pci) / "hwmon" / f"hwmon{board.hwmon_index}" / name[6:], text)
        else:
            self.write(self.device_dir(pci) / name, text)

    def renumber_hwmon(self, pci: str, index: int) -> None:
        """The driver was reloaded: the card's hwmon directory comes back under another number."""
        board = self.boards[pci]
        hwmon = self.device_dir(pci) / "hwmon"
        os.rename(hwmon / f"hwmon{board.hwmon_index}", hwmon / f"hwmon{index}")
        board.hwmon_index = index

    def remove(self, pci: str) -> None:
        """The card is unplugged: its class links and its device directory go."""
        board = self.boards[pci]
        for name in (f"card{board.card}", f"renderD{128 + board.card}", f"card{board.card}-DP-1"):
            (self.root / "class" / "drm" / name).unlink()
        shutil.rmtree(self.device_dir(pci))

    def process(self, pid: int, vram: dict[int, int], queues: tuple[int, ...] = ()) -> None:
        """A KFD process: VRAM bytes per gpu_id, and queues on gpu_ids."""
        d = self.kfd / "proc" / str(pid)
        self.write(d / "pasid", "32769")
        for gpu_id, amount in vram.items():
            self.write(d / f"vram_{gpu_id}", str(amount))
            self.write(d / f"sdma_{gpu_id}", "0")
        for n, gpu_id in enumerate(queues):
            self.write(d / "queues" / str(n) / "gpuid", str(gpu_id))
            self.write(d / "queues" / str(n) / "size", "4096")

    def end_process(self, pid: int) -> None:
        shutil.rmtree(self.kfd / "proc" / str(pid))


def standard(root: Path) -> FakeSysfs:
    """A discrete card (card1) and an MI300X numbered card12 with a compute partition (card13,
    KFD gpu_id 2190, node id 1 ORed into its location_id), and an Intel iGPU to be ignored."""
    tree = FakeSysfs(root)
    tree.add(rx7900())
    mi = tree.add(mi300x())
    tree.add_partition(0, 13)
    tree.kfd_partition(mi.pci, 1, 2190)
    tree.other_card()
    return tree
