"""DRM client usage stats: what /proc/PID/fdinfo says of each open DRM file (amdgpu, i915, xe).

Linux Documentation/gpu/drm-usage-stats.rst: every open DRM file is a "client" (drm-client-id,
unique per device, drm-pdev); its fdinfo has ``key:<whitespace>value`` lines: busy time per
engine class (drm-engine-<name>: N ns, or on xe drm-cycles-<name> over drm-total-cycles-<name>),
the number of engines in a class (drm-engine-capacity-<name>, default 1) and the memory of its
buffer objects per region (drm-total-/drm-resident-<region>, legacy amdgpu drm-memory-<region>).

Policy:

- the scan: runs on a thread of its own (resmon-drm-clients), one at a time; read() starts one
  when none is running and waits for it at most `wait` seconds (0.2 s), so a slow or huge scan
  (a hung FUSE mount as --path.procfs, a million fds) costs the process and busy series, never
  the cards read around it. In time: the scan's result. Late: the newest finished scan's
  result if no read() has had it yet (``stale`` set, ``read_at`` its own time: the rates and
  busy time are as of that scan), else None (unknown). A late scan goes on and is not joined:
  a read() while it runs waits for that one, never starts a second;
- the listing: procfs is listed once per scan; of each process, the fd directory is read
  (os.scandir) for its first max_fds_per_process entries and no further. procfs lists a
  process's fds in ascending order (the kernel walks the fd table from 0), so those are the
  lowest fds, where DRM fds are (opened early); a process with a million fds costs that bound,
  not a million names. Those are readlink'd, and only those pointing at /dev/dri/cardN or
  /dev/dri/renderDN have their fdinfo read (one read, at most 64 KiB). What is kept of a
  process is a fingerprint of its listing (the count and a hash of the names), not the names:
  one whose fingerprint is the same as at the previous scan has only the fds that were DRM fds
  read (no readlink of every fd: most of the cost), and is looked at whole one scan in ten,
  spread over the processes (an fd number closed and reopened on a DRM node keeps the listing:
  found within ten scans);
- errors: any OSError on a process or fd skips it silently (ENOENT / ESRCH: it went between
  the listing and the read; EACCES / EPERM: another user's process, no ptrace access). Only
  procfs itself not listable is reported (read() answers None). An fdinfo without drm-driver,
  drm-pdev or drm-client-id, or of a driver not asked for, is not a client; a number that is
  not one (more than 20 digits, 2**64 and over, a wrong unit) drops that key only, never reads
  as 0;
- dedupe: a client is (pdev, client-id). One process holding it through several fds (dup,
  several threads' handles) counts it once; several processes holding it (inherited through
  fork: DataLoader workers) each list it, but its busy time goes into the device's
  busy_seconds once, and its VRAM into the lowest such pid's memory only (the others have 0 of
  it: a pod's sum counts the client once);
- VRAM of a client: over the VRAM regions (vram, vramN: amdgpu, xe; localN: i915), each
  region's drm-total-, else drm-resident-, else legacy drm-memory-; None (unknown, never 0)
  when it reports no VRAM region (an integrated GPU);
- rates: per client and engine, the largest value seen and when (the spec lets counters step
  back briefly: the reader stays with the larger value until they catch up). A process's
  utilization sums its clients' rates since the previous read, per engine, divided by the
  class's capacity, clamped to 1; clients the previous read did not see have no rate yet;
- glitches: a client's counter cannot grow faster than wall time x the class's capacity
  (drm-engine-capacity-, default 1; xe: its total cycles x capacity). Growth beyond that,
  measured from the kept value to the end of this scan, is held back: not added, no rate.
  If the next scan's value is below the held one, it was a glitch and is never counted (the
  client is counted on from its kept value); if not, the growth is real (work whose time the
  driver books at once) and is counted up to that bound;
- busy_seconds: per device and engine, a counter for the reader's lifetime, per engine of the
  class (busy time / capacity: its rate is the class's utilization, 0..1). A client seen for
  the first time adds all it reports (it was that busy since it was created), then its growth;
  xe cycles add their busy share of the wall time between reads. Clients that exit keep what
  they added; a client that vanishes from one scan and comes back (an fd in flight over a
  socket, a transient read error) is remembered (the last _RETIRED_MAX gone) so its lifetime is
  not added twice; past that, each device keeps the highest client-id it forgot: drm-client-ids
  only grow, so a client at or under it coming back was counted before and starts from a new
  baseline (its growth while away is lost; a never-seen client that old is taken for one).
- per process (GpuProcess.busy_seconds, for the workload counters of exporter/accounting.py):
  per device and pid, a counter from 0 at the first scan that saw the pid, growing by what
  its clients' counters grew between scans, per engine of the class as the device's. A
  client's first sight adds nothing (its past is not this exporter's interval), and a client
  several processes hold (fork) grows the lowest pid's counter only, as its VRAM. A pid whose
  clients are gone from the device is forgotten.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from os.path import join
from typing import Callable

from ...samples import GpuProcess

# xe's short engine class names -> i915's spelling, the exporter's label values
XE_ENGINES: dict[str, str] = {"rcs": "render", "bcs": "copy", "vcs": "video", "vecs": "video-enhance", "ccs": "compute"}

# what /proc/PID/fd/N of a DRM file reads as; "(deleted)" nodes and by-path links are not ours
_DRI_NODE = re.compile(r"/dev/dri/(?:card|renderD)[0-9]+")
# fdinfo numbers are u64: "18446744073709551615" is 20 digits
_NUMBER = re.compile(r"[0-9]{1,20}")
_U64_LIMIT = 2**64
# a DRM fdinfo is well under a page; a bigger one is cut, never read without bound
_FDINFO_MAX = 64 * 1024
_SIZE_UNITS: dict[str, int] = {"": 1, "KiB": 1024, "MiB": 1024**2}
_VRAM_REGION = re.compile(r"vram[0-9]*|local[0-9]+")
# the memory keys that say how much VRAM a client holds, the first one present is used
_VRAM_STATS: tuple[str, ...] = ("total", "resident", "memory")
# clients that left a scan, remembered so one coming back is not counted from zero again
_RETIRED_MAX = 4096
# /proc/1/ns/pid of the host's procfs: PROC_PID_INIT_INO, the initial pid namespace's inode
_HOST_PID_NS = "pid:[4026531836]"
# a process whose fd listing has not changed is looked at whole again one read in this many
_RESCAN = 10
# how long read() waits for a scan; a later one is served to the next read() (stale) or lost
_SCAN_WAIT = 0.2

_Key = tuple[str, int]  # (pdev, client-id)


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """What the DRM clients of one device (a PCI address) say, in one refresh."""

    # one per pid, by pid: memory_bytes is the VRAM of the pid's distinct clients on this
    # device (None when none reports VRAM); utilization is per engine, by name, the sum of
    # the pid's clients' rates since the previous read (0..1); () when the previous read saw
    # none of its clients
    processes: tuple[GpuProcess, ...]
    # per engine, by name: seconds the device's engines were busy, summed over every client
    # this reader has seen; never decreases. Per process: GpuProcess.busy_seconds (its clients'
    # growth since the pid was first seen; () at its first scan)
    busy_seconds: tuple[tuple[str, float], ...]


@dataclass(slots=True)
class _Fdinfo:
    """One client as its fdinfo (or, merged, several fds of it) says in one scan."""

    pdev: str
    client_id: int
    ns: dict[str, int]  # engine -> busy ns since the client was created
    cycles: dict[str, tuple[int, int]]  # engine -> (busy cycles, total cycles): xe
    capacity: dict[str, int]  # engine -> engines in the class (absent: 1)
    vram: int | None  # bytes; None: no VRAM region reported

    def merge(self, other: _Fdinfo) -> None:
        # the same client read again through another fd or process, a moment later:
        # counters only go up (keep the larger), memory is the first reading that has it
        for engine, value in other.ns.items():
            self.ns[engine] = max(value, self.ns.get(engine, value))
        for engine, pair in other.cycles.items():
            mine = self.cycles.get(engine)
            self.cycles[engine] = pair if mine is None else max(mine, pair, key=lambda p: (p[1], p[0]))
        for engine, n in other.capacity.items():
            self.capacity[engine] = max(n, self.capacity.get(engine, n))
        if self.vram is None:
            self.vram = other.vram


@dataclass(slots=True)
class _Client:
    """What the reader remembers of one client between reads."""

    seen_at: float  # clock() of the last read that saw it
    ns: dict[str, tuple[int, float]] = field(default_factory=dict)  # engine -> (largest ns, clock() then)
    # engine -> (cycles, total cycles, clock()) of the last sample a rate was measured from
    cycles: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    # engine -> a value that grew faster than wall time x capacity, held back a read (see glitches)
    held_ns: dict[str, int] = field(default_factory=dict)
    held_cycles: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Device:
    busy_ns: dict[str, float] = field(default_factory=dict)  # drm-engine- growth per engine of the class
    busy_s: dict[str, float] = field(default_factory=dict)  # xe cycles: share x wall time
    forgotten: int = -1  # the highest client-id dropped from the retired clients

    def busy_seconds(self) -> tuple[tuple[str, float], ...]:
        engines = sorted(self.busy_ns.keys() | self.busy_s.keys())
        return tuple((e, self.busy_ns.get(e, 0) / 1e9 + self.busy_s.get(e, 0.0)) for e in engines)


def _u64(text: str) -> int | None:
    if not _NUMBER.fullmatch(text):
        return None
    n = int(text)
    return n if n < _U64_LIMIT else None


def _quantity(value: str, units: dict[str, int]) -> int | None:
    """``<uint>[ unit]`` in the smallest unit; None when the number or the unit is not one."""
    parts = value.split()
    if not 1 <= len(parts) <= 2:
        return None
    scale = units.get(parts[1] if len(parts) == 2 else "")
    n = _u64(parts[0])
    return None if n is None or scale is None else n * scale


_NS_UNITS: dict[str, int] = {"ns": 1}


def _parse(text: str, drivers: frozenset[str]) -> _Fdinfo | None:
    """The client one fdinfo describes; None when it is not a DRM client of `drivers`."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    driver, pdev = fields.get("drm-driver"), fields.get("drm-pdev")
    client_id = _u64(fields.get("drm-client-id", ""))
    if driver not in drivers or not pdev or client_id is None:
        return None
    ns: dict[str, int] = {}
    capacity: dict[str, int] = {}
    busy_cycles: dict[str, int] = {}
    total_cycles: dict[str, int] = {}
    memory: dict[str, dict[str, int]] = {}  # stat -> VRAM region -> bytes
    for key, value in fields.items():
        if not key.startswith("drm-"):
            continue  # pos, flags, pasid, amd-*: not the spec's
        name = key[4:]
        # longest prefixes first: drm-engine-capacity- is not an engine, drm-total-cycles- not memory
        if name.startswith("engine-capacity-"):
            n = _u64(value)
            if n:  # zero capacity is not allowed: ignore it, not divide by it
                capacity[name[16:]] = n
        elif name.startswith("engine-"):
            n = _quantity(value, _NS_UNITS)
            if n is not None and name[7:]:
                ns[name[7:]] = n
        elif name.startswith("total-cycles-"):
            n = _u64(value)
            if n is not None:
                total_cycles[name[13:]] = n
        elif name.startswith("cycles-"):
            n = _u64(value)
            if n is not None:
                busy_cycles[name[7:]] = n
        else:
            stat, _, region = name.partition("-")
            if stat in _VRAM_STATS and _VRAM_REGION.fullmatch(region):
                n = _quantity(value, _SIZE_UNITS)
                if n is not None:
                    memory.setdefault(stat, {})[region] = n
    # a cycles engine needs both halves; where a driver also gives ns (panfrost), ns is exact
    cycles = {e: (busy_cycles[e], total_cycles[e]) for e in busy_cycles.keys() & total_cycles.keys() if e not in ns}
    if driver == "xe":
        # the five engine classes by the exporter's names; xe's "other" (the GSC, firmware's own
        # work) is no engine a user's work runs on, and no label value of the contract
        ns = {XE_ENGINES[e]: v for e, v in ns.items() if e in XE_ENGINES}
        cycles = {XE_ENGINES[e]: v for e, v in cycles.items() if e in XE_ENGINES}
        capacity = {XE_ENGINES[e]: v for e, v in capacity.items() if e in XE_ENGINES}
    regions = {r for by_region in memory.values() for r in by_region}
    vram = None
    if regions:
        vram = sum(next(memory[s][r] for s in _VRAM_STATS if r in memory.get(s, ())) for r in regions)
    return _Fdinfo(pdev.lower(), client_id, ns, cycles, capacity, vram)


def _read_text(path: str) -> str | None:
    """At most _FDINFO_MAX bytes of a procfs file, whole lines only; None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        while size < _FDINFO_MAX:
            chunk = os.read(fd, _FDINFO_MAX - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if size >= _FDINFO_MAX:
        data = data[: data.rfind(b"\n") + 1]  # a cut line could read as a smaller number
    return data.decode("ascii", errors="replace")


def _host_pids(procfs: str) -> bool:
    """procfs is the host's: its pid 1 is in the initial pid namespace. Unreadable (another
    user's process without ptrace access, hidepid) or absent: not known to be."""
    try:
        return os.readlink(join(procfs, "1", "ns", "pid")) == _HOST_PID_NS
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class _Scan:
    """One finished scan: what read() hands out, and what the attributes say of it."""

    number: int  # 1, 2, ...: the scans in the order they finished
    devices: dict[str, DeviceUsage] | None  # None: procfs could not be listed
    read_at: float
    complete: bool
    host_pids: bool


def _grown(value: int, kept: int, held: int | None, limit: float) -> tuple[int, bool]:
    """(growth to count, whether `value` is taken as the new kept value) of a counter at
    `value`, `kept` the last value counted, `held` one held back by the previous scan, `limit`
    the most it can have grown since `kept` (wall time x capacity); see glitches."""
    grown = value - kept
    if grown <= 0:
        return 0, False  # stepped back (or still): stay with the larger value
    if grown <= limit:
        return grown, True
    if held is not None and value >= held:
        return int(limit), True  # a second sight of it: real, counted up to the bound
    return 0, False  # held back: a glitch unless the next scan confirms it


class DrmUsage:
    """Reads the DRM clients of `drivers` from procfs; keeps what rates and counters need.
    wait: how long read() waits for a scan (seconds)."""

    def __init__(
        self,
        procfs: str,
        drivers: frozenset[str],
        max_fds_per_process: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        wait: float = _SCAN_WAIT,
    ) -> None:
        if max_fds_per_process < 1:
            raise ValueError(f"max_fds_per_process must be at least 1, not {max_fds_per_process}")
        self._procfs = procfs
        self._drivers = frozenset(drivers)
        self._max_fds = max_fds_per_process
        self._clock = clock
        self._wait = wait
        # the scan thread and read(): whether a scan runs, the last finished one, what was served
        self._cond = threading.Condition()
        self._running = False
        self._last: _Scan | None = None
        self._served = 0  # the number of the newest scan read() has handed out
        # what follows is the scan's own state: only the one running scan touches it
        self._clients: dict[_Key, _Client] = {}  # the clients the previous scan saw
        self._retired: OrderedDict[_Key, _Client] = OrderedDict()  # recently gone, oldest first
        self._devices: dict[str, _Device] = {}  # every device a client was seen on, kept
        # (pdev, pid) -> engine -> busy seconds since the pid was first seen (per engine of the class)
        self._process_busy: dict[tuple[str, int], dict[str, float]] = {}
        self._steps: dict[_Key, dict[str, float]] = {}  # this scan's growth per client and engine, seconds
        # pid -> (fingerprint of its fd listing, the fds that were DRM fds): a process whose
        # listing is unchanged has its DRM fds' fdinfo read without a readlink of every fd
        self._fds: dict[str, tuple[tuple[int, int], tuple[str, ...]]] = {}
        self._scans = 0  # scans started
        self._complete = True  # the running scan's: no process refused its fds
        # of the result the last read() returned (set by read(), so a backend reads them right
        # after its read() and they describe what it got, whatever the scan thread does since):
        # complete: that scan saw every client: procfs is the host's (host_pids) and no process
        # refused its fds (EACCES / EPERM, another user's process without ptrace access), so a
        # device's process count and busy time are the whole, not the visible part
        self.complete = True
        # procfs is the host's: pid 1 is in the initial pid namespace. A container's own /proc (no
        # hostPID) lists only its processes, and their pids are not the host's (KFD's, NVML's)
        self.host_pids = True
        self.read_at = 0.0  # clock() at that scan's start: the time its rates and busy growth end at
        self.stale = False  # that result is an earlier scan's, finished after its own read() gave up

    @property
    def scans(self) -> int:
        """How many scans have finished."""
        with self._cond:
            return self._last.number if self._last is not None else 0

    def read(self) -> dict[str, DeviceUsage] | None:
        """By lower-case drm-pdev, every device that has (or had, while this reader lived) a
        client of one of `drivers`, as of the scan this call waited for; a late scan's
        result once (stale), or None: unknown (procfs cannot be listed, or no scan finished in
        time that was not served already). Thread-safe; at most one scan runs at a time."""
        with self._cond:
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="resmon-drm-clients", daemon=True).start()
            # the scan running now is the next to finish
            target = (self._last.number if self._last is not None else 0) + 1
            deadline = time.monotonic() + self._wait
            while self._last is None or self._last.number < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            last = self._last
            fresh = last is not None and last.number >= target
            if last is None or (not fresh and last.number <= self._served):
                self.complete = self.host_pids = self.stale = False
                return None
            self._served = max(self._served, last.number)
            self.complete, self.host_pids, self.read_at = last.complete, last.host_pids, last.read_at
            self.stale = not fresh
            return last.devices

    def _run(self) -> None:
        """The scan thread: one scan, its result published whole."""
        scan: _Scan | None = None
        try:
            scan = self._scan_all()
        finally:
            with self._cond:
                number = (self._last.number if self._last is not None else 0) + 1
                if scan is None:  # the scan raised (a bug: the traceback follows): unknown
                    scan = _Scan(number, None, self._clock(), False, False)
                self._last = _Scan(number, scan.devices, scan.read_at, scan.complete, scan.host_pids)
                self._running = False
                self._cond.notify_all()

    def _scan_all(self) -> _Scan:
        """Scan procfs once (the scan thread; one at a time)."""
        now = self._clock()
        try:
            names = os.listdir(self._procfs)
        except OSError:
            return _Scan(0, None, now, False, False)
        host_pids = _host_pids(self._procfs)
        self._complete = host_pids
        clients: dict[_Key, _Fdinfo] = {}
        holders: dict[int, set[_Key]] = {}
        self._scans += 1
        listed: set[str] = set()
        for name in names:
            if name.isascii() and name.isdigit():  # self, sys, thread-self...: not processes
                listed.add(name)
                held = self._scan(name, clients)
                if held:
                    holders[int(name)] = held
        for gone in self._fds.keys() - listed:  # processes that exited: their fd lists go
            del self._fds[gone]
        # the fdinfo were read between now and end: the most a counter can have grown since a
        # previous scan's start is up to this one's end
        end = max(now, self._clock())
        rates = self._advance(clients, now, end)
        return _Scan(0, self._report(clients, holders, rates), now, self._complete, host_pids)

    def _listing(self, fd_dir: str) -> list[str]:
        """The first max_fds_per_process names of an fd directory (procfs: the lowest fds)."""
        with os.scandir(fd_dir) as entries:
            return [e.name for e in itertools.islice(entries, self._max_fds)]

    def _scan(self, pid: str, clients: dict[_Key, _Fdinfo]) -> set[_Key]:
        """The clients one process holds, merged into `clients`."""
        fd_dir = join(self._procfs, pid, "fd")
        try:
            entries = self._listing(fd_dir)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                self._complete = False  # not ours to look at: its clients are unknown
            return set()  # gone
        fingerprint = (len(entries), hash(frozenset(entries)))
        cached = self._fds.get(pid)
        # every process's fds are all looked at again one scan in _RESCAN (spread by pid): an fd
        # number closed and reopened on a DRM node between scans leaves the listing unchanged
        if cached is not None and cached[0] == fingerprint and (self._scans + int(pid)) % _RESCAN:
            candidates = cached[1]
        else:
            fds = sorted(int(e) for e in entries if e.isascii() and e.isdigit())
            del entries  # the names are not kept
            drm = []
            for fd in fds:
                try:
                    target = os.readlink(join(fd_dir, str(fd)))
                except OSError:
                    continue
                if _DRI_NODE.fullmatch(target):
                    drm.append(str(fd))
            candidates = tuple(drm)
            self._fds[pid] = (fingerprint, candidates)
        held: set[_Key] = set()
        for fd in candidates:
            text = _read_text(join(self._procfs, pid, "fdinfo", fd))
            info = _parse(text, self._drivers) if text is not None else None
            if info is None:
                continue
            key = (info.pdev, info.client_id)
            if key in clients:
                clients[key].merge(info)
            else:
                clients[key] = info
            held.add(key)
        return held

    def _advance(self, clients: dict[_Key, _Fdinfo], now: float, end: float) -> dict[_Key, dict[str, float]]:
        """Move the state to this scan (started at now, its reads done by end): busy counters
        grow, old clients retire. Returns the rates (engine -> ratio) of the clients the
        previous scan saw."""
        rates: dict[_Key, dict[str, float]] = {}
        state: dict[_Key, _Client] = {}
        self._steps = {}
        for key, info in clients.items():
            steps = self._steps[key] = {}  # what it grew since the previous scan (not at first sight)
            device = self._devices.setdefault(key[0], _Device())
            old = self._clients.pop(key, None)
            # seen at the previous read: it has a rate, from then
            previous_at = old.seen_at if old is not None else None
            if old is None:
                old = self._retired.pop(key, None)
            # engines it reported before but not now keep their largest values: one that
            # comes back is not counted from zero
            if old is not None:
                client = _Client(now, dict(old.ns), dict(old.cycles), dict(old.held_ns), dict(old.held_cycles))
            else:
                client = _Client(now)
                if key[1] <= device.forgotten:
                    # an id this reader forgot: counted before it was; a new baseline, not its lifetime
                    client.ns = {engine: (value, now) for engine, value in info.ns.items()}
            rate: dict[str, float] = {}
            for engine, value in info.ns.items():
                capacity = info.capacity.get(engine, 1)
                prev = client.ns.get(engine)
                if prev is None and previous_at is not None:
                    # amdgpu prints only engines it used: absent at the previous read, 0 then
                    prev = (0, previous_at)
                if prev is None:
                    grown = value  # first sight: that busy since the client was created
                    client.ns[engine] = (value, now)
                    steps[engine] = 0.0
                else:
                    grown, taken = _grown(value, prev[0], client.held_ns.pop(engine, None),
                                          (end - prev[1]) * 1e9 * capacity)
                    if taken:
                        client.ns[engine] = (value, now)
                    elif value - prev[0] > 0:
                        client.held_ns[engine] = value  # held back: no rate from it
                    if previous_at is not None and now > prev[1] and engine not in client.held_ns:
                        rate[engine] = min(1.0, grown / ((now - prev[1]) * 1e9 * capacity))
                    steps[engine] = grown / capacity / 1e9
                # per engine of the class: rate() of the counter is the class's utilization, 0..1
                device.busy_ns[engine] = device.busy_ns.get(engine, 0) + grown / capacity
            for engine, (busy, total) in info.cycles.items():
                capacity = info.capacity.get(engine, 1)
                device.busy_s.setdefault(engine, 0.0)
                last = client.cycles.get(engine)
                if last is None:
                    client.cycles[engine] = (busy, total, now)  # cycles start anywhere: a baseline
                    continue
                last_busy, last_total, last_at = last
                elapsed = total - last_total
                if elapsed < 0:
                    # the GPU timestamp restarted (a reset): a new baseline, busy kept at its largest
                    client.cycles[engine] = (max(busy, last_busy), total, now)
                    client.held_cycles.pop(engine, None)
                    continue
                if elapsed == 0:
                    continue  # no GPU time passed: no rate
                grown, taken = _grown(busy, last_busy, client.held_cycles.pop(engine, None), elapsed * capacity)
                if taken:
                    client.cycles[engine] = (busy, total, now)
                elif busy - last_busy > 0:
                    client.held_cycles[engine] = busy
                    continue  # held back: nothing counted, no rate
                share = grown / elapsed  # busy engines of the class, 0..capacity
                wall = now - last_at
                if wall > 0:
                    device.busy_s[engine] += min(share / capacity * wall, wall)
                    steps[engine] = min(share / capacity * wall, wall)
                if previous_at is not None:
                    rate[engine] = min(1.0, share / capacity)
            state[key] = client
            if previous_at is not None:
                rates[key] = rate
        # the rest of the previous read's clients left this one
        for key, client in self._clients.items():
            self._retired[key] = client
            self._retired.move_to_end(key)
        while len(self._retired) > _RETIRED_MAX:
            (pdev, client_id), _ = self._retired.popitem(last=False)
            device = self._devices.setdefault(pdev, _Device())
            device.forgotten = max(device.forgotten, client_id)
        self._clients = state
        return rates

    def _report(
        self, clients: dict[_Key, _Fdinfo], holders: dict[int, set[_Key]], rates: dict[_Key, dict[str, float]]
    ) -> dict[str, DeviceUsage]:
        by_device: dict[str, dict[int, list[_Key]]] = {}
        owner: dict[_Key, int] = {}  # a client's VRAM goes to the lowest pid holding it (fork)
        for pid, keys in holders.items():
            for key in keys:
                by_device.setdefault(key[0], {}).setdefault(pid, []).append(key)
                owner[key] = min(pid, owner.get(key, pid))
        out: dict[str, DeviceUsage] = {}
        process_busy: dict[tuple[str, int], dict[str, float]] = {}  # the pids holding a client now
        for pdev, device in self._devices.items():
            processes = []
            for pid, keys in sorted(by_device.get(pdev, {}).items()):
                counters = self._process_busy.get((pdev, pid))
                if counters is None:
                    counters = {}  # first seen: from 0, its clients' past not counted
                else:
                    for k in keys:
                        if owner[k] == pid:  # a client held by several processes: the lowest pid's
                            for engine, seconds in self._steps.get(k, {}).items():
                                counters[engine] = counters.get(engine, 0.0) + seconds
                process_busy[(pdev, pid)] = counters
                vram = [v if owner[k] == pid else 0 for k in keys if (v := clients[k].vram) is not None]
                utilization: tuple[tuple[str, float], ...] = ()
                measured = [rates[k] for k in keys if k in rates]
                if measured:
                    summed: dict[str, float] = {}
                    for rate in measured:
                        for engine, ratio in rate.items():
                            summed[engine] = summed.get(engine, 0.0) + ratio
                    utilization = tuple(sorted((e, min(1.0, r)) for e, r in summed.items()))
                processes.append(GpuProcess(pid, sum(vram) if vram else None, utilization, tuple(sorted(counters.items()))))
            out[pdev] = DeviceUsage(tuple(processes), device.busy_seconds())
        self._process_busy = process_busy  # pids without a client on a device now are forgotten
        return out
