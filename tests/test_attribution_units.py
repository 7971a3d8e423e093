"""Attribution and the process families in-process: device-id resolution, owners, grouping
and the per-GPU limit (the end-to-end tests run the same through the CLI)."""

from __future__ import annotations

import os
from pathlib import Path

from resmon_exporter.attribution import join as attribution
from resmon_exporter.attribution.kubelet import KubeletState
from resmon_exporter.attribution.podlogs import ContainerName, PodName, container_names, pod_names
from resmon_exporter.attribution.podresources import Allocation
from resmon_exporter.collectors.kubernetes import allocation_families
from resmon_exporter.collectors.processes import process_families
from resmon_exporter.attribution.procfs import ProcReader
from resmon_exporter.samples import GpuIdentity, GpuProcess, GpuReading, GpuSample, ProcessSample
from workloads import CID, UID, UID2, procfs_tree, systemd_containerd

G0, G1 = "GPU-00000000-0000-4000-8000-000000000000", "GPU-11111111-1111-4111-8111-111111111111"


def reading(*devices: GpuSample) -> GpuReading:
    return GpuReading(backend="nvml", success=True, device_count=len(devices), devices=devices)


def gpu(index: int, uuid: str, pci: str, **kw: object) -> GpuSample:
    return GpuSample(GpuIdentity(index=index, uuid=uuid, pci_bus_id=pci), up=True, **kw)  # type: ignore[arg-type]


def alloc(device_id: str, resource: str = "nvidia.com/gpu", pod: str = "p") -> Allocation:
    return Allocation("ns", pod, "c", resource, device_id)


def test_device_ids_resolve_to_the_gpu_they_are_on():
    r = reading(gpu(0, G0, "00000000:07:00.0"), gpu(1, G1, "00000000:0A:00.0", mig_uuids=("MIG-aa", "MIG-bb")))
    state = KubeletState((
        alloc(G0), alloc(G0 + "::3", pod="q"), alloc("MIG-bb", "nvidia.com/mig-1g.10gb"), alloc("1", pod="idx"),
        alloc("nvidia0", pod="gke"), alloc("0000:0a:00.0", "amd.com/gpu", pod="bdf"),
        alloc("0000:03:00.0", "amd.com/gpu", pod="amd"), alloc("0", "example.com/foo", pod="foo"), alloc("junk"),
        alloc(G0),  # listed twice (a terminal pod on an old kubelet): one series
    ), True, 0.0, 0.0)
    got = {(a.pod, a.gpu, a.device_id) for a in attribution.allocations(r, state)}
    assert got == {("p", 0, G0), ("q", 0, G0 + "::3"), ("p", 1, "MIG-bb"), ("idx", 1, "1"), ("gke", 0, "nvidia0"),
                   ("bdf", 1, "0000:0a:00.0")}
    assert len(attribution.allocations(r, state)) == 6


def test_owner_labels_from_cgroup_and_the_kubelets_logs(tmp_path: Path):
    me = os.getpid()
    proc = procfs_tree(tmp_path, {me: systemd_containerd(UID, CID)})
    r = reading(gpu(0, G0, "", process_list=(GpuProcess(me, 5, (("sm", 0.5),)), GpuProcess(2**22 + 7, 1))))
    pods = {UID: PodName("ml", "train", ("a", "b")), UID2: PodName("x", "y", ("z",))}
    names = attribution.Names(pods, {CID: ContainerName("ml", "train", "b", UID)})
    rows = attribution.processes(r, ProcReader(str(proc)), names)
    assert len(rows) == 1  # the PID that does not exist is skipped
    row = rows[0]
    assert (row.pid, row.container_id, row.pod_uid, row.namespace, row.pod, row.container) == (me, CID, UID, "ml", "train", "b")
    assert row.process == Path(f"/proc/{me}/comm").read_text().strip() and row.memory_bytes == 5
    # no link for its container id: the pod by UID, but with two containers not which one
    row = attribution.processes(r, ProcReader(str(proc)), attribution.Names(pods, {}))[0]
    assert (row.namespace, row.pod, row.container) == ("ml", "train", "")
    # a pod with one container: that one
    one = attribution.Names({UID: PodName("ml", "train", ("a",))}, {})
    assert attribution.processes(r, ProcReader(str(proc)), one)[0].container == "a"
    # kubernetes off: no names at all, the cgroup's ids still
    row = attribution.processes(r, ProcReader(str(proc)), None)[0]
    assert (row.pod, row.container_id, row.pod_uid) == ("", CID, UID)


def sample(pid: int, memory: int | None, container: str = "", gpu_index: int = 0, sm: float = 0.0) -> ProcessSample:
    return ProcessSample(gpu_index, f"GPU-{gpu_index}", pid, f"p{pid}", "root", container, "", "", "", "",
                         memory, (("sm", sm), ("memory", 0.0)))


def series(families, name):
    return [(s.labels, s.value) for f in families if f.name == name for s in f.samples]


def test_largest_first_per_gpu_and_hidden_memory_last():
    rows = tuple(sample(p, p * 10) for p in range(1, 6)) + (sample(9, None), sample(7, 1, gpu_index=1))
    fams = list(process_families(rows, "process", 3))
    mem = series(fams, "resmon_gpu_process_memory_used_bytes")
    assert [(l["gpu"], l["pid"]) for l, _ in mem] == [("0", "5"), ("0", "4"), ("0", "3"), ("1", "7")]
    util = series(fams, "resmon_gpu_process_utilization_ratio")
    assert len(util) == 4 * 2  # the same 3 + 1 processes, one series per engine
    fams = list(process_families(rows, "process", 10))
    assert "9" not in {l["pid"] for l, _ in series(fams, "resmon_gpu_process_memory_used_bytes")}
    assert "9" in {l["pid"] for l, _ in series(fams, "resmon_gpu_process_utilization_ratio")}  # hidden memory, still listed


def test_group_by_container_sums_and_clamps():
    rows = (sample(1, 10, "c1", sm=0.7), sample(2, 20, "c1", sm=0.6), sample(3, None, "c1"), sample(4, 5, "c2"), sample(5, 1))
    fams = list(process_families(rows, "container", 64))
    mem = {l["container_id"]: v for l, v in series(fams, "resmon_gpu_process_memory_used_bytes")}
    assert mem == {"c1": 30, "c2": 5, "": 1}
    sm = {l["container_id"]: v for l, v in series(fams, "resmon_gpu_process_utilization_ratio") if l["engine"] == "sm"}
    assert sm == {"c1": 1.0, "c2": 0.0, "": 0.0}
    assert all("pid" not in l for l, _ in series(fams, "resmon_gpu_process_memory_used_bytes"))


def test_off_means_no_families():
    assert list(process_families(None, "process", 64)) == [] and list(allocation_families(None)) == []
    assert [f.name for f in allocation_families(())] == ["resmon_gpu_allocation_info"]


def test_a_process_naming_a_victims_pod_in_its_own_cgroup_is_not_summed_into_it(tmp_path: Path):
    """A user's delegated subtree can hold a cgroup named like any pod and container
    (issue 22, 15): with group-by=container its VRAM must not join the victim's series."""
    me, other = os.getpid(), os.getppid()
    victim = systemd_containerd(UID, CID)
    spoof = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/" + victim[len("0::/"):]
    proc = procfs_tree(tmp_path, {me: victim, other: spoof})
    r = reading(gpu(0, G0, "", process_list=(GpuProcess(me, 100), GpuProcess(other, 7))))
    names = attribution.Names({UID: PodName("ml", "train", ("trainer",))}, {CID: ContainerName("ml", "train", "trainer", UID)})
    rows = {p.pid: p for p in attribution.processes(r, ProcReader(str(proc)), names)}
    assert (rows[other].pod_uid, rows[other].container_id, rows[other].pod) == ("", "", "")
    mem = {(l["pod_uid"], l["pod"]): v for l, v in series(process_families(tuple(rows.values()), "container", 64),
                                                          "resmon_gpu_process_memory_used_bytes")}
    assert mem == {(UID, "train"): 100, ("", ""): 7}


def test_a_container_link_counts_only_into_the_cgroups_pod(tmp_path: Path):
    """A link naming the process's container id but pointing into another pod's directory
    does not override the pod UID of the process's own cgroup (issue 22, 19)."""
    me = os.getpid()
    proc = procfs_tree(tmp_path / "proc", {me: systemd_containerd(UID, CID)})
    links = tmp_path / "containers"
    links.mkdir()
    (links / f"db-0_prod_postgres-{CID}.log").symlink_to(f"/var/log/pods/prod_db-0_{UID2}/postgres/0.log")
    r = reading(gpu(0, G0, "", process_list=(GpuProcess(me, 5),)))
    pods = {UID: PodName("ml", "train", ("a", "b")), UID2: PodName("prod", "db-0", ("postgres",))}
    row = attribution.processes(r, ProcReader(str(proc)), attribution.Names(pods, container_names(str(links))))[0]
    assert (row.pod_uid, row.namespace, row.pod, row.container) == (UID, "ml", "train", "")
    # into its own pod's directory: the link names the container
    (links / f"db-0_prod_postgres-{CID}.log").unlink()
    (links / f"train_ml_b-{CID}.log").symlink_to(f"/var/log/pods/ml_train_{UID}/b/0.log")
    row = attribution.processes(r, ProcReader(str(proc)), attribution.Names(pods, container_names(str(links))))[0]
    assert (row.namespace, row.pod, row.container) == ("ml", "train", "b")


def test_an_ambiguous_pod_uid_names_nothing(tmp_path: Path):
    """Two pod log directories with the process's UID: no names, even through a container link."""
    me = os.getpid()
    proc = procfs_tree(tmp_path / "proc", {me: systemd_containerd(UID, CID)})
    logs = tmp_path / "pods"
    for d in (f"ml_train_{UID}", f"zz_evil_{UID}"):
        (logs / d / "b").mkdir(parents=True)
    links = tmp_path / "containers"
    links.mkdir()
    (links / f"evil_zz_b-{CID}.log").symlink_to(f"/var/log/pods/zz_evil_{UID}/b/0.log")
    r = reading(gpu(0, G0, "", process_list=(GpuProcess(me, 5),)))
    names = attribution.Names(pod_names(str(logs)), container_names(str(links)))
    row = attribution.processes(r, ProcReader(str(proc)), names)[0]
    assert (row.pod_uid, row.namespace, row.pod, row.container) == (UID, "", "", "")
