"""The mig collector's NVML reads, and the MIG device UUIDs the kubernetes collector needs.

The MIG layout (mode, devices, their ids and names) is a slow value (slow.py): enumerated on
the GPU's slow reads, and at once again when an instance's handle stops answering (an instance
destroyed or created invalidates handles, shared/reference/nvml-extended.md section 7). Each
instance's memory and GPM values are read on every refresh through the layout's handles. Slots are sparse: NOT_FOUND and
INVALID_ARGUMENT mean an empty slot. Memory belongs to the GPU instance and is read once
per instance (from its first compute instance); GPM values per GPU instance come from
nvmlGpmMigSampleGet on the parent, their samples tagged with the instance's members so a
recreated instance is never diffed against its predecessor.

Each GPU instance's profile id and placement start (nvmlDeviceGetGpuInstanceById, then
nvmlGpuInstanceGetInfo) are read with the layout: NVIDIA's DRA driver names a MIG device by
them (gpu-<minor>-mig-<profile>-<profile id>-<start>), so the kubernetes collector resolves a
DRA claim to the live MIG device, also one created after the exporter started (the next
layout read, at once when a handle stops answering). A GPU instance that does not answer
them gives no slot: its DRA names stay unresolved, never guessed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml

from ...samples import MigDevice, MigInstance, MigSlot, MigState
from . import errors as nvml_errors
from .errors import LOST_CODES, DeviceDown, Fallback
from .gpm import GpmReader

_EMPTY_SLOT = frozenset({pynvml.NVML_ERROR_INVALID_ARGUMENT})  # NOT_FOUND already comes back as None
_PROFILE_MARK = " MIG "  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb"

Ask = Callable[..., Any]


def _optional(name: str) -> Callable[..., Any] | None:
    return getattr(pynvml, name, None)


def profile_of(name: str) -> str:
    """The profile from a MIG device's name ("... MIG 1g.10gb" -> "1g.10gb"); "" when absent."""
    at = name.rfind(_PROFILE_MARK)
    return name[at + len(_PROFILE_MARK):].strip() if at >= 0 else ""


@dataclass(frozen=True)
class MigLayout:
    """One GPU's MIG mode and devices as of its last slow read. first: (GPU instance id, the
    handle of its first MIG device), by id; members: what each instance's GPM samples are tagged with."""

    mode: tuple[int | None, int | None]
    uuids: tuple[str, ...] = ()
    devices: tuple[MigDevice, ...] = ()
    first: tuple[tuple[int, Any], ...] = ()
    members: dict[int, tuple[str, ...]] = field(default_factory=dict)
    slots: tuple[MigSlot, ...] = ()  # by GPU instance placement (DRA names)


class MigReader:
    def __init__(self) -> None:
        self._mode = Fallback(_optional("nvmlDeviceGetMigMode"))
        self._count = Fallback(_optional("nvmlDeviceGetMaxMigDeviceCount"))
        self._handle = Fallback(_optional("nvmlDeviceGetMigDeviceHandleByIndex"))
        self._gi = Fallback(_optional("nvmlDeviceGetGpuInstanceId"))
        self._ci = Fallback(_optional("nvmlDeviceGetComputeInstanceId"))
        self._gi_by_id = _optional("nvmlDeviceGetGpuInstanceById")
        self._gi_info = _optional("nvmlGpuInstanceGetInfo")

    def mode(self, key: str, handle: Any, ask: Ask) -> tuple[int | None, int | None] | None:
        """(current, pending), or None on a GPU without MIG."""
        answer = ask(key, "mig_mode", self._mode, handle, part="mig")
        if not answer:
            return None
        current, pending = (int(v) for v in answer)
        return (1 if current == 1 else 0), (1 if pending == 1 else 0)

    def handles(self, key: str, handle: Any, ask: Ask, fail: Callable[[], None]) -> list[tuple[Any, str]]:
        """The MIG devices now, (handle, UUID; "" when it does not answer), empty slots skipped.
        A slot's failure other than an empty one skips it and counts against the mig
        collector; a lost GPU raises. The UUID is read here once for both of its users."""
        count = ask(key, "mig_count", self._count, handle, part="mig") or 0
        out = []
        for i in range(int(count)):
            try:
                mig = self._handle(handle, i)  # not through ask: a slot empty now may hold an instance next refresh
            except DeviceDown as err:
                if err.code in LOST_CODES:
                    raise
                if err.code not in _EMPTY_SLOT:
                    fail()
                continue
            if mig is not None:
                out.append((mig, _uuid(mig)))
        return out

    def uuids(self, migs: list[tuple[Any, str]]) -> list[str]:
        return [u for _, u in migs if u]

    def layout(self, key: str, handle: Any, ask: Ask, fail: Callable[[], None], mode: tuple[int | None, int | None]) -> MigLayout:
        """The MIG devices now (a slow read): handles, ids, UUIDs and names."""
        migs = self.handles(key, handle, ask, fail) if mode[0] == 1 else []
        devices: list[MigDevice] = []
        first: dict[int, Any] = {}  # GPU instance id -> its first MIG device's handle
        members: dict[int, list[str]] = {}
        for mig, uuid in migs:
            try:
                gi, ci = self._gi(mig), self._ci(mig)
            except DeviceDown as err:  # destroyed between enumeration and now, or a faulty answer
                if err.code in LOST_CODES:
                    raise
                fail()
                continue
            if gi is None or ci is None or not uuid:
                continue
            name = _text(nvml_errors.field(pynvml.nvmlDeviceGetName, mig))
            devices.append(MigDevice(int(gi), int(ci), uuid, profile_of(name)))
            first.setdefault(int(gi), mig)
            members.setdefault(int(gi), []).append(f"{uuid}/{ci}/{name}")
        devices.sort(key=lambda d: (d.gpu_instance_id, d.compute_instance_id))
        return MigLayout(
            mode=mode,
            uuids=tuple(self.uuids(migs)),
            devices=tuple(devices),
            first=tuple(sorted(first.items(), key=lambda item: item[0])),
            members={gi: tuple(sorted(m)) for gi, m in members.items()},
            slots=self._slots(handle, devices),
        )

    def _slots(self, handle: Any, devices: list[MigDevice]) -> tuple[MigSlot, ...]:
        """Each MIG device with its GPU instance's profile id and placement start; a GPU
        instance that does not answer (an older driver, destroyed meanwhile) is left out."""
        if self._gi_by_id is None or self._gi_info is None:
            return ()
        placements: dict[int, tuple[int, int] | None] = {}
        out = []
        for d in devices:
            gi = d.gpu_instance_id
            if gi not in placements:
                instance = nvml_errors.field(self._gi_by_id, handle, gi)
                info = nvml_errors.field(self._gi_info, instance) if instance is not None else None
                placements[gi] = (int(info.profileId), int(info.placement.start)) if info is not None else None
            where = placements[gi]
            if where is not None:
                out.append(MigSlot(uuid=d.uuid, profile=d.profile, gi_profile_id=where[0], placement_start=where[1]))
        return tuple(out)

    def state(
        self, key: str, handle: Any, ask: Ask, fail: Callable[[], None], gpm: GpmReader | None,
        layout: MigLayout, memory_of: Callable[[Any], Any],
    ) -> tuple[MigState, float, bool]:
        """The state (every refresh), the seconds it spent in GPM reads (the profiling
        collector's time; returned, not kept: GPUs are read on parallel workers), and whether
        an instance's handle failed (the layout is stale: read it again). memory_of: the
        backend's memory query (v2, else v1 where used includes reserved memory)."""
        current, pending = layout.mode
        instances = []
        clock = time.perf_counter()
        gpm_on = gpm is not None and gpm.supported(key, handle, ask)
        gpm_seconds = time.perf_counter() - clock
        stale = False
        for gi, mig in layout.first:
            memory, lost = self._memory(mig, fail, memory_of)
            stale = stale or lost
            profiling = None
            if gpm_on:
                assert gpm is not None
                clock = time.perf_counter()
                try:
                    profiling = gpm.read(key, handle, ask, instance=gi, tag=layout.members[gi])
                finally:
                    gpm_seconds += time.perf_counter() - clock
            instances.append(MigInstance(
                gpu_instance_id=gi,
                memory_total_bytes=memory[0] if memory else None,
                memory_used_bytes=memory[1] if memory else None,
                memory_free_bytes=memory[2] if memory else None,
                profiling=profiling,
            ))
        if gpm is not None:
            gpm.forget_instances(key, {gi for gi, _ in layout.first})
        return MigState(current=current, pending=pending, devices=layout.devices, instances=tuple(instances)), gpm_seconds, stale

    def _memory(self, mig: Any, fail: Callable[[], None], memory_of: Callable[[Any], Any]) -> tuple[tuple[int, int, int] | None, bool]:
        """An instance's memory, and whether its handle failed (the instance may be gone)."""
        try:
            memory = memory_of(mig)
        except DeviceDown as err:
            if err.code in LOST_CODES:
                raise
            fail()
            return None, True
        if memory is None or not memory.total:
            return None, False
        return (int(memory.total), int(memory.used), int(memory.free)), False


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _uuid(mig: Any) -> str:
    return _text(nvml_errors.field(pynvml.nvmlDeviceGetUUID, mig))

