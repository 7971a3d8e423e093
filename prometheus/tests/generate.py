#!/usr/bin/env python3
"""Writes resmon.rules.test.yml and resmon.waste.rules.test.yml: promtool unit tests showing
every alert of ../rules/resmon.rules.yml and ../rules/resmon.waste.rules.yml firing and not
firing, and the waste recording rules' exact values.

The expected labels and annotations are written out here literally, as the on-call engineer
reads them, and are NOT derived from the rules file: a changed template, threshold, severity
or message fails `promtool test rules` until this script says the same. After changing one:
    python prometheus/tests/generate.py && promtool test rules prometheus/tests/*.test.yml
tests/test_stack.py fails when the committed file differs from this script's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
H1 = {"job": "resmon", "instance": "gpu-host-1:9636"}
H2 = {"job": "resmon", "instance": "gpu-host-2:9636"}
H3 = {"job": "resmon", "instance": "gpu-host-3:9636"}  # NVML refuses it the GPUs (NO_PERMISSION)
GIB = 1024**3


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
    "thermal": "Treat as overheating: check cooling, fans and inlet temperature; reseat or service the board if it "
               "persists.",
    "brake": "Check the node's power supplies and power-capping policy (BMC); the GPU is running at minimum clocks.",
    "xid_critical": "Drain the GPU; read the Xid line in dmesg and nvidia-smi -q; reset the GPU (nvidia-smi -r) or "
                    "reboot the node, and RMA a board that repeats it.",
    "xid_warning": "Check nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT and the remap/retirement pending alerts; "
                   "reset the GPU when its jobs allow.",
    "recovery": "Drain the GPU and do what the action says (nvidia-smi -r for a reset, a reboot for 2); "
                "docs/metrics.md lists every value.",
    "pcie": "Compare LnkCap and LnkSta in lspci -vv with nvidia-smi -q -d PCIE; reseat the board or its riser, check "
            "the slot's PCIe setting in the BIOS, and service a link that keeps training low.",
}

THERMAL_DESCRIPTION = ("Hardware thermal slowdown has held the clocks more than 10 % of the time over 10 minutes, "
                       "for 5 minutes (drivers without the clock-event counter: the reason has been active for 5 "
                       "minutes): the GPU runs at reduced clocks.")
BRAKE_DESCRIPTION = ("The external power brake (hw_power_brake_slowdown) has held the clocks more than 10 % of the "
                     "time over 10 minutes, for 5 minutes (drivers without the clock-event counter: active for 5 "
                     "minutes), usually a PSU or power-delivery problem.")
CRITICAL_XIDS = "48|62|64|74|79|95|119|120"


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
    # The VRAM pressure descriptions name the largest holder on the GPU, from the processes
    # collector's series of that instance and uuid; the group above (no process series at all)
    # is the collector being off. All but GPU 2 over 90 % (GPU 1: 98 %). group-by=process: the
    # host process (0), the pod (1) or a process without a user (5) largest. group-by=container:
    # a plain Docker container (3), the processes outside containers (4), a pod whose container
    # is not known (7: it runs several, none named holding this GPU) largest. GPU 6 has no
    # process series. GPU 2 (50 %, quiet) and host 2 (the same uuid as GPU 0) hold more than any
    # of them: naming theirs would be the wrong GPU.
    holder_ratio = {0: 5, 1: 2, 2: 50, 3: 5, 4: 5, 5: 5, 6: 5, 7: 5}
    docker_id = "0123456789ab" + "cdef0123" * 6 + "cdef"
    pod = {"container_id": "f" * 64, "pod_uid": "7d5f3c1e-2b4a-4c6d-8e9f-0a1b2c3d4e5f", "namespace": "team-a",
           "pod": "train-0", "container": "trainer"}
    processes = [
        (gpu(0, pid="4242", process="python", user="alice"), 60 * GIB),
        (gpu(0, pid="5151", process="python", user="root", **pod), 20 * GIB),
        (gpu(1, pid="4242", process="python", user="alice"), 10 * GIB),
        (gpu(1, pid="5151", process="python", user="root", **pod), 70 * GIB),
        (gpu(2, pid="7000", process="hog", user="bob"), 90 * GIB),
        (gpu(3, container_id=docker_id), 8 * GIB),
        (gpu(3), 1 * GIB),  # summed host processes
        (gpu(4), 2 * GIB),
        (gpu(5, pid="99", process="tool"), 512 * 1024**2),
        (gpu(7, container_id="e" * 64, pod_uid=pod["pod_uid"], namespace="team-b", pod="notebook-1"), 3 * GIB),
        ({**H2, "gpu": "0", "uuid": "GPU-00000000", "pid": "1", "process": "other", "user": "carol"}, 79 * GIB),
    ]

    def pressure(i: int, held: str) -> dict[str, Any]:
        return firing(gpu(i), "warning", f"GPU {i} on gpu-host-1:9636 has used {100 - holder_ratio[i]}% of its VRAM",
                      "VRAM in use (driver-reserved included) has been above 90 % for 5 minutes on GPU "
                      f"{i} (GPU-0000000{i}). New allocations may fail soon.{held}", RUNBOOK["vram"])

    holder = {
        "name": "VRAM pressure names the largest holder",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_memory_total_bytes", gpu(i)), "values": "100x20"} for i in holder_ratio
        ] + [
            {"series": series("resmon_gpu_memory_free_bytes", gpu(i)), "values": f"{free}x20"}
            for i, free in holder_ratio.items()
        ] + [
            {"series": series("resmon_gpu_process_memory_used_bytes", labels), "values": f"{value}x20"}
            for labels, value in processes
        ],
        "alert_rule_test": [
            check("10m", "ResmonGpuVramPressure",
                  pressure(0, " Largest VRAM holder: process python (pid 4242, user alice), 60GiB."),
                  pressure(1, " Largest VRAM holder: pod team-a/train-0 (container trainer), 70GiB."),
                  pressure(3, " Largest VRAM holder: container 0123456789ab, 8GiB."),
                  pressure(4, " Largest VRAM holder: processes outside containers, 2GiB."),
                  pressure(5, " Largest VRAM holder: process tool (pid 99), 512MiB."),
                  pressure(6, ""),
                  pressure(7, " Largest VRAM holder: pod team-b/notebook-1, 3GiB.")),
            check("10m", "ResmonGpuVramPressureCritical",
                  firing(gpu(1), "critical", "GPU 1 on gpu-host-1:9636 is out of VRAM (98% used)",
                         "VRAM in use has been above 97 % for 2 minutes on GPU 1 (GPU-00000001): allocations are "
                         "failing or about to. Largest VRAM holder: pod team-a/train-0 (container trainer), 70GiB.",
                         "Free VRAM now: stop the largest job on this GPU or move it; check for leaked CUDA "
                         "contexts.")),
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
    # GPUs 0 and 1 have only the reason bits (a driver without the clock-event counters for these
    # reasons): the bit must hold for 5 minutes, as before. GPUs 2 and 3 have the counters, which
    # win over the bit: GPU 2's bit flaps (the old bit rule never fired on it) while its counter
    # says the clocks were held half the time.
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
            {"series": series("resmon_gpu_throttle_active", gpu(2, reason="hw_thermal_slowdown")),
             "values": " ".join(["1 0"] * 10) + " 1"},
            {"series": series("resmon_gpu_clock_event_seconds_total", gpu(2, reason="hw_thermal_slowdown")),
             "values": "0+30x20"},  # held 30 s of every minute
            # the bit read set at every scrape, but the counter says 5 %: the counter wins
            {"series": series("resmon_gpu_throttle_active", gpu(3, reason="hw_thermal_slowdown")), "values": "1x20"},
            {"series": series("resmon_gpu_clock_event_seconds_total", gpu(3, reason="hw_thermal_slowdown")),
             "values": "0+3x20"},  # 5 %: under the 10 % threshold
            {"series": series("resmon_gpu_clock_event_seconds_total", gpu(2, reason="hw_power_brake_slowdown")),
             "values": "0x20"},
            {"series": series("resmon_gpu_throttle_active", gpu(3, reason="hw_power_brake_slowdown")),
             "values": "1x20"},
            {"series": series("resmon_gpu_clock_event_seconds_total", gpu(3, reason="hw_power_brake_slowdown")),
             "values": "0+60x20"},  # held all the time
            {"series": series("resmon_gpu_clock_event_seconds_total", gpu(3, reason="sw_power_cap")),
             "values": "0+60x20"},  # normal under load: never alerted
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
                         "GPU 0 on gpu-host-1:9636 is slowed down by hardware thermal protection (100% of the time)",
                         THERMAL_DESCRIPTION, RUNBOOK["thermal"]),
                  firing(gpu(2, reason="hw_thermal_slowdown"), "warning",
                         "GPU 2 on gpu-host-1:9636 is slowed down by hardware thermal protection (50% of the time)",
                         THERMAL_DESCRIPTION, RUNBOOK["thermal"])),
            check("3m", "ResmonGpuPowerBrake"),
            check("10m", "ResmonGpuPowerBrake",
                  firing(gpu(1, reason="hw_power_brake_slowdown"), "warning",
                         "GPU 1 on gpu-host-1:9636 is held by the power brake (100% of the time)",
                         BRAKE_DESCRIPTION, RUNBOOK["brake"]),
                  firing(gpu(3, reason="hw_power_brake_slowdown"), "warning",
                         "GPU 3 on gpu-host-1:9636 is held by the power brake (100% of the time)",
                         BRAKE_DESCRIPTION, RUNBOOK["brake"])),
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
            {"series": series("resmon_collector_success", {**H3, "collector": "gpu"}), "values": "0x20"},
            {"series": series("resmon_collector_error_info", {**H3, "collector": "gpu", "reason": "no_permission"}),
             "values": "1x20"},
            {"series": series("resmon_collector_success", {**H1, "collector": "xid"}), "values": "0x20"},
            {"series": series("resmon_collector_success", {**H1, "collector": "nvlink"}), "values": "1x20"},
            {"series": series("resmon_collector_success", {**H2, "collector": "health"}), "values": "1 0x3 1x16"},
            {"series": series("resmon_collector_success", {**H1, "collector": "kubernetes"}), "values": "0x20"},
            {"series": series("resmon_collector_success", {**H2, "collector": "processes"}), "values": "0x10 1x10"},
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
            check("3m", "ResmonGpuNoPermission"),  # pending: for 5m
            check("7m", "ResmonGpuNoPermission",
                  firing({**H3, "collector": "gpu", "reason": "no_permission"}, "warning",
                         "resmon on gpu-host-3:9636 may not open its GPUs",
                         "NVML has refused the exporter access to the GPUs (NO_PERMISSION) for 5 minutes: no GPU "
                         "metric and no GPU alert works for this host meanwhile.",
                         "Give the exporter the device nodes: /dev/nvidiactl and /dev/nvidia* readable by its user "
                         "(the video group or a udev rule); in Docker --gpus all (NVIDIA container toolkit) or "
                         "--device for each node; in Kubernetes the nvidia runtime class. README, Troubleshooting.")),
            # gpu-host-3's failing collector is ResmonGpuNoPermission's alone: only gpu-host-1 here
            check("5m", "ResmonGpuCollectorFailing"),
            check("15m", "ResmonGpuCollectorFailing",
                  firing({**H1, "collector": "gpu"}, "warning", "resmon on gpu-host-1:9636 cannot read its GPUs",
                         "The GPU collector has failed for 10 minutes (NVML or the vendor CLI not answering, or "
                         "refreshes timing out).",
                         "Read the exporter's log; check the driver (nvidia-smi) and, in containers, the NVIDIA runtime.")),
            check("5m", "ResmonHealthCollectorFailing"),
            check("15m", "ResmonHealthCollectorFailing",
                  firing({**H1, "collector": "xid"}, "warning",
                         "resmon on gpu-host-1:9636 cannot read GPU health (xid collector)",
                         "The xid collector has failed for 10 minutes: the XID, ECC, row-remap and NVLink alerts that "
                         "read it cannot fire meanwhile.",
                         "Read the exporter's log for the collector's error and check the driver (nvidia-smi -q); "
                         "restart the exporter if it persists.")),
            check("10m", "ResmonAttributionCollectorFailing"),  # pending: for 15m
            check("18m", "ResmonAttributionCollectorFailing",  # H2's processes recovered at 10m
                  firing({**H1, "collector": "kubernetes"}, "warning",
                         "resmon on gpu-host-1:9636 cannot tell who uses its GPUs (kubernetes collector)",
                         "The kubernetes collector has failed for 15 minutes: process or pod attribution is missing, "
                         "and the VRAM alerts cannot name the largest holder.",
                         "Read the exporter's log: for kubernetes, the kubelet socket mount and uid 0; for processes, "
                         "hostPID or --path.procfs.")),
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
    # XIDs. GPU 0's XID 79 is its first ever: the series appears with the event (no 0 before it),
    # so increase() alone never fires on it; the receipt time does, at once, for 10 minutes.
    # GPU 1's XIDs are the application's (13, 31, 43): never alerted. GPU 2's exporter clock runs
    # an hour behind Prometheus: its first XID 48 looks old, its second (20m) fires by increase().
    # GPU 3's XID 48 happened two hours before Prometheus first scraped the series: quiet.
    xid = {
        "name": "XID events",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_xid_errors_total", gpu(0, xid="79")), "values": "_ _ _ 1x30"},
            {"series": series("resmon_gpu_xid_last_timestamp_seconds", gpu(0, xid="79")), "values": "_ _ _ 180x30"},
            {"series": series("resmon_gpu_xid_errors_total", gpu(0, xid="94")), "values": "_ _ _ 1x30"},
            {"series": series("resmon_gpu_xid_last_timestamp_seconds", gpu(0, xid="94")), "values": "_ _ _ 180x30"},
        ] + [
            s for code in ("13", "31", "43") for s in (
                {"series": series("resmon_gpu_xid_errors_total", gpu(1, xid=code)), "values": "_ _ _ 1 2 3x30"},
                {"series": series("resmon_gpu_xid_last_timestamp_seconds", gpu(1, xid=code)),
                 "values": "_ _ _ 180 240 300x30"})
        ] + [
            {"series": series("resmon_gpu_xid_errors_total", gpu(2, xid="48")), "values": "_ _ _ 1x16 2x15"},
            {"series": series("resmon_gpu_xid_last_timestamp_seconds", gpu(2, xid="48")),
             "values": "_ _ _ -3420x16 -2400x15"},
            {"series": series("resmon_gpu_xid_errors_total", gpu(3, xid="48")), "values": "3x34"},
            {"series": series("resmon_gpu_xid_last_timestamp_seconds", gpu(3, xid="48")), "values": "-7200x34"},
        ],
        "alert_rule_test": [
            check("2m", "ResmonGpuXidCritical"),
            check("3m", "ResmonGpuXidCritical", *[firing(
                gpu(0, xid="79"), "critical", "GPU 0 on gpu-host-1:9636 reported hardware XID 79",
                "NVML reported XID 79 on GPU 0 (GPU-00000000) in the last 10 minutes: a hardware, firmware or NVLink "
                "fault (48, 62, 64, 74, 79, 95, 119, 120). Jobs on this GPU have likely failed.",
                RUNBOOK["xid_critical"])]),
            check("12m", "ResmonGpuXidCritical", *[firing(
                gpu(0, xid="79"), "critical", "GPU 0 on gpu-host-1:9636 reported hardware XID 79",
                "NVML reported XID 79 on GPU 0 (GPU-00000000) in the last 10 minutes: a hardware, firmware or NVLink "
                "fault (48, 62, 64, 74, 79, 95, 119, 120). Jobs on this GPU have likely failed.",
                RUNBOOK["xid_critical"])]),
            check("14m", "ResmonGpuXidCritical"),  # 11 minutes old
            check("22m", "ResmonGpuXidCritical", firing(
                gpu(2, xid="48"), "critical", "GPU 2 on gpu-host-1:9636 reported hardware XID 48",
                "NVML reported XID 48 on GPU 2 (GPU-00000002) in the last 10 minutes: a hardware, firmware or NVLink "
                "fault (48, 62, 64, 74, 79, 95, 119, 120). Jobs on this GPU have likely failed.",
                RUNBOOK["xid_critical"])),
            check("2m", "ResmonGpuXidWarning"),
            check("5m", "ResmonGpuXidWarning", firing(
                gpu(0, xid="94"), "warning", "GPU 0 on gpu-host-1:9636 reported memory-error XID 94",
                "NVML reported XID 94 on GPU 0 (GPU-00000000) in the last 10 minutes: a memory error the GPU "
                "contained or repaired (63, 92, 94). It keeps running, but may need a reset.",
                RUNBOOK["xid_warning"])),
            check("20m", "ResmonGpuXidWarning"),
        ],
        "promql_expr_test": [
            # why the timestamp half exists: increase() alone sees nothing of GPU 0's first XID
            {"expr": f'increase(resmon_gpu_xid_errors_total{{xid=~"{CRITICAL_XIDS}"}}[10m]) > 0', "eval_time": "5m",
             "exp_samples": []},
        ],
    }
    # ECC. GPU 0 had 3 uncorrectable errors and gets 2 more at 5m (volatile and aggregate: one
    # alert, showing the volatile count) and corrected ones all along (never alerted); GPU 1 carries 3 old ones;
    # GPU 2's series first appears at 5m with 4 (exporter restarted after old errors): quiet.
    ecc = {
        "name": "ECC errors",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_ecc_errors_total", gpu(0, type="uncorrected", scope="volatile")),
             "values": "3x4 5x20"},
            {"series": series("resmon_gpu_ecc_errors_total", gpu(0, type="uncorrected", scope="aggregate")),
             "values": "7x4 9x20"},
            {"series": series("resmon_gpu_ecc_errors_total", gpu(0, type="corrected", scope="volatile")),
             "values": "0+5x24"},
            {"series": series("resmon_gpu_ecc_errors_total", gpu(1, type="uncorrected", scope="volatile")),
             "values": "3x24"},
            {"series": series("resmon_gpu_ecc_errors_total", gpu(2, type="uncorrected", scope="volatile")),
             "values": "_ _ _ _ _ 4x20"},
        ],
        "alert_rule_test": [
            check("4m", "ResmonGpuEccUncorrectable"),
            check("10m", "ResmonGpuEccUncorrectable", firing(
                gpu(0, type="uncorrected", scope="volatile"), "critical",
                "GPU 0 on gpu-host-1:9636 had uncorrectable ECC errors",
                "The uncorrectable ECC error count of GPU 0 (GPU-00000000) rose in the last 10 minutes, to 5 since "
                "the driver loaded. Data on the GPU may be corrupt; the jobs that hit the error were stopped.",
                "Drain the GPU; check nvidia-smi -q -d ECC,ROW_REMAPPER (PAGE_RETIREMENT before Ampere) and dmesg "
                "(XID 48, 94, 95); reset it so a pending remap applies, and RMA it if errors repeat.")),
            check("20m", "ResmonGpuEccUncorrectable"),
        ],
    }
    # Row remapping (Ampere+), page retirement (before Ampere), recovery action.
    actions = {0: "1", 1: "2", 2: "0", 3: "4", 4: "3", 5: "6"}
    needs = {"1": "a GPU reset", "2": "a node reboot", "3": "its peer-to-peer traffic drained",
             "4": "a drain and a reset", "6": "recovery action 6"}
    memory = {
        "name": "memory repair and recovery",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_row_remap_pending", gpu(0)), "values": "0x2 1x10"},
            {"series": series("resmon_gpu_row_remap_pending", gpu(1)), "values": "0x12"},
            {"series": series("resmon_gpu_row_remap_failed", gpu(0)), "values": "0x12"},
            {"series": series("resmon_gpu_row_remap_failed", gpu(1)), "values": "1x12"},
            {"series": series("resmon_gpu_retired_pages_pending", gpu(2)), "values": "1x12"},
            {"series": series("resmon_gpu_retired_pages_pending", gpu(3)), "values": "0x12"},
        ] + [
            {"series": series("resmon_gpu_recovery_action", gpu(i)), "values": f"{v}x12"} for i, v in actions.items()
        ],
        "alert_rule_test": [
            check("3m", "ResmonGpuRowRemapPending"),  # pending since 3m, for 1m
            check("6m", "ResmonGpuRowRemapPending", firing(
                gpu(0), "warning", "GPU 0 on gpu-host-1:9636 needs a reset to apply a row remap",
                "GPU 0 (GPU-00000000) has remapped a memory row after an ECC error; the remap takes effect at the next "
                "GPU reset, and until then the bad row stays in use.",
                "Drain the GPU and reset it (nvidia-smi -r) or reboot the node; nvidia-smi -q -d ROW_REMAPPER shows "
                "the counts.")),
            check("0m", "ResmonGpuRowRemapFailed"),
            check("5m", "ResmonGpuRowRemapFailed", firing(
                gpu(1), "critical", "GPU 1 on gpu-host-1:9636 failed to remap a memory row",
                "Row remapping has failed on GPU 1 (GPU-00000001): a bad memory row could not be replaced by a spare, "
                "so errors there can no longer be repaired.",
                "Take the GPU out of service and open an RMA with its serial number (nvidia-smi -q); a reset does not "
                "fix this.")),
            check("0m", "ResmonGpuRetiredPagesPending"),
            check("5m", "ResmonGpuRetiredPagesPending", firing(
                gpu(2), "warning", "GPU 2 on gpu-host-1:9636 needs a reset to retire memory pages",
                "GPU 2 (GPU-00000002) has memory pages marked for retirement after ECC errors; they are retired at the "
                "next driver reload or GPU reset.",
                "Drain the GPU and reset it or reboot the node; nvidia-smi -q -d PAGE_RETIREMENT shows the counts "
                "(many retired pages: RMA).")),
            check("0m", "ResmonGpuRecoveryAction"),
            check("5m", "ResmonGpuRecoveryAction", *[firing(
                gpu(i), "critical", f"GPU {i} on gpu-host-1:9636 needs {needs[v]}",
                f"The driver has asked for recovery action {v} on GPU {i} (GPU-0000000{i}) for 1 minute (1 GPU reset, "
                "2 node reboot, 3 drain peer-to-peer, 4 drain and reset). The GPU does not work correctly until it is "
                "done.", RUNBOOK["recovery"]) for i, v in actions.items() if v != "0"]),
        ],
    }
    # NVLink. GPU 0: link 0 goes down at 11m after being up, link 1 stays up, link 2 was never up
    # (not cabled). GPU 1's link 0 drops for one sample (retraining): shorter than `for`.
    nvlink = {
        "name": "NVLink links",
        "interval": "1m",
        "input_series": [
            {"series": series("resmon_gpu_nvlink_active", gpu(0, link="0")), "values": "1x10 0x420"},
            {"series": series("resmon_gpu_nvlink_active", gpu(0, link="1")), "values": "1x430"},
            {"series": series("resmon_gpu_nvlink_active", gpu(0, link="2")), "values": "0x430"},
            {"series": series("resmon_gpu_nvlink_active", gpu(1, link="0")), "values": "1x10 0 1x419"},
        ],
        "alert_rule_test": [
            check("13m", "ResmonGpuNvlinkDown"),  # down since 11m, for 5m
            check("20m", "ResmonGpuNvlinkDown", firing(
                gpu(0, link="0"), "warning", "NVLink 0 of GPU 0 on gpu-host-1:9636 is down",
                "NVLink link 0 of GPU 0 (GPU-00000000) was active during the last 6 hours and has been down for 5 "
                "minutes: multi-GPU jobs fall back to PCIe or hang.",
                "Check nvidia-smi nvlink -s and -e, and dmesg for XID 74; reset the GPU or reboot the node, and "
                "service the board or NVSwitch if the link stays down.")),
            check("7h", "ResmonGpuNvlinkDown"),  # down for over 6 hours: resolved, as documented
        ],
    }
    # PCIe. GPU 0 busy (utilization gauge, no busy counter) at Gen 4 of 5 and x8 of x16: fires
    # both. GPU 1 idle at Gen 1 of 4 and x8 of x16: power saving, quiet. GPU 2 at x8 of x16, busy
    # by its busy-seconds counter (80 %) though the instantaneous gauge reads 10 %: fires. GPU 3
    # at x8 of x16, the gauge reads 90 % but the counter says 10 % over 5 minutes: the counter
    # wins, quiet.
    def pcie_series(i: int, gen: tuple[int, int], width: tuple[int, int]) -> list[dict[str, str]]:
        return [
            {"series": series("resmon_gpu_pcie_link_generation", gpu(i, bound="current")), "values": f"{gen[0]}x30"},
            {"series": series("resmon_gpu_pcie_link_generation", gpu(i, bound="max")), "values": f"{gen[1]}x30"},
            {"series": series("resmon_gpu_pcie_link_width_lanes", gpu(i, bound="current")), "values": f"{width[0]}x30"},
            {"series": series("resmon_gpu_pcie_link_width_lanes", gpu(i, bound="max")), "values": f"{width[1]}x30"},
        ]

    pcie = {
        "name": "PCIe link under load",
        "interval": "1m",
        "input_series": pcie_series(0, (4, 5), (8, 16)) + pcie_series(1, (1, 4), (8, 16)) +
        pcie_series(2, (4, 4), (8, 16)) + pcie_series(3, (4, 4), (8, 16)) + [
            {"series": series("resmon_gpu_utilization_ratio", gpu(0)), "values": "0.9x30"},
            {"series": series("resmon_gpu_utilization_ratio", gpu(1)), "values": "0x30"},
            {"series": series("resmon_gpu_utilization_ratio", gpu(2)), "values": "0.1x30"},
            {"series": series("resmon_gpu_busy_seconds_total", gpu(2, engine="gpu")), "values": "0+48x30"},
            {"series": series("resmon_gpu_busy_seconds_total", gpu(2, engine="memory")), "values": "0+6x30"},
            {"series": series("resmon_gpu_utilization_ratio", gpu(3)), "values": "0.9x30"},
            {"series": series("resmon_gpu_busy_seconds_total", gpu(3, engine="gpu")), "values": "0+6x30"},
        ],
        "alert_rule_test": [
            check("5m", "ResmonGpuPcieGenerationDegraded"),  # for 10m
            check("15m", "ResmonGpuPcieGenerationDegraded", firing(
                gpu(0), "warning",
                "GPU 0 on gpu-host-1:9636 runs its PCIe link at Gen 4, below its maximum, while busy",
                "The PCIe link of GPU 0 (GPU-00000000) has run below its maximum generation for 10 minutes while the "
                "GPU was more than 50 % busy: host-device transfers are slower.", RUNBOOK["pcie"])),
            check("5m", "ResmonGpuPcieWidthDegraded"),
            check("15m", "ResmonGpuPcieWidthDegraded", firing(
                gpu(0), "warning",
                "GPU 0 on gpu-host-1:9636 runs its PCIe link at x8, below its maximum width, while busy",
                "The PCIe link of GPU 0 (GPU-00000000) has run with fewer lanes than its maximum for 10 minutes while "
                "the GPU was more than 50 % busy: host-device transfers are slower.", RUNBOOK["pcie"]), firing(
                gpu(2), "warning",
                "GPU 2 on gpu-host-1:9636 runs its PCIe link at x8, below its maximum width, while busy",
                "The PCIe link of GPU 2 (GPU-00000002) has run with fewer lanes than its maximum for 10 minutes while "
                "the GPU was more than 50 % busy: host-device transfers are slower.", RUNBOOK["pcie"])),
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
    return [vram, holder, filling, temp, xid, ecc, memory, nvlink, pcie, health, absent]



# -- waste and cost: ../rules/resmon.waste.rules.yml ------------------------------------------

WASTE_RUNBOOK = {
    "idle": "Ask the owner to release the GPU (end the job, scale the pod down, close the notebook); check whether it "
            "waits on input or a stuck step. Tune the threshold in prometheus/rules/resmon.waste.rules.yml.",
    "held": "Find the holder (nvidia-smi, the node dashboard's Waste and cost row) and end it or free its memory (a "
            "leaked CUDA context, an idle notebook kernel, a crashed job's orphan). Tune the threshold in "
            "prometheus/rules/resmon.waste.rules.yml.",
}
POD_A = {"pod_uid": "7d5f3c1e-2b4a-4c6d-8e9f-0a1b2c3d4e5f", "namespace": "team-a", "pod": "train-0", "container": "trainer"}
POD_B = {"pod_uid": "9e8d7c6b-5a49-4382-9172-605f4e3d2c1b", "namespace": "team-b", "pod": "notebook-1", "container": "lab"}


def allocation(i: int, namespace: str, pod: str, container: str, device_id: str, **dra: str) -> dict[str, str]:
    return gpu(i, namespace=namespace, pod=pod, container=container, resource="nvidia.com/gpu", device_id=device_id,
               **dra)


def job_info(i: int, job_id: str, user: str) -> dict[str, str]:
    return gpu(i, scheduler="slurm", job_id=job_id, user=user)


def idle_alert(labels: dict[str, str], holder: str, holder_description: str, value: str) -> dict[str, Any]:
    i, uuid = labels["gpu"], labels["uuid"]
    return firing(labels, "warning", f"GPU {i} on gpu-host-1:9636 is held by {holder} and idle",
                  f"{holder_description} holds GPU {i} ({uuid}) and has kept it under 5 % busy for an hour (now "
                  f"{value}): its own processes' busy time where the exporter reports it per process, else the whole "
                  "GPU's.", WASTE_RUNBOOK["idle"])


def held_alert(labels: dict[str, str], summary_holder: str, description_holder: str, size: str) -> dict[str, Any]:
    i, uuid = labels["gpu"], labels["uuid"]
    return firing(labels, "warning", f"{summary_holder} holds {size}B of GPU {i} on gpu-host-1:9636 and does nothing",
                  f"{description_holder} has held {size}B (over 10 % of the VRAM) of GPU {i} ({uuid}) with no engine "
                  "time at all for an hour: memory nobody else can use.", WASTE_RUNBOOK["held"])


def samples(name: str, expr_labels: list[tuple[dict[str, str], float]]) -> list[dict[str, Any]]:
    return [{"labels": series(name, labels), "value": value} for labels, value in expr_labels]


def expect(rule: str, values: list[tuple[dict[str, str], float]], at: str = "10m") -> dict[str, Any]:
    """The rule's exact values at `at`, to 1e-6: promtool 2.42 compares floats exactly, and
    rate()'s extrapolation leaves the last bit of 0.01 or 1.5 to chance (round() keeps no name)."""
    return {"expr": f"round({rule}, 0.000001)", "eval_time": at, "exp_samples": samples("", values)}


def waste_tests() -> list[dict[str, Any]]:
    """Busy shares per holder, the idle alert and the GPU-hour rules. Counters grow by N seconds
    a minute, so N/60 is the busy share. GPU 0 is time-sliced: team-a/train-0's process keeps it
    50 % busy (sm; its memory engine 10 %: the busiest engine counts), team-b/notebook-1 holds a
    replica and runs nothing: idle by its own time though the device is 80 % busy. GPU 1
    (team-c/idle-0 through DRA: extra labels claim and share) and GPU 2 (team-c/busy-0) have no
    per-process busy series: the device's busy time counts, 1 % and 50 %. GPU 3: Slurm job 4242
    (alice) whose process does nothing while a host process keeps the device 50 % busy. GPU 4:
    job 4343 (bob) 40 % busy. GPU 5: job 4444 (carol) on a GPU with only the utilization gauge
    (2 %)."""
    job_4242 = gpu(3, pid="4242", process="python", user="alice", job_id="4242")
    inputs = [
        ("resmon_gpu_allocation_info", allocation(0, "team-a", "train-0", "trainer", "GPU-00000000::0"), "1x80"),
        ("resmon_gpu_allocation_info", allocation(0, "team-b", "notebook-1", "lab", "GPU-00000000::1"), "1x80"),
        ("resmon_gpu_allocation_info", allocation(1, "team-c", "idle-0", "main", "gpu-1", claim="gpu-claim",
                                                  share="1"), "1x80"),
        ("resmon_gpu_allocation_info", allocation(2, "team-c", "busy-0", "main", "GPU-00000002"), "1x80"),
        ("resmon_gpu_job_info", job_info(3, "4242", "alice"), "1x80"),
        ("resmon_gpu_job_info", job_info(4, "4343", "bob"), "1x80"),
        ("resmon_gpu_job_info", job_info(5, "4444", "carol"), "1x80"),
        ("resmon_gpu_busy_seconds_total", gpu(0, engine="gpu"), "0+48x80"),
        ("resmon_gpu_busy_seconds_total", gpu(1, engine="gpu"), "0+0.6x80"),
        ("resmon_gpu_busy_seconds_total", gpu(2, engine="gpu"), "0+30x80"),
        ("resmon_gpu_busy_seconds_total", gpu(2, engine="memory"), "0+6x80"),
        ("resmon_gpu_busy_seconds_total", gpu(3, engine="gpu"), "0+30x80"),
        ("resmon_gpu_busy_seconds_total", gpu(4, engine="gpu"), "0+24x80"),
        ("resmon_gpu_utilization_ratio", gpu(5), "0.02x80"),
        ("resmon_gpu_process_busy_seconds_total", gpu(0, pid="5151", process="python", user="root", engine="sm", **POD_A),
         "0+30x80"),
        ("resmon_gpu_process_busy_seconds_total",
         gpu(0, pid="5151", process="python", user="root", engine="memory", **POD_A), "0+6x80"),
        ("resmon_gpu_process_busy_seconds_total", gpu(3, pid="7000", process="render", user="root", engine="sm"),
         "0+30x80"),
        ("resmon_gpu_process_busy_seconds_total", {**job_4242, "engine": "sm"}, "0x80"),
        ("resmon_gpu_process_busy_seconds_total", gpu(4, pid="4343", process="python", user="bob", job_id="4343",
                                                      engine="sm"), "0+24x80"),
    ]
    pods = [(gpu(0, namespace="team-a", pod="train-0"), 0.5), (gpu(0, namespace="team-b", pod="notebook-1"), 0),
            (gpu(1, namespace="team-c", pod="idle-0"), 0.01), (gpu(2, namespace="team-c", pod="busy-0"), 0.5)]
    jobs = [(gpu(3, job_id="4242", user="alice"), 0), (gpu(4, job_id="4343", user="bob"), 0.4),
            (gpu(5, job_id="4444", user="carol"), 0.02)]



    idle = {
        "name": "idle allocated GPUs: busy shares, GPU-hours, ResmonGpuAllocatedIdle",
        "interval": "1m",
        "input_series": [{"series": series(name, labels), "values": values} for name, labels, values in inputs],
        "promql_expr_test": [
            expect("resmon:gpu_busy:ratio_rate5m", [(gpu(0), 0.8), (gpu(1), 0.01), (gpu(2), 0.5), (gpu(3), 0.5),
                                                     (gpu(4), 0.4), (gpu(5), 0.02)]),
            expect("resmon:gpu_pod_busy:ratio_rate5m", pods),
            expect("resmon:gpu_slurm_job_busy:ratio_rate5m", jobs),
            expect("resmon:gpu_workload_busy:ratio_rate5m", [
                (gpu(0, pid="5151", process="python", user="root", **POD_A), 0.5),  # sm, not its memory engine
                (gpu(3, pid="7000", process="render", user="root"), 0.5), (job_4242, 0),
                (gpu(4, pid="4343", process="python", user="bob", job_id="4343"), 0.4)]),
            expect("resmon:gpu_pod_idle:bool", [(labels, 1.0 if v < 0.05 else 0.0) for labels, v in pods]),
            expect("resmon:gpu_slurm_job_idle:bool", [(labels, 1.0 if v < 0.05 else 0.0) for labels, v in jobs]),
            expect("resmon:namespace:gpu_idle_hours_per_hour",
                   [({**H1, "namespace": ns}, v) for ns, v in (("team-a", 0), ("team-b", 1), ("team-c", 1))]),
            expect("resmon:pod:gpu_idle_hours_per_hour",
                   [({**H1, "namespace": ns, "pod": pod}, v) for ns, pod, v in (
                       ("team-a", "train-0", 0), ("team-b", "notebook-1", 1), ("team-c", "idle-0", 1),
                       ("team-c", "busy-0", 0))]),
            expect("resmon:slurm_job:gpu_idle_hours_per_hour",
                   [({**H1, "job_id": j, "user": u}, v) for j, u, v in (("4242", "alice", 1), ("4343", "bob", 0),
                                                                         ("4444", "carol", 1))]),
            expect("resmon:user:gpu_idle_hours_per_hour",
                   [({**H1, "user": u}, v) for u, v in (("alice", 1), ("bob", 0), ("carol", 1))]),
            # GPU 0 is not idle (train-0 keeps it busy though notebook-1 idles on it): GPUs 1, 3 and 5
            expect("resmon:instance:gpu_idle_hours_per_hour", [(H1, 3)]),
            expect("resmon:fleet:gpu_idle_hours_per_hour", [({"job": "resmon"}, 3)]),
            expect("resmon:pod:gpu_used_hours_per_hour",
                   [({**H1, "namespace": labels["namespace"], "pod": labels["pod"]}, v) for labels, v in pods]),
            expect("resmon:namespace:gpu_used_hours_per_hour",
                   [({**H1, "namespace": ns}, v) for ns, v in (("team-a", 0.5), ("team-b", 0), ("team-c", 0.51))]),
            expect("resmon:slurm_job:gpu_used_hours_per_hour",
                   [({**H1, "job_id": labels["job_id"], "user": labels["user"]}, v) for labels, v in jobs]),
            expect("resmon:instance:gpu_used_hours_per_hour", [(H1, 2.23)]),
            expect("resmon:fleet:gpu_used_hours_per_hour", [({"job": "resmon"}, 2.23)]),
        ],
        "alert_rule_test": [
            check("30m", "ResmonGpuAllocatedIdle"),  # idle since the first minute: pending for 1h
            check("70m", "ResmonGpuAllocatedIdle",
                  idle_alert(gpu(0, namespace="team-b", pod="notebook-1"), "pod team-b/notebook-1",
                             "Pod team-b/notebook-1", "0%"),
                  idle_alert(gpu(1, namespace="team-c", pod="idle-0"), "pod team-c/idle-0", "Pod team-c/idle-0", "1%"),
                  idle_alert(gpu(3, job_id="4242", user="alice"), "Slurm job 4242 of alice",
                             "Slurm job 4242 (user alice)", "0%"),
                  idle_alert(gpu(5, job_id="4444", user="carol"), "Slurm job 4444 of carol",
                             "Slurm job 4444 (user carol)", "2%")),
        ],
    }
    # GPU 0 (80 GiB): what holds over 8 GiB with no engine time fires. group-by=process: the pod's
    # process, a process in a Slurm job; group-by=container: a plain Docker container, a Slurm
    # job's processes outside containers. Quiet: a busy process, a small idle one (2 GiB), one
    # without busy series (MIG: no per-process samples), and one that went idle 20 minutes ago.
    docker_id = "0123456789ab" + "cdef0123" * 6 + "cdef"
    held_inputs = [
        (gpu(0, pid="5151", process="python", user="root", **POD_B), 20 * GIB, "0x80"),
        (gpu(0, pid="9000", process="python", user="alice", job_id="4343"), 16 * GIB, "0x80"),
        (gpu(0, container_id=docker_id), 10 * GIB, "0x80"),
        (gpu(0, job_id="4242"), 9 * GIB, "0x80"),
        (gpu(0, pid="7000", process="train", user="bob"), 30 * GIB, "0+30x80"),
        (gpu(0, pid="8000", process="tiny", user="bob"), 2 * GIB, "0x80"),
        (gpu(0, pid="8100", process="late", user="bob"), 12 * GIB, "0+30x50 1500x30"),
    ]
    held = {
        "name": "VRAM held without work: ResmonGpuMemoryHeldIdle",
        "interval": "1m",
        "input_series": [{"series": series("resmon_gpu_memory_total_bytes", gpu(0)), "values": f"{80 * GIB}x80"}] + [
            {"series": series("resmon_gpu_process_memory_used_bytes", labels), "values": f"{size}x80"}
            for labels, size, _ in held_inputs
        ] + [
            {"series": series("resmon_gpu_process_busy_seconds_total", {**labels, "engine": "sm"}), "values": busy}
            for labels, _, busy in held_inputs
        ] + [{"series": series("resmon_gpu_process_memory_used_bytes", gpu(0, pid="8200", process="mig", user="bob")),
              "values": f"{40 * GIB}x80"}],
        "alert_rule_test": [
            check("30m", "ResmonGpuMemoryHeldIdle"),
            check("70m", "ResmonGpuMemoryHeldIdle",
                  held_alert(held_inputs[0][0], "Pod team-b/notebook-1", "Pod team-b/notebook-1 (container lab)",
                             "20Gi"),
                  held_alert(held_inputs[1][0], "Process python (pid 9000)",
                             "Process python (pid 9000, user alice) in Slurm job 4343", "16Gi"),
                  held_alert(held_inputs[2][0], "Container 0123456789ab", "Container 0123456789ab", "10Gi"),
                  held_alert(held_inputs[3][0], "Slurm job 4242",
                             "Slurm job 4242 (its processes outside containers)", "9Gi")),
        ],
    }
    # kWh per hour from joules per minute: 60 kJ a minute is 1 kW.
    energy_inputs = [
        ("resmon_gpu_process_energy_joules_total", gpu(0, pid="5151", process="python", user="root", **POD_A), 60000),
        ("resmon_gpu_process_energy_joules_total", gpu(1, pid="5152", process="python", user="root", **POD_A), 30000),
        ("resmon_gpu_process_energy_joules_total", gpu(0, pid="6000", process="python", user="root", **POD_B), 6000),
        ("resmon_gpu_process_energy_joules_total", gpu(3, pid="4242", process="python", user="alice", job_id="4242"),
         120000),
        ("resmon_gpu_process_energy_joules_total", gpu(4, job_id="4343"), 60000),  # group-by=container
        ("resmon_gpu_energy_joules_total", gpu(0), 90000),
        ("resmon_gpu_energy_joules_total", gpu(1), 36000),
        ("resmon_gpu_energy_joules_total", gpu(3), 150000),
        ("resmon_gpu_energy_joules_total", gpu(4), 60000),
        ("resmon_gpu_unattributed_energy_joules_total", gpu(0), 24000),
        ("resmon_gpu_unattributed_energy_joules_total", gpu(1), 6000),
        ("resmon_gpu_unattributed_energy_joules_total", gpu(3), 30000),
    ]
    energy = {
        "name": "energy per workload in kWh",
        "interval": "1m",
        "input_series": [{"series": series(name, labels), "values": f"0+{per_minute}x20"}
                         for name, labels, per_minute in energy_inputs] + [
            {"series": series("resmon_gpu_job_info", job_info(3, "4242", "alice")), "values": "1x20"},
            {"series": series("resmon_gpu_job_info", job_info(4, "4343", "bob")), "values": "1x20"},
        ],
        "promql_expr_test": [
            expect("resmon:pod:gpu_energy_kwh_per_hour", [({**H1, "namespace": "team-a", "pod": "train-0"}, 1.5),
                                                          ({**H1, "namespace": "team-b", "pod": "notebook-1"}, 0.1)]),
            expect("resmon:namespace:gpu_energy_kwh_per_hour", [({**H1, "namespace": "team-a"}, 1.5),
                                                                ({**H1, "namespace": "team-b"}, 0.1)]),
            expect("resmon:slurm_job:gpu_energy_kwh_per_hour", [({**H1, "job_id": "4242", "user": "alice"}, 2),
                                                                ({**H1, "job_id": "4343", "user": "bob"}, 1)]),
            expect("resmon:user:gpu_energy_kwh_per_hour", [({**H1, "user": "alice"}, 2), ({**H1, "user": "bob"}, 1)]),
            expect("resmon:instance:gpu_energy_kwh_per_hour", [(H1, 5.6)]),
            expect("resmon:instance:gpu_unattributed_energy_kwh_per_hour", [(H1, 1)]),
            expect("resmon:fleet:gpu_energy_kwh_per_hour", [({"job": "resmon"}, 5.6)]),
        ],
    }
    return [idle, held, energy]


def document(rules: str = "resmon.rules.yml") -> str:
    """The promtool test file of ../rules/<rules>."""
    doc = {"rule_files": [f"../rules/{rules}"], "evaluation_interval": "1m", "tests": TESTS[rules]()}
    header = ("# Generated by generate.py, whose expected annotations are literal (not read from\n"
              f"# ../rules/{rules}): edit that script, then re-run it.\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=200)


# rules file -> its tests; each is written to <rules minus .yml>.test.yml
TESTS = {"resmon.rules.yml": tests, "resmon.waste.rules.yml": waste_tests}


def test_file(rules: str) -> str:
    return rules.removesuffix(".yml") + ".test.yml"


if __name__ == "__main__":
    for rules in TESTS:
        (HERE / test_file(rules)).write_text(document(rules))
        print(f"wrote prometheus/tests/{test_file(rules)}")
