"""The kubernetes collector end to end: the real CLI and a real gRPC kubelet on a unix
socket (tests/fake_kubelet.py, a server generated from the upstream api.proto)."""

from __future__ import annotations

import os
import socket
import threading
import time

import grpc
import pytest

from fake_kubelet import Claim, Container, Device, DraDevice, Pod
from fakenvml import GIB, Scrape
from scenarios import board_uuid
from workloads import CID, CID2, CID3, UID, UID2, container_logs, pod_logs, procfs_tree, systemd_containerd

INFO = "resmon_gpu_allocation_info"
G0, G1 = board_uuid("hopper", 0), board_uuid("hopper", 1)
MIG_A, MIG_B = "MIG-0a1b2c3d-0000-4000-8000-00000000000a", "MIG-0a1b2c3d-0000-4000-8000-00000000000b"






def two_gpus(**extra: object) -> dict[str, object]:
    return {"count": 2, "gpu.0.uuid": G0, "gpu.1.uuid": G1, "gpu.0.pci_bus_id": "00000000:07:00.0",
            "gpu.1.pci_bus_id": "00000000:0A:00.0", **extra}


def pod(namespace: str, name: str, container: str, resource: str, *ids: str) -> Pod:
    return Pod(namespace, name, [Container(container, [Device(resource, list(ids))])])


def allocations(s) -> set[tuple[str, ...]]:
    return {(l["gpu"], l["uuid"], l["namespace"], l["pod"], l["container"], l["resource"], l["device_id"]) for l, v in s.series(INFO)}


def until_allocations(exporter) -> Scrape:
    """The first scrape whose kubelet List has answered: the first List runs beside start-up
    and a scrape waits for it only briefly (0.1 s), so under load the first scrape may
    precede it. Waits for the answer, not for a fixed moment."""
    return exporter.wait_for(lambda s: s.has("resmon_collector_success", collector="kubernetes")
                             and s.value("resmon_collector_success", collector="kubernetes") == 1 and bool(s.series(INFO)), timeout=30)


def test_no_socket_no_kubernetes_series(run_exporter, scenario):
    scenario.write(two_gpus())
    s = run_exporter("--kubernetes.pod-resources-socket=/nonexistent/kubelet.sock").scrape()
    assert INFO not in s.families and not s.has("resmon_collector_success", collector="kubernetes")
    assert s.value("resmon_collector_success", collector="gpu") == 1


def test_exclusive_shared_mig_and_foreign_device_ids(run_exporter, scenario, kubelet):
    scenario.write(two_gpus(**{"gpu.1.mig_uuids": f"{MIG_A},{MIG_B}"}))
    kubelet.pods = [
        pod("ml", "train-0", "trainer", "nvidia.com/gpu", G0 + "::0"),  # time-sliced replica 0
        pod("ml", "train-1", "trainer", "nvidia.com/gpu", G0 + "::1"),  # replica 1 of the same GPU
        pod("web", "infer", "server", "nvidia.com/mig-1g.10gb", MIG_B),
        pod("amd", "rocm", "job", "amd.com/gpu", "0000:03:00.0"),  # not one of these GPUs: left out
        pod("x", "other", "c", "example.com/foo", "0"),  # an index under a resource that is not a GPU
        Pod("ml", "no-gpu", [Container("app", [])]),
    ]
    kubelet.start()
    s = until_allocations(run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}"))
    assert allocations(s) == {
        ("0", G0, "ml", "train-0", "trainer", "nvidia.com/gpu", G0 + "::0"),
        ("0", G0, "ml", "train-1", "trainer", "nvidia.com/gpu", G0 + "::1"),
        ("1", G1, "web", "infer", "server", "nvidia.com/mig-1g.10gb", MIG_B),
    }
    assert s.value("resmon_collector_success", collector="kubernetes") == 1
    assert s.has("resmon_last_refresh_timestamp_seconds", collector="kubernetes")


def test_index_and_exclusive_uuid_ids(run_exporter, scenario, kubelet):
    scenario.write(two_gpus())
    kubelet.pods = [pod("a", "p0", "c", "nvidia.com/gpu", G0), pod("b", "p1", "c", "nvidia.com/gpu", "1")]
    kubelet.start()
    s = until_allocations(run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}"))
    assert allocations(s) == {("0", G0, "a", "p0", "c", "nvidia.com/gpu", G0), ("1", G1, "b", "p1", "c", "nvidia.com/gpu", "1")}


def test_time_sliced_pods_each_get_their_own_processes_numbers(run_exporter, scenario, kubelet, workloads, tmp_path):
    """Two pods share GPU 0: each pod's VRAM is its own processes', never the device's; a
    sidecar that did not ask for the GPU is named as itself, not after the container that did."""
    a, side, b = workloads.start("trainer"), workloads.start("sidecar"), workloads.start("infer")
    proc = procfs_tree(tmp_path / "proc", {
        a: systemd_containerd(UID, CID), side: systemd_containerd(UID, CID3), b: systemd_containerd(UID2, CID2, "besteffort"),
    })
    logs = pod_logs(tmp_path / "pods", [("ml", "train-0", UID, ["trainer", "loader"]), ("ml", "train-1", UID2, ["trainer"])])
    links = container_logs(tmp_path / "containers", logs, [("ml", "train-0", UID, "trainer", CID), ("ml", "train-0", UID, "loader", CID3)])
    scenario.write(two_gpus(**{"gpu.0.processes": f"{a}:{3 * GIB},{side}:{GIB // 2},{b}:{GIB}", "gpu.0.memory_used": 5 * GIB}))
    kubelet.pods = [pod("ml", "train-0", "trainer", "nvidia.com/gpu", G0 + "::0"), pod("ml", "train-1", "trainer", "nvidia.com/gpu", G0 + "::1")]
    kubelet.start()
    s = run_exporter("--collector.processes", f"--path.procfs={proc}", f"--kubernetes.pod-logs-dir={logs}",
                     f"--kubernetes.container-logs-dir={links}", f"--kubernetes.pod-resources-socket={kubelet.socket_path}").scrape()
    mem = {(l["namespace"], l["pod"], l["container"]): v for l, v in s.series("resmon_gpu_process_memory_used_bytes")}
    # train-1 has one container (named from the pod log directory); train-0's by container id
    assert mem == {("ml", "train-0", "trainer"): 3 * GIB, ("ml", "train-0", "loader"): GIB // 2, ("ml", "train-1", "trainer"): GIB}
    # without the container links, train-0's two containers cannot be told apart: left empty
    s = run_exporter("--collector.processes", f"--path.procfs={proc}", f"--kubernetes.pod-logs-dir={logs}",
                     f"--kubernetes.pod-resources-socket={kubelet.socket_path}").scrape()
    mem = {(l["container_id"], l["pod"], l["container"]): v for l, v in s.series("resmon_gpu_process_memory_used_bytes")}
    assert mem == {(CID, "train-0", ""): 3 * GIB, (CID3, "train-0", ""): GIB // 2, (CID2, "train-1", "trainer"): GIB}


def test_kubelet_stopped_and_restarted(run_exporter, scenario, kubelet):
    scenario.write(two_gpus())
    kubelet.pods = [pod("a", "p0", "c", "nvidia.com/gpu", G0)]
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}", "--kubernetes.cache-ttl=0", "--collect.cache-ttl=0")
    assert exporter.scrape().value("resmon_collector_success", collector="kubernetes") == 1
    kubelet.stop()
    dead = socket.socket(socket.AF_UNIX)  # the kubelet died without removing its socket file
    dead.bind(kubelet.socket_path)
    dead.close()
    s = exporter.wait_for(lambda s: s.has("resmon_collector_success", collector="kubernetes")
                          and s.value("resmon_collector_success", collector="kubernetes") == 0)
    assert INFO in s.families and not s.series(INFO)
    assert s.value("resmon_collector_success", collector="gpu") == 1 and s.value("resmon_gpu_up", gpu="0") == 1
    os.unlink(kubelet.socket_path)
    kubelet.pods = [pod("a", "p0", "c", "nvidia.com/gpu", G0), pod("b", "p1", "c", "nvidia.com/gpu", G1)]
    kubelet.start()  # a new socket inode at the same path
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="kubernetes") == 1)
    assert len(s.series(INFO)) == 2


def test_a_hanging_kubelet_is_waited_for_briefly_then_backed_off(run_exporter, scenario, kubelet):
    scenario.write(two_gpus())
    kubelet.pods = [pod("a", "p0", "c", "nvidia.com/gpu", G0)]
    kubelet.delay = 30.0
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}", "--collect.timeout=2s",
                            "--collect.cache-ttl=0", "--kubernetes.cache-ttl=5s")
    started = time.monotonic()
    s = exporter.scrape()
    first = time.monotonic() - started
    assert s.value("resmon_collector_success", collector="kubernetes") == 0
    assert s.value("resmon_collector_success", collector="gpu") == 1 and s.value("resmon_gpu_up", gpu="1") == 1
    assert first < 10  # bounded, not the kubelet's 30 s
    assert not s.has("resmon_last_refresh_timestamp_seconds", collector="kubernetes")  # no List has answered
    time.sleep(2.5)  # the List's own timeout (--collect.timeout) has passed
    s = exporter.scrape()
    assert s.value("resmon_collector_success", collector="kubernetes") == 0
    assert s.has("resmon_last_refresh_timestamp_seconds", collector="kubernetes")  # the failed List, finished
    for _ in range(5):
        exporter.scrape()
    assert kubelet.calls == 1  # the timed-out kubelet is asked again only after the back-off
    print(f"hanging kubelet: first scrape {first:.3f} s")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_refusing_kubelet(run_exporter, scenario, kubelet, code):
    scenario.write(two_gpus())
    kubelet.status = code
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}")
    s = exporter.scrape()
    assert s.value("resmon_collector_success", collector="kubernetes") == 0 and not s.series(INFO)
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert code.name in exporter.stderr  # the log says why, once


def test_kubernetes_collector_off(run_exporter, scenario, kubelet):
    scenario.write(two_gpus())
    kubelet.start()
    s = run_exporter("--no-collector.kubernetes", f"--kubernetes.pod-resources-socket={kubelet.socket_path}").scrape()
    assert INFO not in s.families and not s.has("resmon_collector_success", collector="kubernetes")
    assert kubelet.calls == 0


def test_a_hung_kubelet_fails_no_other_collector_for_concurrent_scrapes(run_exporter, scenario, kubelet):
    """A scrape with a short deadline arriving while another one refreshes: the kubelet is
    never waited for, so neither gets its GPU collector failed."""
    scenario.write(two_gpus(**{"gpu.0.delay_ms.nvmlDeviceGetMemoryInfo_v2": 100}))  # each refresh takes a while
    kubelet.pods = [pod("a", "p0", "c", "nvidia.com/gpu", G0)]
    kubelet.delay = 30.0  # hung from the start: no List ever answers
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}", "--collect.cache-ttl=0",
                            "--kubernetes.cache-ttl=0", "--collect.timeout=10s")
    for _ in range(3):
        concurrent_scrapes(exporter)
    assert kubelet.calls == 1  # started at start-up, still hanging: not asked again meanwhile


def concurrent_scrapes(exporter) -> None:
    results: dict[str, object] = {}

    def scrape(name: str, headers: dict[str, str]) -> None:
        status, _, body = exporter.request("/metrics", headers=headers)
        results[name] = (status, Scrape(body.decode()))

    threads = [threading.Thread(target=scrape, args=("long", {})),
               threading.Thread(target=scrape, args=("short", {"X-Prometheus-Scrape-Timeout-Seconds": "1"}))]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(30)
    for name in ("long", "short"):
        status, s = results[name]
        assert status == 200, name
        assert s.value("resmon_collector_success", collector="gpu") == 1, name
        assert s.value("resmon_gpu_up", gpu="0") == 1, name
        assert s.value("resmon_collector_success", collector="kubernetes") == 0, name


def test_the_first_list_starts_with_the_exporter(run_exporter, scenario, kubelet):
    scenario.write(two_gpus())
    kubelet.start()
    run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}")
    deadline = time.monotonic() + 10
    while kubelet.calls == 0 and time.monotonic() < deadline:  # no scrape has been made
        time.sleep(0.05)
    assert kubelet.calls == 1


def test_mig_pods_keep_their_allocation_while_their_gpu_is_down(run_exporter, scenario, kubelet):
    # a down GPU's sample carries no MIG UUIDs (nothing answers): "which pods are on the broken
    # GPU" is asked exactly then, so MIG ids resolve against the GPU's last known MIG devices
    scenario.write(two_gpus(**{"gpu.1.mig_uuids": f"{MIG_A},{MIG_B}"}))
    kubelet.pods = [pod("web", "infer", "server", "nvidia.com/mig-1g.10gb", MIG_B),
                    pod("ml", "train", "trainer", "nvidia.com/gpu", G0)]
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}", "--collect.cache-ttl=0")
    want = {("1", G1, "web", "infer", "server", "nvidia.com/mig-1g.10gb", MIG_B),
            ("0", G0, "ml", "train", "trainer", "nvidia.com/gpu", G0)}
    exporter.wait_for(lambda s: allocations(s) == want)
    scenario.update(**{"gpu.1.rc.all": 15})  # GPU_IS_LOST on every call of GPU 1
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_up", gpu="1") == 0)
    assert allocations(s) == want
    scenario.update(**{"gpu.1.rc.all": None, "gpu.1.mig_uuids": MIG_A})  # back, MIG_B destroyed meanwhile
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_up", gpu="1") == 1)
    assert allocations(s) == {("0", G0, "ml", "train", "trainer", "nvidia.com/gpu", G0)}


def test_allocation_series_are_capped_per_gpu_like_processes(run_exporter, scenario, kubelet):
    """50,000 replicas of one GPU must not become 50,000 series: at most
    --collector.processes.max-per-gpu allocation series per GPU, the first in label order."""
    scenario.write(two_gpus())
    kubelet.pods = [pod("ml", f"p{i:02d}", "c", "nvidia.com/gpu", f"{G0}::{i}") for i in range(10)]
    kubelet.pods.append(pod("ml", "other", "c", "nvidia.com/gpu", G1))
    kubelet.start()
    s = until_allocations(run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}",
                                       "--collector.processes.max-per-gpu=3"))
    got = sorted((gpu, name) for gpu, _, _, name, *_ in allocations(s))
    assert got == [("0", "p00"), ("0", "p01"), ("0", "p02"), ("1", "other")], got


# -- Dynamic Resource Allocation (issue 38) ---------------------------------------------------------

UNRESOLVED = "resmon_kubernetes_unresolved_devices"
G2 = board_uuid("hopper", 2)
MIG_C = "MIG-0a1b2c3d-0000-4000-8000-00000000000c"
SLOT_GIB = 10 * GIB


def dra_machine(**extra: object) -> dict[str, object]:
    """Three GPUs whose /dev/nvidiaN minors are not their indices (2, 0, 1); GPU 1 in MIG mode
    with a 1g.10gb (GI profile 19 at placement 6) and a 3g.40gb (profile 9 at 0)."""
    return {**two_gpus(), "count": 3, "gpu.2.uuid": G2, "gpu.2.pci_bus_id": "00000000:0B:00.0",
            "gpu.0.minor": 2, "gpu.1.minor": 0, "gpu.2.minor": 1,
            "gpu.1.mig_devices": f"1:0:1g.10gb:{MIG_A}:{SLOT_GIB}:0:19:6,2:0:3g.40gb:{MIG_B}:{4 * SLOT_GIB}:0:9:0:4",
            **extra}


def dra_pod(name: str, claim: str, *devices: DraDevice, namespace: str = "ml") -> Pod:
    return Pod(namespace, name, [Container("main", [], claims=[Claim(claim, list(devices))])])


def dra_rows(s) -> set[tuple[str, ...]]:
    return {(l["gpu"], l["uuid"], l["pod"], l["resource"], l["device_id"], l["claim"], l["share"])
            for l, _ in s.series(INFO)}


def unresolved(s) -> dict[str, float]:
    return {l["resource"]: v for l, v in s.series(UNRESOLVED)}


def test_dra_devices_of_a_1_34_kubelet_resolve_on_the_node(run_exporter, scenario, kubelet):
    """Full GPUs by minor (not index), static and dynamic MIG by GPU instance placement, a shared
    device, AMD and Intel names on an NVIDIA node, an unknown driver, a device of another node
    and a node in transition (device plugin and DRA side by side)."""
    scenario.write(dra_machine())
    nvidia = "gpu.nvidia.com"
    kubelet.pods = [
        dra_pod("full-a", "one-gpu", DraDevice(nvidia, "gpu-0")),  # minor 0: GPU 1
        dra_pod("full-b", "one-gpu", DraDevice(nvidia, "gpu-2")),  # minor 2: GPU 0
        dra_pod("mig", "small", DraDevice(nvidia, "gpu-0-mig-1g10gb-19-6")),
        dra_pod("share-a", "shared-a", DraDevice(nvidia, "gpu-1", share_id="5c1d7e0a")),
        dra_pod("share-b", "shared-b", DraDevice(nvidia, "gpu-1", share_id="9e4f2b11")),
        dra_pod("amd", "rocm", DraDevice("gpu.amd.com", "gpu-1-129")),
        dra_pod("intel", "xe", DraDevice("gpu.intel.com", "0000-0a-00-0-0x56c0")),
        dra_pod("nic", "net", DraDevice("nic.example.com", "eth-0")),
        dra_pod("elsewhere", "remote", DraDevice(nvidia, "gpu-7", pool="node-2")),  # no minor 7 here
        Pod("ml", "mixed", [Container("main", [Device("nvidia.com/gpu", [G2])],
                                      claims=[Claim("more", [DraDevice(nvidia, "gpu-0-mig-3g40gb-9-0")])])]),
        dra_pod("dynamic", "later", DraDevice(nvidia, "gpu-0-mig-1g10gb-19-5")),  # not created yet
    ]
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}", "--kubernetes.cache-ttl=0",
                            "--collect.cache-ttl=0", "--collect.slow-interval=0")
    want = {
        ("1", G1, "full-a", nvidia, "gpu-0", "one-gpu", ""),
        ("0", G0, "full-b", nvidia, "gpu-2", "one-gpu", ""),
        ("1", G1, "mig", nvidia, "gpu-0-mig-1g10gb-19-6", "small", ""),
        ("2", G2, "share-a", nvidia, "gpu-1", "shared-a", "5c1d7e0a"),
        ("2", G2, "share-b", nvidia, "gpu-1", "shared-b", "9e4f2b11"),
        ("2", G2, "mixed", "nvidia.com/gpu", G2, "", ""),
        ("1", G1, "mixed", nvidia, "gpu-0-mig-3g40gb-9-0", "more", ""),
    }
    s = exporter.wait_for(lambda s: dra_rows(s) == want, timeout=30)
    assert unresolved(s) == {nvidia: 2, "gpu.amd.com": 1, "gpu.intel.com": 1, "nic.example.com": 1}
    # the MIG device the driver creates for the pod after the exporter started: resolved at the
    # next MIG layout read, to its parent
    scenario.update(**{"gpu.1.mig_devices": dra_machine()["gpu.1.mig_devices"]
                       + f",3:0:1g.10gb:{MIG_C}:{SLOT_GIB}:0:19:5"})
    s = exporter.wait_for(lambda s: ("1", G1, "dynamic", nvidia, "gpu-0-mig-1g10gb-19-5", "later", "") in dra_rows(s),
                          timeout=30)
    assert dra_rows(s) - want == {("1", G1, "dynamic", nvidia, "gpu-0-mig-1g10gb-19-5", "later", "")}
    assert unresolved(s) == {nvidia: 1, "gpu.amd.com": 1, "gpu.intel.com": 1, "nic.example.com": 1}
    # one warning per unresolved device, however many refreshes saw it
    warned = [line for line in exporter.stderr_lines if "resolves to no GPU of this host" in line]
    for device in ("gpu-7", "gpu-1-129", "0000-0a-00-0-0x56c0", "eth-0"):
        assert sum(device in line for line in warned) == 1, (device, warned)
    assert sum("gpu-0-mig-1g10gb-19-5" in line for line in warned) == 1


def test_dra_names_of_amds_driver_resolve_by_card(tmp_path, kubelet):
    """gpu.amd.com names gpu-<card>-<renderD>: the standard tree's RX 7900 is card1, the MI300X
    card12 (its compute partition card13 is part of that PCI card, which the DRA driver
    publishes as a partition device of its own: not guessed onto the parent)."""
    from fake_sysfs import standard
    from fakenvml import sysfs_exporters

    tree = standard(tmp_path / "sys")
    kubelet.pods = [
        dra_pod("rx", "a", DraDevice("gpu.amd.com", "gpu-1-129")),
        dra_pod("mi", "b", DraDevice("gpu.amd.com", "gpu-12-140")),
        dra_pod("part", "c", DraDevice("gpu.amd.com", "gpu-13-141")),
        dra_pod("nv", "d", DraDevice("gpu.nvidia.com", "gpu-1")),  # no NVIDIA GPU on this node
    ]
    kubelet.start()
    exporters = sysfs_exporters(tmp_path)
    try:
        exporter = next(exporters)("--gpu.backend=amdgpu", f"--kubernetes.pod-resources-socket={kubelet.socket_path}",
                               root=tree.root)
        s = exporter.wait_for(lambda s: len(s.series(INFO)) == 2 and len(s.series(UNRESOLVED)) == 2, timeout=30)
        assert {(l["gpu"], l["pod"], l["device_id"]) for l, _ in s.series(INFO)} == {("0", "rx", "gpu-1-129"),
                                                                                    ("1", "mi", "gpu-12-140")}
        assert unresolved(s) == {"gpu.amd.com": 1, "gpu.nvidia.com": 1}
    finally:
        next(exporters, None)  # past its yield: stops the exporters it started


def test_dra_names_of_intels_driver_resolve_by_pci_address(tmp_path, kubelet):
    """gpu.intel.com names a GPU by its UID, the PCI address and device id (the driver's default
    "machine" naming): the Arc A770 at 0000:03:00.0, the Max 1550 at 0000:3a:00.0."""
    from fake_intel import intel_host
    from fake_sysfs import FakeSysfs
    from fakenvml import sysfs_exporters

    tree = FakeSysfs(tmp_path / "sys")
    intel_host(tree)
    kubelet.pods = [
        dra_pod("arc", "a", DraDevice("gpu.intel.com", "0000-03-00-0-0x56a0")),
        dra_pod("max", "b", DraDevice("gpu.intel.com", "0000-3a-00-0-0x0bd5"), DraDevice("gpu.intel.com", "card1")),
        dra_pod("gone", "c", DraDevice("gpu.intel.com", "0000-99-00-0-0x56a0")),  # not on this host
    ]
    kubelet.start()
    exporters = sysfs_exporters(tmp_path)
    try:
        exporter = next(exporters)("--gpu.backend=intel", f"--kubernetes.pod-resources-socket={kubelet.socket_path}",
                                   root=tree.root)
        s = exporter.wait_for(lambda s: len(s.series(INFO)) == 2 and s.has(UNRESOLVED), timeout=30)
        assert {(l["pod"], l["resource"], l["device_id"]) for l, _ in s.series(INFO)} == {
            ("arc", "gpu.intel.com", "0000-03-00-0-0x56a0"), ("max", "gpu.intel.com", "0000-3a-00-0-0x0bd5")}
        assert {l["pod"]: l["uuid"] for l, _ in s.series(INFO)} == {"arc": "0000:03:00.0", "max": "0000:3a:00.0"}
        assert unresolved(s) == {"gpu.intel.com": 2}  # another naming style (card1) is not guessed either
    finally:
        next(exporters, None)


def test_the_unresolved_count_alone_still_reads_the_mig_slots(run_exporter, scenario, kubelet):
    """--metrics.exclude of resmon_gpu_allocation_info leaves the MIG layout read for the
    unresolved gauge: a MIG device that resolves is not counted as unresolved."""
    scenario.write(dra_machine())
    kubelet.pods = [dra_pod("mig", "small", DraDevice("gpu.nvidia.com", "gpu-0-mig-1g10gb-19-6")),
                    dra_pod("gone", "x", DraDevice("gpu.nvidia.com", "gpu-9"))]
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}",
                            "--metrics.exclude=resmon_gpu_allocation_info")
    s = exporter.wait_for(lambda s: s.has(UNRESOLVED), timeout=30)
    assert INFO not in s.families
    assert unresolved(s) == {"gpu.nvidia.com": 1}  # gpu-9 only
