"""The device registry of the NVML backend: who each GPU is, its handle, its up history, and
the devices that left.

Devices are keyed by UUID (PCI bus id where the UUID cannot be read), never by index: NVML
renumbers after a GPU disappears, so identity, up history and caches follow the UUID and
`gpu` is just the device's current index. A GPU never identified is known by a placeholder
key ("#index-N") until its first answer. A device no longer enumerated stays visible as
down under its last index for a while (DEPARTED_SECONDS, a count bound), then is forgotten.

DeviceRegistry is a room of NvmlBackend (a mixin: backend.py says why): the state set in
_init_registry is its own, and _ident_lock guards it where a GPU reader iterates or re-keys
it (never held over an NVML call). Forgetting a device drops it from every room's caches.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
from typing import Any

import pynvml

from ...logs import fields
from ...samples import CLOCK_TYPES, GpuIdentity, GpuSample
from . import errors as nvml_errors
from .errors import DeviceDown, Fallback as _Fallback, Missing, Undecodable
from .units import CLOCK_IDS, mhz_to_hertz, text
from .workers import HandleCache

# A device no longer enumerated stays as resmon_gpu_up 0 for this long (ResmonGpuDown fires
# after 2 minutes), then it and every cache of it are dropped; at most DEPARTED_PER_GPU times
# the most GPUs enumerated at once are kept meanwhile (the oldest departures go first), so
# GPUs reappearing under new UUIDs cannot grow series and memory without bound.
DEPARTED_SECONDS = 600.0
DEPARTED_PER_GPU = 2


def _raw_name(handle: Any) -> str:
    """nvmlDeviceGetName without pynvml's strict UTF-8 decode (a driver or VBIOS with a
    Latin-1 board name must not make a working GPU look down)."""
    buf = ctypes.create_string_buffer(96)  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    pynvml._nvmlCheckReturn(fn(handle, buf, ctypes.c_uint(len(buf))))
    return buf.value.decode("utf-8", "replace")



class DeviceRegistry:
    """Identity by UUID, placeholders, handles, up history, departed devices."""

    def _init_registry(self, forget_after: float) -> None:
        self._forget_after = forget_after
        # guards the identity maps where a worker iterates or re-keys them (never held over an NVML call)
        self._ident_lock = threading.Lock()
        # by current index, dropped when the count changes; generation-checked (a lookup that
        # hung across a count change must not cache the old enumeration's handle)
        self._handles = HandleCache()
        self._identities: dict[str, GpuIdentity] = {}  # every device seen since start, by key
        self._complete: set[str] = set()  # keys whose identity fields are all known since init
        # index -> key its latest identity read found (under _ident_lock): a read stuck after
        # it is reported under that key, never as a second, placeholder device
        self._identified_at: dict[int, str] = {}
        self._key_at: dict[int, str] = {}  # index -> key seen there in the previous read
        # devices no longer enumerated -> monotonic time since when (the reader's alone);
        # forgotten after forget_after, or beyond DEPARTED_PER_GPU x the most GPUs enumerated at once
        self._departed: dict[str, float] = {}
        self._most_enumerated = 0
        self._up: dict[str, bool] = {}
        self._max_clock = _Fallback(pynvml.nvmlDeviceGetMaxClockInfo)

    def _departures(self, seen: set[str]) -> list[str]:
        """The departed devices to forget now: gone longer than forget_after, and beyond the
        count bound the oldest departures."""
        now = time.monotonic()
        with self._ident_lock:
            known = set(self._identities)
        for key in [k for k in self._departed if k in seen or k not in known]:
            del self._departed[key]  # enumerated again (or re-keyed meanwhile)
        for key in known - seen:
            self._departed.setdefault(key, now)
        by_age = sorted(self._departed, key=self._departed.__getitem__)
        keep = DEPARTED_PER_GPU * max(self._most_enumerated, 1)
        overflow = by_age[: max(0, len(by_age) - keep)]
        return overflow + [k for k in by_age[len(overflow):] if now - self._departed[k] >= self._forget_after]

    def _forget(self, key: str) -> None:
        """Drop a departed device and every per-device cache of it."""
        del self._departed[key]
        with self._ident_lock:
            identity = self._identities.pop(key, None)
            self._up.pop(key, None)
            self._complete.discard(key)
        self._busy.forget(key)
        self._process_seen.forget(key)
        self._process_busy.forget(key)
        self._hints.forget(key)
        self._cadence.forget(key)
        self._slow_parts.pop(key, None)
        self._pcie_unwrap.forget(key)
        for source in [s for s in list(self._clock_event_source) if s[0] == key]:
            self._clock_event_source.pop(source, None)
        self._health.forget_device(key)
        if self._gpm is not None:
            self._gpm.forget(key)
        if identity is not None:
            self._counters.forget(identity.uuid or identity.pci_bus_id or f"#index-{identity.index}")
            if self._xid is not None and identity.uuid:  # its XID series go with the rest
                self._xid.forget(identity.uuid)
            self._log.info("GPU no longer enumerated for long; its series are dropped",
                           extra=fields(gpu=identity.index, uuid=identity.uuid))

    def _known(self) -> list[GpuIdentity]:
        with self._ident_lock:
            return list(self._identities.values())

    def _down(self, key: str, err: DeviceDown | None, identity: GpuIdentity | None = None) -> GpuSample:
        """identity: where the caller holds it (a stuck GPU's placeholder, which a late
        worker may replace in _identities meanwhile)."""
        if identity is None:
            with self._ident_lock:
                identity = self._identities[key]
        self._busy.unread(key)  # not read now: not filled at the busy mean when it answers again
        if self._up.get(key, True):
            self._log.warning(
                "GPU not answering; reporting resmon_gpu_up 0",
                extra=fields(gpu=identity.index, uuid=identity.uuid, error=str(err) if err else "no longer enumerated"),
            )
        self._up[key] = False
        if self._gpm is not None:
            self._gpm.drop(key)  # it may be reset before it answers again: no GPM window across the gap
        return GpuSample(identity, up=False)

    def _open(self, index: int) -> tuple[Any, bool, tuple[str, GpuSample] | None]:
        """The handle of the GPU at index and whether it is this enumeration's cached one; where
        no handle answers, (None, False, the down sample of the device seen at that index)."""
        handle = self._handles.get(index)
        cached = handle is not None
        if handle is None:
            generation = self._handles.generation  # before the lookup: a count change meanwhile wins
            refused = ""
            try:
                handle = nvml_errors.required(pynvml.nvmlDeviceGetHandleByIndex, index)
            except nvml_errors.Denied as err:  # we may not open this GPU: a failure (issue 22 item 12)
                handle, refused = None, str(err)
            except (DeviceDown, Missing):
                handle = None
            if handle is None:  # lost at handle: the device that was at this index is down
                key = self._key_at.get(index) or f"#index-{index}"
                with self._ident_lock:  # the reader and other workers iterate it
                    self._identities.setdefault(key, GpuIdentity(index=index))
                    if refused:
                        self._denied_at[index] = refused
                    else:
                        self._denied_at.pop(index, None)
                return None, False, (key, self._down(key, DeviceDown(None, refused or "no handle")))
            with self._ident_lock:
                self._denied_at.pop(index, None)
            self._handles.put(index, handle, generation)
        return handle, cached, None

    def _known_key(self, index: int) -> str | None:
        """The key of the device at index without asking its UUID: its handle is still the
        cached one of this enumeration, and its identity is complete (the UUID is a slow
        value, read again on the GPU's slow reads, which catch a re-enumeration)."""
        key = self._key_at.get(index)
        with self._ident_lock:
            if key is None or key not in self._complete or key not in self._identities:
                return None
            if self._identities[key].index != index:
                return None
            self._identified_at[index] = key
        return key

    def _identify(self, index: int, handle: Any) -> str:
        """The key of the device at index now (its UUID is read on its slow reads and whenever
        the handle is new: one cheap call that catches re-enumeration), its identity read
        field by field until complete."""
        uuid = text(nvml_errors.field(pynvml.nvmlDeviceGetUUID, handle))
        pci = ""
        key = uuid
        if not uuid:
            # a UUID that does not answer (this once, or on this driver): the device known by
            # this PCI bus id, else a new key by PCI bus id, else whoever was at this index
            pci = self._pci_bus_id(handle)
            with self._ident_lock:
                key = self._key_by_pci(pci) or pci or self._key_at.get(index) or f"#index-{index}"
        placeholder = f"#index-{index}"
        with self._ident_lock:  # NVML calls stay outside: a hung GPU must not block the others
            # from here on a read of this GPU stuck later is reported under this key (_stuck_device)
            self._identified_at[index] = key
            if key != placeholder and placeholder in self._identities:
                # the device's first answer: its uuid="" series is replaced by the real one
                self._identities.pop(placeholder)
                self._up.pop(placeholder, None)
            old = self._identities.get(key)
            if old is not None and key in self._complete:
                if old.index != index:
                    old = self._identities[key] = dataclasses.replace(old, index=index)
                return key
            if old is None:  # what is known so far, for a read that gets stuck before the rest answers
                old = self._identities[key] = GpuIdentity(index=index, uuid=uuid, pci_bus_id=pci)
        identity, complete = self._read_identity(index, handle, uuid, pci, old)
        with self._ident_lock:
            self._identities[key] = identity
            if complete:  # no identity call again until the next init
                self._complete.add(key)
            if uuid and identity.pci_bus_id:
                # the UUID answers now: a device that was known by its PCI bus id is this one
                for other in [k for k, i in self._identities.items() if k != key and not i.uuid and i.pci_bus_id == identity.pci_bus_id]:
                    del self._identities[other]
                    self._up.pop(other, None)
        return key

    def _key_by_pci(self, pci: str) -> str | None:
        if not pci:
            return None
        for key, identity in self._identities.items():
            if identity.pci_bus_id == pci:
                return key
        return None

    def _pci_bus_id(self, handle: Any) -> str:
        pci = nvml_errors.field(pynvml.nvmlDeviceGetPciInfo, handle)
        return text(pci.busId) if pci is not None else ""

    def _name(self, handle: Any) -> str:
        try:
            return text(nvml_errors.call(pynvml.nvmlDeviceGetName, handle))
        except Undecodable:
            return text(nvml_errors.field(_raw_name, handle))
        except (DeviceDown, Missing):
            return ""

    def _read_identity(
        self, index: int, handle: Any, uuid: str, pci: str, old: GpuIdentity | None
    ) -> tuple[GpuIdentity, bool]:
        """The identity with the fields old lacks read again, and whether it is complete:
        name and PCI bus id known, and every max clock read or positively not supported (a
        clock that failed, e.g. RESET_REQUIRED at start, is asked again on later reads)."""
        uuid = uuid or (old.uuid if old else "")  # a UUID once read is kept
        name = (old.name if old else "") or self._name(handle)
        pci = (old.pci_bus_id if old else "") or pci or self._pci_bus_id(handle)
        known = dict(old.clock_max_hertz) if old else {}
        settled = True
        for clock in CLOCK_TYPES:
            if clock in known:
                continue
            try:
                hertz = mhz_to_hertz(self._max_clock(handle, CLOCK_IDS[clock]))
            except DeviceDown:  # not an answer: asked again next time
                settled = False
                continue
            if hertz is not None:  # None: not supported (or no such call), which is an answer
                known[clock] = hertz
        clocks = tuple((clock, known[clock]) for clock in CLOCK_TYPES if clock in known)
        # the /dev/nvidiaN minor: NVIDIA's DRA driver names a GPU gpu-<minor> (kubernetes attribution)
        minor = old.minor if old is not None and old.minor is not None else nvml_errors.field(pynvml.nvmlDeviceGetMinorNumber, handle)
        identity = GpuIdentity(index=index, uuid=uuid, name=name, pci_bus_id=pci, clock_max_hertz=clocks,
                               minor=int(minor) if minor is not None else None)
        return identity, bool(name and pci and settled)
