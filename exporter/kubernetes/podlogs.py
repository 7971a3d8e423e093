"""Pod UID -> namespace, pod and container names, from the kubelet's log directory.

The kubelet writes /var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log. Namespace and
pod names cannot contain "_", so the split is unambiguous; this joins a UID found in a cgroup
path to names without asking the API server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    pod: str
    containers: tuple[str, ...]


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
