"""Which NVML reads a refresh makes, from --metrics.include/exclude (config.FamilyFilter).

Each read is named with the families it feeds; a read whose every family is left out is not
made, so an excluded family costs no NVML call where no other family needs that call. A
collector read along with the GPUs (health, nvlink, profiling, mig, processes, xid) whose
every family is left out is not run at all, as if its --no-collector.X flag were given (and
so has no status series). tests/test_metrics_filter.py checks these names against the
collectors' families. The names are as the text format's # TYPE lines write them (a counter's
with _total), and FamilyFilter.keeps, the one matcher the scrape uses too, decides on them: a
read is skipped exactly when its families are not served.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import FamilyFilter
from ...samples import PROFILING_BANDWIDTHS, PROFILING_RATIOS
from ..base import GpuOptions

# read -> the families it feeds
READS: dict[str, tuple[str, ...]] = {
    "memory": (
        "resmon_gpu_memory_total_bytes", "resmon_gpu_memory_used_bytes",
        "resmon_gpu_memory_free_bytes", "resmon_gpu_memory_reserved_bytes",
    ),
    "clocks": ("resmon_gpu_clock_hertz",),
    "pstate": ("resmon_gpu_performance_state",),
    "throttle": ("resmon_gpu_throttle_active",),
    "power": ("resmon_gpu_power_watts",),
    "power_limit": ("resmon_gpu_power_limit_watts",),
    # also what the workloads' energy splits (exporter/accounting.py): excluding the device's
    # family skips the read, and the workload energy families have no values then
    "energy": ("resmon_gpu_energy_joules_total",),
    "temperature": ("resmon_gpu_temperature_celsius",),
    "memory_temperature": ("resmon_gpu_memory_temperature_celsius",),
    "busy": ("resmon_gpu_busy_seconds_total",),
    "utilization": ("resmon_gpu_utilization_ratio", "resmon_gpu_memory_utilization_ratio"),
    "encoder": ("resmon_gpu_encoder_utilization_ratio",),
    "decoder": ("resmon_gpu_decoder_utilization_ratio",),
    "pcie_replays": ("resmon_gpu_pcie_replays_total",),
    "clock_events": ("resmon_gpu_clock_event_seconds_total",),
    "pcie_bytes": ("resmon_gpu_pcie_bytes_total",),
    "pcie_link": ("resmon_gpu_pcie_link_generation", "resmon_gpu_pcie_link_width_lanes"),
    "fan": ("resmon_gpu_fan_speed_ratio",),
    "process_count": ("resmon_gpu_processes",),
    "ecc": ("resmon_gpu_ecc_enabled", "resmon_gpu_ecc_errors_total"),
    "retired": ("resmon_gpu_retired_pages", "resmon_gpu_retired_pages_pending"),
    "remapped": ("resmon_gpu_remapped_rows", "resmon_gpu_row_remap_pending", "resmon_gpu_row_remap_failed"),
    "recovery": ("resmon_gpu_recovery_action",),
    "nvlink_state": ("resmon_gpu_nvlink_active",),
    "nvlink_bytes": ("resmon_gpu_nvlink_bytes_total",),
    "nvlink_errors": ("resmon_gpu_nvlink_errors_total",),
    "xid": ("resmon_gpu_xid_errors_total", "resmon_gpu_xid_last_timestamp_seconds"),
    "process_memory": (
        "resmon_gpu_process_memory_used_bytes", "resmon_gpu_job_info", "resmon_gpu_unattributed_energy_joules_total",
    ),
    # the same samples, integrated: busy seconds, and the energy shares taken from them
    "process_utilization": (
        "resmon_gpu_process_utilization_ratio", "resmon_gpu_process_busy_seconds_total",
        "resmon_gpu_process_energy_joules_total",
    ),
    "allocations": ("resmon_gpu_allocation_info", "resmon_kubernetes_unresolved_devices"),  # MIG UUIDs and slots
}
# the collectors' reads: a collector none of whose reads is wanted is not run
HEALTH_READS = ("ecc", "retired", "remapped", "recovery")
NVLINK_READS = ("nvlink_state", "nvlink_bytes", "nvlink_errors")
PROCESS_READS = ("process_memory", "process_utilization")


def gpm_families(prefix: str) -> tuple[str, ...]:
    """The GPM families of the profiling (resmon_gpu_) or mig (resmon_gpu_mig_) collector."""
    ratios = (f"{prefix}{name}_ratio" for name, _ in PROFILING_RATIOS)
    bandwidths = (f"{prefix}{link}_bandwidth_bytes_per_second" for link in dict.fromkeys(b[0] for b in PROFILING_BANDWIDTHS))
    return (*ratios, *bandwidths)


MIG_FAMILIES = (
    "resmon_gpu_mig_mode_enabled", "resmon_gpu_mig_info", "resmon_gpu_mig_memory_total_bytes",
    "resmon_gpu_mig_memory_used_bytes", "resmon_gpu_mig_memory_free_bytes",
)


@dataclass(frozen=True, slots=True)
class Wanted:
    """The reads to make: `"clocks" in wanted` for each READS entry (every one without a filter)."""

    reads: frozenset[str]
    gpm: bool  # the GPU's own GPM ratios and bandwidths
    mig_gpm: bool  # the MIG instances' GPM ratios and bandwidths
    mig: bool  # the MIG mode, instances and their memory

    def __contains__(self, read: str) -> bool:
        return read in self.reads

    @classmethod
    def of(cls, metrics: FamilyFilter) -> Wanted:
        return cls(
            reads=frozenset(read for read, families in READS.items() if metrics.keeps_any(families)),
            gpm=metrics.keeps_any(gpm_families("resmon_gpu_")),
            mig_gpm=metrics.keeps_any(gpm_families("resmon_gpu_mig_")),
            mig=metrics.keeps_any(MIG_FAMILIES),
        )

    def options(self, options: GpuOptions) -> GpuOptions:
        """options with the collectors none of whose families is wanted turned off."""
        return dataclasses.replace(
            options,
            health=options.health and any(r in self.reads for r in HEALTH_READS),
            nvlink=options.nvlink and any(r in self.reads for r in NVLINK_READS),
            xid=options.xid and "xid" in self.reads,
            processes=options.processes and any(r in self.reads for r in PROCESS_READS),
            profiling=options.profiling and (self.gpm or self.mig_gpm),
            mig=options.mig and (self.mig or self.mig_gpm),
            mig_devices=options.mig_devices and "allocations" in self.reads,
        )
