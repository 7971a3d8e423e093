"""Dashboards, alert rules and the compose stack, proven against the real Debian Prometheus,
promtool and Alertmanager, with the real exporter running on the fake NVML."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakenvml import GIB, REPO, Exporter, Scenario, Trace, gpu_keys, nvml_env
from gpu_users import HOST_SM, HOST_VRAM, JOB_ID, JOB_SM, JOB_VRAM, POD_SM, POD_VRAM, GpuUsers
from promstack import (RULE_FILES, RULES, PromApi, Webhook, alertmanager_config, exprs, load, need, panels,
                       recording_rules, settle, start_listening, substitute, wait_until, write_test_rules)
import scenarios as sc
from scenarios import three_gpus

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
RULE_TESTS = REPO / "prometheus" / "tests" / "resmon.rules.test.yml"


def rules_of(*paths: Path) -> list[dict[str, Any]]:
    return [r for path in paths for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def alerts_of(*paths: Path) -> set[str]:
    return {r["alert"] for r in rules_of(*paths) if "alert" in r}
def load_script(path: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def contract_families() -> set[str]:
    names = set()
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        names |= set(re.findall(r"^\|\s*`(resmon_[a-z0-9_]+)`", line))
    return names


# -- dashboards: structure ---------------------------------------------------------------


def test_generated_dashboards_are_committed():
    rendered = load_script(REPO / "dashboards" / "generate.py", "dashboard_generator").render()
    assert sorted(rendered) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], f"{path.name} differs: run python dashboards/generate.py"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path):
    d = load(path)
    assert "__inputs" not in d and d.get("id") is None
    assert d["schemaVersion"] == 39 and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance", "gpu"):
        v = variables[name]
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*" and v["refresh"] == 2
        assert v["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    occupied = set()
    for p in panels(d):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["type"] not in ("graph", "singlestat")
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            for var in ("job", "instance"):
                assert f'{var}=~"${var}"' in t["expr"], (p["title"], t["expr"])
            if "resmon_gpu_" in t["expr"] and "resmon_gpu_devices" not in t["expr"]:
                assert 'gpu=~"$gpu"' in t["expr"], (p["title"], t["expr"])
            if p["type"] == "timeseries":
                assert "{{instance}}" in t["legendFormat"], (p["title"], t["legendFormat"])
        unit = p["fieldConfig"]["defaults"]["unit"]
        first = p["targets"][0]["expr"]
        divides = "/" in re.sub(r'"[^"]*"', '""', first)  # not a "/" in a string (label_replace's "$1/$2")
        if p["type"] != "table":
            expected = ("bytes" if "_bytes{" in first and not divides else
                        "percentunit" if "_ratio{" in first or ("_bytes{" in first and divides) else
                        "celsius" if "_celsius{" in first else
                        "watt" if "_watts{" in first else
                        "hertz" if "_hertz{" in first else None)
            if expected and not first.startswith(("count(", "sum(")):
                assert unit == expected, (p["title"], unit, expected)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_metric_names_exist_in_the_contract(path):
    # the contract's families, and the recording rules of prometheus/rules/ (the waste rows')
    known = contract_families() | {"up"} | {name for f in RULE_FILES for name in recording_rules(f)}
    functions = {"sum", "count", "or", "vector", "increase", "time", "rate", "max", "min", "avg", "label_values",
                 "and", "unless", "round", "bool", "group_left", "group_right", "group", "label_join",
                 "label_replace", "sum_over_time", "topk", "sort_desc"}
    # label lists of by/without/on/ignoring/group_*, selectors, strings, ranges and offsets are not names
    grouping = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    for expr in exprs(load(path)):
        cleaned = re.sub(grouping + r'|\{[^}]*\}|"[^"]*"|\[[^\]]*\]|\boffset\s+\w+|\$\w+', "", expr)  # $: variables
        for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", cleaned):
            if name in functions or name in ("e6", "job", "instance", "gpu", "uuid") or re.fullmatch(r"e\d+", name):
                continue
            assert name in known, f"{path.name}: {name} in {expr!r} is not a contract family"


def test_fleet_xid_column_counts_first_events_and_survives_restarts(tmp_path):
    """The fleet table's "XIDs (24h)" query, run by promtool over 30 hours of history."""
    table = next(p for p in panels(load(REPO / "dashboards" / "resmon-fleet.json")) if p["title"] == "GPUs")
    column = table["transformations"][1]["options"]["renameByName"]
    ref = next(k for k, v in column.items() if v == "XIDs (24h)").removeprefix("Value #")
    expr = substitute(next(t["expr"] for t in table["targets"] if t["refId"] == ref))

    def labels(i: int, code: str) -> str:
        return f'{{job="resmon", instance="h:9636", gpu="{i}", uuid="GPU-{i}", xid="{code}"}}'

    series = [  # one sample an hour, 0h..30h ("ax9": 10 samples, "_x3": 3 missing); the query runs at 30h
        (labels(0, "79"), "2x9 3x9 4x10"),  # older than the window, then 2 events in it (10h, 20h)
        (labels(0, "94"), "_x25 1x5"),  # first event at 25h
        (labels(1, "48"), "_x12 1x7 2x10"),  # first event at 12h, second at 20h: both count
        (labels(2, "13"), "5x14 _x3 1x12"),  # exporter restarted at 15h, one event since
        (labels(3, "31"), "1x5"),  # before the window, series gone with a restart: no row
    ]
    expected = {"0": 3, "1": 2, "2": 1}
    doc = {"rule_files": [], "evaluation_interval": "1h", "tests": [{
        "interval": "1h",
        "input_series": [{"series": "resmon_gpu_xid_errors_total" + s, "values": v} for s, v in series],
        "promql_expr_test": [{"expr": expr, "eval_time": "30h", "exp_samples": [
            {"labels": f'{{job="resmon", instance="h:9636", gpu="{i}", uuid="GPU-{i}"}}', "value": n}
            for i, n in expected.items()]}],
    }]}
    (tmp_path / "xid24h.test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = subprocess.run([need("promtool"), "test", "rules", str(tmp_path / "xid24h.test.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def panel_exprs(dashboard: str, title: str) -> dict[str, str]:
    """refId -> query of the panel with that title, the dashboard variables substituted."""
    panel = next(p for p in panels(load(REPO / "dashboards" / dashboard)) if p["title"] == title)
    return {t["refId"]: substitute(t["expr"]) for t in panel["targets"]}


def promtool_instant(tmp_path: Path, series: list[tuple[str, dict[str, str], float]],
                     checks: list[tuple[str, list[tuple[dict[str, str], float]]]]) -> None:
    """Runs each (query, expected samples) with promtool over series of constant value."""
    def text(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": text(name, labels), "values": f"{value}x5"} for name, labels, value in series],
        "promql_expr_test": [
            {"expr": expr, "eval_time": "2m",
             "exp_samples": [{"labels": text(labels.pop("__name__", ""), labels), "value": value}
                             for labels, value in ((dict(l), v) for l, v in expected)]}
            for expr, expected in checks],
    }]}
    (tmp_path / "panels.test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    result = subprocess.run([need("promtool"), "test", "rules", str(tmp_path / "panels.test.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("title, family, extra", [
    ("VRAM by process", "resmon_gpu_process_memory_used_bytes", {}),
    ("SM utilization by process", "resmon_gpu_process_utilization_ratio", {"engine": "sm"}),
])
def test_process_legends_name_the_pod_else_the_process(tmp_path, title, family, extra):
    """The `who` label of the per-process panels for every shape the two group-by modes serve."""
    (expr,) = panel_exprs("resmon-node.json", title).values()
    gpu = {"job": "resmon", "instance": "h:9636", "gpu": "0", "uuid": "GPU-0"}
    pod = {"pod_uid": "7d5f3c1e-2b4a-4c6d-8e9f-0a1b2c3d4e5f", "namespace": "ml"}
    shapes = [  # the owner labels a series carries (empty ones are absent in Prometheus), its legend
        ({"pid": "11", "process": "python", "user": "root", "container_id": "a" * 64, **pod, "pod": "train-0",
          "container": "main"}, "ml/train-0 (main) pid 11"),
        ({"container_id": "b" * 64, **pod, "pod": "train-1", "container": "main"}, "ml/train-1 (main)"),  # by container
        ({"pid": "12", "process": "python", "user": "root", "container_id": "c" * 64, **pod, "pod": "train-2"},
         "ml/train-2"),  # the pod runs several containers, none of them known to hold this GPU
        ({"pid": "13", "process": "Xorg", "user": "root"}, "Xorg (pid 13)"),
        ({"pid": "14", "process": "a;b c", "user": "1001", "container_id": "d" * 64}, "a;b c (pid 14)"),  # Docker
        ({"container_id": "0123456789ab" + "e" * 52}, "container 0123456789ab"),  # by container, plain Docker
        ({}, "outside containers"),  # by container: the host's processes, summed
        ({"pid": "15", "process": "python", "user": "alice", "job_id": "4242"}, "python (pid 15, job 4242)"),  # Slurm
        ({"pid": "16", "process": "a;7", "user": "alice"}, "a;7 (pid 16)"),  # a name that looks like a job id
        ({"pid": "17", "process": "a;b", "user": "alice", "job_id": "9"}, "a;b (pid 17, job 9)"),
        ({"job_id": "4242"}, "job 4242"),  # by container: a job's processes outside containers, summed
        ({"container_id": "0123456789ab" + "f" * 52, "job_id": "7"}, "container 0123456789ab, job 7"),  # enroot, podman
    ]
    series = [(family, {**gpu, **owner, **extra}, i / 8) for i, (owner, _) in enumerate(shapes)]
    if extra:  # another engine's series are not the panel's
        series.append((family, {**gpu, "pid": "13", "process": "Xorg", "user": "root", "engine": "memory"}, 1))
    expected = [({"__name__": family, **labels, "who": legend}, value)
                for (_, labels, value), (_, legend) in zip(series, shapes)]
    promtool_instant(tmp_path, series, [(expr, expected)])


def test_pods_get_their_own_vram_not_the_shared_device(tmp_path):
    """Time-slicing: pods a and b share GPU 0 (replicas GPU-0::0, ::2 for a, ::1 for b), b and c
    share GPU 1. Each pod's VRAM is its own processes' (a runs two in one container); the
    device's VRAM is shown only as the device's; a host process belongs to no pod; c holds a GPU
    it does not use; a's two replicas are one GPU."""
    node = panel_exprs("resmon-node.json", "GPU allocations by pod")
    fleet = panel_exprs("resmon-fleet.json", "Pods by VRAM")
    host = {"job": "resmon", "instance": "h:9636"}
    gpus = {"0": {**host, "gpu": "0", "uuid": "GPU-0"}, "1": {**host, "gpu": "1", "uuid": "GPU-1"}}

    def owner(pod: str) -> dict[str, str]:
        return {"namespace": "ml", "pod": pod, "container": "main"}

    allocations = [{**gpus["0"], **owner("a"), "resource": "nvidia.com/gpu", "device_id": "GPU-0::0"},
                   {**gpus["0"], **owner("a"), "resource": "nvidia.com/gpu", "device_id": "GPU-0::2"},
                   {**gpus["0"], **owner("b"), "resource": "nvidia.com/gpu", "device_id": "GPU-0::1"},
                   {**gpus["1"], **owner("b"), "resource": "nvidia.com/gpu", "device_id": "GPU-1::0"},
                   {**gpus["1"], **owner("c"), "resource": "nvidia.com/gpu", "device_id": "GPU-1::1"}]
    procs = [({**gpus["0"], "pid": "1", **owner("a")}, 30 * GIB, 0.25),
             ({**gpus["0"], "pid": "2", **owner("a")}, 5 * GIB, 0.125),
             ({**gpus["0"], "pid": "3", **owner("b")}, 10 * GIB, 0.25),
             ({**gpus["0"], "pid": "4", "process": "Xorg"}, 25 * GIB, 0.5),
             ({**gpus["1"], "pid": "5", **owner("b")}, 2 * GIB, 0.25)]
    series = [("resmon_gpu_memory_used_bytes", gpus["0"], 70 * GIB),
              ("resmon_gpu_memory_used_bytes", gpus["1"], 5 * GIB)]
    series += [("resmon_gpu_allocation_info", a, 1) for a in allocations]
    series += [("resmon_gpu_process_memory_used_bytes", labels, vram) for labels, vram, _ in procs]
    series += [("resmon_gpu_process_utilization_ratio", {**labels, "engine": engine}, sm if engine == "sm" else 1)
               for labels, _, sm in procs for engine in ("sm", "memory")]
    a, a2, b0, b1, c = allocations

    def pod(name: str) -> dict[str, str]:
        return {"instance": "h:9636", "namespace": "ml", "pod": name}

    promtool_instant(tmp_path, series, [
        (node["A"], [({"__name__": "resmon_gpu_allocation_info", **x}, 1) for x in allocations]),
        (node["B"], [(a, 35 * GIB), (a2, 35 * GIB), (b0, 10 * GIB), (b1, 2 * GIB)]),  # the container's own
        (node["C"], [(a, 70 * GIB), (a2, 70 * GIB), (b0, 70 * GIB), (b1, 5 * GIB), (c, 5 * GIB)]),  # the device's
        (fleet["A"], [(pod("a"), 35 * GIB), (pod("b"), 12 * GIB)]),
        (fleet["B"], [(pod("a"), 0.375), (pod("b"), 0.5)]),
        (fleet["C"], [(pod("a"), 1), (pod("b"), 2), (pod("c"), 1)]),
    ])


# -- alert rules ---------------------------------------------------------------------------


def test_rules_check_clean():
    assert [p.name for p in RULE_FILES] == ["resmon.rules.yml", "resmon.waste.rules.yml"]
    result = subprocess.run([need("promtool"), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.count("SUCCESS") == len(RULE_FILES), result.stdout + result.stderr
    config = subprocess.run([need("promtool"), "check", "config", str(REPO / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


@pytest.mark.parametrize("rules", RULE_FILES, ids=lambda p: p.name)
def test_promtool_rule_unit_tests_pass_and_cover_every_alert(rules):
    """Each rules file's promtool tests (prometheus/tests/<name>.test.yml, generated): every
    alert of that file fires in one check and stays quiet in another."""
    gen_tests = load_script(RULE_TESTS.parent / "generate.py", "rule_test_generator")
    tests = RULE_TESTS.parent / gen_tests.test_file(rules.name)
    assert tests.read_text() == gen_tests.document(rules.name), "run python prometheus/tests/generate.py"
    result = subprocess.run([need("promtool"), "test", "rules", str(tests)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    doc = yaml.safe_load(tests.read_text())
    assert doc["rule_files"] == [f"../rules/{rules.name}"]
    alerts = alerts_of(rules)
    fired, quiet = set(), set()
    for group in doc["tests"]:
        assert group["interval"], "Prometheus 2.42 needs interval in every test group"
        for check in group.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired == alerts and quiet == alerts, (alerts - fired, alerts - quiet)


def test_waste_recording_rules_are_tested_for_exact_values():
    """Every recording rule of the waste file has an exp_samples check in its promtool tests."""
    tests = yaml.safe_load((RULE_TESTS.parent / "resmon.waste.rules.test.yml").read_text())
    checked = {re.sub(r"^round\((\S+), [0-9.]+\)$", r"\1", t["expr"]) for g in tests["tests"]
               for t in g.get("promql_expr_test", []) if t["exp_samples"]}
    records = set(recording_rules(RULE_FILES[1]))
    assert records and records <= checked, sorted(records - checked)


def test_rules_are_annotated():
    for rule in rules_of(*RULE_FILES):
        if "alert" in rule:
            assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
            assert rule["labels"]["severity"] in ("warning", "critical")
        else:
            assert rule["record"].startswith("resmon:") or rule in rules_of(RULES), rule["record"]


# -- compose, image, provisioning ------------------------------------------------------------


def test_compose_file_is_valid_and_mounts_exist():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    result = subprocess.run([need("docker-compose"), "-f", str(REPO / "docker-compose.yml"), "--profile", "nogpu",
                             "--profile", "demo", "--profile", "node", "config", "-q"], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    services = compose["services"]
    assert {"exporter", "prometheus", "alertmanager", "grafana", "node-exporter", "exporter-nogpu"} <= set(services)
    devices = services["exporter"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert services["node-exporter"]["profiles"] == ["node"] and services["exporter-nogpu"]["profiles"] == ["nogpu"]
    assert "exporter" in services["exporter-nogpu"]["networks"]["default"]["aliases"]
    for name, svc in services.items():
        if "image" in svc and "build" not in svc:
            assert re.search(r":v?\d+\.\d+\.\d+$", svc["image"]), f"{name}: pin the image tag"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).is_dir(), f"{name}: {source} must be an existing directory"
    prom_conf = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    assert prom_conf["scrape_configs"][0]["static_configs"][0]["targets"] == ["exporter:9636"]
    amtool = subprocess.run([need("amtool"), "check-config", str(REPO / "alertmanager" / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert amtool.returncode == 0, amtool.stdout + amtool.stderr


def compose_config(*profiles: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """docker-compose's own reading of the file with these profiles (v1: it validates against
    its schema and resolves variables); the normalized YAML it prints."""
    import os

    args = [a for p in profiles for a in ("--profile", p)]
    result = subprocess.run([need("docker-compose"), "-f", str(REPO / "docker-compose.yml"), *args, "config"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.e2e  # docker-compose, through compose_config (conftest sees only the test's own names)
def test_compose_profiles_publish_distinct_host_ports_and_run_the_demo():
    """Issue 35 item 5: every exporter variant (GPU, nogpu, demo) answers to the alias that
    Prometheus scrapes, but publishes its own host port, so no two services of any profile
    mix bind one port; the demo builds demo/Dockerfile and runs the machine RESMON_DEMO_MACHINE
    names (h100 by default), its health check on the port it listens on."""
    services = compose_config("nogpu", "demo", "node")["services"]
    published: dict[int, str] = {}
    for name, svc in services.items():
        for port in svc.get("ports", []):
            host = int(port["published"])
            assert host not in published, f"{name} and {published[host]} both publish host port {host}"
            published[host] = name
    variants = {name for name, svc in services.items() if "exporter" in svc.get("networks", {}).get("default", {}).get(
        "aliases", [])} | {"exporter"}
    assert variants == {"exporter", "exporter-nogpu", "exporter-demo"}
    assert published[9636] == "exporter" and all(
        any(int(p["target"]) == 9636 for p in services[v]["ports"]) for v in variants)
    demo = services["exporter-demo"]
    assert demo["profiles"] == ["demo"] and demo["build"]["dockerfile"] == "demo/Dockerfile"
    assert demo["build"]["context"] == str(REPO) and (REPO / "demo" / "Dockerfile").is_file()
    assert demo["command"] == ["h100", "--listen", ":9636"]
    assert "127.0.0.1:9636/-/healthy" in " ".join(demo["healthcheck"]["test"])
    amd = compose_config("demo", env={"RESMON_DEMO_MACHINE": "amd"})["services"]["exporter-demo"]
    assert amd["command"][0] == "amd"
    assert "deploy" not in demo, "the demo needs no GPU"
    # the compose stack's documentation gives each variant's own address and a start that names it
    doc = (REPO / "docs" / "alerts.md").read_text()
    for variant in variants:
        [host] = [int(p["published"]) for p in services[variant]["ports"]]
        assert f"http://localhost:{host}/metrics" in doc, variant
    for profile, variant in (("nogpu", "exporter-nogpu"), ("demo", "exporter-demo")):
        assert f"--profile {profile} up -d prometheus alertmanager grafana {variant}" in doc, variant


def test_grafana_provisioning_matches_the_compose_mounts():
    ds = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "resmon-prometheus" and ds["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "resmon.yml").read_text())["providers"][0]
    grafana = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["grafana"]
    assert f"./dashboards:{provider['options']['path']}:ro" in grafana["volumes"]


# -- the live stack ----------------------------------------------------------------------------


UUID = {i: f"GPU-0c1c7b8e-1d2e-4c47-9b5a-00000000000{i}" for i in range(5)}
HW_THERMAL_SHARE = 0.5  # GPU 0's hardware thermal slowdown counter grows 0.5 s per second


GPU1_BUSY = 40  # percent, GPU 1's sample buffers: the Slurm jobs table's "GPU busy"


def stack_machine() -> dict[str, Any]:
    """three_gpus and a V100, with what gives every dashboard panel data and makes every health
    alert fire on one GPU while the GPUs next to it show the quiet cases:
    GPU 0, a busy H100: VRAM pressure, ECC, a row remap pending, 4 NVLinks (link 2 never up),
      PCIe Gen 4 of 5, clock-event counters (hardware thermal slowdown ticking, see Stack.tick),
      sample buffers (busy seconds), memory temperature.
    GPU 1, a lightly used A100 (GPU1_BUSY, the Slurm job's): a failed row remap, recovery action 1,
      the power-brake reason bit with no clock-event counters (the bit fallback), PCIe Gen 1 of 4
      while under 50 % busy (quiet).
    GPU 2, the L4 without a utilization gauge: busy only by its sample buffers, x8 of x16.
    GPU 3, a V100 on the violation-status fallback: page retirement pending, ECC (the test
      raises its uncorrectable count), 2 NVLinks.
    GPU 4, an H100 in MIG mode (scenarios.profiling_machine's MIG devices and GPU instances): the
      MIG table and the per-instance profiling series; GPU 0 has whole-GPU GPM (the Profiling row).
    XID events are injected by the fixture (GPU 1, XID 13: an application's) and the tests."""
    machine = three_gpus()
    machine["count"] = 5
    machine["gpu.0.memory_used"] = 76 * GIB  # 95.6 % of 80 GiB in use: VRAM pressure
    machine.update(gpu_keys(
        0, ecc="on", ecc__corrected__volatile=3, ecc__corrected__aggregate=17, row_remapping=1,
        remapped__correctable=2, remapped__uncorrectable=1, remap_pending=1, nvlinks=4, nvlink__2__active=0,
        nvlink__0__tx_kib=1_000_000, nvlink__0__rx_kib=2_000_000, nvlink__1__errors__replay=5,
        field__82=58, field__74=1_500_000_000, field__76=0, field__269=3_000_000_000, field__270=0, field__271=0,
        field__77=0, field__78=0, field__79=0, field__197=10**11, field__198=5 * 10**10, field__230=0,
        pcie_gen=4, pcie_gen_max=5, pcie_width=16, pcie_width_max=16, pcie_replays=3, samples__period_ms=100,
    ))
    machine.update(gpu_keys(
        1, ecc="on", row_remapping=1, remapped__correctable=0, remapped__uncorrectable=3, remap_failed=1,
        field__230=1, clocks_event_reasons=0x81,  # gpu_idle + hw_power_brake_slowdown
        pcie_gen=1, pcie_gen_max=4, pcie_width=16, pcie_width_max=16,
        samples__period_ms=100, samples__gpu=GPU1_BUSY,  # the Slurm job's GPU: busy under 50 %, PCIe quiet
    ))
    machine.update(gpu_keys(2, pcie_gen=4, pcie_gen_max=4, pcie_width=8, pcie_width_max=16, samples__period_ms=100,
                            samples__gpu=90))
    machine.update(gpu_keys(
        3, name="Tesla V100-SXM2-32GB", uuid=UUID[3], pci_bus_id="00000000:0C:00.0", memory_total=32 * GIB,
        memory_used=GIB, memory_reserved=256 * 1024**2, util_gpu=40, util_memory=20, temperature=50,
        power_mw=150000, power_limit_mw=300000, energy_mj=1000, fan=30, pstate=0, clocks_event_reasons=0,
        ecc="on", ecc__uncorrected__volatile=0, ecc__uncorrected__aggregate=1, page_retirement=1,
        retired__multiple_single_bit=1, retired__double_bit=1, retired_pending=1, nvlinks=2,
        violation__0=2_000_000_000, violation__1=600_000_000, violation__2=0, violation__3=0, violation__4=0,
        violation__5=0, pcie_gen=3, pcie_gen_max=3, pcie_width=16, pcie_width_max=16, pcie_replays=0,
    ))
    machine.update(gpu_keys(0, gpm=1, gpm__2=55, gpm__3=30, gpm__5=40, gpm__10=35, gpm__20=1500, gpm__21=700,
                            gpm__60=20000, gpm__61=25000))
    machine.update(gpu_keys(4, name="NVIDIA H100 80GB HBM3", uuid=UUID[4], pci_bus_id="00000000:0D:00.0", gpm=1,
                            mig_devices=sc.mig_slots(), rc__nvmlGpmSampleGet=sc.NOT_SUPPORTED))
    for gi, values in sc.MIG_GPM.items():
        machine.update(sc.gpm_keys(f"gpu.4.gi.{gi}.", values))
    return machine


IDLE_VRAM = 8 * GIB  # the idle holder's, a quarter of GPU 3 (a 32 GiB V100)


class IdleHolder:
    """A host process holding IDLE_VRAM on GPU 3 without any engine time (NVML lists it, with
    no utilization samples): the Waste and cost row's "VRAM held without work" and the
    ResmonGpuMemoryHeldIdle alert. A real child of the test, in the GpuUsers' procfs tree."""

    def __init__(self, procfs: Path) -> None:
        self.child = subprocess.Popen(["sleep", "3600"])
        self.pid = self.child.pid
        # Popen may return (vfork) before exec has renamed the child: its comm reads "python" until then
        wait_until("the idle holder exec'd", lambda: Path(f"/proc/{self.pid}/comm").read_text() == "sleep\n", 10)
        (procfs / str(self.pid)).mkdir()
        for name in ("comm", "status", "cgroup"):
            (procfs / str(self.pid) / name).write_text(Path(f"/proc/{self.pid}/{name}").read_text())

    def scenario(self) -> dict[str, Any]:
        return {"gpu.3.processes": f"{self.pid}:{IDLE_VRAM}"}

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait(5)


class Stack:
    def __init__(self, root: Path, lib: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.users = GpuUsers(root, (UUID[0], UUID[1]))
        self.idle = IdleHolder(self.users.procfs)
        machine = stack_machine()
        machine.pop("gpu.0.graphics_processes")
        self.scenario = Scenario(root / "scenario.txt", {**machine, **self.users.scenario(), **self.idle.scenario()})
        self.ticker = threading.Thread(target=self.tick, daemon=True)
        self.ticker.start()
        # slow values every 2 s: time compressed like the rules' 30 s windows (with the default
        # 30 s, an ECC increase can leave its window before the slowest other alert fires)
        self.exporter = Exporter(["--collect.cache-ttl=500ms", "--collect.slow-interval=2s", *self.users.args()],
                                 nvml_env(lib, self.scenario, Trace(root / "trace")))
        self.exporter.wait_listening()
        self.webhook = Webhook()
        threading.Thread(target=self.webhook.serve_forever, daemon=True).start()
        alertmanager_config(root / "am" / "alertmanager.yml", self.webhook, ["alertname"])
        self.am_port = self.start([need("prometheus-alertmanager"), f"--config.file={root / 'am' / 'alertmanager.yml'}",
                                   f"--storage.path={root / 'am' / 'data'}", "--cluster.listen-address="], "alertmanager")
        write_test_rules(root / "rules")  # short `for`, rate windows cut to 30 s
        (root / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": ["rules/*.yml"],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]},
            "scrape_configs": [{"job_name": "resmon", "static_configs": [{"targets": [f"127.0.0.1:{self.exporter.port}"]}]}],
        }))
        self.prom_port = self.start([need("prometheus"), f"--config.file={root / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={root / 'tsdb'}"], "prometheus")
        wait_until("5 scrapes in Prometheus",
                   lambda: self.query('count_over_time(up{job="resmon"}[1m]) >= 5 and up{job="resmon"} == 1'), 90)
        # XIDs reach only a registered event set (no replay): inject once the exporter watches
        wait_until("the XID watcher registered",
                   lambda: self.query('resmon_collector_success{collector="xid"} == 1'), 60)
        self.inject_xid(1, 13)  # an application's XID: panels get data, nothing pages
        wait_until("the XID in Prometheus", lambda: self.query('resmon_gpu_xid_errors_total{xid="13"}'), 60)
        wait_until("the pod's process and allocations in Prometheus", lambda: self.query(
            'resmon_gpu_process_memory_used_bytes{pod="train-0"} and on (pod) resmon_gpu_allocation_info'), 60)

    def tick(self) -> None:
        """Counters that move: GPU 0's hardware thermal slowdown time, PCIe and NVLink bytes, and
        its energy at its power draw (350.5 W: the energy split per workload, Waste and cost)."""
        started = time.monotonic()
        while not self.stopping.wait(0.25):
            s = time.monotonic() - started
            self.update(**{"gpu.0.field.270": int(HW_THERMAL_SHARE * s * 1e9),
                           "gpu.0.energy_mj": 123456789 + int(350_500 * s),
                           "gpu.0.field.197": 10**11 + int(2e9 * s), "gpu.0.field.198": 5 * 10**10 + int(1e9 * s),
                           "gpu.0.nvlink.0.tx_kib": 1_000_000 + int(1e6 * s),
                           "gpu.0.nvlink.0.rx_kib": 2_000_000 + int(5e5 * s)})

    def update(self, **changes: Any) -> None:
        with self.lock:
            self.scenario.update(**changes)

    def inject_xid(self, gpu: int, code: int) -> None:
        """Appends to the cumulative xid_events list: the fake delivers each entry once."""
        with self.lock:
            events = [e for e in str(self.scenario.values.get("xid_events", "")).split(",") if e]
            self.scenario.update(xid_events=",".join([*events, f"{UUID[gpu]}:{code}"]))

    def alerts(self, name: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/alerts") or {"alerts": []}
        return [a for a in data["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def start(self, cmd: list[str], name: str) -> int:
        """Starts cmd on a port of the kernel's choosing, logging to <name>.log; its port."""
        proc, port = start_listening(cmd, self.root / f"{name}.log")
        self.procs.append(proc)
        return port

    def api(self, path: str, **params: str) -> Any:
        return PromApi(self.prom_port).api(path, **params)

    def query(self, expr: str) -> list[Any]:
        return PromApi(self.prom_port).query(expr)

    def stop(self) -> None:
        self.stopping.set()
        self.ticker.join(5)
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.webhook.shutdown()
        self.exporter.stop()
        self.users.stop()
        self.idle.stop()


@pytest.fixture(scope="module")
def stack(fake_libs, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"), fake_libs["current"])
    yield s
    s.stop()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_returns_data(stack, path):
    """Waits for data: the Waste and cost panels integrate recording rules over the range in
    15 s steps, aligned to multiples of 15 s, so they have data once such a step has passed
    since the rules' first evaluation."""
    empty: list[str] = []

    def all_answered() -> bool:
        empty[:] = [expr for expr in exprs(load(path)) if not stack.query(substitute(expr))]
        return not empty

    try:
        wait_until("every dashboard query answered", all_answered, 120)
    except AssertionError:
        raise AssertionError(f"{path.name}: queries without data: {empty}") from None


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_variables_have_values(stack, path):
    for v in load(path)["templating"]["list"]:
        if v["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert match, v["query"]
        selector, label = substitute(match.group(1)), match.group(2)
        data = stack.api("/api/v1/series", **{"match[]": selector})
        assert data and {s.get(label) for s in data} - {None}, (v["name"], selector)


def test_who_uses_the_gpu_panels_give_each_pod_its_own_vram(stack):
    """The new panels live: GPU 0 is time-sliced between train-0 (40 GiB in its process) and
    notebook-1 (no process), next to a host process (20 GiB); the device uses 76 GiB."""
    users = stack.users
    node = panel_exprs("resmon-node.json", "GPU allocations by pod")
    fleet = panel_exprs("resmon-fleet.json", "Pods by VRAM")

    def by(expr: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(r["metric"].get(l, "") for l in labels): float(r["value"][1]) for r in stack.query(expr)}

    pod_who, host_who = f"team-a/train-0 (trainer) pid {users.pod_pid}", f"sleep (pid {users.host_pid})"
    job_who = f"sleep (pid {users.job_pid}, job {JOB_ID})"
    (vram,) = panel_exprs("resmon-node.json", "VRAM by process").values()
    idle_who = f"sleep (pid {stack.idle.pid})"
    settle("VRAM by process", lambda: by(vram, "gpu", "who"),
           {("0", pod_who): POD_VRAM, ("0", host_who): HOST_VRAM, ("1", job_who): JOB_VRAM, ("3", idle_who): IDLE_VRAM})
    host = [r["metric"] for r in stack.query(vram) if r["metric"]["who"] == host_who]
    assert [(m["process"], m["user"], m.get("pod", "")) for m in host] == [("sleep", users.user, "")]
    (sm,) = panel_exprs("resmon-node.json", "SM utilization by process").values()
    settle("SM utilization by process", lambda: by(sm, "gpu", "who"),  # every sample says POD_SM / HOST_SM
           {("0", pod_who): POD_SM / 100, ("0", host_who): HOST_SM / 100, ("1", job_who): JOB_SM / 100,
            ("3", idle_who): 0})  # listed without samples: idle

    held = {("team-a", "train-0", "trainer", "0", f"{UUID[0]}::0"),
            ("team-b", "notebook-1", "lab", "0", f"{UUID[0]}::1"), ("team-b", "notebook-1", "lab", "1", UUID[1])}
    row = ("namespace", "pod", "container", "gpu", "device_id")
    assert set(by(node["A"], *row)) == held
    assert by(node["B"], *row) == {("team-a", "train-0", "trainer", "0", f"{UUID[0]}::0"): POD_VRAM}
    device = {r["metric"]["gpu"]: float(r["value"][1]) for r in stack.query("resmon_gpu_memory_used_bytes")}
    assert device["0"] == 76 * GIB
    assert by(node["C"], *row) == {r: device[r[3]] for r in held}  # labelled the device's, the same on both pods

    settle("Pods by VRAM", lambda: by(fleet["A"], "namespace", "pod"), {("team-a", "train-0"): POD_VRAM})
    settle("Pods by VRAM: SM", lambda: by(fleet["B"], "namespace", "pod"), {("team-a", "train-0"): POD_SM / 100})
    assert by(fleet["C"], "namespace", "pod") == {("team-a", "train-0"): 1, ("team-b", "notebook-1"): 2}


def test_slurm_jobs_table_shows_the_job_on_its_gpu(stack):
    """The Slurm jobs panel live: job JOB_ID's one process holds JOB_VRAM on GPU 1; the host
    and pod processes on GPU 0 are in no job, so GPU 0 has no row."""
    users = stack.users
    jobs = panel_exprs("resmon-node.json", "Slurm jobs")

    def by(expr: str) -> dict[tuple[str, ...], float]:
        return {tuple(r["metric"].get(l, "") for l in ("gpu", "uuid", "job_id", "user", "scheduler")): float(r["value"][1])
                for r in stack.query(expr)}

    row = ("1", UUID[1], JOB_ID, users.user, "slurm")
    settle("Slurm jobs", lambda: by(jobs["A"]), {row: 1})
    assert by(jobs["B"]) == {row: JOB_VRAM}
    settle("Slurm jobs: SM", lambda: by(jobs["C"]), {row: JOB_SM / 100})
    # the whole GPU's busy share, the job's on a GPU it has to itself
    busy = wait_until("Slurm jobs: GPU busy", lambda: (b := by(jobs["D"])) and abs(b.get(row, -1) - GPU1_BUSY / 100) < 0.05 and b, 60)
    assert list(busy) == [row]


def test_vram_pressure_alert_fires_and_is_delivered(stack):
    def firing():
        data = stack.api("/api/v1/alerts") or {"alerts": []}
        return [a for a in data["alerts"] if a["labels"]["alertname"] == "ResmonGpuVramPressure" and a["state"] == "firing"]

    alerts = wait_until("ResmonGpuVramPressure firing in Prometheus", firing, 60)
    assert {a["labels"]["gpu"] for a in alerts} == {"0"}
    assert alerts[0]["labels"]["severity"] == "warning"
    # written out, not re-derived: 76 GiB used + 0.5 GiB reserved of 80 GiB is 95.625 %, which
    # humanizePercentage prints as 95.62%
    instance = f"127.0.0.1:{stack.exporter.port}"
    assert alerts[0]["annotations"]["summary"] == f"GPU 0 on {instance} has used 95.62% of its VRAM"
    # the largest holder on the GPU, from the per-process series: the pod, named by the kubelet's
    # pod log directory (its UID from the process's cgroup) and the container holding the GPU
    assert alerts[0]["annotations"]["description"] == (
        "VRAM in use (driver-reserved included) has been above 90 % for 5 minutes on GPU 0 "
        "(GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000000). New allocations may fail soon. "
        "Largest VRAM holder: pod team-a/train-0 (container trainer), 40GiB.")

    def delivered():
        return [a for p in stack.webhook.payloads for a in p["alerts"]
                if a["labels"]["alertname"] == "ResmonGpuVramPressure" and a["status"] == "firing"]

    got = wait_until("the alert at the webhook receiver", delivered, 60)
    assert got[0]["labels"]["gpu"] == "0" and got[0]["labels"]["uuid"] == "GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000000"
    assert got[0]["annotations"] == alerts[0]["annotations"]  # delivered as Prometheus rendered it


# -- health alerts, live -------------------------------------------------------------------------

# alert -> the (gpu, extra label) it fires for on stack_machine() after the changes in
# test_health_alerts_fire_in_prometheus; every other GPU is a quiet case of the same alert
HEALTH_FIRING = {
    "ResmonGpuRowRemapPending": {("0", None)},
    "ResmonGpuRowRemapFailed": {("1", None)},
    "ResmonGpuRetiredPagesPending": {("3", None)},
    "ResmonGpuRecoveryAction": {("1", None)},
    "ResmonGpuEccUncorrectable": {("3", None)},
    "ResmonGpuNvlinkDown": {("0", "3")},  # link 3 went down; link 2 was never up
    "ResmonGpuPcieGenerationDegraded": {("0", None)},  # GPU 1 is as low but under 50 % busy
    "ResmonGpuPcieWidthDegraded": {("2", None)},
    "ResmonGpuHwThermalSlowdown": {("0", None)},
    "ResmonGpuPowerBrake": {("1", None)},
    "ResmonGpuXidWarning": {("3", "94")},  # not GPU 1's XID 13
}
EXTRA = {"ResmonGpuNvlinkDown": "link", "ResmonGpuXidWarning": "xid"}
LIVE = set(HEALTH_FIRING) | {"ResmonGpuXidCritical", "ResmonHealthCollectorFailing"}


def v2_families() -> set[str]:
    """The families of docs/metrics.md's v2 collector sections ("... (collector `NAME` ...)")."""
    names: set[str] = set()
    v2 = False
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("#"):
            v2 = "collector `" in line
        elif v2 and (cell := re.match(r"^\|([^|]*)\|", line)):
            names |= set(re.findall(r"`(resmon_[a-z0-9_]+)`", cell.group(1)))
    return names


def test_every_alert_on_a_v2_family_is_proven_live():
    v2 = v2_families()
    assert {"resmon_gpu_xid_errors_total", "resmon_gpu_nvlink_active", "resmon_gpu_clock_event_seconds_total"} <= v2
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    on_v2 = {r["alert"] for r in rules if set(re.findall(r"resmon_[a-z0-9_]+", r["expr"])) & v2}
    on_v2 |= {r["alert"] for r in rules if re.search(r'collector=~"[^"]*health', r["expr"])}
    assert on_v2 == LIVE, (on_v2 - LIVE, LIVE - on_v2)


def test_health_alerts_fire_in_prometheus(stack):
    stack.update(**{"gpu.3.ecc.uncorrected.volatile": 2, "gpu.3.ecc.uncorrected.aggregate": 3,
                    "gpu.0.nvlink.3.active": 0})
    stack.inject_xid(3, 94)

    def fired() -> dict[str, set[tuple[str, str | None]]]:
        return {name: {(a["labels"]["gpu"], a["labels"].get(EXTRA.get(name, ""))) for a in stack.alerts(name)}
                for name in HEALTH_FIRING}

    try:
        wait_until("every health alert firing", lambda: all(fired().values()), 90)
    except AssertionError:
        raise AssertionError(f"not firing: {[name for name, got in fired().items() if not got]}") from None
    time.sleep(3)  # the quiet GPUs had as long to fire, with `for` at 2s
    assert fired() == HEALTH_FIRING
    assert not [a for name in ("ResmonGpuXidCritical", "ResmonGpuXidWarning") for a in stack.alerts(name)
                if a["labels"]["xid"] == "13"]

    instance = f"127.0.0.1:{stack.exporter.port}"
    recovery = stack.alerts("ResmonGpuRecoveryAction")[0]
    assert recovery["annotations"]["summary"] == f"GPU 1 on {instance} needs a GPU reset"
    ecc = stack.alerts("ResmonGpuEccUncorrectable")[0]
    assert ecc["labels"]["type"] == "uncorrected" and ecc["labels"]["scope"] == "volatile"
    assert ecc["annotations"]["description"] == (
        f"The uncorrectable ECC error count of GPU 3 ({UUID[3]}) rose in the last 10 minutes, to 2 since the driver "
        "loaded. Data on the GPU may be corrupt; the jobs that hit the error were stopped.")
    # GPU 0's from its counter (0.5 s/s; less while the series is younger than the window), not
    # its reason bit, which is set too and would read 1; GPU 1's from the bit
    thermal = stack.alerts("ResmonGpuHwThermalSlowdown")[0]
    assert 0.1 < float(thermal["value"]) <= HW_THERMAL_SHARE + 0.05, thermal["value"]
    assert float(stack.alerts("ResmonGpuPowerBrake")[0]["value"]) == 1
    link = stack.alerts("ResmonGpuNvlinkDown")[0]
    assert link["annotations"]["summary"] == f"NVLink 3 of GPU 0 on {instance} is down"


def test_first_critical_xid_fires_and_is_delivered(stack):
    stack.inject_xid(0, 79)  # GPU 0's first XID ever: its series appears with this event
    alerts = wait_until("ResmonGpuXidCritical firing", lambda: stack.alerts("ResmonGpuXidCritical"), 60)
    assert [(a["labels"]["gpu"], a["labels"]["xid"]) for a in alerts] == [("0", "79")]
    # increase() alone cannot see it: the series' first sample is the event
    assert stack.query('increase(resmon_gpu_xid_errors_total{xid="79"}[10m]) > 0') == []
    instance = f"127.0.0.1:{stack.exporter.port}"
    assert alerts[0]["labels"]["severity"] == "critical"
    assert alerts[0]["annotations"] == {
        "summary": f"GPU 0 on {instance} reported hardware XID 79",
        "description": f"NVML reported XID 79 on GPU 0 ({UUID[0]}) in the last 10 minutes: a hardware, firmware or "
                       "NVLink fault (48, 62, 64, 74, 79, 95, 119, 120). Jobs on this GPU have likely failed.",
        "runbook": "Drain the GPU; read the Xid line in dmesg and nvidia-smi -q; reset the GPU (nvidia-smi -r) or "
                   "reboot the node, and RMA a board that repeats it.",
    }

    def delivered():
        return [a for p in stack.webhook.payloads for a in p["alerts"]
                if a["labels"]["alertname"] == "ResmonGpuXidCritical" and a["status"] == "firing"]

    got = wait_until("the XID alert at the webhook receiver", delivered, 60)
    assert got[0]["labels"]["uuid"] == UUID[0] and got[0]["labels"]["xid"] == "79"
    assert got[0]["annotations"] == alerts[0]["annotations"]


def test_waste_alerts_fire_on_idle_holders_and_not_on_busy_ones(stack):
    """ResmonGpuAllocatedIdle and ResmonGpuMemoryHeldIdle live. GPU 1 goes idle: its sample
    buffers read 0 on every engine and the Slurm job's process samples 0. Then team-b/notebook-1
    (holds GPU 1, runs nothing) and Slurm job JOB_ID (its process on GPU 1) are idle; notebook-1
    is idle on GPU 0 too (no process of its own there: its own busy time counts, not the busy
    device's); team-a/train-0 keeps GPU 0 busy (POD_SM) and stays quiet. The job's idle process
    holding JOB_VRAM (over 10 % of GPU 1) fires ResmonGpuMemoryHeldIdle, as the IdleHolder on
    GPU 3 does all along; the busy processes (HOST_VRAM, POD_VRAM) stay quiet."""
    users = stack.users
    instance = f"127.0.0.1:{stack.exporter.port}"
    idle = {f"gpu.1.samples.{engine}": 0 for engine in ("gpu", "memory", "encoder", "decoder")}
    stack.update(**idle, **{"gpu.1.process_util": f"{users.job_pid}:0:0:0:0"})
    try:
        # the processes' own busy time counts: the exporter serves it for every listed process
        wait_until("per-process busy series", lambda: stack.query("resmon_gpu_process_busy_seconds_total"), 30)

        def holders(name: str) -> set[tuple[str, str]]:
            return {(a["labels"]["gpu"], a["labels"].get("pod") or f"job {a['labels'].get('job_id')}")
                    for a in stack.alerts(name)}

        expected = {("1", "notebook-1"), ("1", f"job {JOB_ID}"), ("0", "notebook-1")}
        settle("ResmonGpuAllocatedIdle firing", lambda: holders("ResmonGpuAllocatedIdle"), expected, 90)
        alerts = {(a["labels"]["gpu"], a["labels"].get("pod", "")): a for a in stack.alerts("ResmonGpuAllocatedIdle")}
        job = alerts[("1", "")]
        assert job["labels"]["job_id"] == JOB_ID and job["labels"]["user"] == users.user
        assert job["annotations"]["summary"] == f"GPU 1 on {instance} is held by Slurm job {JOB_ID} of {users.user} and idle"
        pod = alerts[("1", "notebook-1")]
        assert pod["labels"]["namespace"] == "team-b" and set(pod["labels"]) == {
            "alertname", "severity", "job", "instance", "gpu", "uuid", "namespace", "pod"}
        assert pod["annotations"]["description"] == (
            f"Pod team-b/notebook-1 holds GPU 1 ({UUID[1]}) and has kept it under 5 % busy for an hour (now 0%): its "
            "own processes' busy time where the exporter reports it per process, else the whole GPU's.")
        assert float(pod["value"]) == 0
        # the busy pod next to them: its share is its own processes' (or the device's), well over 5 %
        train = stack.query('resmon:gpu_pod_busy:ratio_rate5m{pod="train-0"}')
        assert len(train) == 1 and float(train[0]["value"][1]) > 0.3, train
        assert ("0", "train-0") not in holders("ResmonGpuAllocatedIdle")

        settle("ResmonGpuMemoryHeldIdle firing",
               lambda: {(a["labels"]["gpu"], a["labels"].get("pid", "")) for a in stack.alerts("ResmonGpuMemoryHeldIdle")},
               {("1", str(users.job_pid)), ("3", str(stack.idle.pid))}, 60)
        (zombie,) = [a for a in stack.alerts("ResmonGpuMemoryHeldIdle") if a["labels"]["gpu"] == "1"]
        assert zombie["annotations"]["summary"] == (
            f"Process sleep (pid {users.job_pid}) holds {JOB_VRAM // GIB}GiB of GPU 1 on {instance} and does nothing")
        assert zombie["annotations"]["description"] == (
            f"Process sleep (pid {users.job_pid}, user {users.user}) in Slurm job {JOB_ID} has held "
            f"{JOB_VRAM // GIB}GiB (over 10 % of the VRAM) of GPU 1 ({UUID[1]}) with no engine time at all for an "
            "hour: memory nobody else can use.")
    finally:
        stack.update(**{**{key: None for key in idle}, "gpu.1.samples.gpu": GPU1_BUSY,
                        "gpu.1.process_util": users.scenario()["gpu.1.process_util"]})


def test_health_collector_failing_fires(stack):
    """Last in the module: the XID watcher stays broken until the rc is lifted."""
    assert stack.query('resmon_collector_success{collector=~"health|xid|nvlink"} == 1') != []
    assert stack.alerts("ResmonHealthCollectorFailing") == []
    stack.update(**{"rc.nvmlEventSetWait_v2": 999})
    try:
        alerts = wait_until("ResmonHealthCollectorFailing firing",
                            lambda: stack.alerts("ResmonHealthCollectorFailing"), 60)
        assert [a["labels"]["collector"] for a in alerts] == ["xid"]
    finally:
        stack.update(**{"rc.nvmlEventSetWait_v2": None})
