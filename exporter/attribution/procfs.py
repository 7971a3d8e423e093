"""Name, owner, container and Slurm job of a process, read from procfs (the host's /proc, or a
mount of it).

The PIDs come from the GPU driver's process list, so a process may exit between that list and
this read: every file may vanish at any moment, and a read never raises.

A process is known by its PID and start time (/proc/PID/stat): its owner and container are
read from status and cgroup when it is first seen and again every KNOWN_SECONDS, and
otherwise only stat is read (one file per process and scrape instead of three; a GPU job's
uid and cgroup are set before it opens the GPU). A PID reused by a new process has another
start time and is read afresh.
"""

from __future__ import annotations

import os
import pwd
import threading
import time
from dataclasses import dataclass
from typing import Iterable

from .cgroups import ContainerRef, parse_cgroup

_CGROUP_CACHE = 4096  # distinct cgroup texts remembered
_KNOWN_CACHE = 8192  # processes whose owner and container are remembered
KNOWN_SECONDS = 60.0  # how long a process's owner and container are used before a re-read
_MAX_FILE = 1 << 20  # bytes read of one file at most (stat, status and cgroup are a few KiB)


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """uid: the real uid (None when status could not be read); user: its passwd name, else
    str(uid), "" without a uid; container: the container, pod and Slurm job, ContainerRef()
    for a host process or an unreadable cgroup file."""

    pid: int
    comm: str
    uid: int | None
    user: str
    container: ContainerRef


def _read(path: str) -> str | None:
    # ENOENT / ESRCH (the process exited), EACCES, EISDIR, and ValueError for a root with a
    # NUL in it. os.open/os.read, not open(): no buffered file object per file (7.7 instead
    # of 12 us a file; a scrape with 256 GPU processes reads 256 of them)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        chunks = []
        size = 0
        # procfs answers a file in one read up to a page, longer ones in several; at most
        # _MAX_FILE (a --path.procfs tree whose file is a link to /dev/zero never ends)
        while size < _MAX_FILE:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _comm_and_start(stat: str) -> tuple[str, str] | None:
    # "PID (comm) state ppid ... starttime ...": comm may hold spaces and ")", so up to the
    # last ")"; starttime is field 22, the 20th after it
    head, close, rest = stat.rpartition(")")
    fields = rest.split(None, 20)
    if not close or "(" not in head or len(fields) < 20:
        return None
    return head[head.index("(") + 1 :], fields[19]


def _real_uid(status: str) -> int | None:
    # "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>"
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            return int(fields[0]) if fields and fields[0].isascii() and fields[0].isdigit() else None
    return None


class ProcReader:
    """Reads <root>/PID/{stat,status,cgroup} (comm where stat is unreadable). User names are
    cached per uid for the reader's lifetime: the lookup can go through NSS (LDAP, sssd), and
    GPU jobs repeat their users. cgroup_root: the kubelet's --cgroup-root (see parse_cgroup)."""

    def __init__(self, root: str = "/proc", cgroup_root: str = "/") -> None:
        self._root = root
        self._cgroup_root = cgroup_root
        self._users: dict[int, str] = {}
        # a container's processes share one cgroup text, and parsing it is most of a read
        self._cgroups: dict[str, ContainerRef] = {}
        # pid -> (start time, monotonic time read, what was read): see the module docstring
        self._known: dict[int, tuple[str, float, ProcessInfo]] = {}

    def read(self, pid: int) -> ProcessInfo | None:
        """None when the process is gone (its stat or comm cannot be read); never raises."""
        base = os.path.join(self._root, str(pid))
        stat = _read(os.path.join(base, "stat"))
        parsed = _comm_and_start(stat) if stat is not None else None
        if parsed is None:  # a procfs without stat (or a garbled one): comm, status and cgroup
            comm = _read(os.path.join(base, "comm"))
            return self._read_files(pid, base, comm.rstrip("\n"), "comm")[0] if comm is not None else None
        comm, start = parsed[0].rstrip("\n"), parsed[1]  # as the comm file has it, less its newline
        now = time.monotonic()
        known = self._known.get(pid)
        if known is not None and known[0] == start and now - known[1] < KNOWN_SECONDS:
            info = known[2]
            return info if info.comm == comm else ProcessInfo(pid, comm, info.uid, info.user, info.container)
        info, complete = self._read_files(pid, base, comm, "stat")
        if complete and info is not None:  # a file that failed this once is read again next scrape
            if len(self._known) >= _KNOWN_CACHE:
                self._known.clear()  # bounded: processes come and go
            self._known[pid] = (start, now, info)
        return info

    def _read_files(self, pid: int, base: str, comm: str, alive: str) -> tuple[ProcessInfo | None, bool]:
        """The process with its status and cgroup read, and whether both were; alive: the
        file that is unreadable once the process has exited."""
        status = _read(os.path.join(base, "status"))
        cgroup = _read(os.path.join(base, "cgroup"))
        # a later file that failed may mean the process exited after its stat or comm was read
        if (status is None or cgroup is None) and _read(os.path.join(base, alive)) is None:
            return None, False
        uid = _real_uid(status) if status is not None else None
        info = ProcessInfo(
            pid=pid,
            comm=comm,
            uid=uid,
            user=self._user(uid),
            container=self._container(cgroup) if cgroup is not None else ContainerRef(),
        )
        return info, status is not None and cgroup is not None

    def _container(self, cgroup: str) -> ContainerRef:
        ref = self._cgroups.get(cgroup)
        if ref is None:
            if len(self._cgroups) >= _CGROUP_CACHE:
                self._cgroups.clear()  # bounded: containers come and go
            ref = self._cgroups[cgroup] = parse_cgroup(cgroup, self._cgroup_root)
        return ref

    def _user(self, uid: int | None) -> str:
        if uid is None:
            return ""
        name = self._users.get(uid)
        if name is None:
            name = _lookup_user(uid)
            self._users[uid] = name
        return name


def _lookup_user(uid: int) -> str:
    try:
        name = pwd.getpwuid(uid).pw_name
        name.encode("utf-8")  # a Latin-1 passwd entry comes back with surrogates: unexportable
        return name
    except (KeyError, OverflowError, ValueError):  # UnicodeEncodeError is a ValueError
        return str(uid)


class Reads(dict[int, ProcessInfo | None]):
    """What one round of reads found, by PID; read() as ProcReader's (None: gone or not read)."""

    def read(self, pid: int) -> ProcessInfo | None:
        return self.get(pid)


class DeadlineReader:
    """ProcReader.read for many PIDs on a thread of its own (resmon-procfs), waited for until
    the caller's deadline: a procfs read that blocks (a hung FUSE or network mount as
    --path.procfs, a FIFO where a file should be) costs the processes, never the scrape.

    One round at a time: while a round is stuck in a read, a caller starts none (threads do
    not pile up) and does not wait; it gets what that round has read so far. A round that
    ends after its caller gave up still fills ProcReader's cache, so the next is quicker."""

    def __init__(self, reader: ProcReader) -> None:
        self._reader = reader
        self._cond = threading.Condition()
        self._found = Reads()
        self._running = False

    def read_all(self, pids: Iterable[int], until: float) -> tuple[Reads, bool]:
        """The processes read before until (monotonic), and whether every PID was read."""
        wanted = tuple(dict.fromkeys(pids))
        if not wanted:
            return Reads(), True
        with self._cond:
            if not self._running:
                found = self._found = Reads()
                self._running = True
                threading.Thread(target=self._run, args=(wanted, found), name="resmon-procfs", daemon=True).start()
                # done: not running, or another caller's round replaced it (only after it ended)
                while self._running and self._found is found:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._running or self._found is not found:
                    return Reads(found), True
            # cut off, or a round still stuck from before: what was read in time
            return Reads({p: self._found[p] for p in wanted if p in self._found}), False

    def _run(self, wanted: tuple[int, ...], found: Reads) -> None:
        try:
            for pid in wanted:
                info = self._reader.read(pid)
                with self._cond:
                    found[pid] = info
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()
