"""The dashboards and alerts on an Intel host, with the real Prometheus: an exporter on a fake
sysfs with three Intel GPUs (integrated Xe, Arc A770 on i915, Data Center GPU Max on xe) and a
fake procfs with two GPU clients whose engine time grows, scraped every second with the
shipped rules (test copy: short windows). Every dashboard query runs; each one that reads only
families an Intel host exports returns data; no alert fires on the healthy host; the per-process
and busy-time series match the fdinfo the kernel would give."""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from fake_fdinfo import FakeProc, i915_client, xe_client
from fake_intel import intel_host
from fake_sysfs import GIB, FakeSysfs
from fakenvml import REPO, Exporter
from promstack import PromApi, exprs, load, need, start_listening, stop_all, substitute, wait_until, write_test_rules

pytestmark = pytest.mark.e2e

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
# series this host cannot have: pods (no kubelet here), and NVIDIA's own label values (the SM
# engine and clock, the "gpu" busy engine; Intel's engines are render, copy, video, compute)
NOT_HERE = ('pod!=""', 'engine="sm"', 'engine="gpu"', 'clock="sm"')
A770, MAX = "0000:03:00.0", "0000:3a:00.0"
TRAINER, RENDERER = 4242, 4343  # xe client on the Max, i915 client on the A770
RENDER_SHARE, RCS_SHARE = 0.5, 0.25  # how busy the clients keep their engines


class IntelStack:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys = FakeSysfs(root / "sys")
        intel_host(self.sys)
        self.proc = FakeProc(root / "proc")
        self.proc.add_process(1, comm="systemd", uid=0)
        self.proc.add_process(TRAINER, comm="python3", uid=1000)
        self.proc.add_process(RENDERER, comm="blender", uid=1001)
        self.started = time.monotonic()
        self._write_clients(0.0)
        self.stopping = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        self.ticker.start()
        no_nvml = root / "no-nvml"
        no_nvml.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESMON_")}
        env.update(LD_LIBRARY_PATH=str(no_nvml), PYTHONUNBUFFERED="1")
        self.exporter = Exporter([f"--path.sysfs={self.sys.root}", f"--path.procfs={self.proc.root}",
                                  "--collector.processes", "--no-collector.kubernetes", "--collect.cache-ttl=500ms"], env)
        self.exporter.wait_listening()
        self.exporter.wait_ready()
        write_test_rules(root / "rules")
        (root / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": ["rules/*.yml"],
            "scrape_configs": [{"job_name": "resmon", "static_configs": [{"targets": [f"127.0.0.1:{self.exporter.port}"]}]}],
        }))
        prometheus, self.port = start_listening([need("prometheus"), f"--config.file={root / 'prometheus.yml'}",
                                                 f"--storage.tsdb.path={root / 'tsdb'}"], root / "prometheus.log")
        self.procs = [prometheus]
        self.api = PromApi(self.port)
        wait_until("5 scrapes in Prometheus",
                   lambda: self.api.query('count_over_time(up{job="resmon"}[1m]) >= 5 and up{job="resmon"} == 1'), 90)
        wait_until("a busy rate in Prometheus", lambda: self.api.query(
            'rate(resmon_gpu_busy_seconds_total{engine="render"}[30s]) > 0'), 60)

    def _write_clients(self, seconds: float) -> None:
        # fd 5 and 6 of the trainer are one client (dup'd): counted once
        trainer = xe_client(MAX, 7, rcs_cycles=int(RCS_SHARE * seconds * 1e9) + 1000, rcs_total=int(seconds * 1e9) + 4000,
                            vram0_bytes=12 * GIB)
        renderer = i915_client(A770, 3, render_ns=int(RENDER_SHARE * seconds * 1e9), local0_bytes=2 * GIB)
        for pid, fd, text in ((TRAINER, 5, trainer), (TRAINER, 6, trainer), (RENDERER, 9, renderer)):
            if seconds == 0.0:
                self.proc.add_drm_fd(pid, fd, text)
            else:
                self.proc.set_fdinfo(pid, fd, text)
        energy = int(1e11 + 150e6 * seconds)  # 150 W on the A770
        self.sys.set(A770, "hwmon:energy1_input", str(energy))

    def _tick(self) -> None:
        while not self.stopping.wait(0.25):
            self._write_clients(time.monotonic() - self.started)

    def stop(self) -> None:
        self.stopping.set()
        self.ticker.join(5)
        stop_all(self.procs)
        self.exporter.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntelStack]:
    s = IntelStack(tmp_path_factory.mktemp("intel-stack"))
    yield s
    s.stop()


def families(text: str) -> set[str]:
    """The names of the series in a scrape (a family without samples, e.g. no Slurm job, is not exported)."""
    return {m[1] for m in re.finditer(r"^([a-z_:][a-z0-9_:]*)[{ ]", text, re.M)}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_runs_and_those_of_exported_families_have_data(stack: IntelStack, path: Path) -> None:
    exported = families(stack.exporter.scrape().text)
    assert {"resmon_gpu_energy_joules_total", "resmon_gpu_busy_seconds_total", "resmon_gpu_clock_hertz"} <= exported
    expected, empty = [], []
    for expr in exprs(load(path)):
        query = substitute(expr)
        result: Any = stack.api.api("/api/v1/query", query=query)  # a query Prometheus rejects fails here
        names = set(re.findall(r"\bresmon_[a-z0-9_]+\b", query))
        if any(n in query for n in NOT_HERE):
            continue
        if names and names <= exported and ":" not in re.sub(r"\[[^\]]*\]|\"[^\"]*\"", "", query):
            expected.append(expr)
            if not result["result"]:
                empty.append(expr)
    assert len(expected) >= 10, expected  # the GPU panels are among them, not a vacuous check
    assert empty == [], f"{path.name}: queries of families the Intel host exports, without data: {empty}"


def evaluated_since(stack: IntelStack, since: float) -> bool:
    """Every rule group evaluated after `since` (Unix time)."""
    groups = (stack.api.api("/api/v1/rules") or {"groups": []})["groups"]
    stamps = [datetime.strptime(g["lastEvaluation"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
              for g in groups]
    return bool(stamps) and min(stamps) > since


def test_no_alert_fires_on_a_healthy_intel_host(stack: IntelStack) -> None:
    # the test rules' `for` is 2 s and their windows 30 s: 10 s of evaluations with data is enough to fire
    since = time.time() + 10
    wait_until("10 s of rule evaluations", lambda: evaluated_since(stack, since), 60)
    firing = stack.api.query('ALERTS{alertstate=~"firing|pending"}')
    assert firing == [], [a["metric"] for a in firing]


def test_who_uses_the_gpu_and_how_busy_from_fdinfo(stack: IntelStack) -> None:
    def one(expr: str) -> float:
        result = stack.api.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    assert one(f'resmon_gpu_process_memory_used_bytes{{pid="{TRAINER}",gpu="2"}}') == 12 * GIB  # one client, two fds
    assert one(f'resmon_gpu_process_memory_used_bytes{{pid="{RENDERER}",gpu="1",process="blender"}}') == 2 * GIB
    assert one('resmon_gpu_memory_total_bytes{gpu="2"}') == 128 * GIB
    wait_until("the render engine's rate near its share", lambda: abs(one(
        'rate(resmon_gpu_busy_seconds_total{gpu="1",engine="render"}[20s])') - RENDER_SHARE) < 0.1, 60)
    wait_until("the xe render engine's rate near its share", lambda: abs(one(
        'rate(resmon_gpu_busy_seconds_total{gpu="2",engine="render"}[20s])') - RCS_SHARE) < 0.1, 60)
    wait_until("the A770's power from its energy counter", lambda: abs(one('resmon_gpu_power_watts{gpu="1"}') - 150) < 15, 60)
