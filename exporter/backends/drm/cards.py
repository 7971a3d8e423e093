"""DRM cards in sysfs, by driver: what the amdgpu and intel backends enumerate.

Cards are the /sys/class/drm entries named ``card<N>`` (any number of digits: MI300X in CPX
mode has card192) whose device is a PCI device bound to one of the wanted drivers;
connectors (card0-DP-1), render nodes and platform devices (amdgpu compute partitions,
which are part of their PCI card) are skipped. Sorted by PCI address, as NVML numbers GPUs.
A refresh lists them through Listing, on a thread of its own with a deadline: a listing that
blocks keeps the cards of the last one that answered.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from os.path import join

from ...logs import fields
from ..base import BackendError
from . import errors as sysfs
from .readers import Readers

_CARD = re.compile(r"card\d+")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True, slots=True)
class Card:
    """A DRM card, as discovery found it."""

    pci: str  # 0000:03:00.0, lower case
    device_dir: str  # the PCI device directory (symlinks resolved)
    driver: str = "amdgpu"  # the PCI device's driver: amdgpu, i915, xe
    card_dir: str = ""  # /sys/class/drm/card<N> (i915 keeps its GT frequencies there, not on the device)


def find_cards(sysfs_root: str, drivers: frozenset[str]) -> list[Card] | None:
    """The cards of these drivers, by PCI address; None when /sys/class/drm cannot be listed."""
    drm = join(sysfs_root, "class", "drm")
    names = sysfs.listdir(drm)
    if names is None:
        return None
    cards: dict[str, Card] = {}
    for name in sorted(names, key=lambda n: (len(n), n)):  # card0 before card10: the lowest minor names the card
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
        if driver in drivers:
            cards[pci] = Card(pci, device, driver, join(drm, name))
    return [cards[p] for p in sorted(cards)]


def require_cards(sysfs_root: str, drivers: frozenset[str], backend: str, what: str) -> None:
    """--gpu.backend=<backend> asked for explicitly: there must be a card of these drivers
    (what: "the amdgpu driver") now, or the exporter does not start (BackendError)."""
    cards = find_cards(sysfs_root, drivers)
    if not cards:
        where = join(sysfs_root, "class", "drm")
        raise BackendError(f"--gpu.backend={backend}: no card of {what} under {where}"
                           + (" (cannot list it)" if cards is None else ""))


class Listing:
    """find_cards() for a backend's refresh, on its own reader thread (resmon-drm-scan), so a
    /sys/class/drm listing (or a readlink under it) that blocks holds up no card read: past
    its deadline the cards of the last listing that answered are used, and no second listing
    starts until the blocked one returns (its answer is used from the refresh after)."""

    def __init__(self, log: logging.Logger, sysfs_root: str, drivers: frozenset[str]) -> None:
        self._log = log
        self._root = sysfs_root
        self._drivers = drivers
        self._reader: Readers[list[Card] | None] = Readers()
        self._last: list[Card] | None = None
        self.blocked = False  # the last cards() call used the last listing's cards

    def cards(self, deadline: float) -> list[Card] | None:
        """The cards now, by PCI address; None when /sys/class/drm cannot be listed (or the
        first listing is still in flight: no card is known yet)."""
        outcomes, in_flight = self._reader.run([("class/drm", None, self._list)], deadline)
        if in_flight:
            if not self.blocked:
                self._log.warning("listing /sys/class/drm is in flight; keeping the cards of the last listing",
                                  extra=fields(cards=len(self._last or ())))
            self.blocked = True
            return self._last
        outcome = outcomes["class/drm"]
        if outcome.error is not None:
            raise outcome.error
        if self.blocked:
            self._log.info("listing /sys/class/drm answers again")
        self.blocked = False
        self._last = outcome.value
        return self._last

    def _list(self) -> list[Card] | None:
        return find_cards(self._root, self._drivers)

    def close(self) -> None:
        self._reader.close()
