"""Immutable readings in base units: what a refresh produces and every consumer reads.

Nothing here knows about NVML, psutil or Prometheus; a value of None means the device or
host did not report it (unsupported), which the collector turns into a missing series.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

CLOCK_TYPES: tuple[str, ...] = ("graphics", "sm", "memory", "video")

# Clock-event (throttle) reason bits, in the contract's label spelling.
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x001),
    ("applications_clocks_setting", 0x002),
    ("sw_power_cap", 0x004),
    ("hw_slowdown", 0x008),
    ("sync_boost", 0x010),
    ("sw_thermal_slowdown", 0x020),
    ("hw_thermal_slowdown", 0x040),
    ("hw_power_brake_slowdown", 0x080),
    ("display_clock_setting", 0x100),
    # both in nvmlClocksEventReasonAll; named as clock_event_seconds_total's reasons
    ("board_limit", 0x200),
    ("reliability", 0x400),
)

# Engines of resmon_gpu_busy_seconds_total, in nvmlDeviceGetSamples order.
BUSY_ENGINES: tuple[str, ...] = ("gpu", "memory", "encoder", "decoder")

# Reasons of resmon_gpu_clock_event_seconds_total.
CLOCK_EVENT_REASONS: tuple[str, ...] = (
    "sw_power_cap",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "board_limit",
    "low_utilization",
    "reliability",
)

# Engines of resmon_gpu_process_utilization_ratio, with their nvmlProcessUtilizationSample_t fields.
PROCESS_ENGINES: tuple[tuple[str, str], ...] = (("sm", "smUtil"), ("memory", "memUtil"), ("encoder", "encUtil"), ("decoder", "decUtil"))

# Profiling (GPM) ratio families resmon_gpu_<name>_ratio with their GPM metric ids.
PROFILING_RATIOS: tuple[tuple[str, int], ...] = (
    ("graphics_active", 1),
    ("sm_active", 2),
    ("sm_occupancy", 3),
    ("tensor_active", 5),
    ("dram_active", 10),
    ("fp64_active", 11),
    ("fp32_active", 12),
    ("fp16_active", 13),
)
# Profiling bandwidths resmon_gpu_<link>_bandwidth_bytes_per_second{direction}: (link, direction, GPM id).
PROFILING_BANDWIDTHS: tuple[tuple[str, str, int], ...] = (
    ("pcie", "transmit", 20),
    ("pcie", "receive", 21),
    ("nvlink", "transmit", 61),
    ("nvlink", "receive", 60),
)

CPU_MODES: tuple[str, ...] = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Static facts of one device, read once."""

    index: int
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    clock_max_hertz: tuple[tuple[str, float], ...] = ()
    drm_card: str = ""  # card<N> under /sys/class/drm (intel): what Intel's device plugin names a GPU by
    minor: int | None = None  # NVML: the /dev/nvidiaN minor, what NVIDIA's DRA driver names a GPU by


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """The health collector's values for one device; empty or None where unsupported."""

    ecc_enabled: tuple[tuple[str, int], ...] = ()  # (mode: current|pending, 0/1)
    ecc_errors: tuple[tuple[str, str, int], ...] = ()  # (type: corrected|uncorrected, scope: volatile|aggregate, n)
    retired_pages: tuple[tuple[str, int], ...] = ()  # (cause: multiple_single_bit|double_bit, pages)
    retired_pages_pending: int | None = None
    remapped_rows: tuple[tuple[str, int], ...] = ()  # (cause: correctable|uncorrectable, rows)
    row_remap_pending: int | None = None
    row_remap_failed: int | None = None
    recovery_action: int | None = None


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    """One NVLink of one device."""

    link: int
    active: int | None = None
    bytes: tuple[tuple[str, int], ...] = ()  # (direction: transmit|receive, bytes since driver load)
    errors: tuple[tuple[str, int], ...] = ()  # (type: replay|recovery|crc_flit|crc_data, count)


@dataclass(frozen=True, slots=True)
class ProfilingSample:
    """GPM values of one GPU or GPU instance over one window; an unsupported metric is left out."""

    ratios: tuple[tuple[str, float], ...] = ()  # (PROFILING_RATIOS name, 0..1)
    bandwidths: tuple[tuple[str, str, float], ...] = ()  # (pcie|nvlink, transmit|receive, bytes/s)


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (compute instance) of a GPU in MIG mode."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # MIG-...
    profile: str  # e.g. 1g.18gb; empty where the name does not say


@dataclass(frozen=True, slots=True)
class MigSlot:
    """Where a MIG device sits: what NVIDIA's DRA driver names it by (its GPU instance's profile
    id and placement start), with the profile as its name gives it."""

    uuid: str  # MIG-...
    profile: str  # e.g. 1g.10gb
    gi_profile_id: int
    placement_start: int


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance: its memory (shared by its compute instances) and its GPM values."""

    gpu_instance_id: int
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    profiling: ProfilingSample | None = None


@dataclass(frozen=True, slots=True)
class MigState:
    """MIG mode and instances of one MIG-capable GPU (None on a GPU without MIG)."""

    current: int | None = None  # 1 enabled, 0 disabled
    pending: int | None = None
    devices: tuple[MigDevice, ...] = ()
    instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process in a device's compute or graphics list, as the driver reports it."""

    pid: int
    memory_bytes: int | None  # None: the driver hides it (MIG without privilege, WDDM)
    utilization: tuple[tuple[str, float], ...] = ()  # (engine, ratio since the previous refresh); empty: unsupported
    # (engine, seconds the process kept it busy since the backend first saw it on this GPU; a
    # counter from 0 there); empty: the backend has no per-process busy time (MIG, gpu-tracker)
    busy_seconds: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One device in one refresh. When up is False only the identity is meaningful."""

    identity: GpuIdentity
    up: bool
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    fan_speed_ratio: float | None = None
    clock_hertz: tuple[tuple[str, float], ...] = ()
    performance_state: int | None = None
    throttle_reasons: int | None = None  # bitmask of THROTTLE_REASONS
    processes: int | None = None  # distinct PIDs in the compute and graphics lists
    # v2 additions of the gpu collector
    memory_temperature_celsius: float | None = None
    junction_temperature_celsius: float | None = None  # amdgpu: hwmon temp2 (hotspot)
    gtt_total_bytes: int | None = None  # amdgpu: system memory the GPU maps (GTT)
    gtt_used_bytes: int | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    busy_seconds: tuple[tuple[str, float], ...] = ()  # (engine, seconds busy, integrated)
    clock_event_seconds: tuple[tuple[str, float], ...] = ()  # (reason, seconds since driver load)
    pcie_link_generation: tuple[tuple[str, int], ...] = ()  # (bound: current|max, generation)
    pcie_link_width_lanes: tuple[tuple[str, int], ...] = ()  # (bound, lanes)
    pcie_replays: int | None = None
    pcie_bytes: tuple[tuple[str, int], ...] = ()  # (direction: transmit|receive, bytes)
    health: GpuHealth | None = None  # None: the health collector is off
    nvlinks: tuple[NvLinkSample, ...] = ()  # empty: no links, or the nvlink collector is off
    process_list: tuple[GpuProcess, ...] | None = None  # None: processes collector off, or no list
    mig_uuids: tuple[str, ...] = ()  # UUIDs of the MIG devices while MIG is on (kubernetes device ids)
    mig_slots: tuple[MigSlot, ...] = ()  # the same devices by GPU instance placement (DRA device names)
    profiling: ProfilingSample | None = None  # None: collector off, no GPM, or no window yet
    mig: MigState | None = None  # None: mig collector off, or a GPU without MIG
    slow_read_at: float | None = None  # Unix time its slow values were read (NVML: --collect.slow-interval)


def in_order(samples: Iterable[GpuSample]) -> tuple[GpuSample, ...]:
    """Devices by index, then UUID (a vanished GPU stays under its last index)."""
    return tuple(sorted(samples, key=lambda s: (s.identity.index, s.identity.uuid)))


def all_down(identities: Iterable[GpuIdentity]) -> tuple[GpuSample, ...]:
    return in_order(GpuSample(i, up=False) for i in identities)


@dataclass(frozen=True, slots=True)
class XidCount:
    """XID events of one code on one GPU since the exporter started."""

    uuid: str
    xid: int  # the code; 999 is NVML's "unknown XID"
    count: int
    last_seen_seconds: float  # Unix time the latest one was received


@dataclass(frozen=True, slots=True)
class XidState:
    """What the XID watcher has seen; a copy taken at read time."""

    counts: tuple[XidCount, ...] = ()
    watched: frozenset[str] = frozenset()  # UUIDs registered for XID events
    healthy: bool = True  # False while a registration failed and a rebuild is pending
    duration_seconds: float = 0.0  # how long the latest (re)registration took


@dataclass(frozen=True, slots=True)
class PartStatus:
    """A collector whose values come with the GPU read (health, nvlink)."""

    name: str
    success: bool
    duration_seconds: float
    read_at: float | None = None  # Unix time of the oldest value it serves, where older than the read


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What the GPU backend reported in one refresh."""

    backend: str  # "nvml", "amdgpu", "gpu-tracker" or "none"
    success: bool
    device_count: int = 0
    driver_version: str = ""
    devices: tuple[GpuSample, ...] = ()
    # "v1" when the driver lacks nvmlDeviceGetMemoryInfo_v2: memory used then includes
    # driver-reserved memory, and the family's HELP says so
    memory_api: str = "v2"
    # Collectors read along with the GPUs (health, nvlink) that are active in this reading,
    # with how their part of the read went; absent ones serve no status series.
    parts: tuple["PartStatus", ...] = ()
    xid: XidState | None = None  # None: the xid collector is off or this backend has no events
    # why the read failed, where the backend knows a cause the operator can fix:
    # "no_permission" (NVML NO_PERMISSION: the process may not open the GPU); "" otherwise
    error: str = ""

    def down(self) -> "GpuReading":
        """This reading failed: the same devices, every one down (not vanished)."""
        return dataclasses.replace(self, success=False, devices=tuple(GpuSample(d.identity, up=False) for d in self.devices))


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host CPU and memory, node_exporter semantics."""

    cpu_utilization_ratio: float
    cpu_seconds: tuple[tuple[str, float], ...]
    logical_cores: int
    load1: float
    load5: float
    load15: float
    memory_total_bytes: int
    memory_available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int

    @property
    def memory_used_bytes(self) -> int:
        return self.memory_total_bytes - self.memory_available_bytes


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """Outcome of one subsystem's latest refresh."""

    success: bool
    duration_seconds: float
    timestamp_seconds: float | None  # Unix time the served values were read; None: never read


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process on one GPU with who it belongs to; empty strings where unknown."""

    gpu: int
    uuid: str
    pid: int
    process: str  # the process's comm
    user: str
    container_id: str
    pod_uid: str
    namespace: str
    pod: str
    container: str
    memory_bytes: int | None
    utilization: tuple[tuple[str, float], ...]  # (engine, ratio); empty where unsupported
    job_id: str = ""  # the Slurm job, from the cgroup; last and defaulted: callers name the others


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """Busy time and energy of one process on one GPU, counted since the exporter first saw it
    there (accounting.py); only for processes with per-process busy time."""

    gpu: int
    uuid: str
    pid: int
    busy_seconds: tuple[tuple[str, float], ...]  # (engine, seconds)
    energy_joules: float | None  # None: the device has no energy counter


@dataclass(frozen=True, slots=True)
class WorkloadUsage:
    """Busy time and energy of one workload on one GPU, as the processes collector serves it:
    one process (group-by=process) or a container's processes of one Slurm job
    (group-by=container). Counters since the exporter first saw it (accounting.py): a
    container's keep what its exited processes added while it has a process on the GPU."""

    gpu: int
    uuid: str
    key: tuple[str, ...]  # its label values after gpu and uuid (accounting.workload_key)
    busy_seconds: tuple[tuple[str, float], ...]  # (engine, seconds)
    energy_joules: float | None  # None: the device has no energy counter


@dataclass(frozen=True, slots=True)
class UnattributedEnergy:
    """The part of one GPU's energy counter no process it lists was charged with (idle time,
    processes the exporter cannot see), joules since the exporter started accounting it."""

    gpu: int
    uuid: str
    joules: float


@dataclass(frozen=True, slots=True)
class AllocationSample:
    """One device id a container holds, resolved to a GPU of this backend."""

    gpu: int
    uuid: str
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    claim: str = ""  # DRA: the ResourceClaim's name; "" for a device plugin's
    share: str = ""  # DRA: the kubelet's share_id of a shared device; "" otherwise


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One refresh of every enabled subsystem; None where a collector is disabled."""

    gpu: GpuReading | None
    gpu_status: CollectorStatus | None
    host: HostSample | None
    host_status: CollectorStatus | None
    taken_monotonic: float
    processes: tuple[ProcessSample, ...] | None = None  # None: the processes collector is off
    allocations: tuple[AllocationSample, ...] | None = None  # None: kubernetes collector off or inactive
    kubernetes_status: CollectorStatus | None = None
    # DRA devices no GPU of this host answers to, (resource, count); None with allocations
    unresolved_devices: tuple[tuple[str, int], ...] | None = None
    # busy time and energy per workload and the unattributed energy (accounting.py); empty
    # with the processes collector off
    workloads: tuple[WorkloadUsage, ...] = ()
    unattributed_energy: tuple[UnattributedEnergy, ...] = ()
    process_usage: tuple[ProcessUsage, ...] = ()  # per process (the Python API)

    def gpu_by_index(self, index: int) -> GpuSample | None:
        if self.gpu is None:
            return None
        found = None
        for device in self.gpu.devices:  # a vanished GPU stays (down) under its last index
            if device.identity.index == index and (found is None or device.up):
                found = device
        return found
