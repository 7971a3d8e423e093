"""The health and nvlink collectors' NVML reads: ECC, retired pages, remapped rows, NVLink.

Which generation answers what (shared/reference/nvml-extended.md §2, §4c): ECC on
datacenter and pro boards only; page retirement Kepler..Turing, row remapping Ampere and
newer (each answers NOT_SUPPORTED where the other applies); NVLink where links exist. A
query that answers NOT_SUPPORTED is an absent value, never 0, and is asked again only once a
minute (mostly a property of the board and driver; MIG changes some answers at run time).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import pynvml

from ...logs import fields as log_fields
from ...samples import GpuHealth, NvLinkSample
from . import fields as nvml_fields
from .errors import LOST_CODES, DeviceDown, Fallback

_ECC_TYPES = (("corrected", 0), ("uncorrected", 1))  # nvmlMemoryErrorType_t
_ECC_SCOPES = (("volatile", 0), ("aggregate", 1))  # nvmlEccCounterType_t
_RETIREMENT_CAUSES = (("multiple_single_bit", 0), ("double_bit", 1))  # nvmlPageRetirementCause_t
_NVLINK_ERRORS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))  # nvmlNvLinkErrorCounter_t
# ECC mode and counts, retired pages, remapped rows: the field ids of one slow batch, by the
# read (backends/nvml/wanted.py) each serves
_HEALTH_FIELDS: dict[str, tuple[int, ...]] = {
    "ecc": (nvml_fields.ECC_CURRENT, nvml_fields.ECC_PENDING, *nvml_fields.ECC_COUNTS.values()),
    "retired": (*nvml_fields.RETIRED_PAGES.values(), nvml_fields.RETIRED_PENDING),
    "remapped": tuple(nvml_fields.REMAPPED),
}
_ALL_READS = frozenset(_HEALTH_FIELDS)
_RECOVERY_ACTION_MAX = 255  # enum values 0..7 today; anything larger is garbage
UNSUPPORTED_RECHECK = 60.0  # seconds a NOT_SUPPORTED answer is trusted before asking again
# ... for a slow value's call (slow.py), asked only where its field entry did not answer:
# the board lacks the feature, which a GPU coming back from down or a new init asks again
SLOW_RECHECK = 600.0
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS of the 13.x header: only the probing fallback uses it


def _flag(value: Any) -> int | None:
    return None if value is None else (1 if int(value) else 0)


class HealthReader:
    """Reads one device's health values. Remembers per device key which queries the board
    does not support, so an H100 is not asked for retired pages on every refresh."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._warned: set[tuple[str, str, int | None]] = set()
        self._failed: set[str] = set()  # parts with a failed query since take_failures()
        # a GPU worker's failures go to its own job (begin_job/end_job) and reach the read
        # that job belongs to: a stuck job returning later must not fail a later read
        self._job = threading.local()
        self._ecc_mode = Fallback(pynvml.nvmlDeviceGetEccMode)
        self._ecc_errors = Fallback(pynvml.nvmlDeviceGetTotalEccErrors)
        self._retired = Fallback(pynvml.nvmlDeviceGetRetiredPages)
        self._retired_pending = Fallback(pynvml.nvmlDeviceGetRetiredPagesPendingStatus)
        self._remapped = Fallback(pynvml.nvmlDeviceGetRemappedRows)
        self._link_state = Fallback(pynvml.nvmlDeviceGetNvLinkState)
        self._link_errors = Fallback(pynvml.nvmlDeviceGetNvLinkErrorCounter)
        self._unsupported: dict[tuple[str, str], float] = {}  # (device key, query) -> until when it is trusted
        self._links: dict[str, int] = {}  # device key -> link count, read once per init

    def forget(self) -> None:
        """After nvmlInit (a new driver may answer differently)."""
        self._unsupported.clear()
        self._links.clear()

    def forget_device(self, key: str) -> None:
        """A device that left for good (NvmlBackend forgets departed GPUs): its memos go. On
        the reader thread while workers add their own devices' entries: copies, then pops."""
        for memo in [m for m in list(self._unsupported) if m[0] == key]:
            self._unsupported.pop(memo, None)
        self._links.pop(key, None)
        for warned in [w for w in list(self._warned) if w[0] == key]:
            self._warned.discard(warned)

    def forget_unsupported(self, key: str) -> None:
        """A GPU back from down (reset, MIG change): what it did not support is asked again."""
        for memo in [m for m in list(self._unsupported) if m[0] == key]:
            self._unsupported.pop(memo, None)

    def ask(
        self, key: str, what: str, fn: Callable[..., Any], *args: Any, part: str = "gpu", remember: bool = True,
        recheck: float = UNSUPPORTED_RECHECK,
    ) -> Any:
        """fn(*args) for a health or v2 value. NOT_SUPPORTED (None) is remembered for this
        device for UNSUPPORTED_RECHECK seconds (some answers change at run time: remapped
        rows and utilization samples while MIG is on); remember=False for a call whose None
        means "nothing this once" (GPM's NO_DATA). A failure other than a lost GPU is an
        absent value this once: logged (once per device, query and code) and counted against
        `part`, whose collector then reports the refresh unsuccessful."""
        now = time.monotonic()
        until = self._unsupported.get((key, what)) if remember else None
        if until is not None and now < until:
            return None
        try:
            value = fn(*args)
        except DeviceDown as err:
            if err.code in LOST_CODES:
                raise
            self.fail(part)
            if (key, what, err.code) not in self._warned:
                self._warned.add((key, what, err.code))
                self._log.warning("GPU query failed; leaving its value out", extra=log_fields(device=key, query=what, error=str(err)))
            return None
        if value is None and remember:
            self._unsupported[(key, what)] = now + recheck
        else:
            self._unsupported.pop((key, what), None)
        return value

    def fail(self, part: str) -> None:
        """A query of `part` failed (in ask() or outside it): its collector reports the refresh
        unsuccessful. On a GPU worker it is counted against that worker's job."""
        job_failed = getattr(self._job, "failed", None)
        (job_failed if job_failed is not None else self._failed).add(part)

    def begin_job(self) -> None:
        """This thread's failures from now on are its job's (see end_job)."""
        self._job.failed = set()

    def end_job(self) -> frozenset[str]:
        """The parts that failed in this thread's job; later failures are unscoped again."""
        failed, self._job.failed = self._job.failed, None
        return frozenset(failed)

    def begin_slow(self) -> None:
        """A slow read starts on this thread: end_slow() says which parts failed in it."""
        self._job.slow_base = set(self._current())

    def end_slow(self) -> frozenset[str]:
        return frozenset(self._current() - getattr(self._job, "slow_base", set()))

    def _current(self) -> set[str]:
        job_failed = getattr(self._job, "failed", None)
        return job_failed if job_failed is not None else self._failed

    def take_failures(self) -> set[str]:
        """The parts whose queries failed since the last call (one read)."""
        failed, self._failed = self._failed, set()
        return failed

    def health_requests(self, reads: frozenset[str] = _ALL_READS) -> list[nvml_fields.Request]:
        """The slow health values' field ids, read in the device's one batch (of the reads wanted)."""
        return [(fid, 0) for read, ids in _HEALTH_FIELDS.items() if read in reads for fid in ids]

    def health(
        self, key: str, handle: Any, fields: nvml_fields.Values | dict[nvml_fields.Request, float | int],
        reads: frozenset[str] = _ALL_READS,
    ) -> GpuHealth:
        """ECC, retired pages and remapped rows (slow values; recovery_action is filled in per
        refresh): from the batch, each value its own call where its entry did not answer.
        reads: which of ecc, retired, remapped to read (the others are left out, no call)."""
        ask = self.ask

        def field(fid: int) -> int | None:
            value = fields.get((fid, 0))
            return None if value is None else int(value)

        ecc_enabled: list[tuple[str, int]] = []
        ecc_errors: list[tuple[str, str, int]] = []
        current, pending = _flag(field(nvml_fields.ECC_CURRENT)), _flag(field(nvml_fields.ECC_PENDING))
        if "ecc" in reads and (current is None or pending is None):
            mode = ask(key, "ecc_mode", self._ecc_mode, handle, part="health", recheck=SLOW_RECHECK)
            if mode is not None:
                current, pending = (_flag(m) for m in mode)
        ecc_enabled = [(m, v) for m, v in (("current", current), ("pending", pending)) if v is not None]
        if current:  # the counters need ECC on (they answer NOT_SUPPORTED otherwise)
            for type_name, type_id in _ECC_TYPES:
                for scope_name, scope_id in _ECC_SCOPES:
                    count = field(nvml_fields.ECC_COUNTS[(type_id, scope_id)])
                    if count is None:
                        count = ask(key, f"ecc.{type_id}.{scope_id}", self._ecc_errors, handle, type_id, scope_id, part="health", recheck=SLOW_RECHECK)
                    if count is not None and count != nvml_fields.U64_NA:
                        ecc_errors.append((type_name, scope_name, int(count)))
        retired: list[tuple[str, int]] = []
        for cause, cause_id in _RETIREMENT_CAUSES if "retired" in reads else ():
            pages = field(nvml_fields.RETIRED_PAGES[cause_id])
            if pages is None:
                listed = ask(key, f"retired.{cause_id}", self._retired, handle, cause_id, part="health", recheck=SLOW_RECHECK)
                pages = None if listed is None else len(listed)
            if pages is not None:
                retired.append((cause, pages))
        pending_pages = None
        if retired:
            pending_pages = _flag(field(nvml_fields.RETIRED_PENDING))
            if pending_pages is None:
                pending_pages = _flag(ask(key, "retired_pending", self._retired_pending, handle, part="health", recheck=SLOW_RECHECK))
        remapped: list[tuple[str, int]] = []
        remap_pending = remap_failed = None
        rows: Any = tuple(field(fid) for fid in nvml_fields.REMAPPED)
        if None in rows and "remapped" in reads:
            rows = ask(key, "remapped", self._remapped, handle, part="health", recheck=SLOW_RECHECK)
        if rows is not None and None not in rows:
            corrected, uncorrected, is_pending, failed = rows
            remapped = [("correctable", int(corrected)), ("uncorrectable", int(uncorrected))]
            remap_pending, remap_failed = _flag(is_pending), _flag(failed)
        return GpuHealth(
            ecc_enabled=tuple(ecc_enabled),
            ecc_errors=tuple(ecc_errors),
            retired_pages=tuple(retired),
            retired_pages_pending=pending_pages,
            remapped_rows=tuple(remapped),
            row_remap_pending=remap_pending,
            row_remap_failed=remap_failed,
        )

    @staticmethod
    def recovery_action(fields: nvml_fields.Values | dict[nvml_fields.Request, float | int]) -> int | None:
        action = nvml_fields.in_range(fields.get((nvml_fields.GPU_RECOVERY_ACTION, 0)), 0, _RECOVERY_ACTION_MAX)
        return int(action) if action is not None else None

    # -- NVLink -------------------------------------------------------------------------

    def link_count(self, key: str, handle: Any, read_fields: Callable[[list[nvml_fields.Request]], nvml_fields.Values | None]) -> int:
        """Links the device has: field 91 (cheaper than probing 36 links), else probing
        nvmlDeviceGetNvLinkState until a link index is refused. Kept once the answer is
        definite; a failed probe is 0 this once and asked again."""
        if key in self._links:
            return self._links[key]
        answered = read_fields([(nvml_fields.NVLINK_LINK_COUNT, 0)])
        count = nvml_fields.in_range((answered or {}).get((nvml_fields.NVLINK_LINK_COUNT, 0)), 0, MAX_NVLINKS)
        if count is None:
            count = 0
            for link in range(MAX_NVLINKS):
                try:
                    if self._link_state(handle, link) is None:  # NOT_SUPPORTED: no NVLink
                        break
                except DeviceDown as err:
                    if err.code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                        break  # past the last link
                    if err.code in LOST_CODES:
                        raise
                    self.fail("nvlink")
                    return 0
                count += 1
        self._links[key] = int(count)
        return int(count)

    def link_requests(self, count: int) -> list[nvml_fields.Request]:
        """The links' traffic counters (fast: every refresh)."""
        return [(fid, link) for link in range(count) for fid in (nvml_fields.NVLINK_THROUGHPUT_DATA_TX, nvml_fields.NVLINK_THROUGHPUT_DATA_RX)]

    def link_slow_requests(self, count: int, state: bool = True, errors: bool = True) -> list[nvml_fields.Request]:
        """The links' state and error counters (slow; each where wanted): every link by scope,
        CRC data through the per-link legacy ids, which exist for links 0..11 only."""
        out: list[nvml_fields.Request] = []
        for link in range(count):
            if state:
                out.append((nvml_fields.NVLINK_GET_STATE, link))
            if not errors:
                continue
            out.extend((fid, link) for fid in nvml_fields.NVLINK_DL_ERRORS.values())
            legacy = nvml_fields.nvlink_crc_data_field(link)
            if legacy is not None:
                out.append((legacy, 0))
        return out

    def link_state(
        self, key: str, handle: Any, count: int, fields: nvml_fields.Values | dict[nvml_fields.Request, float | int],
        state_wanted: bool = True, errors_wanted: bool = True,
    ) -> tuple[NvLinkSample, ...]:
        """Each link's state and error counters (slow values; each where wanted), each from its
        field where that entry answered, else its own call."""
        links = []
        for link in range(count):
            state = fields.get((nvml_fields.NVLINK_GET_STATE, link))
            if state is None and state_wanted:
                state = self.ask(key, f"nvlink_state.{link}", self._link_state, handle, link, part="nvlink", recheck=SLOW_RECHECK)
            errors = []
            for name, counter in _NVLINK_ERRORS if errors_wanted else ():
                fid = nvml_fields.NVLINK_DL_ERRORS.get(name)
                value = fields.get((fid, link)) if fid is not None else None
                if value is None and name == "crc_data":
                    legacy = nvml_fields.nvlink_crc_data_field(link)
                    value = fields.get((legacy, 0)) if legacy is not None else None
                if value is None:
                    value = self.ask(key, f"nvlink_errors.{link}.{counter}", self._link_errors, handle, link, counter, part="nvlink", recheck=SLOW_RECHECK)
                if value is not None and value != nvml_fields.U64_NA:
                    errors.append((name, int(value)))
            links.append(NvLinkSample(link=link, active=_flag(state), errors=tuple(errors)))
        return tuple(links)

    @staticmethod
    def link_traffic(slow: tuple[NvLinkSample, ...], count: int, fields: nvml_fields.Values | dict[nvml_fields.Request, float | int]) -> tuple[NvLinkSample, ...]:
        """The links with this refresh's traffic counters on top of their slow state."""
        known = {s.link: s for s in slow}
        links = []
        for link in range(count):
            moved = []
            for direction, fid in (("transmit", nvml_fields.NVLINK_THROUGHPUT_DATA_TX), ("receive", nvml_fields.NVLINK_THROUGHPUT_DATA_RX)):
                kib = fields.get((fid, link))
                if kib is not None and kib >= 0:
                    moved.append((direction, int(kib) * 1024))  # the header says KiB
            base = known.get(link, NvLinkSample(link=link))
            links.append(NvLinkSample(link=link, active=base.active, bytes=tuple(moved), errors=base.errors))
        return tuple(links)
