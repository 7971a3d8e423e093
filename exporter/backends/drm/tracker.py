"""The cards a sysfs backend (amdgpu, intel) has seen: stable indices, down and stale cards.

At start GPUs are numbered in PCI address order (as NVML does); while the exporter runs a
card keeps its index and a card seen for the first time gets the next free one, so an index
never changes meaning: a card that disappears stays, down, under its index. A card is
identified (the backend's identify()) when it appears, and again when it comes back after
leaving /sys/class/drm (maybe another board at that address). A card whose refresh ends in
Gone (ENODEV / ENXIO, its directory vanished) is down for that refresh only; the next one
tries it again. Each change is logged once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Generic, Protocol, TypeVar

from ...logs import fields
from ...samples import GpuIdentity, GpuSample
from . import errors as sysfs
from .cards import Card


class CardState(Protocol):
    """What a backend keeps of one card: at least the card and its identity."""

    @property
    def card(self) -> Card: ...

    @property
    def identity(self) -> GpuIdentity: ...


S = TypeVar("S", bound=CardState)


@dataclass(slots=True)
class _Tracked(Generic[S]):
    state: S
    present: bool = True  # in /sys/class/drm at the last refresh
    answering: bool = True  # its last refresh did not end in Gone
    stale: bool = False  # it left /sys/class/drm: identified again when it is back


class CardTracker(Generic[S]):
    """Not thread-safe by itself: a backend's refresh runs on the monitor's one GPU thread."""

    def __init__(
        self, log: logging.Logger, vendor: str, identify: Callable[[Card, int], S],
        unidentified: Callable[[Card, int], GpuIdentity] = lambda card, index: GpuIdentity(index, pci_bus_id=card.pci),
    ) -> None:
        self._log = log
        # the identity of a card that could not be identified yet: what is known without reading it
        self._unidentified_identity = unidentified
        self._vendor = vendor  # "AMD", "Intel": for the log lines
        self._identify = identify
        self._cards: dict[str, _Tracked[S]] = {}  # by PCI address, every card identified since start
        self._index: dict[str, int] = {}  # PCI address -> GPU index, given when first seen, kept
        self._unidentified: dict[str, Card] = {}  # enumerated at the last sync, identification failed

    def leave_all(self) -> None:
        for pci, tracked in self._cards.items():
            self._leave(pci, tracked)

    def _leave(self, pci: str, tracked: _Tracked[S]) -> None:
        if tracked.present:
            tracked.present, tracked.stale = False, True
            self._log.warning(f"{self._vendor} GPU disappeared; reporting it down",
                              extra=fields(pci_bus_id=pci, uuid=tracked.state.identity.uuid))

    def sync(self, cards: list[Card]) -> None:
        """Identities for cards that appeared, came back or moved; cards that went are marked."""
        now = {c.pci for c in cards}
        for pci, tracked in self._cards.items():
            if pci not in now:
                self._leave(pci, tracked)
        for pci in sorted(now - self._index.keys()):  # by PCI address at start; later ones after the rest
            self._index[pci] = len(self._index)
        found = []
        self._unidentified = {}
        for card in cards:
            known = self._cards.get(card.pci)
            if known is not None and not known.stale and known.state.card == card:
                continue
            try:
                self._cards[card.pci] = _Tracked(self._identify(card, self._index[card.pci]))
            except sysfs.Gone:
                # removed, or not answering (wedged from the start): down under its index, and
                # tried again on the next refresh
                self._unidentified[card.pci] = card
                continue
            found.append(card.pci)
        if found:
            self._log.info(f"{self._vendor} GPUs found", extra=fields(cards=",".join(found)))

    def sample(self, cards: list[Card], read: Callable[[S], GpuSample]) -> dict[str, GpuSample]:
        """read() of every current card; a card whose read raises Gone is left out (down)."""
        samples: dict[str, GpuSample] = {}
        for card in cards:
            tracked = self._cards.get(card.pci)
            if tracked is None or tracked.stale:
                continue  # its identification failed: down (or not listed yet)
            try:
                samples[card.pci] = read(tracked.state)
            except sysfs.Gone as exc:
                if tracked.answering:  # logged once, when it stops; each refresh tries it again
                    tracked.answering = False
                    self._log.warning(f"{self._vendor} GPU stopped answering; reporting it down",
                                      extra=fields(pci_bus_id=card.pci, uuid=tracked.state.identity.uuid, error=str(exc)))
                continue
            if not tracked.answering:
                tracked.answering = True
                self._log.info(f"{self._vendor} GPU answers again",
                               extra=fields(pci_bus_id=card.pci, uuid=tracked.state.identity.uuid))
        return samples

    def devices(self, samples: dict[str, GpuSample]) -> tuple[GpuSample, ...]:
        """Every card identified since start, by index: its sample, or down; and every card
        enumerated now that could not be identified, down (a GPU wedged since before the
        exporter started is a GPU down, not no GPU)."""
        out = [samples.get(pci) or GpuSample(t.state.identity, up=False) for pci, t in self._cards.items()]
        out += [GpuSample(self._unidentified_identity(card, self._index[pci]), up=False)
                for pci, card in self._unidentified.items() if pci not in self._cards]
        return tuple(sorted(out, key=lambda sample: sample.identity.index))
