"""parse_cgroup against every cgroup path shape the kubelet and the runtimes create, plus the
ones outside Kubernetes (Docker, podman, host processes) and garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.cgroups import ContainerRef, parse_cgroup

UID = "1234abcd-5678-90ef-a1b2-c3d4e5f60718"
UID_ = UID.replace("-", "_")  # how the systemd driver writes it
STATIC = "6f2c1a9e8d7b4c3a2f1e0d9c8b7a6f5e"  # a static pod's config hash
CID = "0123456789abcdef" * 4
NODE = "fedcba9876543210" * 4  # a kind node's own container, outside the pod
ALT = "a" * 64

SLICE = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + UID_ + ".slice"
BESTEFFORT_SLICE = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + UID_ + ".slice"


def v1(path: str) -> str:
    """A cgroup v1 file where every hierarchy names the same path, as the kubelet sets it up."""
    controllers = ["cpuset", "cpu,cpuacct", "blkio", "memory", "devices", "freezer", "net_cls,net_prio", "pids"]
    lines = [f"{12 - i}:{c}:{path}" for i, c in enumerate(controllers)]
    return "\n".join(lines + [f"1:name=systemd:{path}"]) + "\n"


def burstable(cid: str = CID) -> ContainerRef:
    return ContainerRef(container_id=cid, pod_uid=UID, qos="burstable")


HOST = ContainerRef()

CASES: dict[str, tuple[str, ContainerRef]] = {
    # cgroup v2, systemd driver, containerd
    "v2-systemd-containerd-burstable": (f"0::{SLICE}/cri-containerd-{CID}.scope\n", burstable()),
    "v2-systemd-containerd-besteffort": (
        f"0::{BESTEFFORT_SLICE}/cri-containerd-{CID}.scope\n",
        ContainerRef(CID, UID, "besteffort"),
    ),
    "v2-systemd-containerd-guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        ContainerRef(CID, UID, "guaranteed"),
    ),
    # CRI-O; conmon is its monitor process: in the pod, but no container
    "v2-systemd-crio": (f"0::{BESTEFFORT_SLICE}/crio-{CID}.scope\n", ContainerRef(CID, UID, "besteffort")),
    "v2-systemd-crio-conmon": (f"0::{BESTEFFORT_SLICE}/crio-conmon-{CID}.scope\n", ContainerRef("", UID, "besteffort")),
    "v2-systemd-crio-guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n",
        ContainerRef(CID, UID, "guaranteed"),
    ),
    # Docker through cri-dockerd
    "v2-systemd-cri-dockerd": (f"0::{SLICE}/docker-{CID}.scope\n", burstable()),
    "v1-systemd-cri-dockerd": (v1(f"{SLICE}/docker-{CID}.scope"), burstable()),
    # cgroup v1, systemd driver, containerd: the slice and the id joined by ":runtime:"
    "v1-systemd-containerd-colon": (
        v1(f"/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}"),
        burstable(),
    ),
    "v1-systemd-containerd-colon-guaranteed": (
        v1(f"/system.slice/containerd.service/kubepods-pod{UID_}.slice:cri-containerd:{CID}"),
        ContainerRef(CID, UID, "guaranteed"),
    ),
    # cgroupfs driver: dashed UIDs, the id as a path element
    "v1-cgroupfs-burstable": (v1(f"/kubepods/burstable/pod{UID}/{CID}"), burstable()),
    "v2-cgroupfs-besteffort": (f"0::/kubepods/besteffort/pod{UID}/{CID}\n", ContainerRef(CID, UID, "besteffort")),
    "v1-cgroupfs-guaranteed": (v1(f"/kubepods/pod{UID}/{CID}"), ContainerRef(CID, UID, "guaranteed")),
    "v2-cgroupfs-guaranteed": (f"0::/kubepods/pod{UID}/{CID}\n", ContainerRef(CID, UID, "guaranteed")),
    # v1 with some hierarchies left at the root (not every controller is delegated)
    "v1-partly-at-root": (
        f"12:cpuset:/\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/\n",
        burstable(),
    ),
    # hybrid hosts: v1 lines and a 0:: line; whichever carries the pod wins, in either order
    "hybrid-pod-on-unified": (
        "4:memory:/process_api/d25377a9cbe64e4cf7197ae28d560080\n1:name=systemd:/\n"
        + f"0::{SLICE}/cri-containerd-{CID}.scope\n",
        burstable(),
    ),
    "hybrid-pod-on-v1": (v1(f"{SLICE}/cri-containerd-{CID}.scope") + "0::/\n", burstable()),
    "hybrid-pod-beats-plain-container": (
        f"5:devices:/docker/{ALT}\n0::{SLICE}/cri-containerd-{CID}.scope\n",
        burstable(),
    ),
    "hybrid-container-beats-pod-only": (
        f"5:devices:{SLICE}\n0::{SLICE}/cri-containerd-{CID}.scope\n",
        burstable(),
    ),
    "hybrid-pod-before-plain-container": (
        v1(f"{SLICE}/cri-containerd-{CID}.scope") + f"0::/docker/{ALT}\n",
        burstable(),
    ),
    "hybrid-pod-only-beats-container-only": (
        f"5:devices:/docker/{ALT}\n0::{SLICE}\n",
        ContainerRef("", UID, "burstable"),
    ),
    "hybrid-pod-and-container-before-pod-only": (
        f"5:devices:{SLICE}/cri-containerd-{CID}.scope\n0::{SLICE}\n",
        burstable(),
    ),
    "tie-first-line-wins": (f"5:devices:/docker/{CID}\n0::/docker/{ALT}\n", ContainerRef(CID)),
    # a reader in a private cgroup namespace sees paths relative to its own root
    "v2-relative-to-namespace": (
        f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        ContainerRef(CID, UID, "besteffort"),
    ),
    # kind and other nested kubelets
    "kind-systemd-nested": (
        (
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
        ),
        ContainerRef(CID, UID, "besteffort"),
    ),
    "kind-cgroupfs-inside-node-container": (f"0::/docker/{NODE}/kubepods/burstable/pod{UID}/{CID}\n", burstable()),
    # static pods: the UID is the 32-hex config hash, kept as is
    "static-pod-systemd": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/crio-{CID}.scope\n",
        ContainerRef(CID, STATIC, "burstable"),
    ),
    "static-pod-cgroupfs-guaranteed": (f"0::/kubepods/pod{STATIC}/{CID}\n", ContainerRef(CID, STATIC, "guaranteed")),
    # a pod-level cgroup (no container below it yet)
    "pod-level-only": (f"0::{SLICE}\n", ContainerRef("", UID, "burstable")),
    # plain Docker outside Kubernetes: a container, no pod
    "docker-v1-cgroupfs": (v1(f"/docker/{CID}"), ContainerRef(CID)),
    "docker-v2-systemd": (f"0::/system.slice/docker-{CID}.scope\n", ContainerRef(CID)),
    "docker-in-docker-innermost": (f"0::/docker/{ALT}/docker/{CID}\n", ContainerRef(CID)),
    # podman: a container, no pod; its conmon is no container
    "podman-root": (f"0::/machine.slice/libpod-{CID}.scope\n", ContainerRef(CID)),
    "podman-rootless-subcgroup": (
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
        ContainerRef(CID),
    ),
    "podman-conmon": (f"0::/machine.slice/libpod-conmon-{CID}.scope\n", HOST),
    # a UID-like "pod..." name outside kubepods is no pod
    "pod-name-without-kubepods": (
        f"0::/system.slice/foo-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        ContainerRef(CID),
    ),
    # only the known runtimes' scopes; a unit that merely ends in one is not a container
    "unknown-scope-prefix": (f"0::/system.slice/mydocker-{CID}.scope\n", HOST),
    # "kubepods" itself is not a pod
    "kubepods-slice-itself": ("0::/kubepods.slice\n", HOST),
    "kubepods-qos-slice": ("0::/kubepods.slice/kubepods-burstable.slice\n", HOST),
    "kubepods-cgroupfs-qos": (v1("/kubepods/besteffort"), HOST),
    # host processes
    "host-user-session": ("0::/user.slice/user-1000.slice/session-3.scope\n", HOST),
    "host-init": ("0::/init.scope\n", HOST),
    "host-root": ("0::/\n", HOST),
    "host-containerd-daemon": ("0::/system.slice/containerd.service\n", HOST),
    "host-v1": (v1("/"), HOST),
    "host-v1-user": (v1("/user.slice/user-0.slice/session-1.scope"), HOST),
    # file endings and garbage
    "crlf-and-blank-lines": (f"\r\n0::{SLICE}/cri-containerd-{CID}.scope\r\n\r\n", burstable()),
    "no-trailing-newline": (f"0::{SLICE}/cri-containerd-{CID}.scope", burstable()),
    "empty": ("", HOST),
    "blank-lines": ("\n\n\n", HOST),
    "prose": ("no cgroups here\n", HOST),
    "path-without-fields": (f"{SLICE}/cri-containerd-{CID}.scope\n", HOST),
    "only-colons": ("::\n:::::\n", HOST),
    "short-hex-is-no-id": (f"0::/docker/{CID[:63]}\n", HOST),
    "long-hex-is-no-id": (f"0::/docker/{CID}0\n", HOST),
    "longer-uid-is-no-pod": (f"0::/kubepods/burstable/pod{UID}0/{CID}\n", ContainerRef(CID)),
    "longer-static-hash-is-no-pod": (f"0::/kubepods/burstable/pod{STATIC}0/{CID}\n", ContainerRef(CID)),
    "word-ending-in-pod-is-no-pod": (
        f"0::/kubepods.slice/kubepods-burstable.slice/ipod{UID_}.slice/crio-{CID}.scope\n",
        ContainerRef(CID),
    ),
    "qos-word-before-kubepods-is-not-the-qos": (
        f"0::/burstable.slice/kubepods/pod{UID}/{CID}\n",
        ContainerRef(CID, UID, "guaranteed"),
    ),
    "short-uid-is-no-pod": (f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}\n", ContainerRef(CID)),
    "replacement-characters": ("\ufffd\ufffd:\x00:\ufffd\n", HOST),
}


@pytest.mark.parametrize("text, expected", CASES.values(), ids=CASES.keys())
def test_parse_cgroup(text: str, expected: ContainerRef) -> None:
    assert parse_cgroup(text) == expected


def test_pod_uid_is_lower_case_even_when_the_path_is_not() -> None:
    ref = parse_cgroup(f"0::/kubepods/burstable/pod{UID.upper()}/{CID.upper()}\n")
    assert ref == burstable()


def test_container_after_the_pod_wins_over_one_before_it() -> None:
    # a nested kubelet's node container precedes the pod; the workload's id follows it
    ref = parse_cgroup(f"0::/system.slice/docker-{NODE}.scope/kubepods/pod{UID}/{CID}\n")
    assert ref == ContainerRef(CID, UID, "guaranteed")


@settings(deadline=None)
@given(st.text())
def test_never_raises_and_qos_only_with_a_pod(text: str) -> None:
    ref = parse_cgroup(text)
    assert ref.qos in ("guaranteed", "burstable", "besteffort", "")
    assert (ref.qos == "") == (ref.pod_uid == "")


@settings(deadline=None)
@given(st.sampled_from([t for t, _ in CASES.values()]), st.text(alphabet="\n:/-_.abc0", max_size=20))
def test_never_raises_on_mangled_real_files(text: str, noise: str) -> None:
    ref = parse_cgroup(noise + text + noise)
    assert (ref.qos == "") == (ref.pod_uid == "")
