#!/usr/bin/env python3
"""Writes the Grafana dashboards (classic JSON, schemaVersion 39) next to this file.

The JSON files are committed; tests/test_dashboards.py fails when they differ from what
this script writes, so edit here and run `python dashboards/generate.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
GSEL = SEL + ', gpu=~"$gpu"'
GPU_LEGEND = "{{instance}} GPU {{gpu}}"


def variables() -> list[dict[str, Any]]:
    def query(name: str, label: str, q: str) -> dict[str, Any]:
        return {
            "name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": q, "refId": f"{name}-values"},
            "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        }

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "hide": 0, "refresh": 1},
        query("job", "Job", "label_values(resmon_build_info, job)"),
        query("instance", "Instance", 'label_values(resmon_build_info{job=~"$job"}, instance)'),
        query("gpu", "GPU", 'label_values(resmon_gpu_info{job=~"$job", instance=~"$instance"}, gpu)'),
        *(price(name, label, default) for name, label, default in PRICES),
    ]


# The cost panels' prices (any currency): textbox variables, so a viewer can type their own.
PRICES = (("price_gpu_hour", "Price per GPU-hour", "2.50"), ("price_kwh", "Price per kWh", "0.15"))


def price(name: str, label: str, default: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "textbox", "query": default, "hide": 0,
            "description": f"{label}, in your currency, for the Waste and cost panels.",
            "current": {"selected": False, "text": default, "value": default},
            "options": [{"selected": True, "text": default, "value": default}]}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping rows."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_h = 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.add({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)
        self.x, self.y, self.row_h = 0, self.y + 1, 0


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "refId": ref}
    if instant:
        t["instant"], t["range"] = True, False
    if table:
        t["format"] = "table"
    return t


def panel(kind: str, title: str, targets: list[dict[str, Any]], unit: str = "short", description: str = "",
          **defaults: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "type": kind, "title": title, "datasource": DS, "targets": targets, "description": description,
        "fieldConfig": {"defaults": {"unit": unit, **defaults}, "overrides": []}, "options": {},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["color"] = {"mode": "palette-classic"}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    if kind in ("stat", "gauge", "bargauge"):
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return p


def ts(title: str, exprs: list[tuple[str, str]], unit: str, **kw: Any) -> dict[str, Any]:
    refs = "ABCDEFGH"
    return panel("timeseries", title, [target(e, l, refs[i]) for i, (e, l) in enumerate(exprs)], unit, **kw)


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


VRAM_RATIO = f"1 - resmon_gpu_memory_free_bytes{{{GSEL}}} / resmon_gpu_memory_total_bytes{{{GSEL}}}"
THROTTLING = (f'sum by (job, instance, gpu, uuid) (resmon_gpu_throttle_active{{{GSEL}, '
              f'reason!~"gpu_idle|applications_clocks_setting|display_clock_setting"}})')
GPU_BY = "job, instance, gpu, uuid"
XIDS = f"resmon_gpu_xid_errors_total{{{GSEL}}}"
# XID events in the last 24 hours. A series appears at its first event, so increase() alone
# misses that event: for a series that already existed a day ago, increase() (reset-safe, for
# exporter restarts); for one that appeared since, its whole count.
XIDS_24H = f"sum by ({GPU_BY}) (round(increase({XIDS}[1d]) and {XIDS} offset 1d) or {XIDS})"
RECOVERY_ACTIONS = {"0": ("none", "green"), "1": ("GPU reset", "red"), "2": ("node reboot", "red"),
                    "3": ("drain P2P", "orange"), "4": ("drain and reset", "red")}


# Per-process series (collector `processes`). Legends cannot branch, so who() adds a `who`
# label: "namespace/pod (container)" where the kubernetes collector named the pod (with
# group-by=process also "pid N", as a pod can run several), else "process (pid N)" (", job N"
# in a Slurm job), with group-by=container "container <12 hex>" (plain Docker), "job N" (a
# Slurm job's processes outside containers, summed; ", job N" after a container in one) or "outside containers" (the host's
# processes summed). label_join lays the labels out as
# namespace;pod;container;container_id;pid;process;job_id (an absent label joins as empty);
# each label_replace matches one of those shapes and leaves the others as they are (the ones
# already rewritten contain no ";"). A process name may hold ";": the shapes that follow it
# read the job id as the text after the last one, which a job id (digits) never holds.
PROC_MEM = f"resmon_gpu_process_memory_used_bytes{{{GSEL}}}"
PROC_SM = f'resmon_gpu_process_utilization_ratio{{{GSEL}, engine="sm"}}'
POD_MEM = f'resmon_gpu_process_memory_used_bytes{{{GSEL}, pod!=""}}'
POD_SM = f'resmon_gpu_process_utilization_ratio{{{GSEL}, engine="sm", pod!=""}}'
WHO_SHAPES = (
    ("([^;]+);([^;]+);([^;]+);[^;]*;;.*", "$1/$2 ($3)"),
    ("([^;]+);([^;]+);([^;]+);[^;]*;([^;]+);.*", "$1/$2 ($3) pid $4"),
    ("([^;]+);([^;]+);;.*", "$1/$2"),
    (";;;[^;]*;([^;]+);(.*);([0-9]+)", "$2 (pid $1, job $3)"),
    (";;;[^;]*;([^;]+);(.*);", "$2 (pid $1)"),
    (";;;([0-9a-f]{12})[^;]*;;;([0-9]+)", "container $1, job $2"),
    (";;;([0-9a-f]{12})[^;]*;;;", "container $1"),
    (";;;;;;([0-9]+)", "job $1"),
    (";;;;;;", "outside containers"),
)


def who(expr: str) -> str:
    out = f'label_join({expr}, "who", ";", "namespace", "pod", "container", "container_id", "pid", "process", "job_id")'
    for regex, replacement in WHO_SHAPES:
        out = f'label_replace({out}, "who", "{replacement}", "who", "{regex}")'
    return out


# Slurm jobs (processes collector): one row per GPU and job from resmon_gpu_job_info, with
# what the job's own processes hold and use there and the whole GPU's busy time, which is the
# job's where it has the GPU to itself (--gres=gpu, exclusive).
JOBS = f"resmon_gpu_job_info{{{GSEL}}}"
JOB_BY = "job, instance, gpu, uuid, job_id"


# A pod's VRAM is what its own processes hold: with time-slicing (device ids GPU-...::N) or
# MPS several pods share one GPU, so the device's VRAM joined onto each allocation would show
# every pod using the whole GPU. POD_BY: one row per container and GPU, as the allocations.
POD_BY = "job, instance, gpu, uuid, namespace, pod, container"
ALLOCATIONS = f"resmon_gpu_allocation_info{{{GSEL}}}"


def merged_table(exclude: dict[str, bool], rename: dict[str, str],
                 index: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """A table panel's transformations: its queries merged into one row per series, then
    columns hidden, ordered and renamed."""
    options: dict[str, Any] = {"excludeByName": exclude}
    if index is not None:
        options["indexByName"] = index
    options["renameByName"] = rename
    return [{"id": "merge", "options": {}}, {"id": "organize", "options": options}]


def column_units(units: dict[str, str]) -> list[dict[str, Any]]:
    """Field overrides giving each named column its unit."""
    return [{"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
            for name, unit in units.items()]


def info_table(title: str, info: str, columns: list[tuple[str, str, str]], labels: list[str], description: str,
               hide: tuple[str, ...] = (), rename: dict[str, str] | None = None, sort: str | None = None) -> dict[str, Any]:
    """A table panel with one row per series of an _info family (query A, its value hidden)
    and a column per (name, unit, expr) after it (queries B, C, ...: each joined onto the
    info series by the caller's expr); labels: the label columns first, in this order."""
    refs = [chr(ord("B") + i) for i in range(len(columns))]
    t = panel("table", title, [target(info, "", "A", instant=True, table=True)]
              + [target(expr, "", ref, instant=True, table=True) for ref, (_, _, expr) in zip(refs, columns)],
              description=description)
    t["transformations"] = merged_table(
        exclude={name: True for name in ("Time", "Value #A", "__name__", "job", *hide)},
        index={**{label: i for i, label in enumerate(labels)},
               **{f"Value #{ref}": len(labels) + i for i, ref in enumerate(refs)}},
        rename={**(rename or {}), **{f"Value #{ref}": name for ref, (name, _, _) in zip(refs, columns)}})
    t["fieldConfig"]["overrides"] = column_units({name: unit for name, unit, _ in columns})
    if sort is not None:
        t["options"] = {"sortBy": [{"displayName": sort, "desc": False}]}
    return t


def value_map(texts: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"type": "value", "options": {v: {"text": text, "color": color, "index": i}
                                          for i, (v, (text, color)) in enumerate(texts.items())}}]


# Waste and cost (prometheus/rules/resmon.waste.rules.yml, docs/alerts.md): a holder (a pod
# through resmon_gpu_allocation_info, a Slurm job through resmon_gpu_job_info) is idle while its
# busy share is under 5 %: its own processes' busy time where the exporter reports it per
# process, else the device's. The *_hours_per_hour rules are GPUs (GPU-hours per hour) and kW
# (kWh per hour); over the dashboard's range, each 15 s step adds 15 s worth (steps align to
# multiples of 15 s: a series is seen within 15 s of its first evaluation; 1m would leave a new
# one out for up to a minute).
def over_range(rule: str) -> str:
    return f"sum_over_time({rule}[$__range:15s]) / 240"


WASTE_NEEDS = (" Needs the recording rules of prometheus/rules/resmon.waste.rules.yml in Prometheus.")
IDLE_NOW = f"sum(resmon:instance:gpu_idle_hours_per_hour{{{SEL}}})"
IDLE_RANGE = f"sum({over_range(f'resmon:instance:gpu_idle_hours_per_hour{{{SEL}}}')})"
ENERGY_RANGE = f"sum(increase(resmon_gpu_energy_joules_total{{{GSEL}}}[$__range])) / 3.6e6"
UNATTRIBUTED_RANGE = f"sum(increase(resmon_gpu_unattributed_energy_joules_total{{{GSEL}}}[$__range])) / 3.6e6"
HELD_IDLE = (f"resmon_gpu_process_memory_used_bytes{{{GSEL}}} "
             f"and resmon:gpu_workload_busy:ratio_rate5m{{{GSEL}}} == 0")
WORKLOAD_ENERGY = f"resmon_gpu_process_energy_joules_total{{{GSEL}}}"


def cost_table(title: str, by: str, exprs: list[tuple[str, str, str]], description: str,
               rename: dict[str, str] | None = None) -> dict[str, Any]:
    """A table with one row per `by` label set, a column per (name, unit, expr)."""
    refs = [chr(ord("A") + i) for i in range(len(exprs))]
    t = panel("table", title, [target(expr, "", ref, instant=True, table=True) for ref, (_, _, expr) in zip(refs, exprs)],
              description=description)
    labels = [label.strip() for label in by.split(",")]
    t["transformations"] = merged_table(
        exclude={"Time": True},
        index={**{label: i for i, label in enumerate(labels)},
               **{f"Value #{ref}": len(labels) + i for i, ref in enumerate(refs)}},
        rename={**(rename or {}), **{f"Value #{ref}": name for ref, (name, _, _) in zip(refs, exprs)}})
    t["fieldConfig"]["overrides"] = column_units({name: unit for name, unit, _ in exprs})
    t["options"] = {"sortBy": [{"displayName": exprs[0][0], "desc": True}]}
    return t


def waste_row(lay: Layout, node: bool) -> None:
    """The "Waste and cost" row: fleet-wide totals and rankings, or (node) one node's holders."""
    lay.row("Waste and cost")
    lay.add(panel("stat", "Idle allocated GPUs now", [target(f"{IDLE_NOW} or vector(0)", "idle", instant=True)],
                  description="GPUs held by a pod or a Slurm job whose every holder was under 5 % busy over the "
                              "last 5 minutes (the alert ResmonGpuAllocatedIdle fires after an hour of it)." +
                              WASTE_NEEDS, thresholds=thresholds((None, "green"), (1, "orange"))), 4, 4)
    lay.add(panel("stat", "Idle GPU-hours", [target(f"{IDLE_RANGE} or vector(0)", "GPU-hours", instant=True)],
                  description="GPU-hours the allocated GPUs spent idle over the dashboard's time range." + WASTE_NEEDS,
                  decimals=1), 4, 4)
    lay.add(panel("stat", "Cost of idle GPU-hours", [target(f"({IDLE_RANGE} or vector(0)) * $price_gpu_hour", "cost",
                                                            instant=True)],
                  description="Idle GPU-hours over the range times the price per GPU-hour (dashboard variable).",
                  decimals=2), 4, 4)
    lay.add(panel("stat", "GPU energy", [target(ENERGY_RANGE, "kWh", instant=True)], "kwatth",
                  description="Energy the GPUs used over the range (their energy counters)."), 4, 4)
    lay.add(panel("stat", "GPU energy cost", [target(f"{ENERGY_RANGE} * $price_kwh", "cost", instant=True)],
                  description="GPU energy over the range times the price per kWh (dashboard variable).",
                  decimals=2), 4, 4)
    lay.add(panel("stat", "Energy no workload was charged", [target(
        f"({UNATTRIBUTED_RANGE}) / ({ENERGY_RANGE} > 0)", "share", instant=True)], "percentunit",
        description="The share of the GPUs' energy over the range that the exporter charged to no process: idle "
                    "time, and processes it cannot see (resmon_gpu_unattributed_energy_joules_total; needs "
                    "--collector.processes). Of the GPUs that report it; empty while their energy did not grow."),
            4, 4)
    if node:
        lay.add(cost_table("Busy share of each pod's GPU", "namespace, pod, gpu, uuid", [
            ("Busy", "percentunit", f"resmon:gpu_pod_busy:ratio_rate5m{{{GSEL}}}"),
        ], "Every pod holding a GPU and its busy share over the last 5 minutes: the pod's own processes' busiest "
           "engine where the exporter reports per-process busy time on that GPU (--collector.processes), else the "
           "whole GPU's (on a time-sliced GPU that is every pod's together). Under 5 % is idle." + WASTE_NEEDS), 12, 7)
        lay.add(cost_table("Busy share of each Slurm job's GPU", "job_id, user, gpu, uuid", [
            ("Busy", "percentunit", f"resmon:gpu_slurm_job_busy:ratio_rate5m{{{GSEL}}}"),
        ], "Every Slurm job with a process on a GPU and its busy share over the last 5 minutes, as for pods."
           + WASTE_NEEDS, rename={"job_id": "Slurm job"}), 12, 7)
        lay.add(ts("Idle GPUs by holder", [
            (f"resmon:pod:gpu_idle_hours_per_hour{{{SEL}}}", "{{instance}} {{namespace}}/{{pod}}"),
            (f"resmon:slurm_job:gpu_idle_hours_per_hour{{{SEL}}}", "{{instance}} Slurm job {{job_id}} ({{user}})"),
        ], "short", min=0, description="GPUs each pod and Slurm job holds and leaves idle (GPU-hours per hour)."
                                       + WASTE_NEEDS), 12, 8)
        lay.add(ts("GPU power by workload", [
            (who(f"rate({WORKLOAD_ENERGY}[$__rate_interval])"), GPU_LEGEND + " {{who}}"),
            (f"rate(resmon_gpu_unattributed_energy_joules_total{{{GSEL}}}[$__rate_interval])",
             GPU_LEGEND + " unattributed"),
        ], "watt", min=0, description="Each workload's share of its GPU's power: the device's energy split by the "
                                      "workloads' busy time (docs/metrics.md); unattributed: idle time and processes "
                                      "the exporter cannot see. Needs --collector.processes."), 12, 8)
    else:
        lay.add(cost_table("Idle GPU-hours by namespace", "namespace", [
            ("Idle GPU-hours", "short", f"sort_desc(sum by (namespace) "
                                        f"({over_range(f'resmon:namespace:gpu_idle_hours_per_hour{{{SEL}}}')}))"),
            ("Cost", "short", f"sum by (namespace) ({over_range(f'resmon:namespace:gpu_idle_hours_per_hour{{{SEL}}}')})"
                              " * $price_gpu_hour"),
        ], "GPU-hours each namespace's pods held a GPU and left it idle over the range, and what they cost."
           + WASTE_NEEDS), 12, 7)
        lay.add(cost_table("Idle GPU-hours by Slurm job", "job_id, user", [
            ("Idle GPU-hours", "short", f"sort_desc(sum by (job_id, user) "
                                        f"({over_range(f'resmon:slurm_job:gpu_idle_hours_per_hour{{{SEL}}}')}))"),
            ("Cost", "short", f"sum by (job_id, user) "
                              f"({over_range(f'resmon:slurm_job:gpu_idle_hours_per_hour{{{SEL}}}')}) * $price_gpu_hour"),
        ], "GPU-hours each Slurm job (and its user) held a GPU and left it idle over the range, and what they cost."
           + WASTE_NEEDS, rename={"job_id": "Slurm job"}), 12, 7)
    lay.add(cost_table("Energy by workload", "job, instance, who", [
        ("Energy", "kwatth", f"sort_desc(sum by (job, instance, who) ({who(f'increase({WORKLOAD_ENERGY}[$__range])')}))"
                             " / 3.6e6"),
        ("Cost", "short", f"sum by (job, instance, who) ({who(f'increase({WORKLOAD_ENERGY}[$__range])')}) / 3.6e6 "
                          "* $price_kwh"),
    ], "Energy each workload (pod, process, container or Slurm job) was charged over the range, summed over its GPUs, "
       "and its cost at the price per kWh. Needs --collector.processes.", rename={"who": "Workload"}), 12, 8)
    lay.add(cost_table("VRAM held without work", "who, instance, gpu", [
        ("VRAM", "bytes", f"topk(10, {who(HELD_IDLE)})"),
    ], "The largest VRAM holders whose processes had no engine time over the last 5 minutes (ResmonGpuMemoryHeldIdle "
       "fires after an hour of it above 10 % of the GPU): memory no one else can use. Needs --collector.processes."
       + WASTE_NEEDS, rename={"who": "Holder"}), 12, 8)


def fleet() -> dict[str, Any]:
    lay = Layout()
    lay.row("Fleet")
    lay.add(panel("stat", "GPUs up", [target(f"sum(resmon_gpu_up{{{GSEL}}})", "up", instant=True)],
                  description="GPUs that answered in the latest refresh.",
                  thresholds=thresholds((None, "green"))), 4, 4)
    lay.add(panel("stat", "GPUs down", [target(f"count(resmon_gpu_up{{{GSEL}}} == 0) or vector(0)", "down", instant=True)],
                  description="GPUs seen since the exporter started that no longer answer.",
                  thresholds=thresholds((None, "green"), (1, "red"))), 4, 4)
    lay.add(panel("stat", "GPUs reported", [target(f"sum(resmon_gpu_devices{{{SEL}}})", "devices", instant=True)]), 4, 4)
    lay.add(panel("stat", "Exporters up", [target(f"sum(up{{{SEL}}})", "up", instant=True)],
                  thresholds=thresholds((None, "green"))), 4, 4)
    lay.add(panel("stat", "GPUs over 90 % VRAM", [target(f"count(({VRAM_RATIO}) > 0.9) or vector(0)", "pressure", instant=True)],
                  thresholds=thresholds((None, "green"), (1, "orange"))), 4, 4)
    lay.add(panel("stat", "GPUs throttling", [target(f"count(({THROTTLING}) > 0) or vector(0)", "throttling", instant=True)],
                  description="Power cap excluded and idle excluded: hardware slowdown, thermal, power brake, sync boost.",
                  thresholds=thresholds((None, "green"), (1, "orange"))), 4, 4)
    lay.row("Every GPU")
    table = panel("table", "GPUs", [
        target(f"resmon_gpu_info{{{GSEL}}}", "", "A", instant=True, table=True),
        target(VRAM_RATIO, "", "B", instant=True, table=True),
        target(f"resmon_gpu_utilization_ratio{{{GSEL}}}", "", "C", instant=True, table=True),
        target(f"resmon_gpu_temperature_celsius{{{GSEL}}}", "", "D", instant=True, table=True),
        target(f"resmon_gpu_power_watts{{{GSEL}}}", "", "E", instant=True, table=True),
        target(f"resmon_gpu_power_limit_watts{{{GSEL}}}", "", "F", instant=True, table=True),
        target(THROTTLING, "", "G", instant=True, table=True),
        target(f"resmon_gpu_up{{{GSEL}}}", "", "H", instant=True, table=True),
        target(XIDS_24H, "", "I", instant=True, table=True),
        target(f'sum by ({GPU_BY}) (resmon_gpu_ecc_errors_total{{{GSEL}, type="uncorrected", scope="volatile"}})',
               "", "J", instant=True, table=True),
        target(f"max by ({GPU_BY}) "
               f"(resmon_gpu_row_remap_pending{{{GSEL}}} or resmon_gpu_retired_pages_pending{{{GSEL}}})",
               "", "K", instant=True, table=True),
        target(f"resmon_gpu_recovery_action{{{GSEL}}}", "", "L", instant=True, table=True),
    ], description="One row per GPU: VRAM in use (including driver-reserved) as a share of total, utilization, "
                   "temperature, power against its limit, active throttle reasons, up; health: XID events in the "
                   "last 24 hours (empty: none since the exporter started, or the GPU reports none), uncorrectable "
                   "ECC errors since the driver loaded, a row remap or page retirement waiting for a reset, and the "
                   "recovery action the driver asks for.")
    table["transformations"] = merged_table(
        exclude={"Time": True, "Value #A": True, "__name__": True, "backend": True},
        rename={"Value #B": "VRAM used", "Value #C": "Utilization", "Value #D": "Temperature",
                "Value #E": "Power", "Value #F": "Power limit", "Value #G": "Throttle reasons",
                "Value #H": "Up", "Value #I": "XIDs (24h)", "Value #J": "Uncorrectable ECC",
                "Value #K": "Reset pending", "Value #L": "Recovery action"})
    table["fieldConfig"]["overrides"] = column_units({
        "VRAM used": "percentunit", "Utilization": "percentunit", "Temperature": "celsius", "Power": "watt",
        "Power limit": "watt"}) + [
        {"matcher": {"id": "byName", "options": "Reset pending"},
         "properties": [{"id": "mappings", "value": value_map({"0": ("no", "green"), "1": ("yes", "orange")})}]},
        {"matcher": {"id": "byName", "options": "Recovery action"},
         "properties": [{"id": "mappings", "value": value_map(RECOVERY_ACTIONS)}]},
    ]
    lay.add(table, 24, 9)
    lay.add(panel("bargauge", "VRAM pressure", [target(VRAM_RATIO, GPU_LEGEND, instant=True)], "percentunit",
                  min=0, max=1, thresholds=thresholds((None, "green"), (0.9, "orange"), (0.97, "red"))), 12, 8)
    lay.add(ts("GPU utilization", [(f"resmon_gpu_utilization_ratio{{{GSEL}}}", GPU_LEGEND)], "percentunit", min=0, max=1), 12, 8)
    lay.add(ts("Tensor-core activity by node", [
        (f"avg by (job, instance) (resmon_gpu_tensor_active_ratio{{{GSEL}}})", "{{instance}}"),
    ], "percentunit", min=0, max=1,
        description="Share of cycles any tensor pipe was active, the mean over the node's GPUs (GPM: Hopper and "
                    "newer; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE). Nodes without GPM are absent, not 0. The fleet's SM "
                    "activity is the recording rule job:resmon_gpu_sm_active:avg."), 24, 8)
    lay.row("Pods")
    pods = panel("table", "Pods by VRAM", [
        target(f"sum by (instance, namespace, pod) ({POD_MEM})", "", "A", instant=True, table=True),
        target(f"sum by (instance, namespace, pod) ({POD_SM})", "", "B", instant=True, table=True),
        target(f"count by (instance, namespace, pod) (group by (instance, namespace, pod, uuid) ({ALLOCATIONS}))",
               "", "C", instant=True, table=True),
    ], description="VRAM held by each pod's own processes, summed over its GPUs (processes collector, with the pod "
                   "named by the kubernetes collector), their SM utilization summed over those GPUs (100 % = one "
                   "whole GPU), and how many GPUs the pod is allocated (kubernetes collector). Pods that share a GPU "
                   "(time-slicing) each show their own VRAM. A pod without VRAM holds GPUs it does not use, or its "
                   "node runs without the processes collector.")
    pods["transformations"] = merged_table(
        exclude={"Time": True},
        index={"namespace": 0, "pod": 1, "instance": 2, "Value #A": 3, "Value #B": 4, "Value #C": 5},
        rename={"Value #A": "VRAM", "Value #B": "SM utilization", "Value #C": "GPUs allocated"})
    pods["fieldConfig"]["overrides"] = column_units(
        {"VRAM": "bytes", "SM utilization": "percentunit", "GPUs allocated": "short"})
    pods["options"] = {"sortBy": [{"displayName": "VRAM", "desc": True}]}
    lay.add(pods, 24, 8)
    waste_row(lay, node=False)
    lay.row("Hosts")
    lay.add(ts("Host CPU", [(f"resmon_cpu_utilization_ratio{{{SEL}}}", "{{instance}}")], "percentunit", min=0, max=1), 12, 7)
    lay.add(ts("Host memory used", [(f"resmon_memory_used_bytes{{{SEL}}} / resmon_memory_total_bytes{{{SEL}}}", "{{instance}}")],
               "percentunit", min=0, max=1), 12, 7)
    lay.row("Exporter health")
    lay.add(ts("Collector success", [(f"resmon_collector_success{{{SEL}}}", "{{instance}} {{collector}}")], "short", min=0, max=1), 12, 6)
    lay.add(ts("Refresh duration", [(f"resmon_collector_duration_seconds{{{SEL}}}", "{{instance}} {{collector}}")], "s"), 12, 6)
    return dashboard("resmon-fleet", "resmon / Fleet overview", lay.panels, ["resmon", "gpu"])


def node() -> dict[str, Any]:
    lay = Layout()
    lay.row("Memory and utilization")
    lay.add(ts("VRAM", [
        (f"resmon_gpu_memory_used_bytes{{{GSEL}}}", GPU_LEGEND + " used"),
        (f"resmon_gpu_memory_reserved_bytes{{{GSEL}}}", GPU_LEGEND + " reserved"),
        (f"resmon_gpu_memory_total_bytes{{{GSEL}}}", GPU_LEGEND + " total"),
    ], "bytes", min=0), 12, 8)
    lay.add(ts("Utilization", [
        (f"resmon_gpu_utilization_ratio{{{GSEL}}}", GPU_LEGEND + " compute"),
        (f"resmon_gpu_memory_utilization_ratio{{{GSEL}}}", GPU_LEGEND + " memory bandwidth"),
        (f"rate(resmon_gpu_busy_seconds_total{{{GSEL}}}[$__rate_interval])", GPU_LEGEND + " {{engine}} busy"),
        (f"resmon_gpu_encoder_utilization_ratio{{{GSEL}}}", GPU_LEGEND + " encoder"),
        (f"resmon_gpu_decoder_utilization_ratio{{{GSEL}}}", GPU_LEGEND + " decoder"),
    ], "percentunit", min=0, max=1,
       description="The gauges are the driver's latest sample period; 'busy' is the busy time between Prometheus "
                   "samples, from the driver's sample buffers, so short bursts are not lost."), 12, 8)
    lay.row("Profiling")
    lay.add(ts("SM active vs occupancy vs tensor vs DRAM", [
        (f"resmon_gpu_sm_active_ratio{{{GSEL}}}", GPU_LEGEND + " SM active"),
        (f"resmon_gpu_sm_occupancy_ratio{{{GSEL}}}", GPU_LEGEND + " SM occupancy"),
        (f"resmon_gpu_tensor_active_ratio{{{GSEL}}}", GPU_LEGEND + " tensor"),
        (f"resmon_gpu_dram_active_ratio{{{GSEL}}}", GPU_LEGEND + " DRAM"),
        (f"resmon_gpu_mig_sm_active_ratio{{{GSEL}}}", GPU_LEGEND + " GI {{gpu_instance_id}} SM active"),
        (f"resmon_gpu_mig_tensor_active_ratio{{{GSEL}}}", GPU_LEGEND + " GI {{gpu_instance_id}} tensor"),
    ], "percentunit", min=0, max=1,
        description="GPM (Hopper and newer), over windows of at least 1 s. Utilization says a kernel was running; "
                    "SM active says how many SMs had work, occupancy how full they were, tensor and DRAM how busy "
                    "the tensor pipes and memory were. GI: per MIG GPU instance. Absent on GPUs without GPM."), 12, 8)
    lay.add(ts("PCIe and NVLink bandwidth", [
        (f"resmon_gpu_pcie_bandwidth_bytes_per_second{{{GSEL}}}", GPU_LEGEND + " PCIe {{direction}}"),
        (f"resmon_gpu_nvlink_bandwidth_bytes_per_second{{{GSEL}}}", GPU_LEGEND + " NVLink {{direction}}"),
        (f"resmon_gpu_mig_pcie_bandwidth_bytes_per_second{{{GSEL}}}", GPU_LEGEND + " GI {{gpu_instance_id}} PCIe {{direction}}"),
    ], "Bps", min=0, description="GPM bandwidths (DCGM_FI_PROF_PCIE_TX/RX_BYTES, DCGM_FI_PROF_NVLINK_TX/RX_BYTES)."), 12, 8)
    mig_join = f"* on (job, instance, gpu, uuid, gpu_instance_id) group_right resmon_gpu_mig_info{{{GSEL}}}"
    mig = info_table("MIG instances", f"resmon_gpu_mig_info{{{GSEL}}}", [
        ("GI memory used", "bytes", f"resmon_gpu_mig_memory_used_bytes{{{GSEL}}} {mig_join}"),
        ("GI memory", "bytes", f"resmon_gpu_mig_memory_total_bytes{{{GSEL}}} {mig_join}"),
        ("GI SM active", "percentunit", f"resmon_gpu_mig_sm_active_ratio{{{GSEL}}} {mig_join}"),
    ], ["instance", "gpu", "gpu_instance_id", "compute_instance_id", "profile", "mig_uuid"],
        description="One row per MIG device (compute instance): its GPU and compute instance, profile and MIG UUID, "
                    "and its GPU instance's memory and SM activity (shared by the instance's compute instances).")
    lay.add(mig, 24, 7)
    lay.row("Who uses the GPU")
    lay.add(ts("VRAM by process", [(who(PROC_MEM), GPU_LEGEND + " {{who}}")], "bytes", min=0,
               description="VRAM each process holds (group-by=container: each container), named by its pod where the "
                           "kubernetes collector knows it. Needs --collector.processes (off by default); absent "
                           "where NVML hides a process's memory."), 12, 8)
    lay.add(ts("SM utilization by process", [(who(PROC_SM), GPU_LEGEND + " {{who}}")], "percentunit", min=0,
               description="Share of the GPU's SM time each process used since the previous refresh (NVML process "
                           "utilization samples); not on MIG GPUs. Needs --collector.processes."), 12, 8)
    allocations = info_table("GPU allocations by pod", ALLOCATIONS, [
        ("Container VRAM", "bytes", f"sum by ({POD_BY}) ({POD_MEM}) * on ({POD_BY}) group_right {ALLOCATIONS}"),
        ("Device VRAM (all pods)", "bytes",
         f"resmon_gpu_memory_used_bytes{{{GSEL}}} * on ({GPU_BY}) group_right {ALLOCATIONS}"),
    ], ["namespace", "pod", "container", "resource", "device_id", "claim", "share", "instance", "gpu", "uuid"], sort="namespace",
        description="Every container holding a GPU, from the kubelet's PodResources API (kubernetes collector): the "
                    "device id the device plugin gave it (GPU-...::N with time-slicing, MIG-... for a MIG "
                    "instance; DRA rows: the driver as resource, the device name as device_id, the ResourceClaim "
                    "as claim and the kubelet's share_id as share), the VRAM its own processes hold on that GPU (repeated on each device id of that GPU "
                    "it holds; empty: none, or the processes collector is off), and the VRAM of the whole device, "
                    "shared by every pod on it.")
    lay.add(allocations, 24, 8)
    jobs = info_table("Slurm jobs", JOBS, [
        ("Job VRAM", "bytes", f'sum by ({JOB_BY}) (resmon_gpu_process_memory_used_bytes{{{GSEL}, job_id!=""}}) '
                              f"* on ({JOB_BY}) group_right {JOBS}"),
        ("Job SM", "percentunit",
         f'sum by ({JOB_BY}) (resmon_gpu_process_utilization_ratio{{{GSEL}, engine="sm", job_id!=""}}) '
         f"* on ({JOB_BY}) group_right {JOBS}"),
        ("GPU busy", "percentunit", f'rate(resmon_gpu_busy_seconds_total{{{GSEL}, engine="gpu"}}[$__rate_interval]) '
                                    f"* on ({GPU_BY}) group_right {JOBS}"),
    ], ["job_id", "user", "instance", "gpu", "uuid"], hide=("scheduler",), rename={"job_id": "Slurm job"},
        sort="Slurm job",
        description="Every Slurm job with a process on a GPU (its cgroup's job_<id>; a job array's task shows its "
                    "own job id, sacct's JobIDRaw), one row per GPU: the owner, the VRAM and SM share of the job's "
                    "own processes there, and the whole GPU's busy share, which is the job's on a GPU it has to "
                    "itself. Needs --collector.processes (off by default).")
    lay.add(jobs, 24, 7)
    waste_row(lay, node=True)
    lay.row("Power and thermals")
    lay.add(ts("Temperature", [
        (f"resmon_gpu_temperature_celsius{{{GSEL}}}", GPU_LEGEND),
        (f"resmon_gpu_memory_temperature_celsius{{{GSEL}}}", GPU_LEGEND + " memory"),
    ], "celsius", description="Memory temperature on HBM boards only."), 8, 8)
    lay.add(ts("Power", [
        (f"resmon_gpu_power_watts{{{GSEL}}}", GPU_LEGEND + " draw"),
        (f"resmon_gpu_power_limit_watts{{{GSEL}}}", GPU_LEGEND + " limit"),
    ], "watt", min=0), 8, 8)
    lay.add(ts("Energy per day", [(f"increase(resmon_gpu_energy_joules_total{{{GSEL}}}[1d]) / 3.6e6", GPU_LEGEND)], "kwatth",
               description="kWh over the trailing 24 hours, from the energy counter (resets on driver reload are handled by increase())."),
            8, 8)
    lay.add(ts("Fan", [(f"resmon_gpu_fan_speed_ratio{{{GSEL}}}", GPU_LEGEND)], "percentunit", min=0,
               description="Absent on passively cooled boards."), 8, 7)
    lay.add(ts("P-state", [(f"resmon_gpu_performance_state{{{GSEL}}}", GPU_LEGEND)], "none", min=0, max=15,
               description="0 is the fastest state."), 8, 7)
    lay.add(ts("Processes", [(f"resmon_gpu_processes{{{GSEL}}}", GPU_LEGEND)], "short", min=0), 8, 7)
    lay.row("Clocks and throttling")
    lay.add(ts("Clocks", [
        (f"resmon_gpu_clock_hertz{{{GSEL}}}", GPU_LEGEND + " {{clock}}"),
        (f"resmon_gpu_clock_max_hertz{{{GSEL}, clock=\"sm\"}}", GPU_LEGEND + " sm max"),
    ], "hertz", min=0), 12, 8)
    timeline = panel("state-timeline", "Throttle reasons",
                     [target(f"resmon_gpu_throttle_active{{{GSEL}}}", "GPU {{gpu}} {{reason}}")], "none",
                     description="Which clock-event reasons are active (1). gpu_idle and sw_power_cap are normal.",
                     thresholds=thresholds((None, "transparent"), (1, "orange")),
                     mappings=[{"type": "value", "options": {"0": {"text": "off"}, "1": {"text": "active"}}}])
    timeline["options"] = {"showValue": "never", "mergeValues": True, "rowHeight": 0.9, "legend": {"showLegend": False}}
    lay.add(timeline, 12, 8)
    lay.row("Health")
    lay.add(ts("XID events", [(f"{XIDS}", GPU_LEGEND + " XID {{xid}}")], "short", min=0,
               description="Events per XID code since the exporter started; a series starts at its first event. "
                           "Hardware XIDs (48, 62, 64, 74, 79, 95, 119, 120) page; application XIDs (13, 31, 43) "
                           "are the program's fault."), 12, 8)
    latest = panel("table", "Latest XIDs", [
        target(XIDS, "", "A", instant=True, table=True),
        target(f"resmon_gpu_xid_last_timestamp_seconds{{{GSEL}}} * 1000", "", "B", instant=True, table=True),
    ], description="Every XID code each GPU has reported since the exporter started, with the time of its latest "
                   "event.")
    latest["transformations"] = merged_table(
        exclude={"Time": True, "__name__": True, "job": True},
        rename={"Value #A": "Events", "Value #B": "Latest"})
    latest["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "Latest"}, "properties": [{"id": "unit", "value": "dateTimeAsIso"}]},
    ]
    lay.add(latest, 12, 8)
    lay.add(ts("ECC errors", [(f"resmon_gpu_ecc_errors_total{{{GSEL}}}", GPU_LEGEND + " {{type}} {{scope}}")], "short",
               min=0, description="volatile: since the driver loaded; aggregate: over the board's life. Uncorrected "
                                  "errors page; corrected ones are repaired in place."), 8, 8)
    lay.add(ts("Memory repair", [
        (f"resmon_gpu_remapped_rows{{{GSEL}}}", GPU_LEGEND + " remapped rows {{cause}}"),
        (f"resmon_gpu_retired_pages{{{GSEL}}}", GPU_LEGEND + " retired pages {{cause}}"),
    ], "short", min=0, description="Row remapping on Ampere and newer, page retirement before it."), 8, 8)
    pending = panel("state-timeline", "Reset needed", [
        target(f"resmon_gpu_row_remap_pending{{{GSEL}}}", "GPU {{gpu}} row remap pending", "A"),
        target(f"resmon_gpu_retired_pages_pending{{{GSEL}}}", "GPU {{gpu}} page retirement pending", "B"),
        target(f"resmon_gpu_row_remap_failed{{{GSEL}}}", "GPU {{gpu}} row remap failed", "C"),
        target(f"resmon_gpu_recovery_action{{{GSEL}}}", "GPU {{gpu}} recovery action", "D"),
    ], "none", description="A pending remap or retirement applies at the next GPU reset; a failed remap means RMA; "
                           "the recovery action is what the driver asks for.",
        thresholds=thresholds((None, "green"), (1, "orange")),
        mappings=value_map({"0": ("no", "green"), "1": ("yes", "orange")}))
    pending["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byFrameRefID", "options": "D"},
         "properties": [{"id": "mappings", "value": value_map(RECOVERY_ACTIONS)}]},
    ]
    pending["options"] = {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9, "legend": {"showLegend": False}}
    lay.add(pending, 8, 8)
    clock_events = ts("Clock-event time", [
        (f"rate(resmon_gpu_clock_event_seconds_total{{{GSEL}}}[$__rate_interval])", GPU_LEGEND + " {{reason}}"),
    ], "percentunit", min=0,
        description="Share of the time each reason held the clocks (seconds per second, stacked; reasons can "
                    "overlap). sw_power_cap under load is normal; hw_thermal_slowdown and hw_power_brake_slowdown "
                    "alert above 10 %. Pick one GPU to read the stack.")
    clock_events["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal", "group": "A"},
                                                         "fillOpacity": 40}
    lay.add(clock_events, 12, 8)
    lay.add(ts("PCIe link", [
        (f"resmon_gpu_pcie_link_generation{{{GSEL}}}", GPU_LEGEND + " Gen {{bound}}"),
        (f"resmon_gpu_pcie_link_width_lanes{{{GSEL}}}", GPU_LEGEND + " lanes {{bound}}"),
    ], "none", min=0, description="A link below its maximum is normal at idle (power saving) and alerts only while "
                                  "the GPU is busy."), 12, 8)
    lay.add(ts("PCIe traffic", [
        (f"rate(resmon_gpu_pcie_bytes_total{{{GSEL}}}[$__rate_interval])", GPU_LEGEND + " {{direction}}"),
    ], "Bps", min=0), 8, 8)
    lay.add(ts("NVLink traffic", [
        (f"sum by ({GPU_BY}, direction) (rate(resmon_gpu_nvlink_bytes_total{{{GSEL}}}[$__rate_interval]))",
         GPU_LEGEND + " {{direction}}"),
    ], "Bps", min=0, description="Summed over the GPU's links."), 8, 8)
    lay.add(ts("Link errors and NVLink state", [
        (f"rate(resmon_gpu_pcie_replays_total{{{GSEL}}}[$__rate_interval])", GPU_LEGEND + " PCIe replays/s"),
        (f"sum by ({GPU_BY}, type) (rate(resmon_gpu_nvlink_errors_total{{{GSEL}}}[$__rate_interval]))",
         GPU_LEGEND + " NVLink {{type}}/s"),
        (f"sum by ({GPU_BY}) (resmon_gpu_nvlink_active{{{GSEL}}})", GPU_LEGEND + " NVLink links up"),
        (f"count by ({GPU_BY}) (resmon_gpu_nvlink_active{{{GSEL}}})", GPU_LEGEND + " NVLink links"),
    ], "short", min=0, description="Error rates per second, and how many of the GPU's NVLink links are up."), 8, 8)
    lay.row("Host")
    lay.add(ts("CPU", [(f"resmon_cpu_utilization_ratio{{{SEL}}}", "{{instance}} busy")], "percentunit", min=0, max=1), 8, 7)
    lay.add(ts("Load", [(f"resmon_load1{{{SEL}}}", "{{instance}} 1m"), (f"resmon_load5{{{SEL}}}", "{{instance}} 5m")], "short", min=0), 8, 7)
    lay.add(ts("Memory", [
        (f"resmon_memory_used_bytes{{{SEL}}}", "{{instance}} used"),
        (f"resmon_memory_total_bytes{{{SEL}}}", "{{instance}} total"),
        (f"resmon_swap_used_bytes{{{SEL}}}", "{{instance}} swap used"),
    ], "bytes", min=0), 8, 7)
    lay.row("Exporter")
    lay.add(ts("Collector success", [(f"resmon_collector_success{{{SEL}}}", "{{instance}} {{collector}}")], "short", min=0, max=1), 8, 6)
    lay.add(ts("Refresh duration", [(f"resmon_collector_duration_seconds{{{SEL}}}", "{{instance}} {{collector}}")], "s"), 8, 6)
    lay.add(ts("Cache age", [(f"time() - resmon_last_refresh_timestamp_seconds{{{SEL}}}", "{{instance}} {{collector}}")], "s",
               description="Age of the data the latest scrape served."), 8, 6)
    return dashboard("resmon-node", "resmon / Node detail", lay.panels, ["resmon", "gpu"])


def dashboard(uid: str, title: str, panels: list[dict[str, Any]], tags: list[str]) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "tags": tags, "schemaVersion": 39, "version": 1, "editable": True,
        "graphTooltip": 1, "refresh": "30s", "time": {"from": "now-6h", "to": "now"}, "timezone": "",
        "timepicker": {}, "annotations": {"list": []}, "links": [
            {"title": "resmon dashboards", "type": "dashboards", "tags": ["resmon"], "asDropdown": True,
             "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False, "tooltip": ""},
        ],
        "templating": {"list": variables()}, "panels": panels,
    }


def render() -> dict[str, str]:
    return {f"{d['uid']}.json": json.dumps(d, indent=2) + "\n" for d in (fleet(), node())}


if __name__ == "__main__":
    for name, text in render().items():
        (HERE / name).write_text(text)
        print(f"wrote dashboards/{name}")
