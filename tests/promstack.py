"""Pieces shared by the tests (and benchmarks) that run a real Prometheus and Alertmanager
against real exporters: tool lookup, ports, the webhook receiver, waiting, the dashboards'
queries with their variables substituted, and the test copy of the rules."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from fakenvml import REPO

RULES = REPO / "prometheus" / "rules" / "resmon.rules.yml"
# every rules file the compose stack loads (rule_files: rules/*.yml): the main one, the waste one
RULE_FILES = sorted((REPO / "prometheus" / "rules").glob("*.yml"))
VARIABLE_VALUES = {"$job": ".*", "$instance": ".*", "$gpu": ".*", "$__rate_interval": "1m", "$__interval": "15s",
                   "$__range": "1h", "$price_gpu_hour": "2.5", "$price_kwh": "0.15"}


def need(tool: str) -> str:
    """The path of a Debian tool; a missing one fails (scripts/test.sh installs them), never skips."""
    path = shutil.which(tool)
    if path is None:
        import pytest

        pytest.fail(f"{tool} missing: scripts/test.sh installs it from Debian")
    return path


# -- dashboards ---------------------------------------------------------------------------


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
    # $1, $2 are label_replace's capture groups: Grafana leaves a "$name" that is no variable as it is
    assert not re.search(r"\$(?!\d)", expr), expr
    return expr


def panel_targets(path: Path) -> list[tuple[str, str, str, bool]]:
    """(panel title, refId, query with the variables substituted, instant?) of every target."""
    return [(p["title"], t["refId"], substitute(t["expr"]), bool(t.get("instant")))
            for p in panels(load(path)) for t in p.get("targets", [])]


# -- rules -----------------------------------------------------------------------------------


def recording_rules(path: Path = RULES) -> dict[str, str]:
    """record name -> expression."""
    return {r["record"]: r["expr"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]
            if "record" in r}


def write_test_rules(directory: Path, for_: str = "2s") -> Path:
    """A test copy of every rules file (RULE_FILES) with short `for`, so alerts fire within the
    test, and rate windows of minutes cut to 30 s: rate() divides by the whole window, so over
    [10m] a series a minute old would read a tenth of its real rate (the 6 h NVLink memory
    stays). Returns the copy of the main file; load directory/*.yml for all of them."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in RULE_FILES:
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = for_
                rule["expr"] = re.sub(r"\[(?:[1-9]|10)m\]", "[30s]", rule["expr"])
        (directory / path.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    return directory / RULES.name


# -- processes and HTTP --------------------------------------------------------------------


# what Prometheus and Alertmanager (exporter-toolkit) log once bound: the address itself
LISTENING = re.compile(r'msg="Listening on" address=\S*:(\d+)')


def start_listening(cmd: list[str], log_path: Path, timeout: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start a Prometheus or Alertmanager on 127.0.0.1 port 0 and return it with the port the
    kernel gave it (its "Listening on" line). Not a port found free first and bound later: on
    parallel workers another test's server or client can take it in between."""
    proc = start_logged([*cmd, "--web.listen-address=127.0.0.1:0"], log_path)

    def port() -> int | None:
        log = log_path.read_text(errors="replace")
        match = LISTENING.search(log)
        if match is None and proc.poll() is not None:
            raise AssertionError(f"{cmd[0]} exited with {proc.returncode} before listening: {log[-2000:]}")
        return int(match.group(1)) if match else None

    try:
        return proc, wait_until(f"{Path(cmd[0]).name} listening", port, timeout)
    except BaseException:
        stop_all([proc])
        raise


class Webhook(http.server.ThreadingHTTPServer):
    """Alertmanager's webhook receiver: keeps every payload."""

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

    def alerts(self, name: str, status: str = "firing") -> list[dict[str, Any]]:
        return [a for p in self.payloads for a in p["alerts"]
                if a["labels"]["alertname"] == name and a["status"] == status]


def alertmanager_config(path: Path, webhook: Webhook, group_by: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "route": {"receiver": "hook", "group_by": group_by, "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": f"http://127.0.0.1:{webhook.server_address[1]}/alerts", "send_resolved": False}]}],
    }))
    return path


def wait_until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def settle(what: str, fetch: Any, expected: Any, timeout: float = 60) -> None:
    """Waits until fetch() == expected; the failure shows the last answer."""
    got: list[Any] = []
    try:
        wait_until(what, lambda: got.append(fetch()) or got[-1] == expected, timeout)
    except AssertionError:
        raise AssertionError(f"{what}: expected {expected}, last got {got[-1] if got else None}") from None


def http_json(url: str, timeout: float = 10) -> Any:
    """GET url and decode its JSON; None while the server is not answering."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.load(resp)
    except OSError:
        return None


class PromApi:
    """The HTTP API of a Prometheus server on 127.0.0.1."""

    def __init__(self, port: int) -> None:
        self.port = port

    def api(self, path: str, **params: str) -> Any:
        data = http_json(f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params, doseq=True)}")
        if data is None:
            return None
        assert data["status"] == "success", data
        return data["data"]

    def query(self, expr: str) -> list[Any]:
        data = self.api("/api/v1/query", query=expr)
        return data["result"] if data else []


def start_logged(cmd: list[str], log_path: Path) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop_all(procs: list[subprocess.Popen], timeout: float = 15) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
