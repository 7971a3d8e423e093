"""Dashboards, alert rules and the compose stack, proven against the real Debian Prometheus,
promtool and Alertmanager, with the real exporter running on the fake NVML."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakenvml import GIB, REPO, Exporter, Scenario, Trace, nvml_env
from scenarios import three_gpus

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
RULES = REPO / "prometheus" / "rules" / "resmon.rules.yml"
RULE_TESTS = REPO / "prometheus" / "tests" / "resmon.rules.test.yml"
VARIABLE_VALUES = {"$job": ".*", "$instance": ".*", "$gpu": ".*", "$__rate_interval": "1m", "$__interval": "15s",
                   "$__range": "1h"}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} missing: scripts/test.sh installs it from Debian")
    return path


def load_script(path: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    for var, value in sorted(VARIABLE_VALUES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


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
        if p["type"] != "table":
            expected = ("bytes" if "_bytes{" in first and "/" not in first else
                        "percentunit" if "_ratio{" in first or ("_bytes{" in first and "/" in first) else
                        "celsius" if "_celsius{" in first else
                        "watt" if "_watts{" in first else
                        "hertz" if "_hertz{" in first else None)
            if expected and not first.startswith(("count(", "sum(")):
                assert unit == expected, (p["title"], unit, expected)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_metric_names_exist_in_the_contract(path):
    known = contract_families() | {"up"}
    functions = {"sum", "count", "by", "or", "vector", "increase", "time", "rate", "max", "min", "avg", "label_values",
                 "and", "on", "group_left", "without"}
    for expr in exprs(load(path)):
        cleaned = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', "", expr)
        for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", cleaned):
            if name in functions or name in ("e6", "job", "instance", "gpu", "uuid") or re.fullmatch(r"e\d+", name):
                continue
            assert name in known, f"{path.name}: {name} in {expr!r} is not a contract family"


# -- alert rules ---------------------------------------------------------------------------


def test_rules_check_clean():
    result = subprocess.run([need("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    config = subprocess.run([need("promtool"), "check", "config", str(REPO / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def test_promtool_rule_unit_tests_pass_and_cover_every_alert():
    gen_tests = load_script(RULE_TESTS.parent / "generate.py", "rule_test_generator")
    assert RULE_TESTS.read_text() == gen_tests.document(), "run python prometheus/tests/generate.py"
    result = subprocess.run([need("promtool"), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    doc = yaml.safe_load(RULE_TESTS.read_text())
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    fired, quiet = set(), set()
    for group in doc["tests"]:
        assert group["interval"], "Prometheus 2.42 needs interval in every test group"
        for check in group.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired == alerts and quiet == alerts, (alerts - fired, alerts - quiet)


def test_rules_are_annotated():
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
                assert rule["labels"]["severity"] in ("warning", "critical")


# -- compose, image, provisioning ------------------------------------------------------------


def test_compose_file_is_valid_and_mounts_exist():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    result = subprocess.run([need("docker-compose"), "-f", str(REPO / "docker-compose.yml"), "--profile", "nogpu",
                             "--profile", "node", "config", "-q"], capture_output=True, text=True, timeout=120, cwd=REPO)
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


def test_dockerfile_runs_unprivileged_with_a_healthcheck():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim$", text, re.M)
    assert re.search(r"^USER 10001$", text, re.M)
    assert "HEALTHCHECK" in text and "/-/healthy" in text
    assert '.[gpu-tracker]' in text


def test_grafana_provisioning_matches_the_compose_mounts():
    ds = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "resmon-prometheus" and ds["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "resmon.yml").read_text())["providers"][0]
    grafana = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["grafana"]
    assert f"./dashboards:{provider['options']['path']}:ro" in grafana["volumes"]


# -- the live stack ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Webhook(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.payloads.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def wait_until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Stack:
    def __init__(self, root: Path, lib: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        machine = three_gpus()
        machine["gpu.0.memory_used"] = 76 * GIB  # 95.6 % of 80 GiB in use: VRAM pressure
        self.scenario = Scenario(root / "scenario.txt", machine)
        self.exporter = Exporter(["--collect.cache-ttl=500ms"], nvml_env(lib, self.scenario, Trace(root / "trace")))
        self.exporter.wait_listening()
        self.webhook = Webhook()
        threading.Thread(target=self.webhook.serve_forever, daemon=True).start()
        self.am_port, self.prom_port = free_port(), free_port()
        (root / "am").mkdir()
        (root / "am" / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                      "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [
                {"url": f"http://127.0.0.1:{self.webhook.server_address[1]}/alerts", "send_resolved": False}]}],
        }))
        self.start([need("prometheus-alertmanager"), f"--config.file={root / 'am' / 'alertmanager.yml'}",
                    f"--storage.path={root / 'am' / 'data'}", f"--web.listen-address=127.0.0.1:{self.am_port}",
                    "--cluster.listen-address="], "alertmanager")
        # a test copy of the rules with short `for`, so alerts fire within the test
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "2s"
        (root / "rules").mkdir()
        (root / "rules" / "resmon.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
        (root / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": ["rules/*.yml"],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]},
            "scrape_configs": [{"job_name": "resmon", "static_configs": [{"targets": [f"127.0.0.1:{self.exporter.port}"]}]}],
        }))
        self.start([need("prometheus"), f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.prom_port}"],
                   "prometheus")
        wait_until("5 scrapes in Prometheus",
                   lambda: self.query('count_over_time(up{job="resmon"}[1m]) >= 5 and up{job="resmon"} == 1'), 90)

    def start(self, cmd: list[str], name: str) -> None:
        log = open(self.root / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.prom_port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                data = json.load(resp)
        except OSError:
            return None
        assert data["status"] == "success", data
        return data["data"]

    def query(self, expr: str) -> list[Any]:
        data = self.api("/api/v1/query", query=expr)
        return data["result"] if data else []

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.webhook.shutdown()
        self.exporter.stop()


@pytest.fixture(scope="module")
def stack(fake_libs, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"), fake_libs["current"])
    yield s
    s.stop()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_returns_data(stack, path):
    empty = []
    for expr in exprs(load(path)):
        if not stack.query(substitute(expr)):
            empty.append(expr)
    assert empty == [], f"{path.name}: queries without data: {empty}"


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
    assert alerts[0]["annotations"]["description"] == (
        "VRAM in use (driver-reserved included) has been above 90 % for 5 minutes on GPU 0 "
        "(GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000000). New allocations may fail soon.")

    def delivered():
        return [a for p in stack.webhook.payloads for a in p["alerts"]
                if a["labels"]["alertname"] == "ResmonGpuVramPressure" and a["status"] == "firing"]

    got = wait_until("the alert at the webhook receiver", delivered, 60)
    assert got[0]["labels"]["gpu"] == "0" and got[0]["labels"]["uuid"] == "GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000000"
    assert got[0]["annotations"] == alerts[0]["annotations"]  # delivered as Prometheus rendered it
