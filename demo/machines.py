"""The demo's machines: what each one starts (a fake NVML scenario or a fake sysfs tree) and
how its values move. tick(t, dt) is called every few seconds with the seconds since the start
and since the previous tick; it rewrites the scenario file (the fake re-reads it) or the
sysfs files (the backends read them at each refresh)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from demo import rig  # noqa: F401  (tests/ on the import path)

import fake_intel  # noqa: E402
import fake_sysfs  # noqa: E402
import scenarios as sc  # noqa: E402
from fakenvml import GIB, MIB, Scenario, build_fake, gpu_keys, nvml_env  # noqa: E402

# XIDs injected by the NVML machines: the first soon after the start, then one a minute,
# cycling through these codes (an application's, an MMU fault, a reset channel, a contained
# ECC error, a row remapping event) over the GPUs that report XIDs.
XID_FIRST_S, XID_EVERY_S = 10.0, 60.0
XID_CODES = (13, 31, 43, 94, 63)
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap


def wave(t: float, period: float, phase: float = 0.0) -> float:
    """0..1, a sine of this period in seconds, shifted by phase (a fraction of the period)."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period + phase))


class Machine:
    """One simulated host. start() returns the exporter's environment and flags."""

    name = ""
    title = ""
    note = ""  # printed at start: what this run lacks

    def start(self, root: Path) -> tuple[dict[str, str], list[str]]:
        raise NotImplementedError

    def tick(self, t: float, dt: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Idempotent; safe after a failed start()."""


class NvmlMachine(Machine):
    """A fake libnvidia-ml.so.1 on a scenario file; XIDs appended to its event list."""

    xid_gpus: tuple[str, ...] = ()  # UUIDs of the GPUs that report XIDs

    def __init__(self) -> None:
        self.scenario: Scenario | None = None
        self.xids = 0

    def initial(self, root: Path) -> dict[str, Any]:
        raise NotImplementedError

    def moving(self, t: float, dt: float) -> dict[str, Any]:
        raise NotImplementedError

    def flags(self) -> list[str]:
        return []

    def start(self, root: Path) -> tuple[dict[str, str], list[str]]:
        lib = build_fake(root / "lib")
        values = self.initial(root)
        self.scenario = Scenario(root / "scenario.txt", values)
        self.scenario.update(**self.moving(0.0, 0.0))
        return nvml_env(lib, self.scenario), ["--gpu.backend=nvml", *self.flags()]

    def tick(self, t: float, dt: float) -> None:
        assert self.scenario is not None
        changes = self.moving(t, dt)
        if self.xid_gpus and t >= XID_FIRST_S + self.xids * XID_EVERY_S:
            # the fake delivers each entry of the cumulative list once, to a registered event set
            events = [e for e in str(self.scenario.values.get("xid_events", "")).split(",") if e]
            gpu = self.xid_gpus[(self.xids * 3) % len(self.xid_gpus)]
            changes["xid_events"] = ",".join([*events, f"{gpu}:{XID_CODES[self.xids % len(XID_CODES)]}"])
            self.xids += 1
        self.scenario.update(**changes)


def _energy(values: dict[str, Any], key: str, power_mw: int, dt: float, start: int = 0) -> int:
    """An energy counter (mJ) grown by power_mw over dt seconds."""
    return int(values.get(key, start)) + int(power_mw * dt)


class H100(NvmlMachine):
    """8 H100 SXM boards (tests/scenarios.py hopper_board); GPUs 0-3 train, 4-6 serve bursts,
    7 idles; GPU 3's power swings to its cap for 15 s a minute; real processes on GPUs 0 and 1
    attributed to two pods and a Slurm job (tests/gpu_users.py, with a fake kubelet)."""

    name = "h100"
    title = "8 x NVIDIA H100 80GB HBM3, processes of 2 pods and a Slurm job on GPUs 0-1"
    COUNT = 8
    LIMIT_MW = 700_000

    def __init__(self) -> None:
        super().__init__()
        self.users: Any = None
        self.xid_gpus = tuple(sc.board_uuid("hopper", i) for i in range(self.COUNT))

    def initial(self, root: Path) -> dict[str, Any]:
        values: dict[str, Any] = {"count": self.COUNT, "driver_version": sc.HEALTH_DRIVER_VERSION}
        for i in range(self.COUNT):
            values.update(sc.hopper_board(i))
            values.update(gpu_keys(
                i, memory_reserved=512 * MIB, power_limit_mw=self.LIMIT_MW, power_management_limit_mw=self.LIMIT_MW,
                max_clock__graphics=1980, max_clock__sm=1980, max_clock__memory=2619, max_clock__video=1545,
                clock__memory=2619, clock__video=1395, pstate=0, rc__nvmlDeviceGetFanSpeed=sc.NOT_SUPPORTED,
                energy_mj=10**9 + i * 10**7))
        try:
            from gpu_users import GpuUsers  # the fake kubelet needs grpcio and grpcio-tools
        except ImportError as e:
            self.note = f"no processes or pods ({e}: pip install -e '.[test]')"
            return values
        self.users = GpuUsers(root, (sc.board_uuid("hopper", 0), sc.board_uuid("hopper", 1)))
        values.update(self.users.scenario())
        return values

    def flags(self) -> list[str]:
        return self.users.args() if self.users is not None else []

    def moving(self, t: float, dt: float) -> dict[str, Any]:
        assert self.scenario is not None
        now = self.scenario.values
        changes: dict[str, Any] = {}
        for i in range(self.COUNT):
            if i < 4:  # training: high, slow
                util = 70 + 28 * wave(t, 40, i / 8)
            elif i < 7:  # inference: short bursts
                util = 90 * wave(t, 20, i / 3) ** 4
            else:  # idle
                util = 2 * wave(t, 30)
            swing = i == 3 and (t % 60) >= 45  # power at its cap, clocks held back
            power = self.LIMIT_MW - 10_000 if swing else int(70_000 + 5_500 * util)
            clock = 1410 if swing else (1980 if util > 5 else 345)
            u = round(util)
            used = {0: 61 * GIB, 1: 11 * GIB}.get(i, int((2 + 60 * util / 100) * GIB))
            changes.update(gpu_keys(
                i, util_gpu=u, util_memory=round(0.55 * util), samples__gpu=u, samples__memory=round(0.55 * util),
                power_mw=power, energy_mj=_energy(now, f"gpu.{i}.energy_mj", power, dt),
                temperature=round(30 + 0.45 * util + (8 if swing else 0)), memory_used=used,
                clock__graphics=clock, clock__sm=clock, clocks_event_reasons=SW_POWER_CAP if swing else 0))
            for link in range(sc.HOPPER_NVLINKS):  # KiB counters, growing with the load
                for way, rate in (("tx", 4_000), ("rx", 3_000)):
                    key = f"gpu.{i}.nvlink.{link}.{way}_kib"
                    changes[key] = int(now.get(key, 0)) + int(rate * util * dt)
        return changes

    def stop(self) -> None:
        if self.users is not None:
            self.users.stop()
            self.users = None


class Mig(NvmlMachine):
    """tests/scenarios.py profiling_machine: GPU 0 an H100 in MIG mode (two GPU instances,
    three compute instances), GPU 1 an H200 with GPM profiling, GPU 2 an A100 with MIG off;
    the GPM metrics and the utilization move."""

    name = "mig"
    title = "H100 in MIG mode, H200 with GPM profiling, A100 (MIG off)"

    def __init__(self) -> None:
        super().__init__()
        self.xid_gpus = (sc.board_uuid("hopper", 0),)
        self.base = sc.profiling_machine()

    def initial(self, root: Path) -> dict[str, Any]:
        values = {"driver_version": sc.HEALTH_DRIVER_VERSION, **self.base}
        for i, limit in enumerate((700_000, 700_000, 400_000)):
            values.update(gpu_keys(i, power_limit_mw=limit, energy_mj=10**9, memory_used=20 * GIB,
                                   rc__nvmlDeviceGetFanSpeed=sc.NOT_SUPPORTED))
        return values

    def moving(self, t: float, dt: float) -> dict[str, Any]:
        assert self.scenario is not None
        now = self.scenario.values
        changes: dict[str, Any] = {}
        for i in range(3):
            util = (55, 85, 30)[i] + 12 * math.sin(2 * math.pi * (t / 30 + i / 3))
            power = int(80_000 + 5_000 * util)
            changes.update(gpu_keys(i, util_gpu=round(util), power_mw=power, temperature=round(32 + 0.4 * util),
                                    energy_mj=_energy(now, f"gpu.{i}.energy_mj", power, dt)))
        scale = 0.6 + 0.4 * wave(t, 30)
        for key, value in self.base.items():  # every numeric GPM value of the H200 and the GPU instances
            if ".gpm." in key and isinstance(value, (int, float)):
                changes[key] = round(value * scale, 2)
        return changes


class SysfsMachine(Machine):
    backend = ""

    def __init__(self) -> None:
        self.tree: fake_sysfs.FakeSysfs | None = None

    def build(self, tree: fake_sysfs.FakeSysfs) -> None:
        raise NotImplementedError

    def start(self, root: Path) -> tuple[dict[str, str], list[str]]:
        self.tree = fake_sysfs.FakeSysfs(root / "sys")
        self.build(self.tree)
        self.tick(0.0, 0.0)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RESMON_", "FAKE_NVML_"))}
        return env, [f"--gpu.backend={self.backend}", f"--path.sysfs={self.tree.root}"]


RX7900, MI300X = "0000:03:00.0", "0000:c3:00.0"


class Amd(SysfsMachine):
    """tests/fake_sysfs.py standard(): a Radeon RX 7900 XTX and an Instinct MI300X (with a
    compute partition), beside an Intel iGPU the amdgpu backend leaves alone."""

    name = "amd"
    title = "AMD Radeon RX 7900 and AMD Instinct MI300X (amdgpu sysfs)"
    backend = "amdgpu"

    def build(self, tree: fake_sysfs.FakeSysfs) -> None:
        fake_sysfs.standard(tree.root)
        # standard() made its own FakeSysfs on the same root: take its boards for set()
        tree.boards.update({RX7900: fake_sysfs.rx7900(), MI300X: fake_sysfs.mi300x()})

    def tick(self, t: float, dt: float) -> None:
        tree = self.tree
        assert tree is not None
        rx = 60 + 38 * wave(t, 30)
        tree.set(RX7900, "gpu_busy_percent", str(round(rx)))
        tree.set(RX7900, "mem_busy_percent", str(round(0.5 * rx)))
        tree.set(RX7900, "mem_info_vram_used", str(int((2 + 0.18 * rx) * GIB)))
        tree.set(RX7900, "hwmon:power1_average", str(int((40 + 3.1 * rx) * 1e6)))
        tree.set(RX7900, "hwmon:temp1_input", str(int((35 + 0.4 * rx) * 1000)))
        tree.set(RX7900, "hwmon:temp2_input", str(int((45 + 0.45 * rx) * 1000)))
        mi = 100 * wave(t, 20, 0.25) ** 2
        tree.set(MI300X, "gpu_busy_percent", str(round(mi)))
        tree.set(MI300X, "mem_busy_percent", str(round(0.6 * mi)))
        tree.set(MI300X, "mem_info_vram_used", str(int((10 + 1.5 * mi) * GIB)))
        tree.set(MI300X, "hwmon:power1_input", str(int((150 + 5.5 * mi) * 1e6)))  # swings 150..700 W of 750
        tree.set(MI300X, "hwmon:temp2_input", str(int((40 + 0.35 * mi) * 1000)))


class Intel(SysfsMachine):
    """tests/fake_intel.py intel_host(): a Meteor Lake iGPU (xe), an Arc A770 (i915) and a
    Data Center GPU Max 1550 (xe, two tiles). Power comes from the energy counters."""

    name = "intel"
    title = "Intel Meteor Lake iGPU, Arc A770, Data Center GPU Max 1550 (i915/xe sysfs)"
    backend = "intel"

    def __init__(self) -> None:
        super().__init__()
        self.boards: tuple[fake_intel.IntelBoard, ...] = ()
        self.energy_uj = {"arc": 123_456_789_000, "max": 500_000_000_000}
        self.idle_ms = 1000.0

    def build(self, tree: fake_sysfs.FakeSysfs) -> None:
        self.boards = fake_intel.intel_host(tree)

    def tick(self, t: float, dt: float) -> None:
        tree = self.tree
        assert tree is not None
        igpu, arc, big = self.boards
        arc_w = 40 + 140 * wave(t, 30)
        big_util = wave(t, 40, 0.5)
        big_w = 150 + 400 * big_util
        self.energy_uj["arc"] += int(arc_w * dt * 1e6)
        self.energy_uj["max"] += int(big_w * dt * 1e6)
        self.idle_ms += (1 - big_util) * dt * 1000
        tree.set(arc.pci, "hwmon:energy1_input", str(self.energy_uj["arc"]))
        freq = str(round(600 + 1800 * wave(t, 30)))
        fake_intel.set_card(tree, arc.pci, "gt/gt0/rps_act_freq_mhz", freq)
        fake_intel.set_card(tree, arc.pci, "gt_act_freq_mhz", freq)
        tree.set(big.pci, "hwmon:energy1_input", str(self.energy_uj["max"]))
        tree.set(big.pci, "hwmon:temp2_input", str(int((40 + 30 * big_util) * 1000)))
        tree.set(big.pci, "tile0/gt0/freq0/act_freq", str(round(300 + 1300 * big_util)))
        tree.set(big.pci, "tile0/gt0/gtidle/idle_residency_ms", str(int(self.idle_ms)))
        tree.set(igpu.pci, "tile0/gt0/freq0/act_freq", str(round(400 + 1500 * wave(t, 15))))


MACHINES: dict[str, type[Machine]] = {m.name: m for m in (H100, Mig, Amd, Intel)}
