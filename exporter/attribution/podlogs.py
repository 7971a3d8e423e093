"""Pod UID and container id -> namespace, pod and container names, from the kubelet's logs.

The kubelet writes /var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log and links
/var/log/containers/<pod>_<namespace>_<container>-<container id>.log to it. Kubernetes
names cannot contain "_", so the splits are unambiguous; this joins the UID and container
id found in a process's cgroup to names without asking the API server.

What is trusted: only real directories (a link could make any directory look like any pod's);
a UID that two pod directories carry names nobody (AMBIGUOUS); a container link only with the
pod directory it points into, whose UID attribution compares with the process's cgroup.

LogNames keeps both listings cached and refreshes them on a thread of its own, so a scrape
never lists a directory (100,000 pod directories take seconds; a hung mount, forever).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from ..logs import fields

# <pod>_<namespace>_<container>-<64 hex>.log; a name the kubelet truncated at 255 bytes
# lost its id and does not match
_CONTAINER_LOG = re.compile(r"^([^_]+)_([^_]+)_([^_]+)-([0-9a-f]{64})\.log$")
_LOG_FILE = re.compile(r"^[0-9]+\.log$")  # what a container log link points at: <n>.log
# a pod UID as the API writes it, or a static pod's 32-hex config hash
_UID = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    pod: str
    containers: tuple[str, ...]


# The entry for a UID that two pod directories carry: which one is the kubelet's cannot be
# told, so no names (as for an unknown pod)
AMBIGUOUS = PodName("", "", ())


@dataclass(frozen=True, slots=True)
class ContainerName:
    """pod_uid: the UID of the pod directory the container's log link points into."""

    namespace: str
    pod: str
    container: str
    pod_uid: str


@dataclass(frozen=True, slots=True)
class Names:
    """What the kubelet's log directories say: pods by UID, containers by id."""

    pods: Mapping[str, PodName]
    containers: Mapping[str, ContainerName]


class _Pods(Mapping[str, PodName]):
    """pod_dirs() and the containers listed for some of them, as PodNames made on lookup: a
    new set of containers does not rebuild an entry for each of 100,000 pods."""

    def __init__(self, dirs: Mapping[str, tuple[str, str, str] | None], containers: Mapping[str, tuple[str, ...]]) -> None:
        self._dirs = dirs
        self._containers = containers

    def __getitem__(self, uid: str) -> PodName:
        found = self._dirs[uid]
        return AMBIGUOUS if found is None else PodName(found[1], found[2], self._containers.get(uid, ()))

    def __iter__(self) -> Iterator[str]:
        return iter(self._dirs)

    def __len__(self) -> int:
        return len(self._dirs)


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _subdirs(path: str) -> list[str]:
    # Kubernetes names and UIDs are ASCII; anything else (a name that is not UTF-8 comes back
    # with surrogates, which no exposition can encode) is not the kubelet's
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.name.isascii() and _is_real_dir(e))
    except (OSError, ValueError):  # ValueError: a NUL in the configured path
        return []


def _split(name: str) -> tuple[str, str, str] | None:
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def pod_dirs(pod_logs_dir: str) -> dict[str, tuple[str, str, str] | None]:
    """Pod UID (lower case) -> (directory name, namespace, pod); None for a UID that two
    directories carry. {} when the directory is missing or unreadable. Never raises."""
    out: dict[str, tuple[str, str, str] | None] = {}
    for name in _subdirs(pod_logs_dir):
        split = _split(name)
        if split is None:
            continue  # not the kubelet's layout
        namespace, pod, uid = split
        uid = uid.lower()
        out[uid] = None if uid in out else (name, namespace, pod)
    return out


def pod_names(pod_logs_dir: str) -> dict[str, PodName]:
    """By pod UID in lower case (a static pod's is its 32-hex config hash), AMBIGUOUS for a
    UID two directories carry; {} when the directory is missing or unreadable. Never raises."""
    pods: dict[str, PodName] = {}
    for uid, found in pod_dirs(pod_logs_dir).items():
        if found is None:
            pods[uid] = AMBIGUOUS
            continue
        name, namespace, pod = found
        pods[uid] = PodName(namespace, pod, tuple(_subdirs(os.path.join(pod_logs_dir, name))))
    return pods


def _link_target(link: str, pod: str, namespace: str, container: str) -> str | None:
    """The UID of the pod directory the link points into, if that directory and the
    container's directory in it are the ones the link's name says; else None."""
    try:
        target = os.readlink(link)
    except (OSError, ValueError):  # not a link, vanished
        return None
    parts = target.split("/")
    if len(parts) < 3 or not _LOG_FILE.match(parts[-1]) or parts[-2] != container:
        return None
    split = _split(parts[-3])
    if split is None or split[:2] != (namespace, pod) or not _UID.match(split[2]):
        return None
    return split[2].lower()


def container_names(container_logs_dir: str) -> dict[str, ContainerName]:
    """By container id (64 hex, lower case), for each link whose target is the pod and
    container directory its name says; {} when the directory is missing or unreadable.
    Never raises."""
    try:
        with os.scandir(container_logs_dir) as entries:
            names = [e.name for e in entries if e.name.isascii()]
    except (OSError, ValueError):
        return {}
    out = {}
    for name in names:
        match = _CONTAINER_LOG.match(name)
        if match:
            pod, namespace, container, cid = match.groups()
            uid = _link_target(os.path.join(container_logs_dir, name), pod, namespace, container)
            if uid is not None:
                out[cid] = ContainerName(namespace=namespace, pod=pod, container=container, pod_uid=uid)
    return out


# Up to this many pod directories, a listing lists every pod's containers too (one small
# listing each); above it only the pods asked about (the GPU processes' own, a few).
_EAGER_PODS = 2000


def _stamp(path: str) -> tuple[int, int] | None:
    # a directory's inode and mtime: an entry added or removed changes the mtime, a
    # directory replaced (a remount) the inode
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_ino, st.st_mtime_ns


class LogNames:
    """Both directories' names, cached, listed again on a thread of its own (resmon-podlogs,
    one at a time) and never on the caller's:

    - a check runs when a caller asks and the last one is check_every seconds old: it stats
      both directories and lists one again only when its mtime (or inode) changed, or its
      listing is max_age old (a change within one mtime tick is not missed for longer);
    - the pod directories' container subdirectories are listed with the listing (up to
      _EAGER_PODS pods) and on each check for the pods a caller asked about (the GPU
      processes' pods: few), so a container that started after its pod's directory was
      listed is seen at the next check.

    current() waits for a check it started at most `wait` seconds (a healthy disk answers
    in well under a millisecond); a slower check is served the previous names."""

    def __init__(
        self, pod_logs_dir: str, container_logs_dir: str, log: logging.Logger,
        check_every: float = 1.0, max_age: float = 60.0,
    ) -> None:
        self._pod_dir = pod_logs_dir
        self._container_dir = container_logs_dir
        self._log = log
        self._check_every = check_every
        self._max_age = max_age
        self._cond = threading.Condition()
        self._names: Names | None = None  # replaced whole: a reader never sees half an update
        self._wanted: frozenset[str] = frozenset()
        self._running = False
        self._checked = -float("inf")  # monotonic start of the last check
        # what the last listing of each directory saw: (stamp, monotonic time listed)
        self._pod_stamp: tuple[tuple[int, int] | None, float] = (None, -float("inf"))
        self._container_stamp: tuple[tuple[int, int] | None, float] = (None, -float("inf"))
        # replaced, never changed in place: a Names handed out keeps seeing what it saw
        self._dirs: dict[str, tuple[str, str, str] | None] = {}
        self._containers: dict[str, ContainerName] = {}
        self._pod_containers: dict[str, tuple[str, ...]] = {}
        self._eager: dict[str, tuple[str, ...]] = {}  # every pod's containers, as of the last listing
        self.listings = 0  # listings of the pod logs directory itself, for tests

    def start(self) -> None:
        """The first listing, in the background."""
        self.current((), 0.0)

    def current(self, wanted: Iterable[str], wait: float) -> Names | None:
        """The latest names (None until the first check completed); wanted: the pod UIDs the
        caller is about to look up. Never blocks longer than wait, never raises."""
        until = time.monotonic() + max(0.0, wait)
        with self._cond:
            wanted = frozenset(wanted)
            if not wanted <= self._wanted:
                self._checked = -float("inf")  # a pod not asked about before: its containers now
            self._wanted = wanted
            now = time.monotonic()
            if not self._running and now - self._checked >= self._check_every:
                self._running = True
                self._checked = now
                generation = self._names
                threading.Thread(target=self._check, name="resmon-podlogs", daemon=True).start()
                while self._running and self._names is generation:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            return self._names

    def _check(self) -> None:
        try:
            names = self._list()
        except Exception as exc:  # a bug must not end attribution for good: keep the old names
            self._log.error("listing the kubelet's log directories failed", extra=fields(error=repr(exc)))
            names = None
        with self._cond:
            if names is not None:
                self._names = names
            self._running = False
            self._cond.notify_all()

    def _list(self) -> Names:
        now = time.monotonic()
        with self._cond:
            wanted = self._wanted
        changed = False
        stamp = _stamp(self._pod_dir)
        if stamp != self._pod_stamp[0] or stamp is None or now - self._pod_stamp[1] >= self._max_age:
            self._dirs = pod_dirs(self._pod_dir)
            self._pod_stamp = (stamp, now)
            self.listings += 1
            changed = True
            # a node of ordinary size: every pod's containers with the listing, so a pod
            # is named in full before anyone asks about it
            self._eager = {} if len(self._dirs) > _EAGER_PODS else {
                uid: tuple(_subdirs(os.path.join(self._pod_dir, found[0])))
                for uid, found in self._dirs.items() if found is not None
            }
        stamp = _stamp(self._container_dir)
        if stamp != self._container_stamp[0] or stamp is None or now - self._container_stamp[1] >= self._max_age:
            self._containers = container_names(self._container_dir)
            self._container_stamp = (stamp, now)
            changed = True
        pod_containers = dict(self._eager)
        for uid in wanted:
            found = self._dirs.get(uid)
            if found is not None:
                pod_containers[uid] = tuple(_subdirs(os.path.join(self._pod_dir, found[0])))
        if not changed and pod_containers == self._pod_containers and self._names is not None:
            return self._names  # nothing new: the same object, and no waiter is woken for it
        self._pod_containers = pod_containers
        # only the asked-about pods' containers are listed: the others' are never looked up
        return Names(_Pods(self._dirs, pod_containers), self._containers)
