"""A fleet on one machine (issue 12): 24 real exporters on their own fake GPUs (1, 2, 4 or 8
per node), found by a real Prometheus through file-based service discovery, scraped every
second for minutes; every Fleet-dashboard query and every recording rule is checked against
values computed from the nodes' scenarios, and one lost GPU pages exactly once through a real
Alertmanager. Also: the remote_write example passes promtool, and the fleet benchmark's quick
mode runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Union

import pytest
import yaml

import gpu_users
from fakenvml import REPO
from fleet import JOB, PODS_NODE, Fleet, Member, fleet_nodes, wait_fleet_up
from gpu_users import POD_SM, POD_VRAM, GpuUsers
from promstack import need, panel_targets, recording_rules, wait_until, write_test_rules
from scenarios import GPU_IS_LOST

# every test here starts exporters, Prometheus or promtool (the conftest cannot see it through Fleet)
pytestmark = pytest.mark.e2e

NODES = 24
FLEET_DASHBOARD = REPO / "dashboards" / "resmon-fleet.json"
REMOTE_WRITE = REPO / "prometheus" / "remote-write.example.yml"
FILE_SD = REPO / "prometheus" / "file_sd.example.json"
LOST = (6, 2)  # node-06 (4 GPUs), GPU 2 is lost in test_one_lost_gpu_pages_exactly_once
XID = (13, 1, 13)  # node-13 GPU 1 reports XID 13 (an application's): the XID column has data
MIN_SCRAPES = 100  # per target, at 1 s: the fleet is scraped for minutes

Labels = frozenset  # of (name, value) pairs, __name__ left out
Expected = dict[Labels, Union[float, Callable[[float], bool]]]


# -- the remote_write example (no fleet) -------------------------------------------------------------


def promtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need("promtool"), "check", "config", str(config)], capture_output=True, text=True,
                          timeout=60)


def example_copy(tmp_path: Path, change: Callable[[dict[str, Any]], None] | None = None,
                 targets: str | None = None) -> Path:
    """The example next to what it references (the rules, a targets file, the password file:
    promtool reads the rules and the targets), optionally changed."""
    doc = yaml.safe_load(REMOTE_WRITE.read_text())
    if change is not None:
        change(doc)
    shutil.copytree(REPO / "prometheus" / "rules", tmp_path / "rules")
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "resmon-example.json").write_text(FILE_SD.read_text() if targets is None else targets)
    for rw in doc["remote_write"]:
        secret = rw.get("basic_auth", {}).get("password_file")
        if secret:
            Path(tmp_path / Path(secret).name).write_text("s3cret\n")
            rw["basic_auth"]["password_file"] = Path(secret).name
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_remote_write_example_passes_promtool(tmp_path: Path) -> None:
    result = promtool_check(example_copy(tmp_path))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr  # every file it references was there and read
    doc = yaml.safe_load(REMOTE_WRITE.read_text())
    assert set(doc["global"]["external_labels"]) == {"cluster", "replica"}
    (scrape,) = [s for s in doc["scrape_configs"] if s["job_name"].startswith("resmon")]
    assert scrape["file_sd_configs"][0]["files"]
    (rw,) = doc["remote_write"]
    assert rw["queue_config"]["max_samples_per_send"] and rw["write_relabel_configs"]


@pytest.mark.parametrize("broken", ["unknown key", "bad relabel regex", "no url", "targets not a list"])
def test_promtool_rejects_a_broken_remote_write(tmp_path: Path, broken: str) -> None:
    def change(doc: dict[str, Any]) -> None:
        rw = doc["remote_write"][0]
        if broken == "unknown key":
            rw["queue_config"]["max_samples_per_sendd"] = 1
        elif broken == "bad relabel regex":
            rw["write_relabel_configs"][0]["regex"] = "resmon_(gpu"
        elif broken == "no url":
            del rw["url"]

    targets = '[{"targets": "gpu-host-01:9636"}]' if broken == "targets not a list" else None
    result = promtool_check(example_copy(tmp_path, change, targets))
    assert result.returncode != 0, result.stdout + result.stderr


# -- the benchmark's quick mode (before the fleet fixture starts, so the two fleets do not overlap) --


BENCHMARK = [sys.executable, str(REPO / "benchmarks" / "fleet.py")]


def stop_group(proc: subprocess.Popen[str], grace: float = 30) -> tuple[str, str]:
    """Every process of proc's session (it was started with one of its own): SIGTERM, which
    the benchmark turns into its fleet.stop(), then SIGKILL for whatever is left. What proc
    wrote is returned."""
    out: tuple[str, str] = ("", "")
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    rest = proc.communicate()  # closes the pipes
    return (out[0] or "") + (rest[0] or ""), (out[1] or "") + (rest[1] or "")


def run_benchmark(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The benchmark in a session of its own: subprocess.run's timeout would kill only
    benchmarks/fleet.py, never reaching its finally, and orphan its exporters, Prometheus
    and sleep children; here a timeout or any error stops the whole group."""
    proc = subprocess.Popen(BENCHMARK + args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        stdout, stderr = stop_group(proc)
        raise AssertionError(f"the benchmark did not finish within {timeout} s:\n{stdout}\n{stderr}") from None
    stop_group(proc, grace=0)  # nothing should be left; if anything is, it goes
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def descendants(pid: int) -> dict[int, str]:
    """pid -> comm of every live process below pid (from /proc; zombies count as gone)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z":
            children.setdefault(int(rest[1]), []).append((int(entry.name), comm))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child, comm in children.get(todo.pop(), []):
            found[child] = comm
            todo.append(child)
    return found


def alive(pids: Iterable[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def test_a_terminated_fleet_benchmark_stops_its_fleet(tmp_path: Path) -> None:
    """SIGTERM to benchmarks/fleet.py alone (as a runner's timeout sends it): its exporters,
    Prometheus and the pods node's sleep children must all be gone when it has exited."""
    log = tmp_path / "benchmark.log"
    with log.open("w") as out:  # a file, not a pipe: orphans holding a pipe would block reading it
        proc = subprocess.Popen(BENCHMARK + ["--quick", "--duration=600"], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        fleet_procs = wait_until("the benchmark's Prometheus", lambda: (
            kids if "prometheus" in (kids := descendants(proc.pid)).values() else None), 180)
        assert list(fleet_procs.values()).count("sleep") == 3, fleet_procs  # the pods node's GPU users (host, pod, Slurm job)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.returncode == 128 + signal.SIGTERM, log.read_text()[-2000:]
        # fleet.stop() waited for each of them, so none may be left, not even briefly
        assert {pid: fleet_procs[pid] for pid in alive(fleet_procs)} == {}
    finally:
        stop_group(proc, grace=5)


def test_gpu_users_that_fail_to_start_leave_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    socket_dirs: list[str] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    def short_socket_dir() -> str:
        socket_dirs.append(real_short_socket_dir())
        return socket_dirs[-1]

    def refuse(self: Any) -> Any:
        raise OSError("the fake kubelet cannot bind")

    real_short_socket_dir = gpu_users.short_socket_dir
    monkeypatch.setattr(gpu_users.subprocess, "Popen", Recorded)
    monkeypatch.setattr(gpu_users, "short_socket_dir", short_socket_dir)
    monkeypatch.setattr(gpu_users.FakeKubelet, "start", refuse)
    with pytest.raises(OSError, match="cannot bind"):
        GpuUsers(tmp_path, ("GPU-a", "GPU-b"))
    assert len(started) == 3  # every child had been started
    assert all(child.returncode is not None for child in started), "a sleep child leaked"
    assert socket_dirs and not any(Path(d).exists() for d in socket_dirs)


def test_quick_fleet_benchmark_prints_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    result = run_benchmark(["--quick", f"--json={out}"], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for needle in ("exporters", "exporter CPU, % of one core", "exporter CPU per scrape", "exporter RSS",
                   "Prometheus RSS", "scrape_duration_seconds", "samples per scrape", "query GPUs up",
                   "query GPUs / A", "query Refresh duration"):
        assert needle in result.stdout, needle
    figures = json.loads(out.read_text())
    assert figures["exporters"] == 4
    assert 0 < figures["exporter_cpu_percent_median"] < 200  # % of one core, not seconds or a ratio
    assert 0 < figures["exporter_cpu_ms_per_scrape_median"]
    assert 10 < figures["exporter_rss_mib_median"] <= figures["exporter_rss_mib_max"] < 1024  # MiB
    assert 10 < figures["prometheus_rss_mib"] < 4096
    assert 0 < figures["scrape_duration_ms_p50"] <= figures["scrape_duration_ms_max"]
    panels = {f"{title} / {ref}" for title, ref, _, _ in panel_targets(FLEET_DASHBOARD)}
    assert set(figures["queries"]) == panels
    assert all(0 < q["p50_ms"] <= q["p99_ms"] for q in figures["queries"].values())


# -- the fleet ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(fake_libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The fleet with every node in its file_sd file. The last node is added only once the
    others are scraped: what Prometheus saw before and after is kept in fleet.discovery."""
    root = tmp_path_factory.mktemp("fleet")
    f = Fleet(root, fake_libs["current"], fleet_nodes(NODES), rules=write_test_rules(root / "rules"),
              alertmanager=True, listed=NODES - 1)
    try:
        wait_fleet_up(f, NODES - 1)
        runtime = f.prom.api("/api/v1/status/runtimeinfo")
        f.discovery = {"before": f.active_targets(), "runtime_before": runtime}
        f.write_targets(f.members)
        wait_fleet_up(f, NODES)
        f.discovery.update(after=f.active_targets(), runtime_after=f.prom.api("/api/v1/status/runtimeinfo"),
                           prometheus_running=f.prometheus.poll() is None)
        # XIDs reach only a registered event set (no replay): inject once the node's watcher is on
        node, gpu, code = XID
        member = f.member(node)
        wait_until("node-13's XID watcher registered", lambda: f.query(
            f'resmon_collector_success{{node="node-{node:02d}", collector="xid"}} == 1'), 60)
        member.scenario.update(xid_events=f"{member.node.gpus[gpu].uuid}:{code}")
        wait_until("the XID in Prometheus", lambda: f.query(f'resmon_gpu_xid_errors_total{{xid="{code}"}}'), 60)
        wait_until("the pod's process and allocations in Prometheus", lambda: f.query(
            'resmon_gpu_process_memory_used_bytes{pod="train-0"} and on (pod) resmon_gpu_allocation_info'), 60)
        yield f
    finally:
        f.stop()


def test_file_sd_adds_a_node_without_restart(fleet: Fleet) -> None:
    names = [f"node-{n:02d}" for n in range(NODES)]
    assert fleet.discovery["before"] == {n: "up" for n in names[:-1]}
    assert fleet.discovery["after"] == {n: "up" for n in names}
    before, after = fleet.discovery["runtime_before"], fleet.discovery["runtime_after"]
    # the same server, not restarted and not reloaded: the file watch found the new target
    assert fleet.discovery["prometheus_running"]
    assert after["startTime"] == before["startTime"] and after["lastConfigTime"] == before["lastConfigTime"]
    assert after["reloadConfigSuccess"]


# -- expectations, from the nodes' scenarios --------------------------------------------------------


def node_labels(m: Member) -> dict[str, str]:
    return {"job": JOB, "instance": m.instance, "node": m.node.name}


def gpu_labels(m: Member, i: int, node: bool = True) -> dict[str, str]:
    labels = {**node_labels(m), "gpu": str(i), "uuid": m.node.gpus[i].uuid}
    if not node:  # sum by (job, instance, gpu, uuid) drops the target's node label
        del labels["node"]
    return labels


def key(labels: dict[str, str]) -> Labels:
    return frozenset(labels.items())


def per_gpu(fleet: Fleet, value: Callable[[Any], float], node: bool = True,
            where: Callable[[Any], bool] = lambda g: True) -> Expected:
    return {key(gpu_labels(m, g.index, node)): value(g) for m in fleet.members for g in m.node.gpus if where(g)}


def per_node(fleet: Fleet, value: Any, **extra: str) -> Expected:
    return {key({**node_labels(m), **extra}): value for m in fleet.members}


def collectors(m: Member) -> set[str]:
    names = {"gpu", "health", "xid", "host"}  # every fake GPU can report XIDs: the watcher runs
    if any(g.health for g in m.node.gpus):
        names |= {"nvlink", "profiling"}  # inactive on hosts without NVLink, without GPM
    return names | ({"processes", "kubernetes"} if m.node.pods else set())


def ratio(v: float) -> bool:
    return 0 <= v <= 1


def panel_expectations(fleet: Fleet) -> dict[tuple[str, str], Expected]:
    """(panel title, refId) -> the series its query must return over the whole fleet."""
    gpus = [g for m in fleet.members for g in m.node.gpus]
    health = lambda g: g.health  # noqa: E731  (H100 boards: ECC, remapping, recovery action)
    pods = fleet.member(PODS_NODE).instance
    xid_node, xid_gpu, _ = XID

    def info(m: Member, i: int) -> Labels:
        g = m.node.gpus[i]
        return key({**gpu_labels(m, i), "name": g.name, "pci_bus_id": g.pci_bus_id,
                    "driver_version": "550.54.15", "backend": "nvml"})

    def pod(name: str) -> Labels:
        return key({"instance": pods, "namespace": {"train-0": "team-a", "notebook-1": "team-b"}[name], "pod": name})

    return {
        ("GPUs up", "A"): {key({}): len(gpus)},
        ("GPUs down", "A"): {key({}): 0},
        ("GPUs reported", "A"): {key({}): len(gpus)},
        ("Exporters up", "A"): {key({}): NODES},
        ("GPUs over 90 % VRAM", "A"): {key({}): sum(g.vram_ratio > 0.9 for g in gpus)},
        ("GPUs throttling", "A"): {key({}): sum(g.throttle_reasons > 0 for g in gpus)},
        ("GPUs", "A"): {info(m, g.index): 1 for m in fleet.members for g in m.node.gpus},
        ("GPUs", "B"): per_gpu(fleet, lambda g: g.vram_ratio),
        ("GPUs", "C"): per_gpu(fleet, lambda g: g.util / 100),
        ("GPUs", "D"): per_gpu(fleet, lambda g: g.temperature),
        ("GPUs", "E"): per_gpu(fleet, lambda g: g.power_mw / 1000),
        ("GPUs", "F"): per_gpu(fleet, lambda g: g.power_limit_mw / 1000),
        ("GPUs", "G"): per_gpu(fleet, lambda g: g.throttle_reasons, node=False),
        ("GPUs", "H"): per_gpu(fleet, lambda g: 1),
        ("GPUs", "I"): {key(gpu_labels(fleet.member(xid_node), xid_gpu, node=False)): 1},
        ("GPUs", "J"): per_gpu(fleet, lambda g: 0, node=False, where=health),
        ("GPUs", "K"): per_gpu(fleet, lambda g: 0, node=False, where=health),
        ("GPUs", "L"): per_gpu(fleet, lambda g: 0, where=health),
        ("VRAM pressure", "A"): per_gpu(fleet, lambda g: g.vram_ratio),
        ("GPU utilization", "A"): per_gpu(fleet, lambda g: g.util / 100),
        # GPM nodes only (the H100 boards); the rest have no series, not 0
        ("Tensor-core activity by node", "A"): {
            key({"job": JOB, "instance": m.instance}): sum(g.tensor_active for g in m.node.gpus) / len(m.node.gpus) / 100
            for m in fleet.members if any(g.health for g in m.node.gpus)},
        # only the pods node runs the processes and kubernetes collectors (see tests/gpu_users.py)
        ("Pods by VRAM", "A"): {pod("train-0"): POD_VRAM},
        ("Pods by VRAM", "B"): {pod("train-0"): POD_SM / 100},
        ("Pods by VRAM", "C"): {pod("train-0"): 1, pod("notebook-1"): 2},
        **waste_expectations(fleet),
        ("Host CPU", "A"): per_node(fleet, ratio),
        ("Host memory used", "A"): per_node(fleet, lambda v: 0 < v < 1),
        ("Collector success", "A"): {key({**node_labels(m), "collector": c}): 1
                                     for m in fleet.members for c in collectors(m)},
        ("Refresh duration", "A"): {key({**node_labels(m), "collector": c}): (lambda v: 0 <= v < 5)
                                    for m in fleet.members for c in collectors(m)},
    }


def waste_expectations(fleet: Fleet) -> dict[tuple[str, str], Expected]:
    """The Waste and cost row. The fleet loads resmon.rules.yml only (the recording-rule test
    here covers that file), so the panels on resmon.waste.rules.yml's rules answer their
    fallbacks (0 idle GPUs, no rows); tests/test_stack.py proves them with the rules loaded.
    Energy per workload: only on the pods node, where the processes collector runs, for its
    three processes (tests/gpu_users.py), once the exporter serves per-process energy."""
    users, pods = fleet.member(PODS_NODE).users, fleet.member(PODS_NODE).instance
    charged = bool(fleet.query("resmon_gpu_process_energy_joules_total"))
    # a share, where the exporter splits energy (the pods node's GPUs), of the energy that grew
    split = bool(fleet.query("resmon_gpu_unattributed_energy_joules_total")) and bool(
        fleet.query("sum(increase(resmon_gpu_energy_joules_total[1h])) > 0"))
    workloads = {key({"job": JOB, "instance": pods, "who": who}): (lambda v: v >= 0) for who in (
        f"team-a/train-0 (trainer) pid {users.pod_pid}", f"sleep (pid {users.host_pid})",
        f"sleep (pid {users.job_pid}, job {gpu_users.JOB_ID})")} if charged else {}
    return {
        ("Idle allocated GPUs now", "A"): {key({}): 0},
        ("Idle GPU-hours", "A"): {key({}): 0},
        ("Cost of idle GPU-hours", "A"): {key({}): 0},
        ("GPU energy", "A"): {key({}): lambda v: v >= 0},
        ("GPU energy cost", "A"): {key({}): lambda v: v >= 0},
        ("Energy no workload was charged", "A"): {key({}): ratio} if split else {},
        ("Idle GPU-hours by namespace", "A"): {}, ("Idle GPU-hours by namespace", "B"): {},
        ("Idle GPU-hours by Slurm job", "A"): {}, ("Idle GPU-hours by Slurm job", "B"): {},
        ("Energy by workload", "A"): workloads, ("Energy by workload", "B"): workloads,
        ("VRAM held without work", "A"): {},
    }


def recording_expectations(fleet: Fleet) -> dict[str, Expected]:
    return {
        "gpu:resmon_gpu_memory_used:ratio": per_gpu(fleet, lambda g: g.vram_ratio),
        "instance:resmon_gpu_up:sum": {key({"job": JOB, "instance": m.instance}): len(m.node.gpus)
                                       for m in fleet.members},
        "job:resmon_gpu_sm_active:avg": {key({"job": JOB}): sum(gpm) / len(gpm) / 100 for gpm in [[
            g.sm_active for m in fleet.members for g in m.node.gpus if g.sm_active is not None]]},
    }


def result(fleet: Fleet, expr: str) -> dict[Labels, float]:
    out: dict[Labels, float] = {}
    for r in fleet.query(expr):
        labels = key({k: v for k, v in r["metric"].items() if k != "__name__"})
        assert labels not in out, f"{expr}: two series with {dict(labels)}"
        out[labels] = float(r["value"][1])
    return out


def mismatch(got: dict[Labels, float], expected: Expected) -> list[str]:
    """What differs, readably; [] when every expected series is there with its value and no other."""
    out = [f"missing {dict(k)}" for k in expected.keys() - got.keys()]
    out += [f"unexpected {dict(k)} = {got[k]}" for k in got.keys() - expected.keys()]
    for k in expected.keys() & got.keys():
        want, value = expected[k], got[k]
        ok = want(value) if callable(want) else math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12)
        if not ok:
            out.append(f"{dict(k)}: got {value}, expected {want}")
    return sorted(out)


def check(fleet: Fleet, what: str, expr: str, expected: Expected, timeout: float = 30) -> None:
    """Until the query returns exactly the expected series (scrapes land at different times)."""
    problems: list[str] = []

    def ok() -> bool:
        problems[:] = mismatch(result(fleet, expr), expected)
        return not problems

    try:
        wait_until(what, ok, timeout)
    except AssertionError:
        raise AssertionError(f"{what}: {expr}\n{len(problems)} problems, first: {problems[:8]}") from None


def test_every_recording_rule_returns_its_series_over_the_fleet(fleet: Fleet) -> None:
    rules = recording_rules()
    expectations = recording_expectations(fleet)
    assert set(rules) == set(expectations), "a recording rule without an expectation in this test"
    for name in rules:
        check(fleet, name, name, expectations[name])
    assert len(expectations["gpu:resmon_gpu_memory_used:ratio"]) == sum(len(m.node.gpus) for m in fleet.members) == 90


def test_every_fleet_panel_returns_the_expected_series(fleet: Fleet) -> None:
    targets = panel_targets(FLEET_DASHBOARD)
    expectations = panel_expectations(fleet)
    assert {(title, ref) for title, ref, _, _ in targets} == set(expectations), "a panel query without an expectation"
    for title, ref, expr, _ in targets:
        check(fleet, f"{title} / {ref}", expr, expectations[(title, ref)])
    # the expectations are not vacuous: every node and GPU kind shows up in them
    assert len(expectations[("GPUs", "A")]) == 90 and expectations[("GPUs over 90 % VRAM", "A")] == {key({}): 3}
    assert 0 < expectations[("GPUs throttling", "A")][key({})] < 90


def test_dashboard_variables_list_the_whole_fleet(fleet: Fleet) -> None:
    members = fleet.members
    assert {s["instance"] for s in fleet.prom.api("/api/v1/series", **{"match[]": "resmon_build_info"})} == {
        m.instance for m in members}
    gpus = {s["gpu"] for s in fleet.prom.api("/api/v1/series", **{"match[]": "resmon_gpu_info"})}
    assert gpus == {str(i) for i in range(8)}


def test_one_lost_gpu_pages_exactly_once(fleet: Fleet) -> None:
    node, gpu = LOST
    member = fleet.member(node)
    total = sum(len(m.node.gpus) for m in fleet.members)
    assert fleet.prom_alerts("ResmonGpuDown") == [] and fleet.am_alerts("ResmonGpuDown") == []
    member.scenario.update(**{f"gpu.{gpu}.rc.all": GPU_IS_LOST})
    try:
        wait_until("ResmonGpuDown in Alertmanager", lambda: fleet.am_alerts("ResmonGpuDown"), 60)
        wait_until("ResmonGpuDown at the webhook", lambda: fleet.webhook.alerts("ResmonGpuDown"), 30)
        # every other GPU had as long to fire (`for` is 2 s in the test rules, evaluation 1 s)
        time.sleep(5)
        labels = {"alertname": "ResmonGpuDown", "severity": "critical", **gpu_labels(member, gpu)}
        assert [a["labels"] for a in fleet.am_alerts("ResmonGpuDown")] == [labels]
        assert [(a["labels"], a["state"]) for a in fleet.prom_alerts("ResmonGpuDown")] == [(labels, "firing")]
        assert [a["labels"] for a in fleet.webhook.alerts("ResmonGpuDown")] == [labels]
        # the lost GPU is down, its identity stays; every other node keeps reporting
        check(fleet, "GPUs up", "sum(resmon_gpu_up)", {key({}): total - 1})
        check(fleet, "GPUs known", "count(resmon_gpu_up)", {key({}): total})
        check(fleet, "exporters up", f'sum(up{{job="{JOB}"}})', {key({}): NODES})
        per_node = recording_expectations(fleet)["instance:resmon_gpu_up:sum"]
        per_node[key({"job": JOB, "instance": member.instance})] -= 1
        check(fleet, "GPUs up per node", "instance:resmon_gpu_up:sum", per_node)
        check(fleet, "the lost GPU", "resmon_gpu_up == 0", {key(gpu_labels(member, gpu)): 0})
    finally:
        member.scenario.update(**{f"gpu.{gpu}.rc.all": None})
    check(fleet, "GPUs up again", "sum(resmon_gpu_up)", {key({}): total})


def test_the_fleet_was_scraped_for_minutes(fleet: Fleet) -> None:
    """Last: the checks above ran while Prometheus scraped; until every target has been
    scraped MIN_SCRAPES times, every panel and recording rule is checked again, so the
    expectations hold scrape after scrape, not once."""
    def counts() -> dict[str, float]:
        return {r["metric"]["node"]: float(r["value"][1])
                for r in fleet.query(f'count_over_time(up{{job="{JOB}"}}[10m])')}

    deadline = time.monotonic() + 240
    while not (len(got := counts()) == NODES and min(got.values()) >= MIN_SCRAPES):
        assert time.monotonic() < deadline, f"fewer than {MIN_SCRAPES} scrapes: {got}"
        for name, expected in recording_expectations(fleet).items():
            check(fleet, name, name, expected)
        panels = panel_expectations(fleet)
        for title, ref, expr, _ in panel_targets(FLEET_DASHBOARD):
            check(fleet, f"{title} / {ref}", expr, panels[(title, ref)])
        time.sleep(2)
    assert set(got) == {f"node-{n:02d}" for n in range(NODES)}, got
    # and they succeeded: a scrape the 1 s timeout cut short (a starved machine) is allowed, rarely
    ok = {r["metric"]["node"]: float(r["value"][1]) for r in fleet.query(f'sum_over_time(up{{job="{JOB}"}}[10m])')}
    assert all(ok[n] >= 0.95 * got[n] for n in got), {n: (ok[n], got[n]) for n in got}
