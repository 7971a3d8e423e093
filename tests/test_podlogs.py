"""pod_names on directory trees laid out like the kubelet's /var/log/pods."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.cgroups import parse_cgroup
from exporter.kubernetes.podlogs import ContainerName, PodName, container_names, pod_names

UID = "1234abcd-5678-90ef-a1b2-c3d4e5f60718"
OTHER = "0b9c5e1a-2f3d-4c6b-8a7e-9d0f1e2c3b4a"
STATIC = "6f2c1a9e8d7b4c3a2f1e0d9c8b7a6f5e"
CID = "0123456789abcdef" * 4


def pod_dir(root: Path, name: str, *containers: str) -> Path:
    """A pod's log directory, containers with their N.log files as the kubelet writes them."""
    pod = root / name
    pod.mkdir(parents=True)
    for container in containers:
        (pod / container).mkdir()
        (pod / container / "0.log").write_text("2024-01-01T00:00:00Z stdout F started\n")
    return pod


def test_kubelet_layout(tmp_path: Path) -> None:
    pod_dir(tmp_path, f"ml-team_trainer-7f9c_{UID}", "trainer", "init-weights", "sidecar")
    pod_dir(tmp_path, f"kube-system_kube-proxy-x7k2p_{OTHER}", "kube-proxy")
    pod_dir(tmp_path, f"kube-system_etcd-node1_{STATIC}", "etcd")  # a static pod: its config hash
    assert pod_names(str(tmp_path)) == {
        UID: PodName(namespace="ml-team", pod="trainer-7f9c", containers=("init-weights", "sidecar", "trainer")),
        OTHER: PodName(namespace="kube-system", pod="kube-proxy-x7k2p", containers=("kube-proxy",)),
        STATIC: PodName(namespace="kube-system", pod="etcd-node1", containers=("etcd",)),
    }


def test_uid_keys_are_lower_case(tmp_path: Path) -> None:
    pod_dir(tmp_path, f"Default_Web_{UID.upper()}", "app")
    assert pod_names(str(tmp_path)) == {UID: PodName("Default", "Web", ("app",))}


def test_joins_with_the_uid_from_a_systemd_cgroup_path(tmp_path: Path) -> None:
    pod_dir(tmp_path, f"ml-team_trainer_{UID}", "trainer")
    slice_name = f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    ref = parse_cgroup(f"0::/kubepods.slice/kubepods-burstable.slice/{slice_name}/cri-containerd-{CID}.scope\n")
    assert pod_names(str(tmp_path))[ref.pod_uid] == PodName("ml-team", "trainer", ("trainer",))


def test_entries_not_in_the_layout_are_ignored(tmp_path: Path) -> None:
    pod_dir(tmp_path, f"default_web_{UID}", "app")
    pod_dir(tmp_path, "default_web")  # two parts
    pod_dir(tmp_path, f"default_web_{OTHER}_extra")  # four parts
    pod_dir(tmp_path, f"_web_{OTHER}")  # an empty namespace
    pod_dir(tmp_path, f"default__{OTHER}")  # an empty pod name
    (tmp_path / f"default_file_{OTHER}").write_text("not a directory\n")
    (tmp_path / f"default_dangling_{OTHER}").symlink_to(tmp_path / "nowhere")
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"default_caf\xe9_" + OTHER.encode()))  # not UTF-8
    assert pod_names(str(tmp_path)) == {UID: PodName("default", "web", ("app",))}


def test_pod_dir_that_is_a_link_counts(tmp_path: Path) -> None:
    # a node that moved pod logs to another disk and linked them back
    moved = pod_dir(tmp_path / "disk2", f"default_web_{UID}", "app")
    (tmp_path / "pods").mkdir()
    (tmp_path / "pods" / moved.name).symlink_to(moved)
    assert pod_names(str(tmp_path / "pods")) == {UID: PodName("default", "web", ("app",))}


def test_files_in_a_pod_dir_are_no_containers(tmp_path: Path) -> None:
    pod = pod_dir(tmp_path, f"default_web_{UID}", "app")
    (pod / "stray.log").write_text("")
    assert pod_names(str(tmp_path))[UID].containers == ("app",)


def test_pod_without_containers_yet(tmp_path: Path) -> None:
    pod_dir(tmp_path, f"default_web_{UID}")
    assert pod_names(str(tmp_path)) == {UID: PodName("default", "web", ())}


def test_missing_or_unusable_dir_is_empty(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert pod_names(str(tmp_path / "absent")) == {}
    assert pod_names(str(afile)) == {}  # ENOTDIR
    assert pod_names(str(afile / "below")) == {}
    assert pod_names("") == {}
    assert pod_names("/var/log/pods\0") == {}  # a NUL: ValueError inside, not raised


def test_empty_dir_is_empty(tmp_path: Path) -> None:
    assert pod_names(str(tmp_path)) == {}


def test_container_links_name_containers_by_id(tmp_path: Path) -> None:
    cid, other = "ab" * 32, "cd" * 32
    (tmp_path / f"train-0_ml_trainer-{cid}.log").symlink_to("/nonexistent/0.log")  # a dangling link still names it
    (tmp_path / f"web-1_prod_server-{other}.log").write_text("")
    (tmp_path / "truncated_ns_name-abc.log").write_text("")  # the kubelet cut the id off: no id, no entry
    (tmp_path / f"too_many_parts_here-{cid}.log").write_text("")
    (tmp_path / f"pod_ns_c-{cid.upper()}.log").write_text("")  # ids are lower-case hex
    assert container_names(str(tmp_path)) == {
        cid: ContainerName("ml", "train-0", "trainer"),
        other: ContainerName("prod", "web-1", "server"),
    }
    assert container_names(str(tmp_path / "missing")) == {} and container_names("bad\0path") == {}
