"""Which container and Kubernetes pod a process belongs to, from the text of /proc/PID/cgroup.

The kubelet and the container runtimes name cgroups in a handful of shapes (cgroup v1 or v2,
systemd or cgroupfs driver, containerd, CRI-O or Docker; tests/test_cgroups.py has them all).
The parser is not anchored at "/" because a reader in a private cgroup namespace sees paths
relative to its own root ("/../../../kubepods-...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QOS_GUARANTEED = "guaranteed"
QOS_BURSTABLE = "burstable"
QOS_BESTEFFORT = "besteffort"


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """container_id: the runtime's 64-hex id; pod_uid: the API's dashed lower-case UID (or a
    static pod's 32-hex hash); qos: guaranteed | burstable | besteffort, "" without a pod."""

    container_id: str = ""
    pod_uid: str = ""
    qos: str = ""


# "pod" must follow a non-alphanumeric so that "kubepods" itself is not a pod. The systemd
# driver writes the UID with "_" because "-" is systemd's hierarchy separator.
_POD = re.compile(
    r"(?<![0-9A-Za-z])pod("
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32}"
    r")(?![0-9A-Za-z])",
    re.IGNORECASE,
)

_CONTAINER = re.compile(
    r"(?:"
    # systemd scopes: cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, libpod-<id>.scope;
    # the conmon variants are the runtime's monitor process, not the container
    r"(?<![0-9A-Za-z])(?P<runtime>cri-containerd|crio-conmon|crio|docker|libpod-conmon|libpod)"
    r"-(?P<scoped>[0-9a-f]{64})(?:\.scope)?"
    # cgroup v1 under the systemd driver: ...-pod<uid>.slice:cri-containerd:<id>
    r"|:(?:cri-containerd|crio|docker):(?P<colon>[0-9a-f]{64})"
    # the cgroupfs driver and plain Docker: the id is a whole path element
    r"|/(?P<element>[0-9a-f]{64})"
    r")(?=$|[/:])",
    re.IGNORECASE,
)

_MONITORS = frozenset({"crio-conmon", "libpod-conmon"})


def _container_id(match: re.Match[str]) -> str:
    if (match.group("runtime") or "").lower() in _MONITORS:
        return ""
    return (match.group("scoped") or match.group("colon") or match.group("element") or "").lower()


def _qos(kubepods_to_pod: str) -> str:
    lowered = kubepods_to_pod.lower()
    if QOS_BESTEFFORT in lowered:
        return QOS_BESTEFFORT
    if QOS_BURSTABLE in lowered:
        return QOS_BURSTABLE
    return QOS_GUARANTEED  # Guaranteed pods sit directly under kubepods, with no QoS level


def _parse_path(path: str) -> ContainerRef:
    kubepods = path.lower().find("kubepods")
    pod = _POD.search(path, kubepods) if kubepods >= 0 else None
    if pod is not None:
        # the first id after the pod: a nested runtime's node container may come before it
        first = _CONTAINER.search(path, pod.end())
        return ContainerRef(
            container_id=_container_id(first) if first else "",
            pod_uid=pod.group(1).lower().replace("_", "-"),
            qos=_qos(path[kubepods : pod.start()]),
        )
    matches = list(_CONTAINER.finditer(path))
    # outside Kubernetes the innermost container (the last id) is the process's own
    return ContainerRef(container_id=_container_id(matches[-1])) if matches else ContainerRef()


def _paths(text: str) -> list[str]:
    # "hierarchy-ID:controller-list:path"; the path itself may contain ":" (v1 systemd driver)
    fields = (line.strip().split(":", 2) for line in text.splitlines())
    return [f[2] for f in fields if len(f) == 3]


def _weight(ref: ContainerRef) -> int:
    return 2 * bool(ref.pod_uid) + bool(ref.container_id)


def parse_cgroup(text: str) -> ContainerRef:
    """The container and pod named by /proc/PID/cgroup text; ContainerRef() for a host process,
    unknown shapes and garbage. On v1 and hybrid hosts the lines can disagree (some
    controllers are not delegated), so the line that names the most wins, the first on a tie."""
    best = ContainerRef()
    for path in _paths(text):
        ref = _parse_path(path)
        if _weight(ref) > _weight(best):
            best = ref
    return best
