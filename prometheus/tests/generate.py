#!/usr/bin/env python3
"""Writes resmon.rules.test.yml: promtool unit tests showing every alert of
../rules/resmon.rules.yml firing and not firing.

The expected labels and annotations are written out here literally, as the on-call engineer
reads them, and are NOT derived from the rules file: a changed template, threshold, severity
or message fails `promtool test rules` until this script says the same. After changing one:
    python prometheus/tests/generate.py && promtool test rules prometheus/tests/resmon.rules.test.yml
tests/test_stack.py fails when the committed file differs from this script's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
H1 = {"job": "resmon", "instance": "gpu-host-1:9636"}
H2 = {"job": "resmon", "instance": "gpu-host-2:9636"}


def gpu(i: int, **extra: str) -> dict[str, str]:
    return {**H1, "gpu": str(i), "uuid": f"GPU-0000000{i}", **extra}


def series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def firing(labels: dict[str, str], severity: str, summary: str, description: str, runbook: str) -> dict[str, Any]:
    """One expected alert: its series' labels plus severity, and its three annotations as rendered."""
    return {
        "exp_labels": {**labels, "severity": severity},
        "exp_annotations": {"summary": summary, "description": description, "runbook": runbook},
    }


# runbooks are constant per alert
RUNBOOK = {
    "vram": "Find the processes holding VRAM (nvidia-smi), stop or move a job, or lower batch sizes.",
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
            check("10m", "ResmonGpuVramPressure",
                  firing(gpu(0), "warning", "GPU 0 on gpu-host-1:9636 has used 95% of its VRAM",
                         "VRAM in use (driver-reserved included) has been above 90 % for 5 minutes on GPU 0 "
                         "(GPU-00000000). New allocations may fail soon.", RUNBOOK["vram"]),
                  firing(gpu(1), "warning", "GPU 1 on gpu-host-1:9636 has used 98% of its VRAM",
                         "VRAM in use (driver-reserved included) has been above 90 % for 5 minutes on GPU 1 "
                         "(GPU-00000001). New allocations may fail soon.", RUNBOOK["vram"])),
            check("1m", "ResmonGpuVramPressureCritical"),
            check("10m", "ResmonGpuVramPressureCritical",
                  firing(gpu(1), "critical", "GPU 1 on gpu-host-1:9636 is out of VRAM (98% used)",
                         "VRAM in use has been above 97 % for 2 minutes on GPU 1 (GPU-00000001): allocations are "
                         "failing or about to.",
                         "Free VRAM now: stop the largest job on this GPU or move it; check for leaked CUDA contexts.")),
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
            check("25m", "ResmonGpuVramFillingUp",
                  firing(gpu(0), "warning", "GPU 0 on gpu-host-1:9636 will run out of VRAM within 30 minutes",
                         "At the trend of the last 30 minutes, free VRAM on GPU 0 (GPU-00000000) reaches zero within "
                         "30 minutes.",
                         "Look for a job whose memory keeps growing (a leak or an unbounded cache) and restart or cap it.")),
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
            check("15m", "ResmonGpuTemperatureHigh",
                  firing(gpu(0), "warning", "GPU 0 on gpu-host-1:9636 is at 90 C",
                         "GPU core temperature has been above 85 C for 10 minutes. Safe limits differ by model: tune "
                         "the threshold for your fleet.",
                         "Check airflow, fans and the data-centre inlet temperature; compare with the GPU's slowdown "
                         "temperature (nvidia-smi -q -d TEMPERATURE).")),
            check("3m", "ResmonGpuHwThermalSlowdown"),
            check("10m", "ResmonGpuHwThermalSlowdown",
                  firing(gpu(0, reason="hw_thermal_slowdown"), "warning",
                         "GPU 0 on gpu-host-1:9636 is slowed down by hardware thermal protection",
                         "The hardware thermal slowdown clock-event reason has been active for 5 minutes: the GPU runs "
                         "at reduced clocks.",
                         "Treat as overheating: check cooling, fans and inlet temperature; reseat or service the board "
                         "if it persists.")),
            check("3m", "ResmonGpuPowerBrake"),
            check("10m", "ResmonGpuPowerBrake",
                  firing(gpu(1, reason="hw_power_brake_slowdown"), "warning",
                         "GPU 1 on gpu-host-1:9636 is held by the power brake",
                         "The external power brake (hw_power_brake_slowdown) has been active for 5 minutes, usually a "
                         "PSU or power-delivery problem.",
                         "Check the node's power supplies and power-capping policy (BMC); the GPU is running at minimum "
                         "clocks.")),
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
            check("5m", "ResmonGpuDown",
                  firing(gpu(0), "critical", "GPU 0 on gpu-host-1:9636 does not answer",
                         "GPU 0 (GPU-00000000) has not answered NVML for 2 minutes (lost, reset required, or the "
                         "refresh timed out).",
                         "Check dmesg for Xid errors and nvidia-smi -q; a GPU that fell off the bus needs a reset or a "
                         "node reboot.")),
            check("25m", "ResmonGpuMissing"),
            check("45m", "ResmonGpuMissing",
                  firing(H1, "warning", "gpu-host-1:9636 reports fewer GPUs than during the last 6 hours",
                         "The backend now reports 7 GPUs, fewer than its maximum of the last 6 hours.",
                         "Check lspci and nvidia-smi -L on the node; a GPU that disappeared needs a reset, reseat or RMA.")),
            check("5m", "ResmonGpuCollectorFailing"),
            check("15m", "ResmonGpuCollectorFailing",
                  firing({**H1, "collector": "gpu"}, "warning", "resmon on gpu-host-1:9636 cannot read its GPUs",
                         "The GPU collector has failed for 10 minutes (NVML or the vendor CLI not answering, or "
                         "refreshes timing out).",
                         "Read the exporter's log; check the driver (nvidia-smi) and, in containers, the NVIDIA runtime.")),
            check("7m", "ResmonRefreshStale"),  # stale since 5m, pending for 5m
            check("12m", "ResmonRefreshStale",
                  firing({**H1, "collector": "gpu"}, "warning",
                         "resmon on gpu-host-1:9636 serves data older than 5 minutes (gpu)",
                         "The gpu values scraped are more than 5 minutes old.",
                         "Check --collect.cache-ttl and the exporter's log.")),
            check("1m", "ResmonExporterDown"),
            check("5m", "ResmonExporterDown",
                  firing(H1, "critical", "resmon-exporter on gpu-host-1:9636 cannot be scraped",
                         "Prometheus has failed to scrape gpu-host-1:9636 (job resmon) for 2 minutes.",
                         "Check the exporter's service and its port from the Prometheus host "
                         "(curl http://HOST:9636/-/healthy).")),
            check("15m", "ResmonExporterAbsent"),  # targets exist
            check("5m", "ResmonHostMemoryPressure"),
            check("15m", "ResmonHostMemoryPressure",
                  firing(H1, "warning", "gpu-host-1:9636 has 5% of its memory available",
                         "MemAvailable has been below 10 % of MemTotal for 10 minutes.",
                         "Find the largest processes (ps aux --sort=-rss); data loaders and pinned-memory buffers are "
                         "usual suspects.")),
        ],
    }
    absent = {
        "name": "no exporter target at all",
        "interval": "1m",
        "input_series": [{"series": series("up", {"job": "node", "instance": "other:9100"}), "values": "1x20"}],
        "alert_rule_test": [
            check("5m", "ResmonExporterAbsent"),
            check("15m", "ResmonExporterAbsent",
                  firing({}, "warning", "No resmon-exporter target is configured or discovered",
                         "Prometheus has had no target in a job matching resmon.* for 10 minutes: GPU alerts cannot "
                         "fire.",
                         "Check the scrape configuration or service discovery (job name must match resmon.*).")),
        ],
    }
    return [vram, filling, temp, health, absent]


def document() -> str:
    doc = {"rule_files": ["../rules/resmon.rules.yml"], "evaluation_interval": "1m", "tests": tests()}
    header = ("# Generated by generate.py, whose expected annotations are literal (not read from\n"
              "# ../rules/resmon.rules.yml): edit that script, then re-run it.\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=200)


if __name__ == "__main__":
    (HERE / "resmon.rules.test.yml").write_text(document())
    print("wrote prometheus/tests/resmon.rules.test.yml")
