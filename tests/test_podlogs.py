"""pod_names on directory trees laid out like the kubelet's /var/log/pods."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resmon_exporter import ResourceMonitor
from resmon_exporter.attribution.cgroups import parse_cgroup
from resmon_exporter.attribution.podlogs import ContainerName, PodName, container_names, pod_names
from resmon_exporter.samples import GpuIdentity, GpuProcess, GpuReading, GpuSample
from workloads import procfs_tree, systemd_containerd

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


def test_links_are_not_followed(tmp_path: Path) -> None:
    """The kubelet makes real directories; a link (to another pod's directory, or anywhere)
    would let whoever made it name any UID (issue 22, 19). Mount a moved log disk instead."""
    moved = pod_dir(tmp_path / "disk2", f"default_web_{UID}", "app")
    (tmp_path / "pods").mkdir()
    (tmp_path / "pods" / moved.name).symlink_to(moved)
    real = pod_dir(tmp_path / "pods", f"default_db_{OTHER}", "db")
    (real / "linked").symlink_to(moved / "app")  # a container directory that is a link
    assert pod_names(str(tmp_path / "pods")) == {OTHER: PodName("default", "db", ("db",))}


def test_two_directories_with_one_uid_are_ambiguous(tmp_path: Path) -> None:
    """Which one is the kubelet's cannot be told: neither name is used (not the later-sorting one)."""
    pod_dir(tmp_path, f"ml_trainer_{UID}", "trainer")
    pod_dir(tmp_path, f"zz_evil_{UID.upper()}", "trainer")  # the same UID in another case
    pod_dir(tmp_path, f"default_web_{OTHER}", "app")
    # empty names, as for an unknown pod
    assert pod_names(str(tmp_path)) == {UID: PodName("", "", ()), OTHER: PodName("default", "web", ("app",))}


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
    """Each link names the pod directory it points into; its UID is what attribution checks
    against the process's cgroup (issue 22, 19)."""
    cid, other, third = "ab" * 32, "cd" * 32, "ef" * 32
    # the kubelet's absolute links; a dangling one still names it (the pod logs may be mounted elsewhere)
    (tmp_path / f"train-0_ml_trainer-{cid}.log").symlink_to(f"/var/log/pods/ml_train-0_{UID}/trainer/0.log")
    (tmp_path / f"web-1_prod_server-{other}.log").symlink_to(f"/nonexistent/prod_web-1_{OTHER.upper()}/server/3.log")
    (tmp_path / f"web-2_prod_server-{third}.log").write_text("")  # a file is no link: no pod directory, no entry
    (tmp_path / "truncated_ns_name-abc.log").symlink_to(f"/var/log/pods/ns_truncated_{UID}/name/0.log")  # id cut off
    (tmp_path / f"too_many_parts_here-{cid}.log").symlink_to(f"/var/log/pods/ml_train-0_{UID}/trainer/0.log")
    (tmp_path / f"pod_ns_c-{cid.upper()}.log").symlink_to(f"/var/log/pods/ns_pod_{UID}/c/0.log")  # ids are lower-case
    assert container_names(str(tmp_path)) == {
        cid: ContainerName("ml", "train-0", "trainer", UID),
        other: ContainerName("prod", "web-1", "server", OTHER),
    }
    assert container_names(str(tmp_path / "missing")) == {} and container_names("bad\0path") == {}


def test_a_link_whose_target_disagrees_with_its_name_is_ignored(tmp_path: Path) -> None:
    cid = "ab" * 32
    targets = {
        "a": f"/var/log/pods/ml_train-9_{UID}/trainer/0.log",  # another pod than the name says
        "b": f"/var/log/pods/other_train-0_{UID}/trainer/0.log",  # another namespace
        "c": f"/var/log/pods/ml_train-0_{UID}/loader/0.log",  # another container
        "d": f"/var/log/pods/ml_train-0_not-a-uid/trainer/0.log",
        "e": "0.log",  # no pod directory at all
        "f": f"/var/log/pods/ml_train-0_{UID}/trainer/0.txt",
    }
    for n, target in targets.items():
        sub = tmp_path / n
        sub.mkdir()
        (sub / f"train-0_ml_trainer-{cid}.log").symlink_to(target)
        assert container_names(str(sub)) == {}, target


# -- the listings are cached and refreshed off the scrape path (issue 22, 16) -----------------


class OneProcessBackend:
    """A GPU backend whose one GPU lists one process (the in-process monitor's input)."""

    name = "one-process"

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def prepare(self) -> None:
        pass

    def read(self) -> GpuReading:
        gpu = GpuSample(GpuIdentity(index=0, uuid="GPU-0"), up=True, process_list=(GpuProcess(self.pid, 1),))
        return GpuReading(backend=self.name, success=True, device_count=1, devices=(gpu,))

    def close(self) -> None:
        pass


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory where there is one (/dev/shm): 100,000 mkdirs take 0.7 s there
    and 17 s of a loaded disk's time."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="resmon-podlogs-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_hundred_thousand_pod_directories_are_not_listed_on_each_refresh(
    tmp_path: Path, fast_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing 100,000 pod log directories took seconds per refresh; the names are cached
    and the directory is listed again only when it changes (counted listings, not time)."""
    logs = fast_dir / "pods"
    logs.mkdir()
    for i in range(100_000):
        os.mkdir(logs / f"ns_pod-{i}_{uuid.UUID(int=i + 1)}")
    pod_dir(logs, f"ml_train_{UID}", "trainer")
    me = os.getpid()
    proc = procfs_tree(tmp_path / "proc", {me: systemd_containerd(UID, CID)})
    listed = [0]
    real_scandir = os.scandir

    def counting(path: Any = ".") -> Any:
        if os.fspath(path) == str(logs):
            listed[0] += 1
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting)
    with ResourceMonitor(backend=OneProcessBackend(me), cache_ttl=0, collect_host=False, collect_processes=True,
                         procfs=str(proc), pod_logs_dir=str(logs), container_logs_dir=str(tmp_path / "none"),
                         pod_resources_socket=str(tmp_path / "no.sock")) as m:
        m.start()
        deadline = time.monotonic() + 60
        while not (rows := m.snapshot().processes) or (rows[0].pod, rows[0].container) != ("train", "trainer"):
            assert time.monotonic() < deadline, "the pod was never named"
            time.sleep(0.05)
        before = listed[0]
        for _ in range(5):
            rows = m.snapshot().processes
            assert rows and (rows[0].namespace, rows[0].pod, rows[0].container) == ("ml", "train", "trainer")
        assert listed[0] - before <= 1, f"listed {listed[0] - before} times in 5 refreshes"
        # a new pod directory (the directory's mtime changes) is seen without a restart
        from resmon_exporter.attribution.podlogs import Names

        pod_dir(logs, f"ml_new_{OTHER}", "c")
        assert m._attribution._log_names is not None
        deadline = time.monotonic() + 30
        while OTHER not in (m._attribution._log_names.current((), 0.0) or Names({}, {})).pods:
            assert time.monotonic() < deadline, "the new pod directory was never listed"
            time.sleep(0.05)


def test_a_container_directory_made_after_its_pod_was_listed_is_seen(tmp_path: Path) -> None:
    """The kubelet makes the pod's directory first and a container's when it starts (an init
    container before the main one): the containers of asked-about pods are listed on each check."""
    from resmon_exporter.attribution.podlogs import LogNames

    logs = tmp_path / "pods"
    pod = pod_dir(logs, f"ml_train_{UID}", "init")
    names = LogNames(str(logs), str(tmp_path / "none"), logging.getLogger("test"), check_every=0.0)
    deadline = time.monotonic() + 10
    while (found := names.current({UID}, 1.0)) is None or found.pods[UID].containers != ("init",):
        assert time.monotonic() < deadline
    listings = names.listings
    (pod / "trainer").mkdir()
    while names.current({UID}, 1.0).pods[UID].containers != ("init", "trainer"):  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the new container directory was never seen"
    assert names.listings - listings <= 1  # the 100,000 pods' directory was not listed again for it
