"""Machines shared by several tests, as fake-NVML scenario dictionaries."""

from __future__ import annotations

import os
from typing import Any

from fakenvml import GIB, MIB, gpu_keys

NOT_SUPPORTED = 3
NOT_FOUND = 6
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


# -- health boards (issue 10) -------------------------------------------------------------
# Each preset is the scenario fragment of one GPU index (its keys: tests/fakenvml.py's docstring,
# answered by tests/fake_nvml/fake_nvml.c). The constants are the exact values, so tests
# assert against them rather than retyping numbers.
# A feature a board lacks is left unset on purpose: it then answers NOT_SUPPORTED.

# field ids (nvml.h NVML_FI_DEV_*)
FI_MEMORY_TEMP = 82
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX, FI_NVLINK_RAW_TX, FI_NVLINK_RAW_RX = 138, 139, 140, 141
FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES = 197, 198
FI_RECOVERY_ACTION = 230
ALL_LINKS = 0xFFFFFFFF
# clock-event reason -> field id; nvmlPerfPolicyType_t of the nvmlDeviceGetViolationStatus
# fallback (None: that reason has no policy)
CLOCK_EVENT_FIELDS = {
    "sw_power_cap": (74, 0),
    "sync_boost": (76, 2),
    "sw_thermal_slowdown": (269, 1),
    "hw_thermal_slowdown": (270, None),
    "hw_power_brake_slowdown": (271, None),
    "board_limit": (77, 3),
    "low_utilization": (78, 4),
    "reliability": (79, 5),
}
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")  # counter 0..4
SAMPLING_TYPES = {"gpu": 1, "memory": 2, "encoder": 3, "decoder": 4}  # nvmlSamplingType_t

HEALTH_DRIVER_VERSION = "550.127.08"

# NVIDIA H100 80GB HBM3 (Hopper): HBM, ECC on, row remapping, 18 NVLinks, every field id answers
HOPPER_NAME = "NVIDIA H100 80GB HBM3"
HOPPER_MEMORY_TEMP = 54
HOPPER_ECC = {"corrected.volatile": 3, "corrected.aggregate": 17, "uncorrected.volatile": 0, "uncorrected.aggregate": 0}
HOPPER_REMAPPED = {"correctable": 2, "uncorrectable": 0, "pending": 0, "failed": 0}
HOPPER_NVLINKS = 18
# link L: tx (L + 1) * 1_000_000 KiB, rx (L + 1) * 1_000_000 + 500_000 KiB
HOPPER_NVLINK_TX_KIB = tuple((link + 1) * 1_000_000 for link in range(HOPPER_NVLINKS))
HOPPER_NVLINK_RX_KIB = tuple((link + 1) * 1_000_000 + 500_000 for link in range(HOPPER_NVLINKS))
HOPPER_NVLINK_ERRORS = {(3, "replay"): 5, (3, "crc_flit"): 2, (7, "recovery"): 1, (11, "crc_data"): 4, (11, "ecc_data"): 1}
HOPPER_CLOCK_EVENT_NS = {
    74: 1_500_000_000,
    76: 250_000_000,
    269: 3_000_000_000,
    270: 40_000_000,
    271: 5_000_000,
    77: 700_000_000,
    78: 9_000_000_000,
    79: 1_000_000,
}
HOPPER_PCIE_TX_BYTES = 123_456_789_012
HOPPER_PCIE_RX_BYTES = 98_765_432_109
HOPPER_RECOVERY_ACTION = 0
HOPPER_PCIE = {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16, "replays": 3}
# sample buffers: one sample every 20 ms, the latest 50 kept (1 s); a pattern of 5 divides 50,
# so a full buffer (and any whole number of cycles) averages exactly the mean
HOPPER_SAMPLES_PERIOD_MS = 20
HOPPER_SAMPLES_CAPACITY = 50
HOPPER_SAMPLES_GPU = (100, 25, 0, 0, 0)  # mean 25 %
HOPPER_SAMPLES_MEMORY = (40, 30, 20, 10, 0)  # mean 20 %
HOPPER_ENCODER_UTIL, HOPPER_DECODER_UTIL = 10, 5  # no pattern: constant samples

# Tesla V100-SXM2-32GB (Volta): HBM2, ECC on, page retirement, 6 NVLinks, an older driver
# where none of the clock-event field ids (nor 197/198/230) answer: violation.* is set instead
VOLTA_NAME = "Tesla V100-SXM2-32GB"
VOLTA_MEMORY_TEMP = 40
VOLTA_ECC = {"corrected.volatile": 1, "corrected.aggregate": 9, "uncorrected.volatile": 0, "uncorrected.aggregate": 0}
VOLTA_RETIRED = {"multiple_single_bit": 1, "double_bit": 0, "pending": 0}
VOLTA_NVLINKS = 6
# link L: tx (L + 1) * 200_000 KiB, rx (L + 1) * 200_000 + 50_000 KiB
VOLTA_NVLINK_TX_KIB = tuple((link + 1) * 200_000 for link in range(VOLTA_NVLINKS))
VOLTA_NVLINK_RX_KIB = tuple((link + 1) * 200_000 + 50_000 for link in range(VOLTA_NVLINKS))
VOLTA_NVLINK_ERRORS = {(2, "replay"): 1}
VOLTA_VIOLATION_NS = {  # nvmlPerfPolicyType_t -> ns
    0: 2_000_000_000,
    1: 600_000_000,
    2: 100_000_000,
    3: 300_000_000,
    4: 8_000_000_000,
    5: 50_000_000,
}
VOLTA_PCIE = {"gen": 3, "gen_max": 3, "width": 16, "width_max": 16, "replays": 0}
VOLTA_SAMPLES_PERIOD_MS = HOPPER_SAMPLES_PERIOD_MS
VOLTA_SAMPLES_CAPACITY = HOPPER_SAMPLES_CAPACITY
VOLTA_SAMPLES_GPU = HOPPER_SAMPLES_GPU
VOLTA_SAMPLES_MEMORY = HOPPER_SAMPLES_MEMORY

# NVIDIA GeForce RTX 4090 (Ada, GDDR6X): memory temperature answers per-entry NOT_SUPPORTED,
# no ECC / retirement / remapping / NVLink, no XID events; the clock-event fields answer
CONSUMER_NAME = "NVIDIA GeForce RTX 4090"
CONSUMER_CLOCK_EVENT_NS = {
    74: 2_500_000_000,
    76: 0,
    269: 120_000_000,
    270: 30_000_000,
    271: 0,
    77: 60_000_000,
    78: 40_000_000_000,
    79: 0,
}
CONSUMER_PCIE = {"gen": 4, "gen_max": 4, "width": 8, "width_max": 16, "replays": 0}  # an x16 card in an x8 link
CONSUMER_SAMPLES_PERIOD_MS = 50
CONSUMER_SAMPLES_CAPACITY = 20
CONSUMER_SAMPLES_GPU = (60,)  # constant
CONSUMER_SAMPLES_MEMORY = (35,)


def _board_uuid(family: int, index: int) -> str:
    return f"GPU-{family:08x}-0000-4000-8000-{index:012x}"


HOPPER_UUID_FAMILY, VOLTA_UUID_FAMILY, CONSUMER_UUID_FAMILY = 0x48100000, 0x56100000, 0x40900000
H200_UUID_FAMILY, A100_UUID_FAMILY = 0x48200000, 0xA1000000
HOPPER_PCI_BUS, VOLTA_PCI_BUS, CONSUMER_PCI_BUS = 0x18, 0x3B, 0x81  # bus of index 0; index i adds i
H200_PCI_BUS, A100_PCI_BUS = 0x9A, 0xC1


def board_uuid(board: str, index: int) -> str:
    """The UUID a preset gives GPU `index` (board: hopper, volta, consumer, h200, a100)."""
    family = {"hopper": HOPPER_UUID_FAMILY, "volta": VOLTA_UUID_FAMILY, "consumer": CONSUMER_UUID_FAMILY,
              "h200": H200_UUID_FAMILY, "a100": A100_UUID_FAMILY}[board]
    return _board_uuid(family, index)


def board_pci_bus_id(board: str, index: int) -> str:
    bus = {"hopper": HOPPER_PCI_BUS, "volta": VOLTA_PCI_BUS, "consumer": CONSUMER_PCI_BUS,
           "h200": H200_PCI_BUS, "a100": A100_PCI_BUS}[board] + index
    return f"00000000:{bus & 0xFF:02X}:00.0"


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _nvlink_keys(tx: tuple[int, ...], rx: tuple[int, ...], errors: dict[tuple[int, str], int]) -> dict[str, Any]:
    keys: dict[str, Any] = {"nvlinks": len(tx)}
    for link, (t, r) in enumerate(zip(tx, rx)):
        keys[f"nvlink.{link}.tx_kib"] = t
        keys[f"nvlink.{link}.rx_kib"] = r
    for (link, counter), value in errors.items():
        keys[f"nvlink.{link}.errors.{counter}"] = value
    return keys


def _pcie_keys(pcie: dict[str, int]) -> dict[str, Any]:
    return {f"pcie_{key}": value for key, value in pcie.items()}  # pcie_gen, pcie_gen_max, ...


def hopper_board(i: int) -> dict[str, Any]:
    """GPU i as an H100 SXM: see the HOPPER_* constants for every value."""
    return gpu_keys(
        i,
        **{
            "name": HOPPER_NAME,
            "uuid": board_uuid("hopper", i),
            "pci_bus_id": board_pci_bus_id("hopper", i),
            "memory_total": 80 * GIB,
            "cuda_cc": "9.0",
            "util_gpu": 25,
            "util_memory": 20,
            "encoder_util": HOPPER_ENCODER_UTIL,
            "decoder_util": HOPPER_DECODER_UTIL,
            f"field.{FI_MEMORY_TEMP}": HOPPER_MEMORY_TEMP,
            "ecc": "on",
            **{f"ecc.{key}": value for key, value in HOPPER_ECC.items()},
            "page_retirement": 0,
            "row_remapping": 1,
            "remapped.correctable": HOPPER_REMAPPED["correctable"],
            "remapped.uncorrectable": HOPPER_REMAPPED["uncorrectable"],
            "remap_pending": HOPPER_REMAPPED["pending"],
            "remap_failed": HOPPER_REMAPPED["failed"],
            **_nvlink_keys(HOPPER_NVLINK_TX_KIB, HOPPER_NVLINK_RX_KIB, HOPPER_NVLINK_ERRORS),
            **{f"field.{fid}": ns for fid, ns in HOPPER_CLOCK_EVENT_NS.items()},
            f"field.{FI_PCIE_TX_BYTES}": HOPPER_PCIE_TX_BYTES,
            f"field.{FI_PCIE_RX_BYTES}": HOPPER_PCIE_RX_BYTES,
            f"field.{FI_RECOVERY_ACTION}": HOPPER_RECOVERY_ACTION,
            **_pcie_keys(HOPPER_PCIE),
            "samples.period_ms": HOPPER_SAMPLES_PERIOD_MS,
            "samples.capacity": HOPPER_SAMPLES_CAPACITY,
            "samples.gpu": _csv(HOPPER_SAMPLES_GPU),
            "samples.memory": _csv(HOPPER_SAMPLES_MEMORY),
            "xid_supported": 1,
        },
    )


def volta_board(i: int) -> dict[str, Any]:
    """GPU i as a V100 SXM2 on an older driver: see the VOLTA_* constants."""
    return gpu_keys(
        i,
        **{
            "name": VOLTA_NAME,
            "uuid": board_uuid("volta", i),
            "pci_bus_id": board_pci_bus_id("volta", i),
            "memory_total": 32 * GIB,
            "power_limit_mw": 300000,
            "power_management_limit_mw": 300000,
            "cuda_cc": "7.0",
            "util_gpu": 25,
            "util_memory": 20,
            f"field.{FI_MEMORY_TEMP}": VOLTA_MEMORY_TEMP,
            "ecc": "on",
            **{f"ecc.{key}": value for key, value in VOLTA_ECC.items()},
            "page_retirement": 1,
            "retired.multiple_single_bit": VOLTA_RETIRED["multiple_single_bit"],
            "retired.double_bit": VOLTA_RETIRED["double_bit"],
            "retired_pending": VOLTA_RETIRED["pending"],
            "row_remapping": 0,
            **_nvlink_keys(VOLTA_NVLINK_TX_KIB, VOLTA_NVLINK_RX_KIB, VOLTA_NVLINK_ERRORS),
            **{f"violation.{policy}": ns for policy, ns in VOLTA_VIOLATION_NS.items()},
            **_pcie_keys(VOLTA_PCIE),
            "samples.period_ms": VOLTA_SAMPLES_PERIOD_MS,
            "samples.capacity": VOLTA_SAMPLES_CAPACITY,
            "samples.gpu": _csv(VOLTA_SAMPLES_GPU),
            "samples.memory": _csv(VOLTA_SAMPLES_MEMORY),
            "xid_supported": 1,
        },
    )


def consumer_board(i: int) -> dict[str, Any]:
    """GPU i as a GeForce RTX 4090: see the CONSUMER_* constants."""
    return gpu_keys(
        i,
        **{
            "name": CONSUMER_NAME,
            "uuid": board_uuid("consumer", i),
            "pci_bus_id": board_pci_bus_id("consumer", i),
            "memory_total": 24 * GIB,
            "power_limit_mw": 450000,
            "power_management_limit_mw": 450000,
            "cuda_cc": "8.9",
            "util_gpu": CONSUMER_SAMPLES_GPU[0],
            "util_memory": CONSUMER_SAMPLES_MEMORY[0],
            f"field_rc.{FI_MEMORY_TEMP}": NOT_SUPPORTED,
            "ecc": "none",
            "page_retirement": 0,
            "row_remapping": 0,
            "nvlinks": 0,
            **{f"field.{fid}": ns for fid, ns in CONSUMER_CLOCK_EVENT_NS.items()},
            **_pcie_keys(CONSUMER_PCIE),
            "samples.period_ms": CONSUMER_SAMPLES_PERIOD_MS,
            "samples.capacity": CONSUMER_SAMPLES_CAPACITY,
            "samples.gpu": _csv(CONSUMER_SAMPLES_GPU),
            "samples.memory": _csv(CONSUMER_SAMPLES_MEMORY),
            "xid_supported": 0,
        },
    )


def health_machine() -> dict[str, Any]:
    """Three GPUs: 0 hopper_board, 1 volta_board, 2 consumer_board."""
    return {
        "count": 3,
        "driver_version": HEALTH_DRIVER_VERSION,
        **hopper_board(0),
        **volta_board(1),
        **consumer_board(2),
    }


# -- profiling (GPM) and MIG (issue 13) ------------------------------------------------------
# GPU 0: an H100 with MIG on (two GPU instances, three compute instances, an empty and an
# invalid slot; the parent refuses GPM and utilization, as in MIG mode); GPU 1: an H200
# without MIG (every GPM family, one clamped, one NaN, one per-metric error); GPU 2: an A100
# (MIG-capable, MIG off; no GPM: its support query says 0).
H200_NAME = "NVIDIA H200"
A100_NAME = "NVIDIA A100-SXM4-80GB"
# GPM metric id -> value in the scenario (percent or MiB/s)
H200_GPM: dict[int, Any] = {1: 62.5, 2: 55.25, 3: 31.5, 5: 40, 10: 120, 11: "nan", 12: 20, 13: 7, 20: 1500, 21: 750.5, 60: 20000, 61: 25000}
H200_GPM_RC = {13: 999}  # fp16: a per-metric error
# what the exporter must serve for the H200: family -> value (fp64 NaN, fp16 error: absent; dram clamped)
H200_RATIOS = {"graphics_active": 0.625, "sm_active": 0.5525, "sm_occupancy": 0.315, "tensor_active": 0.4,
               "dram_active": 1.0, "fp32_active": 0.2}
H200_BANDWIDTHS = {("pcie", "transmit"): 1500 * MIB, ("pcie", "receive"): 750.5 * MIB,
                   ("nvlink", "transmit"): 25000 * MIB, ("nvlink", "receive"): 20000 * MIB}
# MIG devices of GPU 0, slot by slot: (gi, ci, profile, uuid) or None for an empty ("empty": NOT_FOUND) slot
MIG_UUIDS = {(1, 0): "MIG-4a1b0000-0000-5000-8000-000000000001", (1, 1): "MIG-4a1b0000-0000-5000-8000-000000000002",
             (2, 0): "MIG-4a1b0000-0000-5000-8000-000000000003"}
MIG_PROFILES = {(1, 0): "2c.4g.40gb", (1, 1): "2c.4g.40gb", (2, 0): "3g.40gb"}
MIG_MEMORY = {1: (40 * GIB, 5 * GIB), 2: (40 * GIB, 12 * GIB)}  # GPU instance -> (total, used)
MIG_GPM: dict[int, dict[int, Any]] = {1: {2: 70, 3: 35, 5: 60, 10: 45, 20: 100}, 2: {2: 20, 5: 5, 21: "window"}}
MIG_RATIOS = {1: {"sm_active": 0.7, "sm_occupancy": 0.35, "tensor_active": 0.6, "dram_active": 0.45}, 2: {"sm_active": 0.2, "tensor_active": 0.05}}


def mig_slots(uuids: dict[tuple[int, int], str] | None = None, profiles: dict[tuple[int, int], str] | None = None,
              memory: dict[int, tuple[int, int]] | None = None) -> str:
    """The mig_devices key: the instances in GI/CI order with an empty slot after the first
    and an invalid one after the second."""
    uuids, profiles, memory = uuids or MIG_UUIDS, profiles or MIG_PROFILES, memory or MIG_MEMORY
    entries = []
    for n, (gi, ci) in enumerate(sorted(uuids)):
        total, used = memory[gi]
        entries.append(f"{gi}:{ci}:{profiles[(gi, ci)]}:{uuids[(gi, ci)]}:{total}:{used}")
        if n == 0:
            entries.append("empty")
        if n == 1:
            entries.append("invalid")
    return ",".join(entries)


def gpm_keys(prefix: str, values: dict[int, Any], rcs: dict[int, int] | None = None) -> dict[str, Any]:
    return {**{f"{prefix}gpm.{mid}": v for mid, v in values.items()}, **{f"{prefix}gpm_rc.{mid}": rc for mid, rc in (rcs or {}).items()}}


def profiling_machine() -> dict[str, Any]:
    """Three GPUs: 0 an H100 with MIG, 1 an H200 with GPM and no MIG, 2 an A100 (no GPM, MIG off)."""
    return {
        "count": 3,
        **hopper_board(0),
        "gpu.0.gpm": 1,
        "gpu.0.rc.nvmlGpmSampleGet": NOT_SUPPORTED,  # the parent in MIG mode: per GPU instance only
        "gpu.0.mig_devices": mig_slots(),
        **{k: v for gi, values in MIG_GPM.items() for k, v in gpm_keys(f"gpu.0.gi.{gi}.", values).items()},
        **gpu_keys(1, name=H200_NAME, uuid=board_uuid("h200", 1), pci_bus_id=board_pci_bus_id("h200", 1),
                   memory_total=141 * GIB, util_gpu=90, gpm=1),
        **gpm_keys("gpu.1.", H200_GPM, H200_GPM_RC),
        **gpu_keys(2, name=A100_NAME, uuid=board_uuid("a100", 2), pci_bus_id=board_pci_bus_id("a100", 2),
                   memory_total=80 * GIB, util_gpu=33, cuda_cc="8.0", mig_mode="0:0"),
    }
