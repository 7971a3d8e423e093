"""The processes collector end to end: the real CLI, the fake NVML listing real child
processes, their real comm and uid from procfs, containers and pods from cgroup files."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenvml import GIB, MIB, REPO, nvml_env
from scenarios import board_uuid
from workloads import CID, CID2, HOST, UID, UID2, Workloads, crio, pod_logs, procfs_tree, systemd_containerd

MEMORY = "resmon_gpu_process_memory_used_bytes"
UTIL = "resmon_gpu_process_utilization_ratio"
JOB = "resmon_gpu_job_info"
ROOT = os.geteuid() == 0




def one_gpu(**keys: object) -> dict[str, object]:
    return {"count": 1, "gpu.0.uuid": board_uuid("hopper", 0), **{f"gpu.0.{k}": v for k, v in keys.items()}}


def promtool_clean(text: str) -> None:
    tool = shutil.which("promtool")
    assert tool, "promtool is needed (scripts/test.sh installs it)"
    result = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result.stdout + result.stderr


def test_off_by_default_only_the_count(run_exporter, scenario, workloads):
    pid = workloads.start("trainer")
    scenario.write(one_gpu(processes=f"{pid}:{GIB}"))
    s = run_exporter().scrape()
    assert s.value("resmon_gpu_processes", gpu="0") == 1
    assert MEMORY not in s.families and UTIL not in s.families
    assert not s.has("resmon_collector_success", collector="processes")


def test_real_processes_with_their_comm_user_memory_and_utilization(run_exporter, scenario, workloads):
    trainer = workloads.start("trainer")
    infer = workloads.start("infer", uid=65534 if ROOT else None)
    gone = workloads.exited_pid()
    # trainer in both lists (one process, the larger entry); infer's memory hidden by the
    # driver; two utilization samples for trainer (mean), one past 100 (clamped), none for infer
    machine = one_gpu(
        processes=f"{trainer}:{GIB},{infer}:na,{gone}:{MIB}",
        graphics_processes=f"{trainer}:{512 * MIB}",
    )
    scenario.write(machine)
    exporter = run_exporter("--collector.processes", "--collect.cache-ttl=0")
    # samples taken after the exporter's first refresh (which consumed whatever was there)
    scenario.write({**machine, "gpu.0.process_util": f"{trainer}:50:20:0:0,{trainer}:70:40:0:130"})
    s = exporter.wait_for(lambda s: s.series(UTIL, pid=str(trainer), engine="sm")[0][1] > 0)
    me = pwd.getpwuid(os.geteuid()).pw_name
    series = s.series(MEMORY, gpu="0")
    assert [(l["pid"], l["process"], l["user"], v) for l, v in series] == [(str(trainer), "trainer", me, GIB)]
    labels = series[0][0]
    assert set(labels) == {"gpu", "uuid", "pid", "process", "user", "container_id", "pod_uid", "namespace", "pod", "container",
                           "job_id"}
    assert labels["job_id"] == "" and not s.series(JOB)  # not in a Slurm job
    assert labels["uuid"] == board_uuid("hopper", 0) and labels["namespace"] == labels["pod"] == labels["container"] == ""
    assert s.value(UTIL, pid=str(trainer), engine="sm") == pytest.approx(0.60)
    assert s.value(UTIL, pid=str(trainer), engine="memory") == pytest.approx(0.30)
    assert s.value(UTIL, pid=str(trainer), engine="decoder") == pytest.approx(0.50)  # (0 + 100) / 2
    assert s.value(UTIL, pid=str(infer), engine="sm") == 0  # listed, no samples: idle
    assert s.series(UTIL, pid=str(infer))[0][0]["user"] == ("nobody" if ROOT else me)
    assert not s.has(MEMORY, pid=str(infer)) and not s.has(UTIL, pid=str(gone))  # hidden memory; exited process skipped
    assert s.value("resmon_gpu_processes", gpu="0") == 3  # the driver's count is not filtered
    assert s.value("resmon_collector_success", collector="processes") == 1
    promtool_clean(s.text)
    # the samples were counted once: the next refresh has none newer, so both processes were idle
    again = exporter.scrape()
    assert again.value(UTIL, pid=str(trainer), engine="sm") == 0
    assert again.value(MEMORY, pid=str(trainer)) == GIB


def test_unsupported_utilization_is_absent_not_zero(run_exporter, scenario, workloads):
    pid = workloads.start("trainer")
    scenario.write(one_gpu(processes=f"{pid}:{GIB}", process_util=f"{pid}:50:20:0:0", process_util_supported=0))
    s = run_exporter("--collector.processes").scrape()
    assert s.value(MEMORY, pid=str(pid)) == GIB
    assert UTIL in s.families and not s.series(UTIL)
    assert s.value("resmon_collector_success", collector="processes") == 1


def test_failing_utilization_query_fails_the_collector_not_the_gpu(run_exporter, scenario, workloads):
    pid = workloads.start("trainer")
    scenario.write(one_gpu(processes=f"{pid}:{GIB}", **{"rc.nvmlDeviceGetProcessUtilization": 999}))
    s = run_exporter("--collector.processes").scrape()
    assert s.value(MEMORY, pid=str(pid)) == GIB and not s.series(UTIL)
    assert s.value("resmon_collector_success", collector="processes") == 0
    assert s.value("resmon_collector_success", collector="gpu") == 1 and s.value("resmon_gpu_up", gpu="0") == 1


def attributed_machine(tmp_path: Path, workloads: Workloads) -> tuple[dict[str, int], Path, Path]:
    pids = {
        "trainer": workloads.start("trainer"),  # pod A, containerd, systemd driver
        "sidecar": workloads.start("sidecar"),  # pod A, the same container
        "crio": workloads.start("crioapp"),  # pod B, CRI-O
        "host": workloads.start("hostjob"),  # not in a container
    }
    proc = procfs_tree(tmp_path / "proc", {
        pids["trainer"]: systemd_containerd(UID, CID),
        pids["sidecar"]: systemd_containerd(UID, CID),
        pids["crio"]: crio(UID2, CID2),
        pids["host"]: HOST,
    })
    logs = pod_logs(tmp_path / "pods", [("ml", "train-0", UID, ["trainer"]), ("web", "infer-7", UID2, ["server", "warmup"])])
    return pids, proc, logs


def test_container_and_pod_labels_from_cgroups_and_pod_logs(run_exporter, scenario, workloads, tmp_path):
    pids, proc, logs = attributed_machine(tmp_path, workloads)
    scenario.write(one_gpu(processes=",".join(f"{p}:{(i + 1) * GIB}" for i, p in enumerate(pids.values()))))
    s = run_exporter("--collector.processes", f"--path.procfs={proc}", f"--kubernetes.pod-logs-dir={logs}").scrape()
    by_pid = {l["pid"]: l for l, _ in s.series(MEMORY)}
    trainer = by_pid[str(pids["trainer"])]
    assert (trainer["container_id"], trainer["pod_uid"], trainer["namespace"], trainer["pod"], trainer["container"]) == (
        CID, UID, "ml", "train-0", "trainer")  # the pod's only container
    crio_labels = by_pid[str(pids["crio"])]
    assert (crio_labels["container_id"], crio_labels["pod_uid"], crio_labels["namespace"], crio_labels["pod"]) == (CID2, UID2, "web", "infer-7")
    assert crio_labels["container"] == ""  # two containers, no allocation to tell which
    host = by_pid[str(pids["host"])]
    assert host["container_id"] == host["pod_uid"] == host["pod"] == "" and host["process"] == "hostjob"


def test_group_by_container_sums_a_containers_processes(run_exporter, scenario, workloads, tmp_path):
    pids, proc, logs = attributed_machine(tmp_path, workloads)
    machine = one_gpu(processes=",".join(f"{p}:{(i + 1) * GIB}" for i, p in enumerate(pids.values())))
    scenario.write(machine)
    exporter = run_exporter("--collector.processes", "--collector.processes.group-by=container", "--collect.cache-ttl=0",
                            f"--path.procfs={proc}", f"--kubernetes.pod-logs-dir={logs}")
    scenario.write({**machine, "gpu.0.process_util": f"{pids['trainer']}:60:0:0:0,{pids['sidecar']}:70:0:0:0"})
    s = exporter.wait_for(lambda s: s.series(UTIL, container_id=CID, engine="sm")[0][1] > 0)
    rows = {(l["container_id"], l["pod"]): v for l, v in s.series(MEMORY)}
    assert rows == {(CID, "train-0"): 3 * GIB, (CID2, "infer-7"): 3 * GIB, ("", ""): 4 * GIB}
    assert all("pid" not in l and "process" not in l and "user" not in l for l, _ in s.series(MEMORY))
    assert s.value(UTIL, container_id=CID, engine="sm") == 1.0  # 0.6 + 0.7, one engine: at most 1
    promtool_clean(s.text)


def slurm_v2(job: str, step: str) -> str:
    """What slurmstepd's cgroup/v2 plugin makes for a task of a job step."""
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_{step}/user/task_0\n"


def slurm_v1(uid: int, job: str, step: str) -> str:
    """cgroup/v1: the job in the controllers slurmd constrains, the rest in slurmd's service."""
    path = f"/slurm/uid_{uid}/job_{job}/step_{step}"
    return f"12:pids:/system.slice/slurmd.service\n9:memory:{path}\n6:devices:{path}\n4:freezer:{path}\n"


def two_gpus(**per_gpu: str) -> dict[str, object]:
    return {"count": 2, **{f"gpu.{i}.uuid": board_uuid("hopper", i) for i in range(2)},
            **{f"gpu.{k.removeprefix('gpu')}.processes": v for k, v in per_gpu.items()}}


def slurm_machine(tmp_path: Path, workloads: Workloads) -> tuple[dict[str, int], Path, str]:
    """Two jobs' steps on cgroup v2, a v1 job run by another user (nobody, as root), a job
    array's task and a host process; the owner of the v1 job."""
    other = 65534 if ROOT else None
    pids = {
        "batch": workloads.start("batchscript"),  # job 42's batch step, on GPU 0
        "step": workloads.start("srunstep"),  # job 42's step 0, on GPU 1
        "extern": workloads.start("sshsession", uid=other),  # job 43's extern step (pam_slurm_adopt), cgroup v1
        "array": workloads.start("arraytask"),  # array job 1234's task 7: its own job id, 1235
        "host": workloads.start("hostdaemon"),  # outside any job
    }
    proc = procfs_tree(tmp_path / "proc", {
        pids["batch"]: slurm_v2("42", "batch"),
        pids["step"]: slurm_v2("42", "0"),
        pids["extern"]: slurm_v1(other or os.geteuid(), "43", "extern"),
        pids["array"]: slurm_v2("1235", "batch"),
        pids["host"]: HOST,
    })
    return pids, proc, "nobody" if ROOT else pwd.getpwuid(os.geteuid()).pw_name


def test_slurm_jobs_from_cgroup_v1_and_v2(run_exporter, scenario, workloads, tmp_path):
    pids, proc, other = slurm_machine(tmp_path, workloads)
    scenario.write(two_gpus(
        gpu0=f"{pids['batch']}:{GIB},{pids['extern']}:{2 * GIB},{pids['array']}:{3 * GIB},{pids['host']}:{4 * GIB}",
        gpu1=f"{pids['step']}:{5 * GIB}",
    ))
    s = run_exporter("--collector.processes", f"--path.procfs={proc}").scrape()
    me = pwd.getpwuid(os.geteuid()).pw_name
    jobs = {(l["pid"], l["gpu"]): l["job_id"] for l, _ in s.series(MEMORY)}
    assert jobs == {(str(pids["batch"]), "0"): "42", (str(pids["extern"]), "0"): "43", (str(pids["array"]), "0"): "1235",
                    (str(pids["host"]), "0"): "", (str(pids["step"]), "1"): "42"}
    # one series per GPU and job: job 42 on both GPUs, none for the host process
    info = sorted((l["gpu"], l["job_id"], l["user"], l["scheduler"], v) for l, v in s.series(JOB))
    assert info == [("0", "1235", me, "slurm", 1), ("0", "42", me, "slurm", 1), ("0", "43", other, "slurm", 1),
                    ("1", "42", me, "slurm", 1)]
    assert all(set(l) == {"gpu", "uuid", "scheduler", "job_id", "user"} for l, _ in s.series(JOB))
    assert s.series(JOB, gpu="1")[0][0]["uuid"] == board_uuid("hopper", 1)
    assert all(l["job_id"] for l, _ in s.series(UTIL, engine="sm") if l["pid"] != str(pids["host"]))
    promtool_clean(s.text)


def test_group_by_container_sums_per_job_and_job_info_is_not_cut(run_exporter, scenario, workloads, tmp_path):
    pids, proc, _ = slurm_machine(tmp_path, workloads)
    second = workloads.start("batchworker")  # job 42's batch step too: summed with "batch"
    procfs_tree(proc, {second: slurm_v2("42", "batch")})
    scenario.write(two_gpus(gpu0=f"{pids['batch']}:{GIB},{second}:{GIB},{pids['array']}:{3 * GIB},{pids['host']}:{4 * GIB}",
                            gpu1=f"{pids['step']}:{5 * GIB}"))
    s = run_exporter("--collector.processes", "--collector.processes.group-by=container",
                     "--collector.processes.max-per-gpu=1", f"--path.procfs={proc}").scrape()
    assert {(l["gpu"], l["job_id"]): v for l, v in s.series(MEMORY)} == {("0", ""): 4 * GIB, ("1", "42"): 5 * GIB}
    # the largest row alone is served per GPU, but every job on the GPU keeps its info series
    assert sorted((l["gpu"], l["job_id"]) for l, _ in s.series(JOB)) == [("0", "1235"), ("0", "42"), ("1", "42")]
    wide = run_exporter("--collector.processes", "--collector.processes.group-by=container",
                        f"--path.procfs={proc}").scrape()
    assert {(l["gpu"], l["job_id"]): v for l, v in wide.series(MEMORY)} == {
        ("0", ""): 4 * GIB, ("0", "42"): 2 * GIB, ("0", "1235"): 3 * GIB, ("1", "42"): 5 * GIB}


def test_a_job_id_reused_after_its_job_ended_names_the_new_job(run_exporter, scenario, workloads, tmp_path):
    first = workloads.start("firstjob")
    proc = procfs_tree(tmp_path / "proc", {first: slurm_v2("42", "batch")})
    scenario.write(one_gpu(processes=f"{first}:{GIB}"))
    exporter = run_exporter("--collector.processes", "--collect.cache-ttl=0", f"--path.procfs={proc}")
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert [(l["job_id"], l["user"]) for l, _ in exporter.scrape().series(JOB)] == [("42", me)]
    # the job ends; Slurm wraps around MaxJobId and gives 42 to another user's job
    os.kill(first, signal.SIGKILL)
    other = 65534 if ROOT else None
    second = workloads.start("secondjob", uid=other)
    procfs_tree(proc, {second: slurm_v2("42", "0")})
    scenario.write(one_gpu(processes=f"{second}:{2 * GIB}"))
    s = exporter.wait_for(lambda s: s.has(MEMORY, pid=str(second)))
    assert [(l["job_id"], l["user"]) for l, _ in s.series(JOB)] == [("42", "nobody" if ROOT else me)]
    assert [(l["pid"], l["job_id"]) for l, _ in s.series(MEMORY)] == [(str(second), "42")]


def test_max_per_gpu_keeps_the_largest_of_200_processes(run_exporter, scenario, workloads):
    pids = [workloads.start("worker") for _ in range(200)]
    scenario.write(one_gpu(processes=",".join(f"{p}:{(i + 1) * MIB}" for i, p in enumerate(pids))))
    exporter = run_exporter("--collector.processes", "--collector.processes.max-per-gpu=10")
    started = time.perf_counter()
    s = exporter.scrape()
    elapsed = time.perf_counter() - started
    shown = sorted(int(v) for _, v in s.series(MEMORY))
    assert shown == [(i + 1) * MIB for i in range(190, 200)]
    assert len(s.series(UTIL)) == 10 * 4  # one per engine for each of the 10
    assert s.value("resmon_gpu_processes", gpu="0") == 200
    print(f"scrape with 200 processes on one GPU, 10 shown: {elapsed * 1000:.1f} ms")  # figure, not a limit


def test_bad_procfs_is_a_usage_error(fake_libs, scenario):
    env = nvml_env(fake_libs["current"], scenario)
    result = subprocess.run([sys.executable, "-m", "resmon_exporter", "--collector.processes", "--path.procfs=/nonexistent"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--path.procfs=/nonexistent" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


API_SCRIPT = """
import json, sys
from resmon_exporter import ResourceMonitor
with ResourceMonitor(collect_processes=True, procfs=sys.argv[1], pod_logs_dir=sys.argv[2]) as m:
    print(json.dumps({"on": m.get_gpu_processes()}))
with ResourceMonitor() as m:
    print(json.dumps({"off": m.get_gpu_processes()}))
"""


def test_python_api_lists_processes_largest_first(fake_libs, scenario, workloads, tmp_path):
    pids, proc, logs = attributed_machine(tmp_path, workloads)
    scenario.write(one_gpu(processes=f"{pids['trainer']}:{GIB},{pids['host']}:{4 * GIB}"))
    env = nvml_env(fake_libs["current"], scenario)
    result = subprocess.run([sys.executable, "-c", API_SCRIPT, str(proc), str(logs)], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    on, off = (next(iter(__import__("json").loads(line).values())) for line in result.stdout.splitlines())
    assert [(p["pid"], p["process"], p["memory_bytes"]) for p in on] == [(pids["host"], "hostjob", 4 * GIB), (pids["trainer"], "trainer", GIB)]
    assert on[1]["pod"] == "train-0" and on[1]["namespace"] == "ml" and on[1]["container_id"] == CID and on[1]["gpu"] == 0
    assert off == []

