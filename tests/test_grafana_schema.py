"""The dashboards type-checked against Grafana's own schema, offline: the `@grafana/schema`
TypeScript types (the package Grafana's frontend is built with) and `tsc`, pinned in
tests/grafana-schema/package-lock.json and installed by this test with `npm ci` into
tests/grafana-schema/node_modules (git-ignored), once until the lock file changes.

What it catches that tests/test_stack.py does not: keys Grafana does not know (a misspelt
option is silently ignored by Grafana, and the JSON still loads), values of the wrong type,
enum values Grafana does not have (a threshold mode, a legend placement, a tooltip mode),
required fields left out (a dashboard link's `icon`), per panel type (timeseries, stat,
bargauge, table, state-timeline options and field config). It does not run queries: the
live stack does that.

node and npm are needed: with CI=true a missing one fails; elsewhere it is skipped with the
reason shown (`pytest -rs`)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fakenvml import REPO

PKG = REPO / "tests" / "grafana-schema"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
# the panel types schema.ts knows; a dashboard with another type fails here until it is added
PANEL_TYPES = {"timeseries", "stat", "bargauge", "table", "state-timeline"}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} missing: the Grafana schema check needs node and npm (Debian: apt-get install nodejs npm)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def installed() -> Path:
    """tests/grafana-schema/node_modules as package-lock.json pins it: `npm ci` the first
    time and after the lock changes (a stamp holds the lock's hash), under a file lock so
    that parallel workers install once."""
    npm = tool("npm")
    tool("node")
    lock_hash = hashlib.sha256((PKG / "package-lock.json").read_bytes()).hexdigest()
    stamp = PKG / "node_modules" / ".resmon-lock-sha256"
    with open(PKG / ".install.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == lock_hash):
            done = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=PKG,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"npm ci failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            stamp.write_text(lock_hash)
    return PKG / "node_modules"


def typescript(dashboard: dict[str, Any], name: str) -> str:
    """The dashboard as a typed object literal, and each panel but rows again, typed by its panel type."""
    lines = ["import type { CheckedDashboard, CheckedPanel } from '../../schema';",
             f"// {name}", f"export const dashboard: CheckedDashboard = {json.dumps(dashboard, indent=2)};"]
    panels = [p for top in dashboard.get("panels", []) for p in (top, *top.get("panels", []))]
    for p in panels:
        kind = p.get("type")
        if kind == "row":  # the dashboard's own type checks rows
            continue
        assert kind in PANEL_TYPES, f"{name}: panel {p.get('title')!r} has type {kind!r}, which schema.ts does not map"
        lines.append(f"export const panel_{p['id']}: CheckedPanel<{json.dumps(kind)}> = {json.dumps(p, indent=2)};")
    return "\n".join(lines) + "\n"


def type_check(dashboards: dict[str, dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """tsc --noEmit over the dashboards (file name -> JSON), in a fresh directory under
    tests/grafana-schema/build (there, so that @grafana/schema resolves from node_modules)."""
    node = tool("node")
    modules = installed()
    (PKG / "build").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=PKG / "build"))
    try:
        files = []
        for name, dashboard in dashboards.items():
            ts = work / (Path(name).stem.replace("-", "_") + ".ts")
            ts.write_text(typescript(dashboard, name))
            files.append(ts.name)
        (work / "tsconfig.json").write_text(json.dumps({
            "compilerOptions": {"strict": True, "noEmit": True, "module": "esnext", "moduleResolution": "bundler",
                                "target": "es2022", "skipLibCheck": True, "types": []},
            "files": files,
        }))
        return subprocess.run([node, str(modules / "typescript" / "bin" / "tsc"), "-p", str(work), "--pretty", "false"],
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_every_dashboard_matches_grafanas_schema():
    result = type_check({p.name: json.loads(p.read_text()) for p in DASHBOARDS})
    assert result.returncode == 0, result.stdout + result.stderr


def first_panel(dashboard: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for top in dashboard["panels"] for p in (top, *top.get("panels", [])) if p["type"] == kind)


@pytest.mark.parametrize("break_it, error", [
    # a misspelt option: Grafana ignores it, so the legend silently stays where it was
    (lambda d: first_panel(d, "timeseries")["options"]["legend"].update(placment="right"), "placment"),
    # a tooltip mode Grafana does not have
    (lambda d: first_panel(d, "timeseries")["options"]["tooltip"].update(mode="all"), '"all"'),
    # a threshold mode that is not "absolute" or "percentage"
    (lambda d: first_panel(d, "stat")["fieldConfig"]["defaults"]["thresholds"].update(mode="absolut"), '"absolut"'),
    # a table option of the wrong type
    (lambda d: first_panel(d, "table")["options"].update(showHeader="yes"),
     "Type 'string' is not assignable to type 'boolean | undefined'"),
    # a dashboard-level key of the wrong type
    (lambda d: d.update(refresh=30), "Type 'number' is not assignable to type 'string"),
], ids=["misspelt-option", "unknown-enum-value", "threshold-mode", "wrong-type", "dashboard-field"])
def test_the_check_fails_on_a_broken_panel(break_it, error):
    dashboard = json.loads((REPO / "dashboards" / "resmon-fleet.json").read_text())
    break_it(dashboard)
    result = type_check({"broken.json": dashboard})
    assert result.returncode != 0, "tsc accepted a broken dashboard"
    assert "error TS" in result.stdout and error in result.stdout, result.stdout + result.stderr
