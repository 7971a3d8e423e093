"""The amdgpu backend end to end: the real CLI with --path.sysfs=<fake tree>, scraped over HTTP;
with the processes collector, a real gRPC kubelet listing amd.com/gpu ids, promtool, and auto."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from fake_kubelet import Container, Device, Pod
from fake_sysfs import GIB, FakeSysfs, rx7900, standard
from fakenvml import REPO, Exporter, Scrape, nvml_env, sysfs_exporters
from fuse_tree import FuseTree, mounted
from scenarios import three_gpus
from workloads import CID, CID2, UID, UID2, container_logs, pod_logs, procfs_tree, systemd_containerd

RX, MI = "0000:03:00.0", "0000:c3:00.0"
RX_UUID, MI_UUID = "GPU-a4e8c1b26c2f0001", "GPU-3e52f2a4b7c10d12"
RX_GPU_ID, MI_GPU_ID, MI_PART1_GPU_ID = 47823, 2189, 2190  # 2190: the MI300X's compute partition 1
FAKE_SMI = Path(__file__).parent / "fake_smi" / "fake_smi.py"


@pytest.fixture
def amd(tmp_path: Path):
    """amd(*flags, root=...) -> a ready exporter on the fake sysfs, NVML absent."""
    yield from sysfs_exporters(tmp_path)


def test_scrape_maps_the_cards_and_follows_changes(amd, tmp_path):
    tree = standard(tmp_path / "sys")
    exporter = amd("--gpu.backend=amdgpu", "--collect.cache-ttl=0", root=tree.root)
    s = exporter.scrape()
    rx, mi = {"gpu": "0", "uuid": RX_UUID}, {"gpu": "1", "uuid": MI_UUID}
    assert s.value("resmon_gpu_backend_info", backend="amdgpu") == 1 and s.value("resmon_gpu_devices") == 2
    (labels, _), = s.series("resmon_gpu_info", **mi)
    assert (labels["name"], labels["pci_bus_id"], labels["backend"]) == ("AMD Instinct MI300X", MI, "amdgpu")
    assert labels["driver_version"]  # the kernel release (no DKMS module version in this tree)
    assert s.value("resmon_gpu_memory_total_bytes", **rx) == 24 * GIB
    assert s.value("resmon_gpu_memory_free_bytes", **rx) == 21 * GIB
    assert s.value("resmon_gpu_utilization_ratio", **rx) == 0.87
    assert s.value("resmon_gpu_temperature_celsius", **mi) == 58.0  # MI300X: junction, no edge sensor
    assert s.value("resmon_gpu_junction_temperature_celsius", **rx) == 75.0
    assert s.value("resmon_gpu_memory_temperature_celsius", **mi) == 49.0
    assert s.value("resmon_gpu_power_watts", **mi) == 612.0 and s.value("resmon_gpu_power_limit_watts", **rx) == 355.0
    assert s.value("resmon_gpu_fan_speed_ratio", **rx) == pytest.approx(102 / 255)
    assert not s.has("resmon_gpu_fan_speed_ratio", **mi)  # no fan: absent, not 0
    assert s.value("resmon_gpu_clock_max_hertz", clock="graphics", **mi) == 2100e6
    assert s.value("resmon_gpu_gtt_total_bytes", **mi) == 1024 * GIB
    assert not s.series("resmon_gpu_energy_joules_total") and not s.series("resmon_gpu_memory_reserved_bytes")
    assert s.value("resmon_gpu_processes", **rx) == 0
    assert s.value("resmon_collector_success", collector="gpu") == 1
    tree.set(RX, "gpu_busy_percent", "5")
    tree.process(os.getpid(), {RX_GPU_ID: GIB})
    s = exporter.scrape()
    assert s.value("resmon_gpu_utilization_ratio", **rx) == 0.05 and s.value("resmon_gpu_processes", **rx) == 1
    tree.remove(MI)
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", **mi) == 0 and s.value("resmon_gpu_up", **rx) == 1
    assert s.value("resmon_gpu_devices") == 1 and not s.has("resmon_gpu_memory_total_bytes", **mi)


@pytest.fixture
def fuse_tree(tmp_path: Path) -> Iterator[FuseTree]:
    yield from mounted(standard(tmp_path / "sys"), tmp_path)


def test_a_blocked_sensor_file_downs_only_its_card_and_the_scrape_keeps_its_deadline(amd, fuse_tree):
    ft = fuse_tree
    exporter = amd("--gpu.backend=amdgpu", "--collect.cache-ttl=0", "--collect.timeout=2s", root=ft.mount)
    rx, mi = {"gpu": "0", "uuid": RX_UUID}, {"gpu": "1", "uuid": MI_UUID}
    assert exporter.scrape().value("resmon_gpu_up", **rx) == 1
    ft.rules({(RX, "hwmon:temp1_input"): {"hang": True}})  # a hung SMU: one sensor file never answers
    deadline = time.monotonic() + 30
    while True:  # the refresh that meets the hang waits for it up to --collect.timeout less 0.1 s
        started = time.monotonic()
        status, _, body = exporter.request("/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "3"})
        elapsed = time.monotonic() - started
        assert status == 200 and elapsed < 3.0, (status, elapsed)
        s = Scrape(body.decode())
        if s.value("resmon_gpu_up", **rx) == 0 or time.monotonic() > deadline:
            break
    assert s.value("resmon_gpu_up", **rx) == 0 and s.value("resmon_gpu_up", **mi) == 1  # down alone
    assert s.value("resmon_gpu_power_watts", **mi) == 612.0 and s.value("resmon_gpu_temperature_celsius", **mi) == 58.0
    assert not s.has("resmon_gpu_memory_total_bytes", **rx) and s.value("resmon_collector_success", collector="gpu") == 0
    ft.rules({})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1)
    assert s.value("resmon_gpu_up", **rx) == 1 and s.value("resmon_gpu_temperature_celsius", **rx) == 61.0


def test_promtool_check_metrics_is_clean(amd, tmp_path):
    tree = standard(tmp_path / "sys")
    tree.process(os.getpid(), {RX_GPU_ID: GIB})
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: scripts/test.sh installs Debian's prometheus package")
    exporter = amd("--gpu.backend=amdgpu", "--collector.processes", root=tree.root)
    status, _, body = exporter.request("/metrics")
    assert status == 200 and b"resmon_gpu_junction_temperature_celsius" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""


def test_processes_and_kubelet_amd_ids_resolve_to_these_gpus(amd, tmp_path, kubelet, workloads):
    tree = standard(tmp_path / "sys")
    a, b = workloads.start("trainer"), workloads.start("infer")
    tree.process(a, {RX_GPU_ID: 3 * GIB, MI_GPU_ID: 0})
    tree.process(b, {MI_GPU_ID: GIB, MI_PART1_GPU_ID: 4 * GIB, RX_GPU_ID: 0})  # on two partitions: summed
    proc = procfs_tree(tmp_path / "proc", {a: systemd_containerd(UID, CID), b: systemd_containerd(UID2, CID2, "besteffort")})
    logs = pod_logs(tmp_path / "pods", [("ml", "train-0", UID, ["trainer"]), ("ml", "serve-0", UID2, ["server"])])
    links = container_logs(tmp_path / "containers", logs, [("ml", "train-0", UID, "trainer", CID)])
    kubelet.pods = [
        Pod("ml", "train-0", [Container("trainer", [Device("amd.com/gpu", [RX])])]),  # the ROCm plugin: PCI address
        Pod("ml", "serve-0", [Container("server", [Device("amd.com/gpu", [MI + "-slice-1"])])]),  # time-sliced
        Pod("ml", "other", [Container("c", [Device("amd.com/gpu", ["0000:99:00.0"])])]),  # not on this host: left out
    ]
    kubelet.start()
    exporter = amd("--gpu.backend=amdgpu", "--collector.processes", f"--path.procfs={proc}",
                   f"--kubernetes.pod-logs-dir={logs}", f"--kubernetes.container-logs-dir={links}",
                   f"--kubernetes.pod-resources-socket={kubelet.socket_path}", root=tree.root)
    # the kubelet List runs on a background thread: wait for it, and for what it feeds
    s = exporter.wait_for(lambda s: [v for _, v in s.series("resmon_collector_success", collector="kubernetes")] == [1]
                          and len(s.series("resmon_gpu_allocation_info")) == 2
                          and len(s.series("resmon_gpu_process_memory_used_bytes")) == 2
                          and all(l.get("pod") for l, _ in s.series("resmon_gpu_process_memory_used_bytes")))
    alloc = {(l["gpu"], l["uuid"], l["pod"], l["device_id"]) for l, _ in s.series("resmon_gpu_allocation_info")}
    assert alloc == {("0", RX_UUID, "train-0", RX), ("1", MI_UUID, "serve-0", MI + "-slice-1")}
    mem = {(l["gpu"], l["pid"], l["process"], l["pod"], l["container"]): v
           for l, v in s.series("resmon_gpu_process_memory_used_bytes")}
    assert mem == {("0", str(a), "trainer", "train-0", "trainer"): 3 * GIB, ("1", str(b), "infer", "serve-0", "server"): 5 * GIB}
    assert not s.series("resmon_gpu_process_utilization_ratio")  # KFD has no per-process utilization: absent
    assert s.value("resmon_collector_success", collector="kubernetes") == 1


def test_auto_chooses_amdgpu_after_nvml(amd, tmp_path):
    tree = FakeSysfs(tmp_path / "sys")
    tree.add(rx7900())
    exporter = amd(root=tree.root)  # --gpu.backend=auto
    s = exporter.scrape()
    assert s.value("resmon_gpu_backend_info", backend="amdgpu") == 1 and s.value("resmon_gpu_up", gpu="0") == 1
    line = next(l for l in exporter.stderr_lines if "GPU backend selected" in l)
    assert "backend=amdgpu" in line and "nvml:" in line  # why NVML was skipped


def test_auto_prefers_nvml_over_amdgpu(run_exporter, scenario, tmp_path):
    tree = standard(tmp_path / "sys")  # AMD cards in sysfs, and NVML (the fake) sees GPUs too
    scenario.write(three_gpus())
    exporter = run_exporter("--gpu.backend=auto", f"--path.sysfs={tree.root}", "--no-collector.kubernetes")
    s = exporter.scrape()
    assert s.value("resmon_gpu_backend_info", backend="nvml") == 1 and not s.has("resmon_gpu_backend_info", backend="amdgpu")
    assert s.value("resmon_gpu_devices") == 3 and not s.series("resmon_gpu_gtt_total_bytes")


def test_auto_prefers_amdgpu_over_gpu_tracker(tmp_path):
    tree = standard(tmp_path / "sys")
    bin_dir, no_nvml = tmp_path / "bin", tmp_path / "no-nvml"
    bin_dir.mkdir()
    no_nvml.mkdir()
    (bin_dir / "amd-smi").symlink_to(FAKE_SMI)  # an amd-smi that answers, the gpu-tracker extra installed
    smi = tmp_path / "smi.json"
    smi.write_text(json.dumps({"amd": {"gpus": [{"uuid": "b2ff7400-0000-1000-80f6-6b71f7d7d1e2", "total_mib": 196592,
                                                 "used_mib": 1600, "util": 75}]}}))
    env = nvml_env(no_nvml, None)
    env.update(PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", FAKE_SMI_SCENARIO=str(smi),
               FAKE_SMI_TRACE=str(tmp_path / "smi-trace.txt"))
    exporter = Exporter(["--gpu.backend=auto", f"--path.sysfs={tree.root}", "--no-collector.kubernetes"], env)
    try:
        exporter.wait_listening()
        exporter.wait_ready()
        s = exporter.scrape()
        assert s.value("resmon_gpu_backend_info", backend="amdgpu") == 1 and s.value("resmon_gpu_devices") == 2
        assert not (tmp_path / "smi-trace.txt").exists()  # amd-smi never run
    finally:
        exporter.stop()


def test_an_oversized_number_is_absent_and_the_scrape_works(amd, tmp_path):
    tree = standard(tmp_path / "sys")
    huge = "9" * 400
    tree.set(RX, "mem_info_vram_total", huge)  # a bytes file
    tree.set(MI, "hwmon:power1_input", huge)  # a hwmon file
    tree.set(RX, "pp_dpm_sclk", f"0: 500Mhz\n1: {huge}Mhz *\n")  # a dpm table
    exporter = amd("--gpu.backend=amdgpu", root=tree.root)
    status, _, _ = exporter.request("/metrics")
    assert status == 200
    s = exporter.scrape()
    rx, mi = {"gpu": "0", "uuid": RX_UUID}, {"gpu": "1", "uuid": MI_UUID}
    assert s.value("resmon_gpu_up", **rx) == 1 and s.value("resmon_gpu_up", **mi) == 1
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert not s.has("resmon_gpu_memory_total_bytes", **rx) and not s.has("resmon_gpu_power_watts", **mi)
    assert not s.has("resmon_gpu_clock_max_hertz", clock="graphics", **rx)
    assert s.value("resmon_gpu_clock_max_hertz", clock="memory", **rx) == 1249e6
    assert s.value("resmon_gpu_utilization_ratio", **rx) == 0.87 and s.value("resmon_gpu_memory_total_bytes", **mi) == 192 * GIB


def test_auto_without_amdgpu_cards_is_not_amdgpu(amd, tmp_path):
    tree = FakeSysfs(tmp_path / "sys")
    tree.other_card()  # an Intel card only
    s = amd(root=tree.root).scrape()
    assert not s.has("resmon_gpu_backend_info", backend="amdgpu")


@pytest.mark.e2e
def test_explicit_amdgpu_without_cards_exits_2_with_one_line(tmp_path):
    FakeSysfs(tmp_path / "sys").other_card()
    result = subprocess.run([sys.executable, "-m", "resmon_exporter", "--gpu.backend=amdgpu", f"--path.sysfs={tmp_path / 'sys'}",
                             "--web.listen-address=127.0.0.1:0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("resmon-exporter: error: --gpu.backend=amdgpu: no card")


@pytest.mark.e2e
def test_benchmark_prints_both_backends_side_by_side():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "amdgpu.py"), "--quick", "--gpus", "2"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("refresh cost, 2 MI300X-like GPUs")
    assert [l.split()[0] for l in lines[2:]] == ["amdgpu", "gpu-tracker"] and lines[2].endswith("1x")
