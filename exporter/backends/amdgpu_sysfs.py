"""AMD GPUs from the amdgpu driver's sysfs files: no subprocess, no ROCm, no device nodes.

Cards are the /sys/class/drm entries named ``card<N>`` (any number of digits: MI300X in CPX
mode has card192) whose device is a PCI device bound to amdgpu; connectors (card0-DP-1),
render nodes and compute partitions (amdgpu_xcp platform devices, which lack the amdgpu
attributes: they are part of their PCI card) are skipped. GPUs are ordered by PCI address
and keep their index while the exporter runs: a card that disappears stays, down, under
its index. Per card, identity (uuid, name, PCI address, max clocks, which attribute files
the board has, its KFD gpu_ids) is read once, when the card appears; each refresh then
reads only the value files the board has. Every read goes through exporter/sysfs_errors.py,
the one place errors are classified. The refresh runs on the monitor's GPU worker thread,
so a read that blocks on a hung GPU is bounded by --collect.timeout as a hung NVML call is.

Processes come from the KFD proc directory (/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>),
which lists host PIDs whatever PID namespace the exporter runs in.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from dataclasses import dataclass, field
from os.path import join

from .. import sysfs_errors as sysfs
from ..logs import fields
from ..samples import GpuIdentity, GpuProcess, GpuReading, GpuSample
from . import BackendError, GpuOptions

AMDGPU_IDS = "/usr/share/libdrm/amdgpu.ids"  # Debian's libdrm-common: "device, revision, name"
_CARD = re.compile(r"card\d+")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# value files read on every refresh, where the board has them
_DEVICE_VALUES = (
    "mem_info_vram_total", "mem_info_vram_used", "mem_info_gtt_total", "mem_info_gtt_used",
    "gpu_busy_percent", "mem_busy_percent", "pp_dpm_sclk", "pp_dpm_mclk",
)
_HWMON_VALUES = (
    "temp1_input", "temp2_input", "temp3_input", "power1_average", "power1_input", "power1_cap",
    "pwm1", "freq1_input", "freq2_input",
)


@dataclass(frozen=True, slots=True)
class Card:
    """A DRM card of the amdgpu driver, as discovery found it."""

    pci: str  # 0000:03:00.0, lower case
    device_dir: str  # the PCI device directory (symlinks resolved)


@dataclass(slots=True)
class _State:
    """What is known of one card: its identity and the files it has (read once)."""

    card: Card
    identity: GpuIdentity
    hwmon: str | None
    has: frozenset[str]  # names of the value files present, "hwmon/<name>" for hwmon ones
    gpu_ids: tuple[int, ...]  # KFD gpu_ids of the card (several with compute partitions)
    present: bool = True
    missing_max: frozenset[str] = field(default_factory=frozenset)  # max clocks still to read


def find_cards(sysfs_root: str) -> list[Card] | None:
    """The amdgpu cards, by PCI address; None when /sys/class/drm cannot be listed."""
    drm = join(sysfs_root, "class", "drm")
    names = sysfs.listdir(drm)
    if names is None:
        return None
    cards: dict[str, Card] = {}
    for name in names:
        if not _CARD.fullmatch(name):
            continue  # connectors (card0-DP-1), renderD128, version
        device = os.path.realpath(join(drm, name, "device"))
        pci = os.path.basename(device).lower()
        if not _PCI_ADDRESS.fullmatch(pci) or pci in cards:
            continue  # a compute partition's platform device: part of its PCI card
        # the driver link, not uevent: a readlink per card and refresh, no file opened
        driver = sysfs.link_name(join(device, "driver"))
        if driver is None:  # no link (odd trees): what uevent says
            try:
                driver = sysfs.uevent(sysfs.read(join(device, "uevent"), device)).get("DRIVER")
            except sysfs.Gone:
                continue  # removed while we looked
        if driver == "amdgpu":
            cards[pci] = Card(pci, device)
    return [cards[p] for p in sorted(cards)]


def load_ids(path: str) -> dict[tuple[str, str], str]:
    """libdrm's amdgpu.ids: (device id, revision) -> marketing name; empty where absent."""
    out: dict[tuple[str, str], str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = [p.strip() for p in line.split(",", 2)]
                if len(parts) == 3 and not line.startswith("#"):
                    out.setdefault((parts[0].upper(), parts[1].upper()), parts[2])  # libdrm: the first match
    except OSError:
        pass
    return out


class AmdgpuBackend:
    name = "amdgpu"

    def __init__(
        self, log: logging.Logger, sysfs_root: str = "/sys", options: GpuOptions | None = None, ids_file: str = AMDGPU_IDS
    ) -> None:
        self._log = log
        self._root = sysfs_root
        self._options = options or GpuOptions()
        self._ids_file = ids_file
        self._ids: dict[tuple[str, str], str] | None = None  # loaded when a card needs a name
        self._cards: dict[str, _State] = {}  # by PCI address, every card seen since start
        self._kfd_proc = join(sysfs_root, "class", "kfd", "kfd", "proc")
        self._driver_version = self._read_driver_version()

    def prepare(self) -> None:
        pass  # nothing slow: discovery is a directory listing

    def close(self) -> None:
        pass

    # -- identity, once per card --------------------------------------------------------

    def _read_driver_version(self) -> str:
        # DKMS builds have a module version; the in-tree driver goes with the kernel
        path = join(self._root, "module", "amdgpu", "version")
        try:
            return sysfs.read(path, os.path.dirname(path)) or platform.release()
        except sysfs.Gone:
            return platform.release()

    def _name(self, card: Card, product: str | None) -> str:
        if product:
            return product
        pci_id = sysfs.uevent(sysfs.read(join(card.device_dir, "uevent"), card.device_dir)).get("PCI_ID", "").upper()
        device = pci_id.partition(":")[2]
        revision = sysfs.read(join(card.device_dir, "revision"), card.device_dir) or ""
        revision = revision.lower().removeprefix("0x").upper().zfill(2)
        if self._ids is None:
            self._ids = load_ids(self._ids_file)
        return self._ids.get((device, revision)) or f"AMD GPU [{pci_id.lower() or 'unknown'}]"

    def _hwmon(self, device_dir: str) -> str | None:
        base = join(device_dir, "hwmon")
        for entry in sorted(sysfs.listdir(base, device_dir) or ()):
            path = join(base, entry)
            if sysfs.read(join(path, "name"), device_dir) == "amdgpu":
                return path
        return None

    def _kfd_gpu_ids(self) -> dict[str, tuple[int, ...]]:
        """PCI address -> KFD gpu_ids, from the KFD topology (several per card in CPX/DPX
        partition modes); empty without KFD."""
        nodes = join(self._root, "class", "kfd", "kfd", "topology", "nodes")
        out: dict[str, list[int]] = {}
        for node in sysfs.listdir(nodes) or ():
            path = join(nodes, node)
            try:
                gpu_id = sysfs.integer(sysfs.read(join(path, "gpu_id"), path))
                props = sysfs.properties(sysfs.read(join(path, "properties"), path))
            except sysfs.Gone:
                continue
            location = props.get("location_id")
            if not gpu_id or location is None:
                continue  # a CPU node (gpu_id 0)
            # location_id is the PCI bus << 8 | devfn, devfn = device << 3 | function
            pci = f"{props.get('domain', 0):04x}:{location >> 8:02x}:{(location >> 3) & 0x1F:02x}.{location & 0x7}"
            out.setdefault(pci, []).append(gpu_id)
        return {pci: tuple(sorted(ids)) for pci, ids in out.items()}

    def _identify(self, card: Card, index: int, gpu_ids: dict[str, tuple[int, ...]]) -> _State:
        d = card.device_dir
        unique = sysfs.read(join(d, "unique_id"), d)
        # the form rocminfo prints and ROCR_VISIBLE_DEVICES accepts; empty where the board has none
        uuid = f"GPU-{unique.lower()}" if unique and re.fullmatch(r"[0-9A-Fa-f]+", unique) else ""
        hwmon = self._hwmon(d)
        has = set(_DEVICE_VALUES).intersection(sysfs.listdir(d, d) or ())
        if hwmon is not None:
            has |= {f"hwmon/{n}" for n in set(_HWMON_VALUES).intersection(sysfs.listdir(hwmon, d) or ())}
        identity = GpuIdentity(index=index, uuid=uuid, name=self._name(card, sysfs.read(join(d, "product_name"), d)),
                               pci_bus_id=card.pci)
        state = _State(card, identity, hwmon, frozenset(has), gpu_ids.get(card.pci, ()),
                       missing_max=frozenset(k for k in ("pp_dpm_sclk", "pp_dpm_mclk") if k in has))
        self._max_clocks(state)
        return state

    def _max_clocks(self, state: _State) -> None:
        """The top pp_dpm level of each clock, read once (retried while the GPU answers
        EPERM, runtime-suspended)."""
        found = dict(state.identity.clock_max_hertz)
        still = set()
        for attr in state.missing_max:
            kind = "graphics" if attr == "pp_dpm_sclk" else "memory"
            _, top = sysfs.dpm_levels(sysfs.read(join(state.card.device_dir, attr), state.card.device_dir))
            if top is None:
                still.add(attr)
            else:
                found[kind] = top
        state.missing_max = frozenset(still)
        ordered = tuple((k, found[k]) for k in ("graphics", "memory") if k in found)
        if ordered != state.identity.clock_max_hertz:
            state.identity = GpuIdentity(state.identity.index, state.identity.uuid, state.identity.name,
                                         state.identity.pci_bus_id, ordered)

    def _sync(self, cards: list[Card]) -> None:
        """Identities for cards that appeared (or came back); cards that went are marked."""
        now = {c.pci for c in cards}
        fresh = [c for c in cards if c.pci not in self._cards or not self._cards[c.pci].present
                 or self._cards[c.pci].card != c]
        for pci, state in self._cards.items():
            if state.present and pci not in now:
                state.present = False
                self._log.warning("AMD GPU disappeared; reporting it down",
                                  extra=fields(pci_bus_id=pci, uuid=state.identity.uuid))
        if not fresh:
            return
        gpu_ids = self._kfd_gpu_ids()
        order = sorted(set(self._cards) | now)  # a vanished card keeps its place
        for card in fresh:
            try:
                self._cards[card.pci] = self._identify(card, order.index(card.pci), gpu_ids)
            except sysfs.Gone:
                continue  # removed while being identified: found again next refresh if back
        # a card inserted before others in PCI order moves them along
        for pci, state in self._cards.items():
            index = order.index(pci)
            if state.identity.index != index:
                ident = state.identity
                state.identity = GpuIdentity(index, ident.uuid, ident.name, ident.pci_bus_id, ident.clock_max_hertz)
        self._log.info("AMD GPUs found", extra=fields(cards=",".join(c.pci for c in fresh)))

    # -- the refresh --------------------------------------------------------------------

    def read(self) -> GpuReading:
        cards = find_cards(self._root)
        if cards is None:  # no DRM class at all: the driver stack is gone
            for state in self._cards.values():
                state.present = False
            return GpuReading(backend=self.name, success=False, driver_version=self._driver_version,
                              devices=self._devices({}))
        self._sync(cards)
        kfd = self._kfd_processes()
        samples: dict[str, GpuSample] = {}
        for card in cards:
            state = self._cards.get(card.pci)
            if state is None:
                continue
            try:
                samples[card.pci] = self._sample(state, kfd)
            except sysfs.Gone as exc:
                state.present = False  # identified again when it is back
                self._log.warning("AMD GPU stopped answering; reporting it down", extra=fields(error=str(exc)))
        return GpuReading(backend=self.name, success=True, device_count=len(samples),
                          driver_version=self._driver_version, devices=self._devices(samples))

    def _devices(self, samples: dict[str, GpuSample]) -> tuple[GpuSample, ...]:
        return tuple(samples.get(pci) or GpuSample(self._cards[pci].identity, up=False) for pci in sorted(self._cards))

    def _sample(self, state: _State, kfd: dict[int, dict[int, int]] | None) -> GpuSample:
        d, has, hwmon = state.card.device_dir, state.has, state.hwmon

        def dev(name: str) -> str | None:
            return sysfs.read(join(d, name), d) if name in has else None

        def mon(name: str) -> str | None:
            return sysfs.read(join(hwmon, name), d) if hwmon is not None and f"hwmon/{name}" in has else None

        if state.missing_max:
            self._max_clocks(state)
        total, used = sysfs.integer(dev("mem_info_vram_total")), sysfs.integer(dev("mem_info_vram_used"))
        valid = total is not None and used is not None and used <= total
        edge, junction = sysfs.scaled(mon("temp1_input"), 1000.0), sysfs.scaled(mon("temp2_input"), 1000.0)
        power = sysfs.scaled(mon("power1_average"), 1e6)
        if power is None:  # newer dGPUs (and MI300) have only the instantaneous sensor
            power = sysfs.scaled(mon("power1_input"), 1e6)
        pwm = sysfs.integer(mon("pwm1"))
        clocks = []
        for kind, hwmon_file, dpm in (("graphics", "freq1_input", "pp_dpm_sclk"), ("memory", "freq2_input", "pp_dpm_mclk")):
            hertz = sysfs.scaled(mon(hwmon_file), 1.0)
            if hertz is None:
                hertz, _ = sysfs.dpm_levels(dev(dpm))
            if hertz is not None:
                clocks.append((kind, hertz))
        count, plist = self._processes(state, kfd)
        return GpuSample(
            identity=state.identity,
            up=True,
            memory_total_bytes=total,
            memory_used_bytes=used if valid else None,
            memory_free_bytes=total - used if valid else None,  # type: ignore[operator]
            utilization_ratio=sysfs.percent_ratio(dev("gpu_busy_percent")),
            memory_utilization_ratio=sysfs.percent_ratio(dev("mem_busy_percent")),
            # MI300 has no edge sensor: its junction; an edge sensor that fails is absent, not replaced
            temperature_celsius=edge if "hwmon/temp1_input" in has else junction,
            junction_temperature_celsius=junction,
            memory_temperature_celsius=sysfs.scaled(mon("temp3_input"), 1000.0),
            power_watts=power,
            power_limit_watts=sysfs.scaled(mon("power1_cap"), 1e6),
            fan_speed_ratio=pwm / 255.0 if pwm is not None and pwm <= 255 else None,
            clock_hertz=tuple(clocks),
            gtt_total_bytes=sysfs.integer(dev("mem_info_gtt_total")),
            gtt_used_bytes=sysfs.integer(dev("mem_info_gtt_used")),
            processes=count,
            process_list=plist,
        )

    # -- processes ----------------------------------------------------------------------

    def _kfd_processes(self) -> dict[int, dict[int, int]] | None:
        """pid -> {gpu_id: VRAM bytes} for every KFD process, a gpu_id with a queue but no
        VRAM as 0; None without KFD (no ROCm compute on this kernel: counts absent)."""
        pids = sysfs.listdir(self._kfd_proc)
        if pids is None:
            return None
        out: dict[int, dict[int, int]] = {}
        for pid in pids:
            if not pid.isdecimal():
                continue
            path = join(self._kfd_proc, pid)
            try:
                entries = sysfs.listdir(path, path) or []
                usage: dict[int, int] = {}
                for entry in entries:
                    gpu_id = entry[5:]
                    if entry.startswith("vram_") and gpu_id.isdecimal():
                        vram = sysfs.integer(sysfs.read(join(path, entry), path))
                        if vram:
                            usage[int(gpu_id)] = vram
                if "queues" in entries:  # a process running kernels on a GPU with no VRAM of its own yet
                    queues = join(path, "queues")
                    for queue in sysfs.listdir(queues, path) or ():
                        gpu_id = sysfs.integer(sysfs.read(join(queues, queue, "gpuid"), path))
                        if gpu_id:
                            usage.setdefault(gpu_id, 0)
            except sysfs.Gone:
                continue  # exited while we looked
            if usage:
                out[int(pid)] = usage
        return out

    def _processes(
        self, state: _State, kfd: dict[int, dict[int, int]] | None
    ) -> tuple[int | None, tuple[GpuProcess, ...] | None]:
        if kfd is None or not state.gpu_ids:
            return None, None  # no KFD, or this card is not in its topology: unknown, not 0
        mine = []
        for pid in sorted(kfd):
            usage = kfd[pid]
            if any(g in usage for g in state.gpu_ids):
                mine.append(GpuProcess(pid, sum(usage.get(g, 0) for g in state.gpu_ids)))
        return len(mine), tuple(mine) if self._options.processes else None


def explicit_backend(log: logging.Logger, sysfs_root: str, options: GpuOptions | None) -> AmdgpuBackend:
    """--gpu.backend=amdgpu: there must be an amdgpu card now, or the exporter does not start."""
    cards = find_cards(sysfs_root)
    if not cards:
        where = join(sysfs_root, "class", "drm")
        raise BackendError(f"--gpu.backend=amdgpu: no card of the amdgpu driver under {where}"
                           + (" (cannot list it)" if cards is None else ""))
    return AmdgpuBackend(log, sysfs_root, options)
