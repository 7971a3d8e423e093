"""A fleet on one machine: many real exporters, each on its own fake GPUs, scenario file and
loopback port, found by a real Prometheus through file-based service discovery. Shared by
tests/test_fleet.py and benchmarks/fleet.py.

The nodes are described here (Node, Gpu) so that tests compute every expected value from the
same description the fake NVML is given."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from fakenvml import GIB, MIB, Exporter, Scenario, gpu_keys, nvml_env
from promstack import (PromApi, Webhook, alertmanager_config, http_json, need, start_listening, stop_all,
                       wait_until)
from scenarios import hopper_board

JOB = "resmon"
DRIVER_VERSION = "550.54.15"
# clock-event reason bits the dashboards do not count as throttling (gpu_idle,
# applications_clocks_setting, display_clock_setting)
NOT_THROTTLING = 0x1 | 0x2 | 0x100
SW_POWER_CAP = 0x4
# GPUs over 90 % VRAM: (node, gpu)
PRESSURE = {(7, 5), (19, 2), (22, 0)}
# nodes whose GPUs are H100 boards answering the health families (ECC, remapping, NVLink, XID) and GPM
HEALTH_NODES = {1, 13}
# the node whose GPU 0 is used by a pod and a host process (processes and kubernetes collectors)
PODS_NODE = 3
GPU_COUNTS = (1, 2, 4, 8)
MODELS = {  # GPUs per node -> (name, VRAM)
    1: ("NVIDIA L4", 24 * GIB),
    2: ("NVIDIA L4", 24 * GIB),
    4: ("NVIDIA A100-SXM4-40GB", 40 * GIB),
    8: ("NVIDIA H100 80GB HBM3", 80 * GIB),
}


@dataclass(frozen=True)
class Gpu:
    node: int
    index: int
    name: str
    memory_total: int
    memory_used: int
    memory_reserved: int
    util: int  # percent
    temperature: int
    power_mw: int
    power_limit_mw: int
    reasons: int
    health: bool  # an H100 board answering the health families

    @property
    def uuid(self) -> str:
        return f"GPU-f1ee7{self.node:03x}-0000-4000-8000-{self.index:012x}"

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x10 + self.index:02X}:00.0"

    @property
    def free(self) -> int:
        return max(0, self.memory_total - self.memory_used - self.memory_reserved)

    @property
    def vram_ratio(self) -> float:
        """As the dashboards and the recording rule compute it: 1 - free / total."""
        return 1 - float(self.free) / float(self.memory_total)

    @property
    def throttle_reasons(self) -> int:
        """Active reasons the dashboards count (of the 9 the fake supports)."""
        return bin(self.reasons & 0x1FF & ~NOT_THROTTLING).count("1")

    @property
    def sm_active(self) -> float | None:
        """GPM SM activity in percent: the H100 boards only (GPM, Hopper and newer)."""
        return 10 + (self.node * 8 + self.index) * 13 % 80 if self.health else None

    @property
    def tensor_active(self) -> float | None:
        return 5 + (self.node * 8 + self.index) * 11 % 60 if self.health else None

    def keys(self) -> dict[str, Any]:
        base = hopper_board(self.index) if self.health else {}
        if self.health:
            base.update(gpu_keys(self.index, gpm=1, gpm__2=self.sm_active, gpm__5=self.tensor_active))
        return {**base, **gpu_keys(
            self.index, name=self.name, uuid=self.uuid, pci_bus_id=self.pci_bus_id, memory_total=self.memory_total,
            memory_used=self.memory_used, memory_reserved=self.memory_reserved, util_gpu=self.util,
            temperature=self.temperature, power_mw=self.power_mw, power_limit_mw=self.power_limit_mw,
            power_management_limit_mw=self.power_limit_mw, clocks_event_reasons=self.reasons)}


@dataclass
class Node:
    index: int
    gpus: list[Gpu]
    pods: bool = False

    @property
    def name(self) -> str:
        return f"node-{self.index:02d}"

    def scenario(self) -> dict[str, Any]:
        values: dict[str, Any] = {"count": len(self.gpus), "driver_version": DRIVER_VERSION}
        for gpu in self.gpus:
            values.update(gpu.keys())
        return values


def fleet_nodes(count: int) -> list[Node]:
    """count nodes of 1, 2, 4 and 8 GPUs in turn, every value distinct per GPU."""
    nodes = []
    for n in range(count):
        gpus = GPU_COUNTS[n % len(GPU_COUNTS)]
        name, total = MODELS[gpus]
        health = n in HEALTH_NODES
        if health:
            name, total = "NVIDIA H100 80GB HBM3", 80 * GIB
        node = Node(n, [], pods=n == PODS_NODE)
        for i in range(gpus):
            share = 0.95 if (n, i) in PRESSURE else ((n * 8 + i) % 85 + 1) / 100  # 1 % .. 85 %
            used = int(total * share) // MIB * MIB
            if node.pods and i == 0:
                used = 70 * GIB  # the pod's and the host process' 60 GiB, and more
            node.gpus.append(Gpu(
                node=n, index=i, name=name, memory_total=total, memory_used=used, memory_reserved=256 * MIB,
                util=(n * 8 + i) * 7 % 101, temperature=30 + (n + i) % 50, power_mw=50_000 + 1000 * n + 10 * i,
                power_limit_mw=300_000 + 1000 * i, reasons=SW_POWER_CAP if (n + i) % 5 == 0 else 0x1, health=health))
        nodes.append(node)
    return nodes


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Member:
    node: Node
    scenario: Scenario
    exporter: Exporter
    users: Any = None  # GpuUsers on the pods node

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.exporter.port}"


@dataclass
class Fleet:
    """Exporters for nodes, then (optionally) Alertmanager with a webhook, then Prometheus
    with a file_sd target file listing the first `listed` nodes (all by default)."""

    root: Path
    lib: Path
    nodes: Sequence[Node]
    rules: Path | None = None
    alertmanager: bool = False
    listed: int | None = None
    interval: str = "1s"
    members: list[Member] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.targets = self.root / "targets" / "fleet.json"
        self.targets.parent.mkdir(parents=True, exist_ok=True)
        self.webhook: Webhook | None = None
        self.am_port = self.prom_port = 0
        self.stopping = threading.Event()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    # -- start ------------------------------------------------------------------------------

    def _start(self) -> None:
        for node in self.nodes:  # all at once: each spends its start-up importing, in parallel
            self.members.append(self._exporter(node))
        for m in self.members:
            m.exporter.wait_listening(60)
        for m in self.members:
            m.exporter.wait_ready(60)
        if any(m.users is not None for m in self.members):
            threading.Thread(target=self._restamp, daemon=True).start()
        self.write_targets(self.members[: self.listed])
        if self.alertmanager:
            self.webhook = Webhook()
            threading.Thread(target=self.webhook.serve_forever, daemon=True).start()
            config = alertmanager_config(self.root / "am" / "alertmanager.yml", self.webhook,
                                         ["alertname", "instance", "gpu"])
            alertmanager, self.am_port = start_listening(
                [need("prometheus-alertmanager"), f"--config.file={config}", f"--storage.path={self.root / 'am' / 'data'}",
                 "--cluster.listen-address="], self.root / "alertmanager.log")
            self.procs.append(alertmanager)
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "scrape_timeout": self.interval,
                       "evaluation_interval": self.interval},
            # no refresh_interval: the default 5 m, so a target added within the test can only
            # come from Prometheus watching the file
            "scrape_configs": [{"job_name": JOB, "file_sd_configs": [{"files": ["targets/*.json"]}]}],
        }
        if self.rules is not None:
            config["rule_files"] = [str(self.rules)]
        if self.alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]}
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.prometheus, self.prom_port = start_listening(
            [need("prometheus"), f"--config.file={self.root / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.root / 'tsdb'}"], self.root / "prometheus.log")
        self.procs.append(self.prometheus)
        self.prom = PromApi(self.prom_port)
        wait_until("Prometheus ready", self._ready, 60)

    def _ready(self) -> bool:
        if self.prometheus.poll() is not None:
            raise AssertionError(f"Prometheus exited: {(self.root / 'prometheus.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}/-/ready", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def _restamp(self) -> None:
        """The fake stamps process-utilization samples when it loads the scenario, and the
        exporter counts only samples newer than its last read: rewriting the pods node's
        scenario (unchanged) every 0.25 s keeps fresh samples coming, as a driver does."""
        while not self.stopping.wait(0.25):
            for m in self.members:
                if m.users is not None:
                    m.scenario.write(m.scenario.values)

    def _exporter(self, node: Node) -> Member:
        directory = self.root / node.name
        directory.mkdir(parents=True, exist_ok=True)
        values = node.scenario()
        args = ["--collect.cache-ttl=500ms"]
        users = None
        if node.pods:
            from gpu_users import GpuUsers

            users = GpuUsers(directory, (node.gpus[0].uuid, node.gpus[1].uuid))
            values.update(users.scenario())
            args += users.args()
        try:
            scenario = Scenario(directory / "scenario.txt", values)
            return Member(node, scenario, Exporter(args, nvml_env(self.lib, scenario)), users)
        except BaseException:
            if users is not None:  # not a member yet: stop() would not find its children
                users.stop()
            raise

    # -- use ----------------------------------------------------------------------------------

    def write_targets(self, members: Sequence[Member]) -> None:
        """Replaces the file_sd file atomically (rename), as Prometheus asks of writers."""
        groups = [{"targets": [m.instance], "labels": {"node": m.node.name}} for m in members]
        tmp = self.targets.with_name(self.targets.name + ".tmp")  # not matched by *.json
        tmp.write_text(json.dumps(groups, indent=1))
        os.replace(tmp, self.targets)

    def query(self, expr: str) -> list[Any]:
        return self.prom.query(expr)

    def active_targets(self) -> dict[str, str]:
        """node label -> health of every active target of the job."""
        data = self.prom.api("/api/v1/targets", state="active") or {"activeTargets": []}
        return {t["labels"].get("node", "?"): t["health"] for t in data["activeTargets"]
                if t["labels"].get("job") == JOB}

    def member(self, node: int) -> Member:
        return next(m for m in self.members if m.node.index == node)

    def am_alerts(self, name: str) -> list[dict[str, Any]]:
        """Active alerts of that name in Alertmanager (API v2)."""
        import urllib.parse

        url = (f"http://127.0.0.1:{self.am_port}/api/v2/alerts?"
               + urllib.parse.urlencode({"filter": f'alertname="{name}"', "active": "true"}))
        return http_json(url) or []

    def prom_alerts(self, name: str) -> list[dict[str, Any]]:
        """Pending and firing alerts of that name in Prometheus."""
        data = self.prom.api("/api/v1/alerts") or {"alerts": []}
        return [a for a in data["alerts"] if a["labels"]["alertname"] == name]

    def exporter_pids(self) -> list[int]:
        return [m.exporter.proc.pid for m in self.members]

    def stop(self) -> None:
        self.stopping.set()
        stop_all(self.procs)
        if self.webhook is not None:
            self.webhook.shutdown()
        for m in self.members:
            m.exporter.stop()
            if m.users is not None:
                m.users.stop()


def wait_fleet_up(fleet: Fleet, count: int, timeout: float = 120) -> None:
    """Until `count` targets are up and each has been scraped a few times."""
    def ready() -> bool:
        got = fleet.query(f'count_over_time(up{{job="{JOB}"}}[1m]) >= 3 and up{{job="{JOB}"}} == 1')
        return len(got) == count

    wait_until(f"{count} targets up in Prometheus", ready, timeout)

