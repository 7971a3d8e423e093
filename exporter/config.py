"""The options a ResourceMonitor is built from, and the CLI's flag values that make them.

A leaf module (the standard library only): the CLI builds MonitorOptions once from its flags
(Config.monitor_options()), library users build them directly, and the monitor hands each
part to the reader that needs it. COLLECTORS is the one list of --collector.X names and
defaults: the CLI's flags, the options' defaults and the collectors' registry read it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GROUP_BY: tuple[str, ...] = ("process", "container")


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """One --[no-]collector.X flag."""

    name: str
    default: bool
    help: str


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec("gpu", True, "Enable the GPU collector."),
    CollectorSpec("health", True, "Enable the GPU health collector (ECC, retired pages, remapped rows, recovery action)."),
    CollectorSpec("xid", True, "Enable the XID error event collector (one NVML event thread)."),
    CollectorSpec("nvlink", True, "Enable the NVLink collector (inactive on GPUs without links)."),
    CollectorSpec("profiling", True, "Enable GPM profiling ratios and bandwidths (Hopper and newer; absent elsewhere)."),
    CollectorSpec("mig", True, "Enable MIG mode and per-instance series (inactive while no GPU has MIG)."),
    CollectorSpec(
        "processes", False,
        "Enable per-process GPU memory and utilization (process names and users become visible to scrapers).",
    ),
    CollectorSpec("kubernetes", True, "Enable pod attribution from the kubelet PodResources socket (inactive without it)."),
    CollectorSpec("host", True, "Enable the host CPU/memory collector."),
)
COLLECTOR_NAMES: tuple[str, ...] = tuple(c.name for c in COLLECTORS)
DEFAULT_COLLECTORS: frozenset[str] = frozenset(c.name for c in COLLECTORS if c.default)


# Never removed by --metrics.include/exclude (the contract): a GPU's identity and up, and the
# collector status series (alerts on a failed collector must keep working)
ALWAYS_SERVED: frozenset[str] = frozenset({
    "resmon_gpu_up", "resmon_gpu_info", "resmon_collector_success", "resmon_collector_duration_seconds",
    "resmon_last_refresh_timestamp_seconds", "resmon_collector_error_info",
})


def _pattern(flag: str, text: str) -> re.Pattern[str] | None:
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"invalid {flag} pattern {text!r}: {exc}") from None


def type_line_name(name: str, kind: str) -> str:
    """A family's name as the text format (0.0.4) writes it in its # TYPE line and samples, from
    prometheus_client's stored name and type: it keeps a counter without _total (and an info
    without _info) and adds the suffix when rendering."""
    if kind == "counter":
        return name + "_total"
    if kind == "info":
        return name + "_info"
    return name


@dataclass(frozen=True)
class FamilyFilter:
    """--metrics.include / --metrics.exclude: regular expressions over family names, each
    matching the whole name (anchored, as Prometheus' relabel regexes are). A family is served
    where include is empty or matches it, and exclude is empty or does not; ALWAYS_SERVED
    families are served regardless. A bad pattern is a ValueError (the CLI: exit 2).

    The name is the one the text format's # TYPE line and samples write, a counter's with
    _total (resmon_gpu_energy_joules_total, process_cpu_seconds_total); a counter also answers
    to its name without _total, OpenMetrics' # TYPE name: a pattern that matches either selects
    it (issue 35). keeps() is the one matcher: the scrape, the client library's own families and
    NVML's skipped reads (backends/nvml/wanted.py) all ask it."""

    include: str = ""
    exclude: str = ""
    _include: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _exclude: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    # name -> kept: the answer never changes, and a scrape asks about every family
    _memo: dict[str, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include", _pattern("--metrics.include", self.include))
        object.__setattr__(self, "_exclude", _pattern("--metrics.exclude", self.exclude))
        object.__setattr__(self, "_memo", {})

    @property
    def active(self) -> bool:
        return self._include is not None or self._exclude is not None

    def keeps(self, name: str) -> bool:
        """name: as the text format's # TYPE line writes it (type_line_name). A name ending in
        _total is a counter's (the contract puts _total on counters only, and prometheus_client
        on every counter), so it is matched without _total as well."""
        known = self._memo.get(name)
        if known is None:
            names = (name, name.removesuffix("_total")) if name.endswith("_total") else (name,)
            known = name in ALWAYS_SERVED or (
                (self._include is None or any(self._include.fullmatch(n) is not None for n in names))
                and (self._exclude is None or all(self._exclude.fullmatch(n) is None for n in names))
            )
            self._memo[name] = known  # a pure answer: concurrent writers write the same value
        return known

    def keeps_family(self, name: str, kind: str) -> bool:
        """keeps() for a prometheus_client family: its stored name and its type."""
        return self.keeps(type_line_name(name, kind))

    def keeps_any(self, names: Iterable[str]) -> bool:
        return any(self.keeps(n) for n in names)


@dataclass(frozen=True, slots=True)
class ProcessesOptions:
    """The processes collector: how series are grouped and capped, and where procfs is."""

    group_by: str = "process"  # or "container": summed, without pid, process and user
    max_per_gpu: int = 64  # process series per GPU and family (and allocation series per GPU)
    procfs: str = "/proc"  # the host's /proc in a container (NVML reports host PIDs)

    def __post_init__(self) -> None:
        if self.group_by not in GROUP_BY:
            raise ValueError(f"processes group_by {self.group_by!r}: choose from {', '.join(GROUP_BY)}")
        if self.max_per_gpu < 1:
            raise ValueError(f"processes max_per_gpu {self.max_per_gpu}: must be 1 or more")


@dataclass(frozen=True, slots=True)
class KubernetesOptions:
    """The kubernetes collector: the kubelet's PodResources socket and log directories."""

    pod_resources_socket: str = POD_RESOURCES_SOCKET
    cache_ttl: float = 5.0  # reuse the kubelet's List answer this long, seconds
    pod_logs_dir: str = "/var/log/pods"  # pod UID -> namespace and name
    container_logs_dir: str = "/var/log/containers"  # container id -> its name


@dataclass(frozen=True, slots=True)
class MonitorOptions:
    """Everything a ResourceMonitor reads, and how. collectors: the enabled collector names
    (COLLECTOR_NAMES; any iterable, kept as a frozenset); sysfs: where the amdgpu backend
    finds the cards (the host's /sys in a container)."""

    cache_ttl: float = 1.0
    collect_timeout: float = 5.0
    slow_interval: float = 30.0  # values that change rarely are read this often (0: every refresh)
    gpu_backend: str = "auto"
    collectors: frozenset[str] = DEFAULT_COLLECTORS
    sysfs: str = "/sys"
    processes: ProcessesOptions = field(default_factory=ProcessesOptions)
    kubernetes: KubernetesOptions = field(default_factory=KubernetesOptions)
    metrics: FamilyFilter = field(default_factory=FamilyFilter)  # the families served (and read)

    def __post_init__(self) -> None:
        names = frozenset(self.collectors)
        unknown = sorted(names - set(COLLECTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown collector {', '.join(unknown)}: choose from {', '.join(COLLECTOR_NAMES)}")
        object.__setattr__(self, "collectors", names)

    def enabled(self, collector: str) -> bool:
        return collector in self.collectors

    def with_collectors(self, **flags: bool) -> MonitorOptions:
        """These options with collectors turned on or off by name: with_collectors(processes=True)."""
        names = set(self.collectors)
        for name, on in flags.items():
            if name not in COLLECTOR_NAMES:
                raise ValueError(f"unknown collector {name}: choose from {', '.join(COLLECTOR_NAMES)}")
            (names.add if on else names.discard)(name)
        return dataclasses.replace(self, collectors=frozenset(names))


# ResourceMonitor's keyword arguments before MonitorOptions (the public Python API keeps them):
# keyword -> (part of the options, field); part "" is MonitorOptions itself, "collectors" a name.
_KEYWORDS: dict[str, tuple[str, str]] = {
    "cache_ttl": ("", "cache_ttl"),
    "collect_timeout": ("", "collect_timeout"),
    "slow_interval": ("", "slow_interval"),
    "gpu_backend": ("", "gpu_backend"),
    "sysfs": ("", "sysfs"),
    **{f"collect_{c.name}": ("collectors", c.name) for c in COLLECTORS},
    "processes_group_by": ("processes", "group_by"),
    "processes_max_per_gpu": ("processes", "max_per_gpu"),
    "procfs": ("processes", "procfs"),
    "pod_resources_socket": ("kubernetes", "pod_resources_socket"),
    "kubernetes_cache_ttl": ("kubernetes", "cache_ttl"),
    "pod_logs_dir": ("kubernetes", "pod_logs_dir"),
    "container_logs_dir": ("kubernetes", "container_logs_dir"),
    "metrics": ("", "metrics"),
}


def options_from_keywords(base: MonitorOptions | None, keywords: dict[str, Any]) -> MonitorOptions:
    """base (default MonitorOptions()) with the old keyword arguments applied on top; an
    unknown keyword is a TypeError, as it was when they were parameters."""
    options = base or MonitorOptions()
    unknown = sorted(set(keywords) - set(_KEYWORDS))
    if unknown:
        raise TypeError(f"ResourceMonitor() got an unexpected keyword argument {unknown[0]!r}")
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {"processes": {}, "kubernetes": {}}
    collectors: dict[str, bool] = {}
    for keyword, value in keywords.items():
        part, name = _KEYWORDS[keyword]
        if part == "":
            top[name] = value
        elif part == "collectors":
            collectors[name] = bool(value)
        else:
            parts[part][name] = value
    if collectors:
        options = options.with_collectors(**collectors)
    return dataclasses.replace(
        options,
        **top,
        processes=dataclasses.replace(options.processes, **parts["processes"]),
        kubernetes=dataclasses.replace(options.kubernetes, **parts["kubernetes"]),
    )


@dataclass(frozen=True)
class Config:
    """The CLI's flag values, one field per flag (cli.FLAGS: the field is the flag's name with
    dots and dashes as underscores)."""

    web_listen_address: str
    web_telemetry_path: str
    web_config_file: str
    web_max_requests: int
    web_read_header_timeout: float
    web_idle_timeout: float
    web_timeout_offset: float
    gpu_backend: str
    collect_cache_ttl: float
    collect_timeout: float
    collect_slow_interval: float
    metrics_include: str
    metrics_exclude: str
    collector_gpu: bool
    collector_health: bool
    collector_xid: bool
    collector_nvlink: bool
    collector_profiling: bool
    collector_mig: bool
    collector_processes: bool
    collector_processes_group_by: str
    collector_processes_max_per_gpu: int
    path_procfs: str
    path_sysfs: str
    collector_kubernetes: bool
    kubernetes_pod_resources_socket: str
    kubernetes_cache_ttl: float
    kubernetes_pod_logs_dir: str
    kubernetes_container_logs_dir: str
    collector_host: bool
    log_level: str
    log_format: str

    def monitor_options(self) -> MonitorOptions:
        return MonitorOptions(
            cache_ttl=self.collect_cache_ttl,
            collect_timeout=self.collect_timeout,
            slow_interval=self.collect_slow_interval,
            gpu_backend=self.gpu_backend,
            collectors=frozenset(c.name for c in COLLECTORS if getattr(self, f"collector_{c.name}")),
            sysfs=self.path_sysfs,
            processes=ProcessesOptions(
                group_by=self.collector_processes_group_by,
                max_per_gpu=self.collector_processes_max_per_gpu,
                procfs=self.path_procfs,
            ),
            kubernetes=KubernetesOptions(
                pod_resources_socket=self.kubernetes_pod_resources_socket,
                cache_ttl=self.kubernetes_cache_ttl,
                pod_logs_dir=self.kubernetes_pod_logs_dir,
                container_logs_dir=self.kubernetes_container_logs_dir,
            ),
            metrics=FamilyFilter(self.metrics_include, self.metrics_exclude),
        )
