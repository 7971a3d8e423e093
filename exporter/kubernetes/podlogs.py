"""Pod UID and container id -> namespace, pod and container names, from the kubelet's logs.

The kubelet writes /var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log and links
/var/log/containers/<pod>_<namespace>_<container>-<container id>.log to it. Kubernetes
names cannot contain "_", so the splits are unambiguous; this joins the UID and container
id found in a process's cgroup to names without asking the API server.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# <pod>_<namespace>_<container>-<64 hex>.log; a name the kubelet truncated at 255 bytes
# lost its id and does not match
_CONTAINER_LOG = re.compile(r"^([^_]+)_([^_]+)_([^_]+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    pod: str
    containers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerName:
    namespace: str
    pod: str
    container: str


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _subdirs(path: str) -> list[str]:
    # Kubernetes names and UIDs are ASCII; anything else (a name that is not UTF-8 comes back
    # with surrogates, which no exposition can encode) is not the kubelet's
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.name.isascii() and _is_dir(e))
    except (OSError, ValueError):  # ValueError: a NUL in the configured path
        return []


def _split(name: str) -> tuple[str, str, str] | None:
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def pod_names(pod_logs_dir: str) -> dict[str, PodName]:
    """By pod UID in lower case (a static pod's is its 32-hex config hash); {} when the
    directory is missing or unreadable. Never raises."""
    pods: dict[str, PodName] = {}
    for name in _subdirs(pod_logs_dir):
        split = _split(name)
        if split is None:
            continue  # not the kubelet's layout
        namespace, pod, uid = split
        containers = tuple(_subdirs(os.path.join(pod_logs_dir, name)))
        pods[uid.lower()] = PodName(namespace=namespace, pod=pod, containers=containers)
    return pods


def container_names(container_logs_dir: str) -> dict[str, ContainerName]:
    """By container id (64 hex, lower case); {} when the directory is missing or unreadable.
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
            out[cid] = ContainerName(namespace=namespace, pod=pod, container=container)
    return out
