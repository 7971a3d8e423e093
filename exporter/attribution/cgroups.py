"""Which container, Kubernetes pod and Slurm job a process belongs to, from the text of /proc/PID/cgroup.

The kubelet and the container runtimes name cgroups in a handful of shapes (cgroup v1 or v2,
systemd or cgroupfs driver, containerd, CRI-O or Docker; tests/test_cgroups.py has them all).

A pod is recognised only where the kubelet puts it, because anyone with a delegated cgroup
subtree (systemd user delegation, rootless containers, a container's own cgroup namespace)
can create cgroups with any name below it, "kubepods...pod<victim UID>" included:

- absolute paths: the kubelet's tree starts at the kubelet's cgroup root ("/" unless the
  kubelet runs with --cgroup-root): cgroupfs `kubepods/[qos/]pod<uid>/<container>`; systemd
  `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/<runtime>-<id>.scope`,
  where every slice from the root down is named after its parent (systemd's own naming, so
  kind's `kubelet.slice/kubelet-kubepods.slice/...` counts, a slice below a user's or a
  container's unit does not); cgroup v1's containerd form
  `system.slice/containerd.service/kubepods-...-pod<uid>.slice:cri-containerd:<id>`.
- paths relative to the reader's cgroup namespace ("/../../kubepods-..."): the part after the
  ".." may start at any level of the kubelet's tree (or of the slices above it), but nowhere
  else. Its first element is a child of an ancestor of the reader's own cgroup, which no one
  but the exporter's owner controls.
- the container id is only the element right below the pod; cgroups a container made inside
  its own cgroup are the container's.

A path that names "kubepods" anywhere else is no pod and no container (a spoof or a nested
kubelet seen from outside its node). Outside Kubernetes the innermost runtime id is the
process's container (plain Docker, podman).

The Slurm job comes from slurm.py, which is as strict about where slurmstepd puts a job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .slurm import job_id as _job_id

QOS_GUARANTEED = "guaranteed"
QOS_BURSTABLE = "burstable"
QOS_BESTEFFORT = "besteffort"


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """container_id: the runtime's 64-hex id; pod_uid: the API's dashed lower-case UID (or a
    static pod's 32-hex hash); qos: guaranteed | burstable | besteffort, "" without a pod;
    job_id: the Slurm job's id (decimal), "" outside Slurm and in a pod."""

    container_id: str = ""
    pod_uid: str = ""
    qos: str = ""
    job_id: str = ""


_HEX32 = r"[0-9a-f]{32}"
_QOS = r"(?P<qos>burstable|besteffort)"
# the systemd driver writes the UID with "_" ("-" is systemd's hierarchy separator), cgroupfs with "-"
_SYSTEMD_POD = re.compile(
    r"(?P<stem>(?:[0-9a-z_]+-)*kubepods(?:-" + _QOS + r")?-pod"
    r"(?P<uid>[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}|" + _HEX32 + r"))\.slice",
    re.IGNORECASE,
)
_CGROUPFS_POD = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|" + _HEX32 + r")", re.IGNORECASE
)
# v1, systemd driver, non-systemd controllers: the pod slice and the id joined by ":runtime:"
_COLON_POD = re.compile(_SYSTEMD_POD.pattern + r":(?:cri-containerd|crio|docker):(?P<cid>[0-9a-f]{64})", re.IGNORECASE)
_COLON_PARENTS = ("system.slice", "containerd.service")
_MAX_POD_DEPTH = 8  # slices above a pod: kubepods.slice, its QoS slice, and a custom root's

# The element right below a pod: cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope
# (systemd), <id> or crio-<id> (cgroupfs). conmon is CRI-O's monitor process, not the container.
_POD_CHILD = re.compile(
    r"(?P<runtime>cri-containerd|crio-conmon|crio|docker)-(?P<scoped>[0-9a-f]{64})(?:\.scope)?|(?P<bare>[0-9a-f]{64})",
    re.IGNORECASE,
)

# Outside Kubernetes: any known runtime's id, anywhere (the innermost is the process's)
_CONTAINER = re.compile(
    r"(?:"
    r"(?<![0-9A-Za-z])(?P<runtime>cri-containerd|crio-conmon|crio|docker|libpod-conmon|libpod)"
    r"-(?P<scoped>[0-9a-f]{64})(?:\.scope)?"
    r"|:(?:cri-containerd|crio|docker):(?P<colon>[0-9a-f]{64})"
    r"|/(?P<element>[0-9a-f]{64})"
    r")(?=$|[/:])",
    re.IGNORECASE,
)

_MONITORS = frozenset({"crio-conmon", "libpod-conmon"})


def _uid(raw: str) -> str:
    return raw.lower().replace("_", "-")


def _child_id(elements: list[str], at: int) -> str:
    """The container id of the element right below the pod (at), "" if there is none."""
    if at >= len(elements):
        return ""
    match = _POD_CHILD.fullmatch(elements[at])
    if match is None or (match.group("runtime") or "").lower() == "crio-conmon":
        return ""
    return (match.group("scoped") or match.group("bare") or "").lower()


def _systemd_chain(stem: str) -> list[str]:
    # systemd puts a-b-c.slice at /a.slice/a-b.slice/a-b-c.slice
    parts = stem.split("-")
    return ["-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))]


def _cgroupfs_pod(elements: list[str]) -> ContainerRef | None:
    """kubepods/[qos/]pod<uid>/<container> (or, relative, from the QoS level down)."""
    lowered = [e.lower() for e in elements[:3]]
    at = 1 if lowered[0] == "kubepods" else 0
    qos = QOS_GUARANTEED  # Guaranteed pods sit directly under kubepods, with no QoS level
    if at < len(lowered) and lowered[at] in (QOS_BURSTABLE, QOS_BESTEFFORT):
        qos = lowered[at]
        at += 1
    elif at == 0:
        return None  # relative, but neither kubepods nor a QoS level
    pod = _CGROUPFS_POD.fullmatch(elements[at]) if at < len(elements) else None
    if pod is None:
        return None
    return ContainerRef(_child_id(elements, at + 1), _uid(pod.group("uid")), qos)


def _systemd_pod(elements: list[str], relative: bool) -> ContainerRef | None:
    for at, element in enumerate(elements[:_MAX_POD_DEPTH]):
        colon = _COLON_POD.fullmatch(element)
        if colon is not None:
            parents = tuple(e.lower() for e in elements[:at])
            if parents != (_COLON_PARENTS[len(_COLON_PARENTS) - at :] if relative and at <= 2 else _COLON_PARENTS):
                return None
            qos = (colon.group("qos") or QOS_GUARANTEED).lower()
            return ContainerRef(colon.group("cid").lower(), _uid(colon.group("uid")), qos)
        pod = _SYSTEMD_POD.fullmatch(element)
        if pod is None:
            continue
        chain = _systemd_chain(pod.group("stem").lower())
        seen = [e.lower() for e in elements[: at + 1]]
        # absolute: every slice from the root, each named after its parent; relative: a tail
        # of that chain (the part below the reader's and the process's common ancestor)
        if seen != (chain[len(chain) - len(seen) :] if relative else chain):
            return None
        return ContainerRef(_child_id(elements, at + 1), _uid(pod.group("uid")), (pod.group("qos") or QOS_GUARANTEED).lower())
    return None


def _kubelet_pod(elements: list[str], relative: bool) -> ContainerRef | None:
    """The pod and container where the elements are the kubelet's tree from its start (an
    absolute path below the cgroup root) or from one of its levels (relative); None if not."""
    if not elements:
        return None
    first = elements[0].lower()
    if first == "kubepods" or (relative and first in (QOS_BURSTABLE, QOS_BESTEFFORT)):
        return _cgroupfs_pod(elements)
    return _systemd_pod(elements, relative)


def _container_id(match: re.Match[str]) -> str:
    if (match.group("runtime") or "").lower() in _MONITORS:
        return ""
    return (match.group("scoped") or match.group("colon") or match.group("element") or "").lower()


def _parse_path(path: str, root: list[str]) -> ContainerRef:
    elements = [e for e in path.split("/") if e]
    relative = bool(elements) and elements[0] == ".."
    while elements and elements[0] == "..":
        elements.pop(0)
    ref = None
    if relative or elements[: len(root)] == root:
        ref = _kubelet_pod(elements if relative else elements[len(root) :], relative)
    if ref is not None:
        return ref
    if "kubepods" in path.lower():
        return ContainerRef()  # kubepods where the kubelet does not put it: trust nothing in it
    matches = list(_CONTAINER.finditer(path))
    # outside Kubernetes the innermost container (the last id) is the process's own
    return ContainerRef(container_id=_container_id(matches[-1])) if matches else ContainerRef()


def _paths(text: str) -> list[str]:
    # "hierarchy-ID:controller-list:path"; the path itself may contain ":" (v1 systemd driver)
    fields = (line.strip().split(":", 2) for line in text.splitlines())
    return [f[2] for f in fields if len(f) == 3]


def _weight(ref: ContainerRef) -> int:
    return 2 * bool(ref.pod_uid) + bool(ref.container_id)


def parse_cgroup(text: str, cgroup_root: str = "/") -> ContainerRef:
    """The container, pod and Slurm job named by /proc/PID/cgroup text; ContainerRef() for a
    host process, unknown shapes, pods and jobs where the kubelet or slurmstepd does not put
    them, and garbage. cgroup_root: the kubelet's --cgroup-root (absolute paths only). On v1
    and hybrid hosts the lines can disagree (some controllers are not delegated), so the line
    that names the most container and pod wins, the first on a tie, and the first line that
    names a job gives the job."""
    root = [e for e in cgroup_root.split("/") if e]
    best, job = ContainerRef(), ""
    for path in _paths(text):
        ref = _parse_path(path, root)
        if _weight(ref) > _weight(best):
            best = ref
        job = job or _job_id(path)
    # A pod's processes are never in a Slurm job: lines that say both (only root could make
    # them) give the pod, which the kubelet and its allocations confirm, and no job
    return replace(best, job_id=job) if job and not best.pod_uid else best
