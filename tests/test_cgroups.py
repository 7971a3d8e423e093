"""parse_cgroup against every cgroup path shape the kubelet and the runtimes create, plus the
ones outside Kubernetes (Docker, podman, host processes) and garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resmon_exporter.attribution.cgroups import ContainerRef, parse_cgroup

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
    # a kubelet nested in a node container, seen from outside the node: kubepods below a
    # container's cgroup is not where a kubelet of this host puts it (and the node's own
    # view, relative to its cgroup namespace, is the row above)
    "kind-cgroupfs-seen-from-the-host": (f"0::/docker/{NODE}/kubepods/burstable/pod{UID}/{CID}\n", HOST),
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
    # not a pod where the kubelet puts one: nothing of the path is trusted
    "longer-uid-is-no-pod": (f"0::/kubepods/burstable/pod{UID}0/{CID}\n", HOST),
    "longer-static-hash-is-no-pod": (f"0::/kubepods/burstable/pod{STATIC}0/{CID}\n", HOST),
    "word-ending-in-pod-is-no-pod": (
        f"0::/kubepods.slice/kubepods-burstable.slice/ipod{UID_}.slice/crio-{CID}.scope\n",
        HOST,
    ),
    "kubepods-below-another-slice": (f"0::/burstable.slice/kubepods/pod{UID}/{CID}\n", HOST),
    "short-uid-is-no-pod": (f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}\n", HOST),
    "replacement-characters": ("\ufffd\ufffd:\x00:\ufffd\n", HOST),
}


@pytest.mark.parametrize("text, expected", CASES.values(), ids=CASES.keys())
def test_parse_cgroup(text: str, expected: ContainerRef) -> None:
    assert parse_cgroup(text) == expected


def test_pod_uid_is_lower_case_even_when_the_path_is_not() -> None:
    ref = parse_cgroup(f"0::/kubepods/burstable/pod{UID.upper()}/{CID.upper()}\n")
    assert ref == burstable()


VICTIM = "0b9c5e1a-2f3d-4c6b-8a7e-9d0f1e2c3b4a"  # a pod on the node that some process pretends to be
VICTIM_ = VICTIM.replace("-", "_")
VICTIM_SLICE = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + VICTIM_ + ".slice"
USER_UNIT = "/user.slice/user-1000.slice/user@1000.service"  # systemd delegates this subtree to uid 1000

# Cgroups that anyone with a delegated subtree can create (systemd user delegation, rootless
# podman, a container writing its own cgroup): named like the victim's pod and container.
SPOOFS: dict[str, tuple[str, ContainerRef]] = {
    "user-delegation-systemd-shape": (f"0::{USER_UNIT}/app.slice/{VICTIM_SLICE}/cri-containerd-{CID}.scope\n", HOST),
    "user-delegation-at-the-unit": (f"0::{USER_UNIT}/{VICTIM_SLICE}/cri-containerd-{CID}.scope\n", HOST),
    "user-delegation-cgroupfs-shape": (f"0::{USER_UNIT}/kubepods/burstable/pod{VICTIM}/{CID}\n", HOST),
    "user-delegation-v1-colon-shape": (
        v1(f"{USER_UNIT}/kubepods-burstable-pod{VICTIM_}.slice:cri-containerd:{CID}"), HOST,
    ),
    "rootless-podman-inner-cgroups": (
        f"0::{USER_UNIT}/user.slice/libpod-{ALT}.scope/container/kubepods/pod{VICTIM}/{CID}\n", HOST,
    ),
    "system-service-subtree": (f"0::/system.slice/myjob.service/{VICTIM_SLICE}/cri-containerd-{CID}.scope\n", HOST),
    "docker-container-subtree": (f"0::/system.slice/docker-{ALT}.scope/kubepods/pod{VICTIM}/{CID}\n", HOST),
    "slice-not-named-after-its-parent": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{VICTIM_}.slice/crio-{CID}.scope\n",
        HOST,
    ),
    "relative-path-into-a-user-subtree": (f"0::/../../..{USER_UNIT}/{VICTIM_SLICE}/crio-{CID}.scope\n", HOST),
    # a pod's own container creating cgroups inside its cgroup: still that pod and container
    "inside-a-real-pods-container-systemd": (
        f"0::{SLICE}/cri-containerd-{ALT}.scope/{VICTIM_SLICE}/cri-containerd-{CID}.scope\n",
        ContainerRef(ALT, UID, "burstable"),
    ),
    "inside-a-real-pods-container-cgroupfs": (
        f"0::/kubepods/burstable/pod{UID}/{ALT}/kubepods/pod{VICTIM}/{CID}\n",
        ContainerRef(ALT, UID, "burstable"),
    ),
    "inside-a-real-pods-container-relative": (
        f"0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{ALT}.scope/{VICTIM_SLICE}/crio-{CID}.scope\n",
        ContainerRef(ALT, UID, "burstable"),
    ),
    "below-conmon-is-no-container": (
        f"0::{BESTEFFORT_SLICE}/crio-conmon-{ALT}.scope/crio-{CID}.scope\n", ContainerRef("", UID, "besteffort"),
    ),
}


@pytest.mark.parametrize("text, expected", SPOOFS.values(), ids=SPOOFS.keys())
def test_a_pod_only_where_the_kubelet_puts_it(text: str, expected: ContainerRef) -> None:
    assert parse_cgroup(text) == expected


def test_pod_at_the_relative_levels_of_the_kubelets_tree() -> None:
    """A reader in a cgroup namespace inside the kubelet's tree: the part after ".." starts
    at the level of the common ancestor."""
    pod_slice = f"kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"
    assert parse_cgroup(f"0::/../../{pod_slice}\n") == burstable()
    assert parse_cgroup(f"0::/../../../kubepods-burstable.slice/{pod_slice}\n") == burstable()
    assert parse_cgroup(f"0::/../../../../kubepods.slice/kubepods-burstable.slice/{pod_slice}\n") == burstable()
    assert parse_cgroup(f"0::/../../kubepods/burstable/pod{UID}/{CID}\n") == burstable()
    assert parse_cgroup(f"0::/../../burstable/pod{UID}/{CID}\n") == burstable()
    assert parse_cgroup(f"0::/../kubepods.slice/kubepods-burstable.slice/{pod_slice}\n") == burstable()
    # kind's kubelet below kubelet.slice, seen from beside that slice
    kind = f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/crio-{CID}.scope"
    assert parse_cgroup(f"0::/../../{kind}\n") == ContainerRef(CID, UID, "guaranteed")
    # but not below anything else
    assert parse_cgroup(f"0::/../../a.slice/{kind}\n") == HOST
    assert parse_cgroup(f"0::/../../x.service/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n") == HOST


def test_the_kubelets_cgroup_root() -> None:
    """--cgroup-root: the kubelet's tree starts below it; elsewhere it is no pod."""
    text = f"0::/resmon-test/kubepods/burstable/pod{UID}/{CID}\n"
    assert parse_cgroup(text) == HOST
    assert parse_cgroup(text, cgroup_root="/resmon-test") == burstable()
    assert parse_cgroup(text, cgroup_root="/resmon-test/") == burstable()
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}/{CID}\n", cgroup_root="/resmon-test") == HOST
    assert parse_cgroup(f"0::/system.slice/docker-{CID}.scope\n", cgroup_root="/resmon-test") == ContainerRef(CID)


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
