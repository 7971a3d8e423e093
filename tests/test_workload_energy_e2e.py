"""Busy time and energy per workload end to end (issue 37): the real CLI on the fake NVML,
real child processes, per-process samples with known timestamps and values and a known energy
counter, so the busy seconds and joules served are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios import board_uuid
from test_processes_e2e import attributed_machine, one_gpu, promtool_clean
from workloads import CID

BUSY = "resmon_gpu_process_busy_seconds_total"
ENERGY = "resmon_gpu_process_energy_joules_total"
REST = "resmon_gpu_unattributed_energy_joules_total"
GPU = "resmon_gpu_energy_joules_total"
PERIOD_US = 10_000_000  # 10 s between samples: the samples cover far more than a refresh interval


def samples(pid: int, sm: int, mem: int, count: int = 10, start_us: int = 5_000_000_000) -> list[str]:
    return [f"{pid}:{sm}:{mem}:0:0@{start_us + i * PERIOD_US}" for i in range(count)]


def test_busy_seconds_and_energy_of_known_samples(run_exporter, scenario, workloads):
    trainer, infer = workloads.start("trainer"), workloads.start("infer")
    machine = one_gpu(processes=f"{trainer}:{2 << 30},{infer}:{1 << 30}", energy_mj=1_000_000)
    scenario.write(machine)
    exporter = run_exporter("--collector.processes", "--collect.cache-ttl=0")
    first = exporter.wait_for(lambda s: s.has(REST, gpu="0"))
    assert first.value(REST, gpu="0") == 0.0 and first.value(ENERGY, pid=str(trainer)) == 0.0
    assert first.value(BUSY, pid=str(trainer), engine="sm") == 0.0  # listed, no samples yet
    # 100 s of samples: trainer 50 % SM (50 s busy), infer 25 % (25 s): together 75 s, longer
    # than the refresh interval, so they share all of the 900 J the device used meanwhile, 2:1
    util = ",".join(samples(trainer, 50, 20) + samples(infer, 25, 0))
    scenario.write({**machine, "gpu.0.energy_mj": 1_900_000, "gpu.0.process_util": util})
    s = exporter.wait_for(lambda s: s.value(GPU, gpu="0") == 1900.0)
    assert s.value(BUSY, pid=str(trainer), engine="sm") == pytest.approx(50.0)
    assert s.value(BUSY, pid=str(trainer), engine="memory") == pytest.approx(20.0)
    assert s.value(BUSY, pid=str(infer), engine="sm") == pytest.approx(25.0)
    assert s.value(ENERGY, pid=str(trainer)) == pytest.approx(600.0)
    assert s.value(ENERGY, pid=str(infer)) == pytest.approx(300.0)
    assert s.value(REST, gpu="0", uuid=board_uuid("hopper", 0)) == pytest.approx(0.0, abs=1e-9)
    promtool_clean(s.text)
    # no new samples: an idle interval; its 500 J are unattributed, the processes keep theirs
    scenario.write({**machine, "gpu.0.energy_mj": 2_400_000, "gpu.0.process_util": util})
    s = exporter.wait_for(lambda s: s.value(GPU, gpu="0") == 2400.0)
    assert s.value(REST, gpu="0") == pytest.approx(500.0)
    assert s.value(ENERGY, pid=str(trainer)) == pytest.approx(600.0)
    assert s.value(BUSY, pid=str(trainer), engine="sm") == pytest.approx(50.0)


def test_a_containers_counters_keep_an_exited_process_share(run_exporter, scenario, workloads, tmp_path: Path):
    pids, proc, logs = attributed_machine(tmp_path, workloads)
    trainer, sidecar = pids["trainer"], pids["sidecar"]  # one container (CID)
    machine = one_gpu(processes=f"{trainer}:{1 << 30},{sidecar}:{1 << 30}", energy_mj=0)
    scenario.write(machine)
    exporter = run_exporter("--collector.processes", "--collector.processes.group-by=container", "--collect.cache-ttl=0",
                            f"--path.procfs={proc}", f"--kubernetes.pod-logs-dir={logs}")
    exporter.wait_for(lambda s: s.has(ENERGY, container_id=CID))
    util = ",".join(samples(trainer, 60, 0) + samples(sidecar, 30, 0))
    scenario.write({**machine, "gpu.0.energy_mj": 1_000_000, "gpu.0.process_util": util})
    s = exporter.wait_for(lambda s: s.value(GPU, gpu="0") == 1000.0)
    assert s.value(BUSY, container_id=CID, engine="sm") == pytest.approx(90.0)
    assert s.value(ENERGY, container_id=CID) == pytest.approx(1000.0)
    assert all("pid" not in labels for labels, _ in s.series(BUSY))
    # the sidecar exits: the container's counters keep what it added
    scenario.write({**machine, "gpu.0.processes": f"{trainer}:{1 << 30}", "gpu.0.energy_mj": 1_200_000,
                    "gpu.0.process_util": util})
    s = exporter.wait_for(lambda s: s.value(GPU, gpu="0") == 1200.0)
    assert s.value(BUSY, container_id=CID, engine="sm") == pytest.approx(90.0)
    assert s.value(ENERGY, container_id=CID) == pytest.approx(1000.0)
    assert s.value(REST, gpu="0") == pytest.approx(200.0)


def test_mig_has_no_process_energy_and_all_of_it_is_unattributed(run_exporter, scenario, workloads):
    pid = workloads.start("trainer")
    machine = one_gpu(processes=f"{pid}:{1 << 30}", energy_mj=0, process_util_supported=0)
    scenario.write(machine)
    exporter = run_exporter("--collector.processes", "--collect.cache-ttl=0")
    exporter.wait_for(lambda s: s.has(REST, gpu="0"))
    scenario.write({**machine, "gpu.0.energy_mj": 300_000})
    s = exporter.wait_for(lambda s: s.value(GPU, gpu="0") == 300.0)
    assert s.value(REST, gpu="0") == pytest.approx(300.0)
    assert ENERGY.removesuffix("_total") in s.families and not s.series(ENERGY) and not s.series(BUSY)  # declared, empty


API_SCRIPT = """
import json, os, sys, time
from pathlib import Path
from resmon_exporter import ResourceMonitor

path = Path(os.environ["FAKE_NVML_SCENARIO"])
with ResourceMonitor(collect_processes=True, cache_ttl=0) as monitor:
    before = monitor.get_gpu_processes()
    tmp = path.with_name(path.name + ".api")
    tmp.write_text(sys.argv[1])
    os.replace(tmp, path)  # the next machine: samples and 900 J more
    deadline = time.monotonic() + 20
    while monitor.snapshot().gpu.devices[0].energy_joules != 1900.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"before": before, "after": monitor.get_gpu_processes()}))
"""


def test_python_api_busy_seconds_and_energy(fake_libs, scenario, workloads):
    import json
    import subprocess
    import sys

    from fakenvml import REPO, nvml_env

    trainer, infer = workloads.start("trainer"), workloads.start("infer")
    machine = one_gpu(processes=f"{trainer}:{2 << 30},{infer}:{1 << 30}", energy_mj=1_000_000)
    scenario.write(machine)
    after = {**machine, "gpu.0.energy_mj": 1_900_000,
             "gpu.0.process_util": ",".join(samples(trainer, 50, 20) + samples(infer, 25, 0))}
    text = "".join(f"{key}={value}\n" for key, value in after.items())
    result = subprocess.run([sys.executable, "-c", API_SCRIPT, text], env=nvml_env(fake_libs["current"], scenario),
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    first = {p["pid"]: p for p in got["before"]}
    assert first[trainer]["energy_joules"] == 0.0 and first[trainer]["busy_seconds"]["sm"] == 0.0
    now = {p["pid"]: p for p in got["after"]}
    assert now[trainer]["busy_seconds"]["sm"] == pytest.approx(50.0)
    assert now[trainer]["busy_seconds"]["memory"] == pytest.approx(20.0)
    assert now[infer]["busy_seconds"]["sm"] == pytest.approx(25.0)
    assert now[trainer]["energy_joules"] == pytest.approx(600.0) and now[infer]["energy_joules"] == pytest.approx(300.0)


def test_intel_process_busy_seconds_from_fdinfo_and_the_energy_split_adds_up(tmp_path: Path):
    from fake_fdinfo import FakeProc, i915_client
    from fake_intel import intel_host
    from fake_sysfs import FakeSysfs
    from fakenvml import sysfs_exporters

    tree = FakeSysfs(tmp_path / "sys")
    _, arc, _ = intel_host(tree)  # Meteor Lake, A770 (card energy 123456789000 µJ), Max 1550
    proc = FakeProc(tmp_path / "proc")
    pid, labels = 4242, {"gpu": "1", "uuid": arc.pci}
    proc.add_process(pid, "trainer")
    proc.add_drm_fd(pid, 5, i915_client(arc.pci, 11, render_ns=7_000_000_000, local0_bytes=1 << 30), node="renderD129")
    starts = sysfs_exporters(tmp_path)
    start = next(starts)
    try:
        exporter = start("--gpu.backend=intel", f"--path.procfs={proc.root}", "--collector.processes",
                         "--collect.cache-ttl=0", root=tree.root)
        # first scan: the client's 7 s before the exporter are not the process's; then from 0
        s = exporter.wait_for(lambda s: s.has(BUSY, pid=str(pid), engine="render"))
        assert s.value(BUSY, pid=str(pid), engine="render") == 0.0
        before_rest, before_mine = s.value(REST, **labels), s.value(ENERGY, pid=str(pid))
        # 1 ms of render (less than any time between two scans: never held back) and 50 J
        proc.set_fdinfo(pid, 5, i915_client(arc.pci, 11, render_ns=7_001_000_000, local0_bytes=1 << 30))
        tree.set(arc.pci, "hwmon:energy1_input", str(123456789000 + 50_000_000))
        s = exporter.wait_for(lambda s: s.value(GPU, **labels) == pytest.approx(123506.789))
        assert s.value(BUSY, pid=str(pid), engine="render") == pytest.approx(0.001)
        mine = s.value(ENERGY, pid=str(pid)) - before_mine
        rest = s.value(REST, **labels) - before_rest
        assert 0 < mine <= 50.0 and mine + rest == pytest.approx(50.0)
    finally:
        next(starts, None)  # stops the exporters
