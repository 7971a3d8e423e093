"""AMD GPUs from the amdgpu driver's sysfs files: no subprocess, no ROCm, no device nodes.

Cards are the /sys/class/drm entries named ``card<N>`` (any number of digits: MI300X in CPX
mode has card192) whose device is a PCI device bound to amdgpu; connectors (card0-DP-1),
render nodes and compute partitions (amdgpu_xcp platform devices, which lack the amdgpu
attributes: they are part of their PCI card) are skipped (drm/cards.py). Indices, cards
that leave and cards that stop answering are drm/tracker.py's, shared with the intel
backend. Per card, identity (uuid, name, PCI
address, max clocks, which attribute files the board has) is read once, when the card
appears (and again when it comes back after leaving /sys/class/drm); each refresh then
reads only the value files the board has. Every read goes through drm/errors.py, the one
place sysfs errors are classified. Each card is identified and read on a reader thread of
its own (drm/readers.py), bounded by --collect.timeout a little less: a card whose read blocks
(a hung SMU) is down alone while the others report, as a hung NVML GPU is; the /sys/class/drm
listing runs on its own reader too (drm/cards.py Listing: one that blocks keeps the last
listing's cards). A hwmon directory that vanished (a driver reload renumbers hwmon) is looked
for again. Cards that left are forgotten as NVML's departed GPUs are (drm/tracker.py).

Processes come from the KFD proc directory (/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>),
which lists host PIDs whatever PID namespace the exporter runs in. With --collector.processes
the DRM client usage stats of every process (drm/fdinfo.py) add graphics clients KFD does
not list and every process's engine utilization; where both report a process's VRAM, KFD's
figure wins (the kernel's own per-process accounting, readable without ptrace access).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import threading
import time
from dataclasses import dataclass, field, replace
from os.path import join
from typing import Callable

from ...samples import GpuIdentity, GpuProcess, GpuReading, GpuSample
from ..base import GpuOptions
from ..drm import errors as sysfs
from ...logs import fields
from ..drm.cards import Card, Listing
from ..drm.cards import find_cards as drm_cards
from ..drm.cards import require_cards
from ..drm.fdinfo import DeviceUsage, DrmUsage
from ..drm.readers import device_limit
from ..drm.tracker import DEPARTED_SECONDS, CardTracker

AMDGPU_IDS = "/usr/share/libdrm/amdgpu.ids"  # Debian's libdrm-common: "device, revision, name"
_DRIVERS = frozenset({"amdgpu"})
# value files read on every refresh, where the board has them
_DEVICE_VALUES = (
    "mem_info_vram_total", "mem_info_vram_used", "mem_info_gtt_total", "mem_info_gtt_used",
    "gpu_busy_percent", "mem_busy_percent", "pp_dpm_sclk", "pp_dpm_mclk",
)
_HWMON_VALUES = (
    "temp1_input", "temp2_input", "temp3_input", "power1_average", "power1_input", "power1_cap",
    "pwm1", "freq1_input", "freq2_input",
)


@dataclass(slots=True)
class _State:
    """What is known of one card: its identity and the files it has (read once)."""

    card: Card
    identity: GpuIdentity
    hwmon: str | None
    has: frozenset[str]  # names of the value files present, "hwmon/<name>" for hwmon ones
    missing_max: frozenset[str] = field(default_factory=frozenset)  # max clocks still to read


_PciKey = tuple[int, int, int]  # PCI domain, bus, device: what a KFD node's location says of its card


def _pci_key(pci: str) -> _PciKey:
    domain, bus, rest = pci.split(":")
    return int(domain, 16), int(bus, 16), int(rest.partition(".")[0], 16)


def find_cards(sysfs_root: str) -> list[Card] | None:
    """The amdgpu cards, by PCI address; None when /sys/class/drm cannot be listed."""
    return drm_cards(sysfs_root, _DRIVERS)


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
    device_deadlines = True  # read() itself bounds each card (see ResourceMonitor)

    def __init__(
        self, log: logging.Logger, sysfs_root: str = "/sys", options: GpuOptions | None = None, ids_file: str = AMDGPU_IDS,
        clock: Callable[[], float] = time.monotonic, device_timeout: float = 5.0, forget_after: float = DEPARTED_SECONDS,
    ) -> None:
        self._log = log
        self._root = sysfs_root
        self._options = options or GpuOptions()
        self._ids_file = ids_file
        self._ids: dict[tuple[str, str], str] | None = None  # loaded when a card needs a name
        self._ids_lock = threading.Lock()  # cards are identified on their own readers
        self._limit = device_limit(device_timeout)  # how long a refresh waits for a card
        self._listing = Listing(log, sysfs_root, _DRIVERS)
        self._cards: CardTracker[_State] = CardTracker(log, "AMD", self._identify, forget_after=forget_after)
        self._kfd_proc = join(sysfs_root, "class", "kfd", "kfd", "proc")
        self._kfd_nodes = join(sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
        self._topology: dict[_PciKey, tuple[int, ...]] = {}  # card -> KFD gpu_ids (several when partitioned)
        self._topology_scanned = False
        self._node_names: frozenset[str] | None = None  # the node listing the last scan saw (None: no topology)
        self._topology_ids: frozenset[int] = frozenset()  # every GPU gpu_id of the last scan
        self._unresolved: frozenset[int] = frozenset()  # gpu_ids processes name that the last scan lacked
        self._driver_version = self._read_driver_version()
        # DRM clients: only for the processes collector (a scan of every process's fds)
        self._clients = DrmUsage(self._options.procfs, _DRIVERS, clock=clock) if self._options.processes else None

    def prepare(self) -> None:
        pass  # nothing slow: discovery is a directory listing

    def close(self) -> None:
        self._cards.close()
        self._listing.close()

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
        with self._ids_lock:
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

    def _hwmon_moved(self, state: _State) -> None:
        """The card's hwmon directory vanished while the card stayed: the driver was reloaded
        and registered it under a new number (hwmon numbers are global: on a multi-GPU host
        they shuffle). Found again, with its files; logged once per move."""
        d = state.card.device_dir
        hwmon = self._hwmon(d)
        if hwmon is None:
            return  # not registered again yet: its values absent, looked for on the next refresh
        files = set(_HWMON_VALUES).intersection(sysfs.listdir(hwmon, d) or ())
        state.has = frozenset({n for n in state.has if not n.startswith("hwmon/")} | {f"hwmon/{n}" for n in files})
        self._log.info("AMD GPU hwmon moved; reading it from its new directory",
                       extra=fields(pci_bus_id=state.card.pci, uuid=state.identity.uuid, hwmon=hwmon))
        state.hwmon = hwmon

    def _refresh_topology(self, kfd: dict[int, dict[int, int]]) -> None:
        """Card -> KFD gpu_ids, from the KFD topology. Not only at start: KFD can come up
        after the cards, and a compute-partition mode switch (SPX/DPX/CPX) re-creates the
        nodes with new gpu_ids, possibly under the same node names. So the topology is
        scanned again when its node listing changes or when a process names a gpu_id the
        last scan did not have (once per such id: an id no node has is not looked for on
        every refresh). Otherwise a refresh costs one directory listing here, not the two
        reads per node (64 GPU nodes on 8 MI300X in CPX mode) a scan takes."""
        listing = sysfs.listdir(self._kfd_nodes)
        names = frozenset(listing) if listing is not None else None
        named = {gpu_id for usage in kfd.values() for gpu_id in usage}
        unknown = named - self._topology_ids - self._unresolved
        if self._topology_scanned and names == self._node_names and not unknown:
            return
        out: dict[_PciKey, list[int]] = {}
        for node in sorted(names or ()):
            path = join(self._kfd_nodes, node)
            try:
                gpu_id = sysfs.integer(sysfs.read(join(path, "gpu_id"), path))
                props = sysfs.properties(sysfs.read(join(path, "properties"), path))
            except sysfs.Gone:
                continue
            location = props.get("location_id")
            if not gpu_id or location is None:
                continue  # a CPU node (gpu_id 0)
            # location_id is bus << 8 | devfn (devfn = device << 3 | function), but with
            # compute partitions the kernel ORs the partition's node id into it (and a later,
            # reverted, patch put it at bits 31:28): only domain, bus and device are the card's
            # (amdgpu cards are PCI function 0; the function bits say nothing of which card)
            key = (props.get("domain", 0), (location >> 8) & 0xFF, (location >> 3) & 0x1F)
            out.setdefault(key, []).append(gpu_id)
        self._topology = {key: tuple(sorted(set(ids))) for key, ids in out.items()}
        self._topology_scanned, self._node_names = True, names
        self._topology_ids = frozenset(g for ids in self._topology.values() for g in ids)
        self._unresolved = frozenset(named - self._topology_ids)

    def _identify(self, card: Card, index: int) -> _State:
        d = card.device_dir
        unique = sysfs.read(join(d, "unique_id"), d)
        # the form rocminfo prints and ROCR_VISIBLE_DEVICES accepts; empty where the board has none
        uuid = f"GPU-{unique.lower()}" if unique and re.fullmatch(r"[0-9A-Fa-f]+", unique) else ""
        hwmon = self._hwmon(d)
        has = set(_DEVICE_VALUES).intersection(sysfs.listdir(d, d) or ())
        if hwmon is not None:
            has |= {f"hwmon/{n}" for n in set(_HWMON_VALUES).intersection(sysfs.listdir(hwmon, d) or ())}
        # drm_card: AMD's DRA driver names a GPU gpu-<card>-<renderD> (kubernetes attribution)
        identity = GpuIdentity(index=index, uuid=uuid, name=self._name(card, sysfs.read(join(d, "product_name"), d)),
                               pci_bus_id=card.pci, drm_card=os.path.basename(card.card_dir) if card.card_dir else "")
        state = _State(card, identity, hwmon, frozenset(has),
                       missing_max=frozenset(k for k in ("pp_dpm_sclk", "pp_dpm_mclk") if k in has))
        self._max_clocks(state)
        return state

    def _max_clocks(self, state: _State) -> None:
        """The top pp_dpm level of each clock, read once; one that could not be read (EPERM:
        runtime-suspended at start) is tried again on each refresh until it is."""
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
            state.identity = replace(state.identity, clock_max_hertz=ordered)

    # -- the refresh --------------------------------------------------------------------

    def read(self) -> GpuReading:
        started = time.monotonic()
        # the listing gets half the wait at most: a blocked one leaves the cards time to answer
        cards = self._listing.cards(started + self._limit / 2)
        if cards is None:  # no DRM class at all: the driver stack is gone
            self._cards.leave_all()
            return GpuReading(backend=self.name, success=False, driver_version=self._driver_version,
                              devices=self._cards.devices({}))
        kfd = self._kfd_processes()
        if kfd is not None:
            self._refresh_topology(kfd)
        usage = self._clients.read() if self._clients is not None else None
        samples = self._cards.refresh(cards, lambda state: self._sample(state, kfd, usage), started + self._limit)
        # enumerated cards, answering or not (as nvmlDeviceGetCount): a card that answers ENODEV
        # is down, not missing (ResmonGpuMissing compares this count with its past maximum);
        # a card still being read, or a listing still in flight, is a refresh that did not succeed
        return GpuReading(backend=self.name, success=not (self._listing.blocked or self._cards.in_flight),
                          device_count=len(cards), driver_version=self._driver_version, devices=self._cards.devices(samples))

    def _sample(
        self, state: _State, kfd: dict[int, dict[int, int]] | None, usage: dict[str, DeviceUsage] | None = None
    ) -> GpuSample:
        if state.hwmon is not None and not os.path.isdir(state.hwmon):
            self._hwmon_moved(state)
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
        # newer dGPUs (and MI300) have only the instantaneous sensor; an average sensor that
        # fails is absent, not replaced (as the edge temperature below)
        power = sysfs.scaled(mon("power1_average" if "hwmon/power1_average" in has else "power1_input"), 1e6)
        pwm = sysfs.integer(mon("pwm1"))
        clocks = []
        for kind, hwmon_file, dpm in (("graphics", "freq1_input", "pp_dpm_sclk"), ("memory", "freq2_input", "pp_dpm_mclk")):
            hertz = sysfs.scaled(mon(hwmon_file), 1.0)
            if hertz is None:
                hertz, _ = sysfs.dpm_levels(dev(dpm))
            if hertz is not None:
                clocks.append((kind, hertz))
        count, plist = self._processes(state, kfd, usage)
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
                    vram_of = sysfs.integer(entry[5:]) if entry.startswith("vram_") else None
                    if vram_of is not None:
                        vram = sysfs.integer(sysfs.read(join(path, entry), path))
                        if vram:
                            usage[vram_of] = vram
                if "queues" in entries:  # a process running kernels on a GPU with no VRAM of its own yet
                    queues = join(path, "queues")
                    for queue in sysfs.listdir(queues, path) or ():
                        queue_on = sysfs.integer(sysfs.read(join(queues, queue, "gpuid"), path))
                        if queue_on:
                            usage.setdefault(queue_on, 0)
            except sysfs.Gone:
                continue  # exited while we looked
            if usage:
                out[int(pid)] = usage
        return out

    def _processes(
        self, state: _State, kfd: dict[int, dict[int, int]] | None, usage: dict[str, DeviceUsage] | None
    ) -> tuple[int | None, tuple[GpuProcess, ...] | None]:
        gpu_ids = self._topology.get(_pci_key(state.card.pci), ()) if kfd is not None else ()
        kfd_known = kfd is not None and bool(gpu_ids)  # no KFD, or this card not in its topology: unknown
        mine: dict[int, GpuProcess] = {}
        if kfd_known:
            assert kfd is not None
            for pid in sorted(kfd):
                vram = kfd[pid]
                if any(g in vram for g in gpu_ids):
                    mine[pid] = GpuProcess(pid, sum(vram.get(g, 0) for g in gpu_ids))
        kfd_pids = len(mine)
        # DRM clients' pids are the host's (KFD's) only when procfs is the host's
        host = usage is not None and self._clients is not None and self._clients.host_pids
        clients = usage.get(state.card.pci) if usage is not None and host else None
        for client in clients.processes if clients is not None else ():
            known = mine.get(client.pid)
            memory = known.memory_bytes if known is not None else client.memory_bytes  # KFD's VRAM wins
            mine[client.pid] = GpuProcess(client.pid, memory, client.utilization, client.busy_seconds)
        if not kfd_known and clients is None:
            return None, None  # unknown, not 0
        listed = tuple(mine[pid] for pid in sorted(mine))
        # the count stays KFD's (ROCm compute processes, the host's whole list, readable without
        # ptrace access): the same with --collector.processes on or off
        return kfd_pids if kfd_known else None, listed if self._options.processes else None


def explicit_backend(log: logging.Logger, sysfs_root: str, options: GpuOptions | None, device_timeout: float = 5.0) -> AmdgpuBackend:
    """--gpu.backend=amdgpu: there must be an amdgpu card now, or the exporter does not start."""
    require_cards(sysfs_root, _DRIVERS, "amdgpu", "the amdgpu driver")
    return AmdgpuBackend(log, sysfs_root, options, device_timeout=device_timeout)
