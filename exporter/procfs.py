"""Name, owner and container of a process, read from procfs (the host's /proc, or a mount of it).

The PIDs come from the GPU driver's process list, so a process may exit between that list and
this read: every file may vanish at any moment, and a read never raises.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from .cgroups import ContainerRef, parse_cgroup

_CGROUP_CACHE = 4096  # distinct cgroup texts remembered


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """uid: the real uid (None when status could not be read); user: its passwd name, else
    str(uid), "" without a uid; container: ContainerRef() for a host process or an unreadable
    cgroup file."""

    pid: int
    comm: str
    uid: int | None
    user: str
    container: ContainerRef


def _read(path: str) -> str | None:
    # ENOENT / ESRCH (the process exited), EACCES, and ValueError for a root with a NUL in it
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _real_uid(status: str) -> int | None:
    # "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>"
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            return int(fields[0]) if fields and fields[0].isascii() and fields[0].isdigit() else None
    return None


class ProcReader:
    """Reads <root>/PID/{comm,status,cgroup}. User names are cached per uid for the reader's
    lifetime: the lookup can go through NSS (LDAP, sssd), and GPU jobs repeat their users."""

    def __init__(self, root: str = "/proc") -> None:
        self._root = root
        self._users: dict[int, str] = {}
        # a container's processes share one cgroup text, and parsing it is most of a read
        self._cgroups: dict[str, ContainerRef] = {}

    def read(self, pid: int) -> ProcessInfo | None:
        """None when the process is gone (its comm cannot be read); never raises."""
        base = os.path.join(self._root, str(pid))
        comm = _read(os.path.join(base, "comm"))
        if comm is None:
            return None
        status = _read(os.path.join(base, "status"))
        cgroup = _read(os.path.join(base, "cgroup"))
        # a later file that failed may mean the process exited after its comm was read
        if (status is None or cgroup is None) and _read(os.path.join(base, "comm")) is None:
            return None
        uid = _real_uid(status) if status is not None else None
        return ProcessInfo(
            pid=pid,
            comm=comm.rstrip("\n"),
            uid=uid,
            user=self._user(uid),
            container=self._container(cgroup) if cgroup is not None else ContainerRef(),
        )

    def _container(self, cgroup: str) -> ContainerRef:
        ref = self._cgroups.get(cgroup)
        if ref is None:
            if len(self._cgroups) >= _CGROUP_CACHE:
                self._cgroups.clear()  # bounded: containers come and go
            ref = self._cgroups[cgroup] = parse_cgroup(cgroup)
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
