"""The cards a sysfs backend (amdgpu, intel) has seen: stable indices, down, hung and departed cards.

At start GPUs are numbered in PCI address order (as NVML does); while the exporter runs a
card keeps its index and a card seen for the first time gets the next index never given
before, so an index never changes meaning: a card that disappears stays, down, under its
index. A card is identified (the backend's identify()) when it appears, and again when it
comes back after leaving /sys/class/drm (maybe another board at that address). A card whose
refresh ends in Gone (ENODEV / ENXIO, its directory vanished) is down for that refresh only;
the next one tries it again. Each change is logged once.

Each card is identified and read on a reader thread of its own (readers.py), bounded by the
refresh's deadline: a card whose read is still in flight then is down alone (resmon_gpu_up 0,
under its identity), and is not read again until that read returns.

A card no longer listed is forgotten as the NVML backend forgets a departed GPU (the same
rule, nvml/registry.py): after DEPARTED_SECONDS, or sooner when more than DEPARTED_PER_GPU x
the most cards listed at once have departed (the oldest departure first), so cards replugged
at new PCI addresses cannot grow series and memory without bound. A forgotten card that comes
back is a new card, with a new index.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Generic, Protocol, TypeVar

from ...logs import fields
from ...samples import GpuIdentity, GpuSample
from . import errors as sysfs
from .cards import Card
from .readers import Readers

# The NVML backend's rule for departed GPUs (nvml/registry.py; a test checks they agree): a
# card no longer listed stays as resmon_gpu_up 0 for this long (ResmonGpuDown fires after 2
# minutes), at most DEPARTED_PER_GPU x the most cards listed at once of them
DEPARTED_SECONDS = 600.0
DEPARTED_PER_GPU = 2


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


@dataclass(frozen=True, slots=True)
class _Read(Generic[S]):
    """What one card's job hands back: its state (None: identification ended in Gone), its
    sample, or the Gone that ended its read; new: identified in this job."""

    state: S | None
    sample: GpuSample | None = None
    gone: sysfs.Gone | None = None
    new: bool = False


class CardTracker(Generic[S]):
    """Not thread-safe by itself: a backend's refresh runs on the monitor's one GPU thread (the
    card reads run on the readers, and hand their results back through it)."""

    def __init__(
        self, log: logging.Logger, vendor: str, identify: Callable[[Card, int], S],
        unidentified: Callable[[Card, int], GpuIdentity] = lambda card, index: GpuIdentity(index, pci_bus_id=card.pci),
        forget: Callable[[S], None] = lambda state: None, forget_after: float = DEPARTED_SECONDS,
    ) -> None:
        self._log = log
        # the identity of a card that could not be identified yet: what is known without reading it
        self._unidentified_identity = unidentified
        self._vendor = vendor  # "AMD", "Intel": for the log lines
        self._identify = identify
        self._forget_state = forget  # the backend's own per-card memory of a forgotten card
        self._forget_after = forget_after
        self._cards: dict[str, _Tracked[S]] = {}  # by PCI address, every card identified and not forgotten
        self._index: dict[str, int] = {}  # PCI address -> GPU index, given when first seen, kept until forgotten
        self._next_index = 0  # never given twice
        self._unidentified: dict[str, Card] = {}  # listed at the last refresh, not identified (Gone, or in flight)
        self._departed: dict[str, float] = {}  # PCI address -> monotonic time it was first missed
        self._most_listed = 0
        self._hung: set[str] = set()  # cards whose read was in flight at a refresh's deadline
        self._readers: Readers[_Read[S]] = Readers()
        self.in_flight = False  # a card's read was in flight at the last refresh's deadline

    def close(self) -> None:
        self._readers.close()

    def leave_all(self) -> None:
        for pci, tracked in self._cards.items():
            self._leave(pci, tracked)

    def _leave(self, pci: str, tracked: _Tracked[S]) -> None:
        if tracked.present:
            tracked.present, tracked.stale = False, True
            self._log.warning(f"{self._vendor} GPU disappeared; reporting it down",
                              extra=fields(pci_bus_id=pci, uuid=tracked.state.identity.uuid))

    def refresh(self, cards: list[Card], read: Callable[[S], GpuSample], deadline: float) -> dict[str, GpuSample]:
        """Every listed card identified where needed and read, each on its reader, until
        deadline; the samples of those that answered. Cards that went are marked (and
        forgotten after a while), cards that appeared or came back are identified."""
        now = {c.pci for c in cards}
        for pci, tracked in self._cards.items():
            if pci not in now:
                self._leave(pci, tracked)
        for pci in sorted(now - self._index.keys()):  # by PCI address at start; later ones after the rest
            self._index[pci], self._next_index = self._next_index, self._next_index + 1
        self._departures(now)
        jobs = []
        for card in cards:
            known = self._cards.get(card.pci)
            fresh = known is None or known.stale or known.state.card != card
            index = self._index[card.pci]
            jobs.append((card.pci, index, partial(self._job, card, index, None if fresh else known.state, read)))  # type: ignore[union-attr]
        outcomes, in_flight = self._readers.run(jobs, deadline)
        self.in_flight = bool(in_flight)
        found, samples = [], {}
        self._unidentified = {}
        for card in cards:
            pci = card.pci
            if pci in in_flight:
                if pci not in self._hung:
                    self._hung.add(pci)
                    self._log.warning(f"{self._vendor} GPU read in flight longer than --collect.timeout; reporting it down",
                                      extra=fields(pci_bus_id=pci, gpu=self._index[pci]))
                if pci not in self._cards or self._cards[pci].stale:
                    self._unidentified[pci] = card
                continue
            outcome = outcomes[pci]
            if outcome.error is not None:
                raise outcome.error  # not a device fault: out of read(), as before the readers
            result = outcome.value
            assert result is not None
            if pci in self._hung:
                self._hung.discard(pci)
                self._log.info(f"{self._vendor} GPU read returned", extra=fields(pci_bus_id=pci, gpu=self._index[pci]))
            if result.state is None:
                # removed, or not answering (wedged from the start): down under its index, and
                # tried again on the next refresh
                self._unidentified[pci] = card
                continue
            if result.new:
                self._cards[pci] = _Tracked(result.state)
                found.append(pci)
            tracked = self._cards[pci]
            if result.gone is not None:
                if tracked.answering:  # logged once, when it stops; each refresh tries it again
                    tracked.answering = False
                    self._log.warning(f"{self._vendor} GPU stopped answering; reporting it down",
                                      extra=fields(pci_bus_id=pci, uuid=tracked.state.identity.uuid, error=str(result.gone)))
                continue
            assert result.sample is not None
            samples[pci] = result.sample
            if not tracked.answering:
                tracked.answering = True
                self._log.info(f"{self._vendor} GPU answers again",
                               extra=fields(pci_bus_id=pci, uuid=tracked.state.identity.uuid))
        if found:
            self._log.info(f"{self._vendor} GPUs found", extra=fields(cards=",".join(found)))
        return samples

    def _job(self, card: Card, index: int, state: S | None, read: Callable[[S], GpuSample]) -> _Read[S]:
        """On the card's reader: identify it if needed, then read it."""
        new = state is None
        if state is None:
            try:
                state = self._identify(card, index)
            except sysfs.Gone:
                return _Read(None)
        try:
            return _Read(state, read(state), new=new)
        except sysfs.Gone as exc:
            return _Read(state, gone=exc, new=new)

    def _departures(self, listed: set[str]) -> None:
        """Forget the cards gone longer than forget_after, and beyond the count bound the
        oldest departures (NVML's rule)."""
        now = time.monotonic()
        for pci in [p for p in self._departed if p in listed]:
            del self._departed[pci]  # listed again
        for pci in self._index.keys() - listed:
            self._departed.setdefault(pci, now)
        self._most_listed = max(self._most_listed, len(listed))
        by_age = sorted(self._departed, key=self._departed.__getitem__)
        keep = DEPARTED_PER_GPU * max(self._most_listed, 1)
        overflow = by_age[: max(0, len(by_age) - keep)]
        for pci in overflow + [p for p in by_age[len(overflow):] if now - self._departed[p] >= self._forget_after]:
            self._forget(pci)

    def _forget(self, pci: str) -> None:
        del self._departed[pci]
        index = self._index.pop(pci)
        tracked = self._cards.pop(pci, None)
        self._hung.discard(pci)
        self._readers.forget(pci)  # a read still in flight ends its thread when it returns
        if tracked is not None:
            self._forget_state(tracked.state)
        self._log.info(f"{self._vendor} GPU gone for long; its series are dropped",
                       extra=fields(pci_bus_id=pci, gpu=index, uuid=tracked.state.identity.uuid if tracked else ""))

    def devices(self, samples: dict[str, GpuSample]) -> tuple[GpuSample, ...]:
        """Every card identified and not forgotten, by index: its sample, or down; and every card
        listed now that could not be identified (or whose identification is in flight), down (a
        GPU wedged since before the exporter started is a GPU down, not no GPU)."""
        out = [samples.get(pci) or GpuSample(t.state.identity, up=False) for pci, t in self._cards.items()]
        out += [GpuSample(self._unidentified_identity(card, self._index[pci]), up=False)
                for pci, card in self._unidentified.items() if pci not in self._cards]
        return tuple(sorted(out, key=lambda sample: sample.identity.index))
