#!/usr/bin/env python3
"""Writes resmon.rules.test.yml: promtool unit tests showing every alert of
../rules/resmon.rules.yml firing and not firing. The expected annotations are rendered from
the rules file itself, so editing a message only needs a re-run:
    python prometheus/tests/generate.py && promtool test rules prometheus/tests/resmon.rules.test.yml
tests/test_alert_rules.py fails when the committed file differs from this script's output.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "rules" / "resmon.rules.yml"
H1 = {"job": "resmon", "instance": "gpu-host-1:9636"}
H2 = {"job": "resmon", "instance": "gpu-host-2:9636"}


def gpu(i: int, **extra: str) -> dict[str, str]:
    return {**H1, "gpu": str(i), "uuid": f"GPU-0000000{i}", **extra}


def series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def go_value(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def render(template: str, labels: dict[str, str], value: float) -> str:
    def sub(m: re.Match[str]) -> str:
        expr = m.group(1).strip()
        if expr == "$value":
            return go_value(value)
        if expr == "$value | humanizePercentage":
            return f"{value * 100:.4g}%"
        if expr.startswith("$labels."):
            return labels.get(expr[len("$labels."):], "")
        raise ValueError(f"template {expr!r} not supported by this generator")

    return re.sub(r"{{(.*?)}}", sub, template)


def alerts() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


RULE = alerts()


def firing(alert: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    rule = RULE[alert]
    return {
        "exp_labels": {**labels, **rule.get("labels", {})},
        "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()},
    }


def check(eval_time: str, alert: str, *expected: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": eval_time, "alertname": alert, "exp_alerts": list(expected)}


def tests() -> list[dict[str, Any]]:
    vram = {
        "name": "VRAM pressure",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_memory_total_bytes", gpu(i)), "values": "100x20"} for i in range(3)
        ] + [
            {"series": series("resmon_gpu_memory_free_bytes", gpu(0)), "values": "5x20"},  # 95 % used
            {"series": series("resmon_gpu_memory_free_bytes", gpu(1)), "values": "2x20"},  # 98 % used
            {"series": series("resmon_gpu_memory_free_bytes", gpu(2)), "values": "50x20"},  # 50 % used
        ],
        "alert_rule_test": [
            check("3m", "ResmonGpuVramPressure"),  # pending: for 5m
            check("10m", "ResmonGpuVramPressure", firing("ResmonGpuVramPressure", gpu(0), 1 - 5 / 100),
                  firing("ResmonGpuVramPressure", gpu(1), 1 - 2 / 100)),
            check("1m", "ResmonGpuVramPressureCritical"),
            check("10m", "ResmonGpuVramPressureCritical", firing("ResmonGpuVramPressureCritical", gpu(1), 1 - 2 / 100)),
        ],
        "promql_expr_test": [
            {"expr": "gpu:resmon_gpu_memory_used:ratio", "eval_time": "5m", "exp_samples": [
                {"labels": series("gpu:resmon_gpu_memory_used:ratio", gpu(i)), "value": v}
                for i, v in ((0, 0.95), (1, 0.98), (2, 0.5))]},
        ],
    }
    filling = {
        "name": "VRAM filling up",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_memory_total_bytes", gpu(0)), "values": "100x40"},
            {"series": series("resmon_gpu_memory_free_bytes", gpu(0)), "values": "40-1x39"},  # loses 1 a minute
            {"series": series("resmon_gpu_memory_total_bytes", gpu(1)), "values": "100x40"},
            {"series": series("resmon_gpu_memory_free_bytes", gpu(1)), "values": "40x40"},  # full-ish but flat
        ],
        "alert_rule_test": [
            check("15m", "ResmonGpuVramFillingUp"),  # predicted below zero from 10m on, pending for 10m
            check("25m", "ResmonGpuVramFillingUp", firing("ResmonGpuVramFillingUp", gpu(0), -15)),
        ],
    }
    temp = {
        "name": "temperature and throttling",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_temperature_celsius", gpu(0)), "values": "90x20"},
            {"series": series("resmon_gpu_temperature_celsius", gpu(1)), "values": "80x20"},
            {"series": series("resmon_gpu_throttle_active", gpu(0, reason="hw_thermal_slowdown")), "values": "1x20"},
            {"series": series("resmon_gpu_throttle_active", gpu(1, reason="hw_thermal_slowdown")), "values": "0x20"},
            {"series": series("resmon_gpu_throttle_active", gpu(0, reason="hw_power_brake_slowdown")), "values": "0x20"},
            {"series": series("resmon_gpu_throttle_active", gpu(1, reason="hw_power_brake_slowdown")), "values": "1x20"},
            {"series": series("resmon_gpu_throttle_active", gpu(0, reason="sw_power_cap")), "values": "1x20"},
        ],
        "alert_rule_test": [
            check("5m", "ResmonGpuTemperatureHigh"),
            check("15m", "ResmonGpuTemperatureHigh", firing("ResmonGpuTemperatureHigh", gpu(0), 90)),
            check("3m", "ResmonGpuHwThermalSlowdown"),
            check("10m", "ResmonGpuHwThermalSlowdown",
                  firing("ResmonGpuHwThermalSlowdown", gpu(0, reason="hw_thermal_slowdown"), 1)),
            check("3m", "ResmonGpuPowerBrake"),
            check("10m", "ResmonGpuPowerBrake", firing("ResmonGpuPowerBrake", gpu(1, reason="hw_power_brake_slowdown"), 1)),
        ],
    }
    health = {
        "name": "GPU and exporter health",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_up", gpu(0)), "values": "0x20"},
            {"series": series("resmon_gpu_up", gpu(1)), "values": "1x20"},
            {"series": series("resmon_gpu_devices", H1), "values": "8x30 7x30"},
            {"series": series("resmon_gpu_devices", H2), "values": "4x60"},
            {"series": series("resmon_collector_success", {**H1, "collector": "gpu"}), "values": "0x20"},
            {"series": series("resmon_collector_success", {**H1, "collector": "host"}), "values": "0x20"},
            {"series": series("resmon_collector_success", {**H2, "collector": "gpu"}), "values": "1x20"},
            {"series": series("resmon_last_refresh_timestamp_seconds", {**H1, "collector": "gpu"}), "values": "0x20"},
            {"series": series("resmon_last_refresh_timestamp_seconds", {**H2, "collector": "gpu"}), "values": "0+60x20"},
            {"series": series("up", H1), "values": "0x20"},
            {"series": series("up", H2), "values": "1x20"},
            {"series": series("resmon_memory_available_bytes", H1), "values": "5x20"},
            {"series": series("resmon_memory_total_bytes", H1), "values": "100x20"},
            {"series": series("resmon_memory_available_bytes", H2), "values": "50x20"},
            {"series": series("resmon_memory_total_bytes", H2), "values": "100x20"},
        ],
        "alert_rule_test": [
            check("1m", "ResmonGpuDown"),
            check("5m", "ResmonGpuDown", firing("ResmonGpuDown", gpu(0), 0)),
            check("25m", "ResmonGpuMissing"),
            check("45m", "ResmonGpuMissing", firing("ResmonGpuMissing", H1, 7)),
            check("5m", "ResmonGpuCollectorFailing"),
            check("15m", "ResmonGpuCollectorFailing", firing("ResmonGpuCollectorFailing", {**H1, "collector": "gpu"}, 0)),
            check("7m", "ResmonRefreshStale"),  # stale since 5m, pending for 5m
            check("12m", "ResmonRefreshStale",
                  firing("ResmonRefreshStale", {**H1, "collector": "gpu"}, 720)),
            check("1m", "ResmonExporterDown"),
            check("5m", "ResmonExporterDown", firing("ResmonExporterDown", H1, 0)),
            check("15m", "ResmonExporterAbsent"),  # targets exist
            check("5m", "ResmonHostMemoryPressure"),
            check("15m", "ResmonHostMemoryPressure", firing("ResmonHostMemoryPressure", H1, 0.05)),
        ],
    }
    absent = {
        "name": "no exporter target at all",
        "interval": "1m",
        "input_series": [{"series": series("up", {"job": "node", "instance": "other:9100"}), "values": "1x20"}],
        "alert_rule_test": [
            check("5m", "ResmonExporterAbsent"),
            check("15m", "ResmonExporterAbsent", firing("ResmonExporterAbsent", {}, 1)),
        ],
    }
    return [vram, filling, temp, health, absent]


def document() -> str:
    doc = {"rule_files": ["../rules/resmon.rules.yml"], "evaluation_interval": "1m", "tests": tests()}
    header = "# Generated by generate.py from ../rules/resmon.rules.yml: edit that script, then re-run it.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, width=200)


if __name__ == "__main__":
    (HERE / "resmon.rules.test.yml").write_text(document())
    print("wrote prometheus/tests/resmon.rules.test.yml")
