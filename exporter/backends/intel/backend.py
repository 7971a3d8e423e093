"""Intel GPUs (xe and i915 drivers) from sysfs, hwmon and DRM client usage stats: no vendor
tool, no subprocess, no device node opened, nothing that needs root but the per-process part.

Cards are the DRM cards bound to xe or i915 (drm/cards.py), indexed and tracked as amdgpu's
are (drm/tracker.py); every read goes through drm/errors.py, where for these drivers EIO
(a wedged GPU) as well as ENODEV makes the card down, alone (ENXIO, the power firmware
refusing one request, is that value absent). Per card, read once
when it appears: identity (uuid: the PCI address, as the kernel gives Intel GPUs no serial
number; name from the PCI id: names.py), which hwmon files it has, its GT frequency files,
the maximum clocks (RP0) and, on xe discrete cards, VRAM (tile<t>/physical_vram_size_bytes,
0444, summed over tiles). Each refresh reads:

- energy: hwmon energy1_input (card, µJ), else energy2_input (xe package; integrated GPUs);
  power: the energy counter's growth over the time since the previous refresh (neither
  driver has an instantaneous power file); power limit: power1_max (PL1, µW; 0 = disabled:
  absent), else power2_max (xe package);
- temperatures: xe temp2_input (package) else temp1_input as the GPU temperature, xe
  temp3_input (VRAM) as the memory temperature; i915 has no temperature file;
- clocks: the actual frequency of the first GT of tile 0 as graphics and of the second GT of
  tile 0 (the media GT of Meteor Lake and later) as video: xe tile<t>/gt<g>/freq0/act_freq,
  i915 card<N>/gt/gt<g>/rps_act_freq_mhz, else card<N>/gt_act_freq_mhz (MHz). Other tiles'
  GTs (the second stack of a Data Center GPU Max) are not exported;
- engine busy time and processes: DRM client usage stats (drm/fdinfo.py) of every process,
  summed per device into resmon_gpu_busy_seconds_total{engine}; utilization is the busiest
  engine's share of the time since the previous refresh. Without ptrace access to every
  process (not root, no CAP_SYS_PTRACE), or with a procfs that is not the host's (a
  container's own /proc), the process count, busy time and utilization are unknown (absent):
  only the visible processes' own series are exported.

Each card is identified and read on a reader thread of its own, the /sys/class/drm listing on
another, bounded by --collect.timeout a little less (drm/readers.py, drm/cards.py Listing): a
card whose read blocks is down alone. A hwmon renumbered by a driver reload is found again (and
logged); cards that left are forgotten by NVML's departed-GPU rule (drm/tracker.py).

VRAM used is not in the upstream drivers' sysfs: they answer it only to a DRM query ioctl with
CAP_PERFMON, which this backend does not make. Intel's out-of-tree i915 (the DKMS driver of
Flex and Max) has card<N>/lmem_total_bytes and lmem_avail_bytes (0444): total, and used as
their difference, read on every refresh.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import threading
import time
from dataclasses import dataclass, replace
from os.path import join
from typing import Callable

from ...counters import Monotonic
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
from .names import PCI_IDS_FILES, gpu_name

DRIVERS = frozenset({"i915", "xe"})
_GONE = sysfs.INTEL_GONE_ERRNOS
_HWMON_NAMES = frozenset(DRIVERS)  # i915 also has per-GT hwmons named i915_gt0: not the card's
_HWMON_VALUES = (
    "energy1_input", "energy2_input", "power1_max", "power2_max", "temp1_input", "temp2_input", "temp3_input",
)
_NUMBERED = re.compile(r"(tile|gt)(\d+)")
_INTEGRATED = "00:02.0"  # bus 0, device 2: where every Intel integrated GPU sits


@dataclass(slots=True)
class _State:
    """What is known of one card: identity and files (read once), and the previous refresh."""

    card: Card
    identity: GpuIdentity
    hwmon: str | None
    has: frozenset[str]  # hwmon value files present
    frequencies: tuple[tuple[str, str], ...]  # (clock, the actual-frequency file, MHz)
    memory_total_bytes: int | None
    lmem: bool  # the out-of-tree i915 (DKMS, Flex and Max) has card<N>/lmem_total_bytes and lmem_avail_bytes
    energy_at: tuple[float, float] | None = None  # (joules, monotonic) at the previous refresh
    busy_at: tuple[dict[str, float], float] | None = None  # (engine -> busy seconds, monotonic)


def _numbered(names: list[str] | None, prefix: str) -> list[str]:
    """tile0, tile1, ... (or gt<N>) in numeric order."""
    found = [(int(m[2]), n) for n in names or () if (m := _NUMBERED.fullmatch(n)) and m[1] == prefix]
    return [n for _, n in sorted(found)]


def _placeholder(card: Card, index: int) -> GpuIdentity:
    """A card not identified yet (wedged from the start): all that is known without reading it."""
    return GpuIdentity(index, uuid=card.pci, pci_bus_id=card.pci, drm_card=os.path.basename(card.card_dir))


def find_cards(sysfs_root: str) -> list[Card] | None:
    """The xe and i915 cards, by PCI address; None when /sys/class/drm cannot be listed."""
    return drm_cards(sysfs_root, DRIVERS)


class IntelBackend:
    name = "intel"
    device_deadlines = True  # read() itself bounds each card (see ResourceMonitor)

    def __init__(
        self, log: logging.Logger, sysfs_root: str = "/sys", options: GpuOptions | None = None,
        pci_ids_files: tuple[str, ...] = PCI_IDS_FILES, clock: Callable[[], float] | None = None,
        device_timeout: float = 5.0, forget_after: float = DEPARTED_SECONDS,
    ) -> None:
        self._log = log
        self._root = sysfs_root
        self._options = options or GpuOptions()
        self._pci_ids_files = pci_ids_files
        self._clock = clock or time.monotonic
        self._limit = device_limit(device_timeout)  # how long a refresh waits for a card
        self._listing = Listing(log, sysfs_root, DRIVERS)
        self._cards: CardTracker[_State] = CardTracker(log, "Intel", self._identify, unidentified=_placeholder,
                                                       forget=self._forget, forget_after=forget_after)
        self._clients = DrmUsage(self._options.procfs, DRIVERS, clock=self._clock)
        self._counters = Monotonic()
        self._lock = threading.Lock()  # one refresh at a time: the previous-refresh values are per card
        self._version_of: tuple[frozenset[str], str] = (frozenset(), platform.release())

    def prepare(self) -> None:
        pass  # nothing slow: discovery is a directory listing

    def close(self) -> None:
        self._cards.close()
        self._listing.close()

    def _forget(self, state: _State) -> None:
        """A card forgotten for good (drm/tracker.py): its energy counter's offset goes."""
        self._counters.forget(state.identity.uuid or state.identity.pci_bus_id)

    # -- identity, once per card --------------------------------------------------------

    def _driver_version(self, cards: list[Card]) -> str:
        # an out-of-tree (DKMS) build has a module version; the in-tree driver goes with the kernel.
        # Read when the drivers in use change, not on every refresh: a module is not replaced under us
        drivers = frozenset(c.driver for c in cards)
        if drivers != self._version_of[0]:
            self._version_of = (drivers, self._read_driver_version(drivers))
        return self._version_of[1]

    def _read_driver_version(self, drivers: frozenset[str]) -> str:
        for driver in sorted(drivers):
            path = join(self._root, "module", driver, "version")
            try:
                version = sysfs.read(path, os.path.dirname(path))
            except sysfs.Gone:
                version = None
            if version:
                return version
        return platform.release()

    def _hwmon(self, device_dir: str) -> str | None:
        base = join(device_dir, "hwmon")
        for entry in sorted(sysfs.listdir(base, device_dir, _GONE) or ()):
            path = join(base, entry)
            if sysfs.read(join(path, "name"), device_dir, _GONE) in _HWMON_NAMES:
                return path
        return None

    def _hwmon_files(self, hwmon: str | None, device_dir: str) -> frozenset[str]:
        if hwmon is None:
            return frozenset()
        return frozenset(set(_HWMON_VALUES).intersection(sysfs.listdir(hwmon, device_dir, _GONE) or ()))

    def _gt_files(self, card: Card) -> list[tuple[str, str]]:
        """(actual-frequency file, RP0 file) of each GT of tile 0, in GT order."""
        d = card.device_dir
        if card.driver == "xe":
            tiles = _numbered(sysfs.listdir(d, d, _GONE), "tile")
            if not tiles:
                return []
            tile = join(d, tiles[0])
            gts = _numbered(sysfs.listdir(tile, d, _GONE), "gt")
            return [(join(tile, gt, "freq0", "act_freq"), join(tile, gt, "freq0", "rp0_freq")) for gt in gts]
        gt_dir = join(card.card_dir, "gt")
        gts = _numbered(sysfs.listdir(gt_dir, d, _GONE), "gt")
        if len(gts) > 1 and card.pci.partition(":")[2] != _INTEGRATED:
            gts = gts[:1]  # i915 numbers a discrete card's tiles as gt0, gt1 (Max): gt1 is no media GT
        if gts:
            return [(join(gt_dir, gt, "rps_act_freq_mhz"), join(gt_dir, gt, "rps_RP0_freq_mhz")) for gt in gts]
        legacy = join(card.card_dir, "gt_act_freq_mhz")  # kernels before 5.17: the card-level files only
        return [(legacy, join(card.card_dir, "gt_RP0_freq_mhz"))] if os.path.exists(legacy) else []

    def _vram_total(self, card: Card) -> int | None:
        if card.driver != "xe":
            return None  # i915 gives local memory only to the query ioctl
        d = card.device_dir
        sizes = [sysfs.integer(sysfs.read(join(d, tile, "physical_vram_size_bytes"), d, _GONE))
                 for tile in _numbered(sysfs.listdir(d, d, _GONE), "tile")]
        known = [s for s in sizes if s]  # integrated GPUs have no such file; a tile without VRAM has none either
        return sum(known) if known and len(known) == len(sizes) else None

    def _identify(self, card: Card, index: int) -> _State:
        d = card.device_dir
        pci_id = sysfs.uevent(sysfs.read(join(d, "uevent"), d, _GONE)).get("PCI_ID", "")
        hwmon = self._hwmon(d)
        has = self._hwmon_files(hwmon, d)
        frequencies, maxima = [], []
        for clock, (actual, rp0) in zip(("graphics", "video"), self._gt_files(card)):
            frequencies.append((clock, actual))
            top = sysfs.integer(sysfs.read(rp0, d, _GONE))
            if top:
                maxima.append((clock, top * 1e6))
        identity = replace(_placeholder(card, index), name=gpu_name(pci_id, self._pci_ids_files), clock_max_hertz=tuple(maxima))
        lmem = card.driver == "i915" and os.path.exists(join(card.card_dir, "lmem_total_bytes"))
        return _State(card, identity, hwmon, has, tuple(frequencies), self._vram_total(card), lmem)

    # -- the refresh --------------------------------------------------------------------

    def read(self) -> GpuReading:
        with self._lock:
            started = time.monotonic()
            # the listing gets half the wait at most: a blocked one leaves the cards time to answer
            cards = self._listing.cards(started + self._limit / 2)
            if cards is None:  # no DRM class at all: the driver stack is gone
                self._cards.leave_all()
                return GpuReading(backend=self.name, success=False, driver_version=platform.release(),
                                  devices=self._cards.devices({}))
            usage = self._clients.read()
            # what the scan says of itself, taken here: a card's read may return after the next scan
            clients = (usage, self._clients.complete, self._clients.read_at)
            samples = self._cards.refresh(cards, lambda state: self._sample(state, *clients), started + self._limit)
            # the energy counter restarts with the driver: served values never decrease
            samples = dict(zip(samples, self._counters.samples(samples.values())))
            # a card still being read, or a listing still in flight, is a refresh that did not succeed
            return GpuReading(backend=self.name, success=not (self._listing.blocked or self._cards.in_flight),
                              device_count=len(cards), driver_version=self._driver_version(cards),
                              devices=self._cards.devices(samples))

    def _sample(self, state: _State, usage: dict[str, DeviceUsage] | None, complete: bool, read_at: float) -> GpuSample:
        d = state.card.device_dir
        if state.hwmon is not None and not os.path.isdir(state.hwmon):
            # the driver was reloaded between two refreshes: its hwmon came back under a new number
            hwmon = self._hwmon(d)
            if hwmon is not None:  # else not registered again yet: looked for on the next refresh
                state.hwmon, state.has = hwmon, self._hwmon_files(hwmon, d)
                self._log.info("Intel GPU hwmon moved; reading it from its new directory",
                               extra=fields(pci_bus_id=state.card.pci, uuid=state.identity.uuid, hwmon=hwmon))
        hwmon, has = state.hwmon, state.has
        now = self._clock()

        def mon(name: str) -> str | None:
            return sysfs.read(join(hwmon, name), d, _GONE) if hwmon is not None and name in has else None

        energy_file = "energy1_input" if "energy1_input" in has else "energy2_input"
        microjoules = sysfs.integer(mon(energy_file))
        energy = microjoules / 1e6 if microjoules is not None else None
        power = None
        if energy is not None and state.energy_at is not None:
            joules, at = state.energy_at
            if now > at and energy >= joules:  # a smaller value: the counter was reset (driver reload)
                power = (energy - joules) / (now - at)
        state.energy_at = (energy, now) if energy is not None else None
        limit = sysfs.integer(mon("power1_max" if "power1_max" in has else "power2_max"))
        temperature = "temp2_input" if "temp2_input" in has else "temp1_input"
        clocks = []
        for clock, path in state.frequencies:
            mhz = sysfs.integer(sysfs.read(path, d, _GONE))
            if mhz is not None:
                clocks.append((clock, mhz * 1e6))  # 0 while the GT sleeps (RC6): the clock is really stopped
        busy, utilization, count, plist = self._clients_of(state, usage, complete, read_at)
        total, used = self._lmem(state) if state.lmem else (state.memory_total_bytes, None)
        return GpuSample(
            identity=state.identity,
            up=True,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=total - used if total is not None and used is not None else None,
            utilization_ratio=utilization,
            temperature_celsius=sysfs.scaled(mon(temperature), 1000.0),
            memory_temperature_celsius=sysfs.scaled(mon("temp3_input"), 1000.0),
            power_watts=power,
            power_limit_watts=limit / 1e6 if limit else None,  # 0: the limit is disabled
            energy_joules=energy,
            clock_hertz=tuple(clocks),
            busy_seconds=busy,
            processes=count,
            process_list=plist,
        )

    def _lmem(self, state: _State) -> tuple[int | None, int | None]:
        """(total, used) local memory of the out-of-tree i915; 0 total: no local memory."""
        d, card_dir = state.card.device_dir, state.card.card_dir
        total = sysfs.integer(sysfs.read(join(card_dir, "lmem_total_bytes"), d, _GONE)) or None
        avail = sysfs.integer(sysfs.read(join(card_dir, "lmem_avail_bytes"), d, _GONE))
        return total, total - avail if total is not None and avail is not None and avail <= total else None

    def _clients_of(
        self, state: _State, usage: dict[str, DeviceUsage] | None, complete: bool, read_at: float
    ) -> tuple[tuple[tuple[str, float], ...], float | None, int | None, tuple[GpuProcess, ...] | None]:
        """(busy seconds by engine, utilization since the previous refresh, process count, process
        list). Busy time, utilization and the count need every client: a client of a process this
        exporter may not look into (no ptrace access), or one outside the procfs it reads (a
        container's own /proc), would be missing, and its part would read as idle; only the
        visible processes' own series are exported then."""
        if usage is None:  # procfs cannot be listed: nothing is known of the clients
            state.busy_at = None
            return (), None, None, None
        mine = usage.get(state.card.pci)
        processes = mine.processes if mine is not None else ()
        listed = processes if self._options.processes else None
        if not complete:
            state.busy_at = None
            return (), None, None, listed
        now = read_at  # the busy time grew up to the scan, not to this card's sample
        busy = mine.busy_seconds if mine is not None else ()
        utilization = None
        if busy and state.busy_at is not None:
            before, at = state.busy_at
            # engines counted at the previous refresh only: one that just appeared brings its
            # clients' whole past, not this interval's work
            shares = [(s - before[e]) / (now - at) for e, s in busy if e in before] if now > at else []
            if shares:
                utilization = min(1.0, max(0.0, max(shares)))
        state.busy_at = (dict(busy), now) if busy else None
        return busy, utilization, len(processes), listed


def explicit_backend(log: logging.Logger, sysfs_root: str, options: GpuOptions | None, device_timeout: float = 5.0) -> IntelBackend:
    """--gpu.backend=intel: there must be an xe or i915 card now, or the exporter does not start."""
    require_cards(sysfs_root, DRIVERS, "intel", "the xe or i915 driver")
    return IntelBackend(log, sysfs_root, options, device_timeout=device_timeout)
