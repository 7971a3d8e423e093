"""Machines shared by several tests, as fake-NVML scenario dictionaries."""

from __future__ import annotations

import os
from typing import Any

from fakenvml import GIB, MIB, gpu_keys

NOT_SUPPORTED = 3
GPU_IS_LOST = 15
UNKNOWN = 999
DRIVER_NOT_LOADED = 9

# A second real PID besides the test's own, so process lists hold live processes.
OTHER_PID = os.getppid()


def three_gpus() -> dict[str, Any]:
    """GPU 0 busy H100 without a fan reading, GPU 1 idle A100, GPU 2 an L4 where
    utilization, power and energy are not supported (as on MIG or some SKUs)."""
    me = os.getpid()
    return {
        "count": 3,
        "driver_version": "550.54.15",
        **gpu_keys(
            0,
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000000",
            pci_bus_id="00000000:07:00.0",
            memory_total=80 * GIB,
            memory_used=20 * GIB,
            memory_reserved=512 * MIB,
            util_gpu=87,
            util_memory=45,
            temperature=71,
            power_mw=350500,
            power_limit_mw=700000,
            energy_mj=123456789,
            rc__nvmlDeviceGetFanSpeed=NOT_SUPPORTED,
            clock__graphics=1755,
            clock__sm=1755,
            clock__memory=2619,
            clock__video=1395,
            max_clock__graphics=1980,
            max_clock__sm=1980,
            max_clock__memory=2619,
            max_clock__video=1545,
            pstate=0,
            clocks_event_reasons=0x44,  # sw_power_cap + hw_thermal_slowdown
            processes=f"{me}:{2 * GIB},{OTHER_PID}:{GIB}",
            graphics_processes=f"{me}:{GIB}",  # same PID in both lists counts once
        ),
        **gpu_keys(
            1,
            name="NVIDIA A100-SXM4-40GB",
            uuid="GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000001",
            pci_bus_id="00000000:0A:00.0",
            memory_total=40 * GIB,
            memory_used=1 * GIB,
            memory_reserved=256 * MIB,
            util_gpu=3,
            util_memory=1,
            temperature=40,
            power_mw=60000,
            power_limit_mw=400000,
            energy_mj=5000,
            fan=45,
            clock__graphics=210,
            clock__sm=210,
            clock__memory=1215,
            clock__video=585,
            max_clock__graphics=1410,
            max_clock__sm=1410,
            max_clock__memory=1215,
            max_clock__video=1290,
            pstate=8,
            clocks_event_reasons=0x1,
        ),
        **gpu_keys(
            2,
            name="NVIDIA L4",
            uuid="GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000002",
            pci_bus_id="00000000:0B:00.0",
            memory_total=24 * GIB,
            memory_used=0,
            memory_reserved=300 * MIB,
            temperature=33,
            power_limit_mw=72000,
            fan=0,
            pstate=12,
            clocks_event_reasons=0,
            rc__nvmlDeviceGetUtilizationRates=NOT_SUPPORTED,
            rc__nvmlDeviceGetPowerUsage=NOT_SUPPORTED,
            rc__nvmlDeviceGetTotalEnergyConsumption=NOT_SUPPORTED,
        ),
    }


def gpu_field(values: dict[str, Any], index: int, key: str) -> Any:
    return values[f"gpu.{index}.{key}"]
