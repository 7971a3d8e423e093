"""NVIDIA GPUs through NVML (pynvml from nvidia-ml-py): NvmlBackend, the GpuBackend of NVML.

The backend is in rooms, one job each (docs/architecture.md):

    backend.py    NvmlBackend: a refresh across the GPUs (the reader chain of workers.py, the
                  slow cadence of slow.py, each GPU's deadline), the reading it hands the monitor
    session.py    nvmlInit and nvmlShutdown, the backoff between tries, NO_PERMISSION
    registry.py   identity by UUID, placeholders, handles, up history, departed devices
    gpu_read.py   one GPU's read on its reader: values, field batch, clocks, PCIe, busy
                  seconds, processes, MIG, GPM, the slow part
    errors.py     the one boundary that classifies NVML's errors; every room calls through it

The rooms are mixins of the one NvmlBackend object, not separate objects: they share state
that one lock guards (the identity maps under _ident_lock, read by the refresh, the readers
and the session), a departed device or a new init drops caches of every room at once, and
the readers' jobs need the registry and the read together; each room sets up its own state
(_init_session, _init_registry, _init_read) and no room imports another's module.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import pynvml

from ...counters import Monotonic
from ...logs import fields
from ...samples import GpuIdentity, GpuReading, GpuSample, PartStatus, XidState, all_down, in_order
from ..base import GpuOptions
from . import errors as nvml_errors
from .errors import BackendDown, DeviceDown, Missing
from .gpm import GpmReader
from .gpu_read import PARTS as _PARTS, DeviceRead, GpuRead
from .registry import DEPARTED_PER_GPU, DEPARTED_SECONDS, DeviceRegistry
from .session import NvmlSession
from .slow import Cadence, SlowPart
from .workers import GpuSlot, Readers, Starts, device_limit
from .wanted import Wanted
from .xid import XidWatcher

__all__ = ["DEPARTED_PER_GPU", "DEPARTED_SECONDS", "NvmlBackend"]


class NvmlBackend(NvmlSession, DeviceRegistry, GpuRead):
    name = "nvml"
    device_deadlines = True  # read() itself bounds each GPU (see ResourceMonitor)

    def __init__(
        self,
        log: logging.Logger,
        explicit: bool = False,
        min_backoff: float = 1.0,
        max_backoff: float = 30.0,
        options: GpuOptions | None = None,
        device_timeout: float = 5.0,
        forget_after: float = DEPARTED_SECONDS,
    ) -> None:
        self._log = log
        # the reads --metrics.include/exclude leave to make; collectors left with none are off
        self._wanted = Wanted.of((options or GpuOptions()).metrics)
        options = self._wanted.options(options or GpuOptions())
        self._options = options
        # what the rooms share: the watcher and the readers are inside NVML (the session waits
        # for them), GPM samples belong to an init, every room drops a device's GPM state
        self._xid = XidWatcher(log) if self._options.xid else None
        self._gpm = GpmReader(log) if self._options.profiling else None
        self._readers = Readers()
        self._init_session(explicit, min_backoff, max_backoff)
        self._init_registry(forget_after)
        self._init_read()
        # the slow cadence (slow.py): which GPUs read their slow part in a refresh, and the
        # parts as last read (both the reader's; workers only read _slow_parts)
        self._cadence = Cadence(options.slow_interval)
        self._slow_parts: dict[str, SlowPart] = {}
        # the GPUs are read on the reader threads (workers.py); a refresh waits this long for
        # one GPU, after which that GPU alone is down until its read returns (--collect.timeout,
        # a little less)
        self._device_timeout = device_timeout
        self._device_limit = device_limit(device_timeout)
        self._workers: dict[int, GpuSlot] = {}  # each GPU's read state, by index
        self._starts = Starts()  # a chain or all at once (workers.py)
        self._stuck: set[int] = set()  # indices whose read is in flight past the limit
        self._any_stuck = False  # in this read
        self._unstarted: set[int] = set()  # indices warned about as not started, until read again
        self._count = -1  # device count of the previous read: a change means re-enumeration
        self._mig_on = False  # a GPU in this read answers its MIG mode (on or off): the mig collector is active
        # counters never decrease (exporter/counters.py): every counter family restarted lower
        # kept monotonic, once per read
        self._counters = Monotonic()
        self._xid_seen: dict[tuple[str, int], int] = {}  # (uuid, code) -> events seen by the last read
        self._watched: dict[str, Any] = {}  # uuid -> handle of the devices enumerated in this read
        # index -> (uuid, handle) of its last read that got that far: a GPU whose read is
        # stuck stays watched for XIDs (a hung GPU is when they come)
        self._last_watched: dict[int, tuple[str, Any]] = {}
        self._part_seconds = dict.fromkeys(_PARTS, 0.0)  # summed over the GPUs' reads
        self._xid_ever_watched = False  # the xid collector has been active (some GPU registered)

    # -- lifecycle --------------------------------------------------------------------

    def prepare(self) -> None:
        self.try_init()  # nvmlInit can take seconds without persistence mode: not in a scrape

    def _new_init(self) -> None:
        """A new init of NVML (session.py): what the rooms knew of the old one goes."""
        self._handles.clear()
        self._last_watched.clear()
        self._complete.clear()
        self._count = -1
        self._busy.reset()  # the driver's sample clock may have restarted
        self._process_seen.clear()
        self._process_busy.restart()  # counters go on; the old clock's timestamps are no start
        self._health.forget()
        self._hints.forget()
        self._cadence.force_all()  # a new init (a driver reload, a reset GPU): every slow part again

    def _init_lost(self) -> None:
        """This init stopped answering (session.py): its handles go with it."""
        self._handles.clear()
        self._last_watched.clear()

    # -- reading ----------------------------------------------------------------------

    def read(self) -> GpuReading:
        if not self.try_init():
            return self._unavailable()
        self._part_seconds = dict.fromkeys(_PARTS, 0.0)
        self._watched = {}
        try:
            try:
                count = nvml_errors.required(pynvml.nvmlDeviceGetCount) or 0
            except nvml_errors.Denied as err:  # asked again on the next refresh (a cheap call)
                self._refused(str(err))
                return self._unavailable()
            self._denied = ""
            if count != self._count:  # re-enumerated: an index may now be another device
                self._handles.clear()
                self._last_watched.clear()
                self._count = count
            devices, self._watched, self._part_seconds = self._read_devices(count)
        except (BackendDown, DeviceDown, Missing) as err:  # count failing means the library, not a device
            self._lost_backend(err)
            return self._unavailable()
        by_key: dict[str, GpuSample] = {}
        for key, sample in devices:  # two indices can claim one key mid re-enumeration: the answering one wins
            if key not in by_key or sample.up:
                by_key[key] = sample
        self._key_at = {sample.identity.index: key for key, sample in by_key.items()}
        for key, sample in by_key.items():
            if not sample.up:  # when it answers again, its slow part is read with it, and
                self._cadence.force(key)  # what it did not support is asked again (a reset, MIG)
                self._health.forget_unsupported(key)
        # a GPU in this read answered its MIG mode (on or off): the mig collector is active
        self._mig_on = any(sample.mig is not None for sample in by_key.values())
        seen = set(by_key)
        samples = list(by_key.values())
        # A device seen before but no longer enumerated stays visible as down, under its last index.
        shown = {(s.identity.index, s.identity.uuid) for s in samples}
        self._most_enumerated = max(self._most_enumerated, count)
        for key in self._departures(seen):
            self._forget(key)
        with self._ident_lock:  # a stuck worker may still be adding to it
            known = list(self._identities.items())
            identified = dict(self._identified_at)
        # a GPU reported stuck under its placeholder whose identity answered while this read
        # finished: its sample is that identity's (one series, never uuid="" beside the UUID)
        placeholders = {s.identity.index: i for i, (k, s) in enumerate(by_key.items()) if k == f"#index-{s.identity.index}"}
        for key, identity in known:
            if key in seen:
                continue
            at = placeholders.get(identity.index)
            if at is not None and identified.get(identity.index) == key:
                samples[at] = dataclasses.replace(samples[at], identity=identity)
                del placeholders[identity.index]
                continue
            if (identity.index, identity.uuid) in shown:
                continue  # same labels as an enumerated device (no UUID to tell them apart)
            samples.append(self._down(key, None))
        samples = self._counters.samples(samples)  # no counter decreases (exporter/counters.py)
        self._backoff = self._min_backoff  # a read that worked: the next loss retries soon again
        with self._ident_lock:  # a late worker may still write it
            refused = {i: e for i, e in self._denied_at.items() if i < count}
        if refused:
            self._refused(next(iter(refused.values())), tuple(sorted(refused)))
        xid = None
        if self._xid is not None:
            if not self._closing:
                self._xid.watch(dict(self._watched))
            xid = self._xid.state()
            self._xid_ever_watched = self._xid_ever_watched or bool(xid.watched)
            self._reread_after_xid(xid)
        return GpuReading(
            backend="nvml",
            # a GPU not read this time, or one we may not open: the collector did not succeed
            success=not self._any_stuck and not refused,
            error="no_permission" if refused else "",
            device_count=count,
            driver_version=self._driver_version,
            devices=in_order(samples),
            memory_api=self.memory_api,
            parts=self._parts(not self._any_stuck, samples),  # a stuck GPU's health is missing too
            xid=xid,
        )

    def _reread_after_xid(self, xid: XidState) -> None:
        """A GPU with a new XID event reads its slow part on the next refresh: ECC, remapping
        and NVLink errors are what XIDs 48, 63, 64, 74, 92, 94, 95, 119, 120 ... announce."""
        counts = {(c.uuid, c.xid): c.count for c in xid.counts}
        for (uuid, code), count in counts.items():
            if count > self._xid_seen.get((uuid, code), 0):
                self._cadence.force(uuid)
        self._xid_seen = counts

    def _parts(self, success: bool, samples: list[GpuSample] | tuple[GpuSample, ...] = ()) -> tuple[PartStatus, ...]:
        """health and nvlink fail with the read, and when one of their queries failed on an
        answering GPU in it (the values are then missing, and their alerts blind). Those
        served from slow reads (health, nvlink, mig) carry the oldest slow read's time."""
        failed = self._health.take_failures()
        slow_at = min((s.slow_read_at for s in samples if s.up and s.slow_read_at is not None), default=None)
        parts = []
        if self._options.health:
            ok = success and not failed & {"health", "fields"}
            parts.append(PartStatus("health", ok, self._part_seconds["health"], slow_at))
        if self._options.nvlink and self._has_links:
            ok = success and not failed & {"nvlink", "fields"}
            parts.append(PartStatus("nvlink", ok, self._part_seconds["nvlink"], slow_at))
        if self._gpm is not None and self._gpm.active:
            parts.append(PartStatus("profiling", success and "profiling" not in failed, self._part_seconds["profiling"]))
        if self._options.mig and self._mig_on:
            parts.append(PartStatus("mig", success and "mig" not in failed, self._part_seconds["mig"], slow_at))
        if self._options.processes:
            parts.append(PartStatus("processes", success and "processes" not in failed, self._part_seconds["processes"]))
        return tuple(parts)

    def _unavailable(self) -> GpuReading:
        """No NVML right now. Before it ever worked (auto mode) the host simply has no GPU
        backend; after, or when NVML was asked for explicitly, it is a failure."""
        # NO_PERMISSION is a failure even before NVML ever worked: a GPU is there, closed to us
        failing = self._ever_initialised or self._explicit or bool(self._denied)
        self._busy.unread_all()
        return GpuReading(
            backend="nvml" if failing else "none",
            success=not failing,
            error="no_permission" if self._denied else "",
            driver_version=self._driver_version,
            devices=all_down(self._known()),
            memory_api=self.memory_api,
            parts=self._parts(False) if failing else (),
            xid=self._xid_while_away() if failing else None,
        )

    def _read_devices(self, count: int) -> tuple[list[tuple[str, GpuSample]], dict[str, Any], dict[str, float]]:
        """Every device read on the GPU readers (workers.py): the samples, the devices to watch for
        XIDs (uuid -> handle) and the part seconds summed over the reads. A device whose read
        does not return within the limit (or is still running from an earlier refresh) is down
        alone, watched by its last handle; the first error of any device is raised once all
        have answered (a defect before a library-level error)."""
        self._readers.ensure(count)  # before the deadline is set: the first refresh makes them
        now = time.monotonic()
        until = now + self._device_limit
        jobs = []
        for i in range(count):
            slot = self._workers.get(i)
            if slot is None:
                slot = self._workers[i] = GpuSlot(i)
            slow = self._cadence.due(self._key_at.get(i), now)
            jobs.append((slot, lambda i=i, slow=slow: self._read_device(i, slow)))
        # busy now: a read still in flight from an earlier refresh, which the chain passes over
        in_flight = [slot.busy for slot, _ in jobs]
        chain = self._readers.run(jobs, until, self._starts.at_once(), self._starts.expect, self._starts.alone)
        out: list[tuple[str, GpuSample]] = []
        watched: dict[str, Any] = {}
        seconds = dict.fromkeys(_PARTS, 0.0)
        error: BaseException | None = None
        defect: BaseException | None = None
        self._any_stuck = False
        for i, (submitted, done, result, err) in enumerate(self._readers.outcome(chain)):
            if not done:
                # neither started nor in flight: the refresh's deadline passed before its turn
                out.append(self._stuck_device(i, started=submitted or in_flight[i]))
                if i in self._last_watched:
                    uuid, handle = self._last_watched[i]
                    watched[uuid] = handle
                continue
            self._unstarted.discard(i)
            if i in self._stuck:
                self._stuck.discard(i)
                self._log.info("GPU read returned; reading it again", extra=fields(gpu=i))
            if err is not None:
                if isinstance(err, (BackendDown, DeviceDown, Missing)):
                    error = error or err
                else:  # a defect (the reader logs it): raised once every worker is waited for
                    defect = defect or err
                continue
            assert isinstance(result, DeviceRead)
            out.append((result.key, result.sample))
            if result.watch is not None:
                self._last_watched[i] = result.watch
                watched[result.watch[0]] = result.watch[1]
            else:
                self._last_watched.pop(i, None)
            for part, spent in result.seconds.items():
                seconds[part] += spent
            for part in result.failed:
                self._health.fail(part)  # on this thread: the read's own failures
            if result.slow is not None:
                self._slow_parts[result.key] = result.slow
                self._cadence.read(result.key, i, count, now)
            if result.reread:
                self._cadence.force(result.key)
        self._starts.learn(chain)
        if defect is not None:
            if error is not None:  # the library went too: re-initialise as read() would, then report the defect
                self._lost_backend(error)
            raise defect
        if error is not None:
            raise error
        return out, watched, seconds

    def _stuck_device(self, index: int, started: bool = True) -> tuple[str, GpuSample]:
        """A GPU not read in this refresh: its read in flight past the limit, or (started
        False) never started before the refresh's deadline. Reported under the key its
        worker's identity read found (also while that read is still in flight), else the one
        seen at this index before; a placeholder only for a GPU never identified."""
        self._any_stuck = True
        with self._ident_lock:  # _identify sets the key and drops the placeholder under it too
            key = self._identified_at.get(index) or self._key_at.get(index) or f"#index-{index}"
            identity = self._identities.setdefault(key, GpuIdentity(index=index))
        if not started:
            if index not in self._unstarted:
                self._unstarted.add(index)
                self._log.warning(
                    "GPU read not started: the refresh's deadline passed before its turn; reporting this GPU down this time",
                    extra=fields(collect_timeout_seconds=round(self._device_timeout, 3), gpu=index),
                )
            return key, self._down(key, DeviceDown(None, "read not started before the refresh's deadline"), identity)
        if index not in self._stuck:
            self._stuck.add(index)
            self._log.warning(
                "GPU read in flight longer than --collect.timeout; reporting this GPU down until it returns",
                extra=fields(collect_timeout_seconds=round(self._device_timeout, 3), gpu=index),
            )
        return key, self._down(key, DeviceDown(None, "read in flight longer than --collect.timeout"), identity)

    def _xid_while_away(self) -> XidState | None:
        """The counts so far stay served; an xid collector that was active fails while NVML
        is away (nothing is watched), one that never was (GeForce only) stays inactive."""
        if self._xid is None:
            return None
        state = self._xid.state()
        return dataclasses.replace(state, healthy=False) if self._xid_ever_watched else state
