"""MonitorOptions, the old keyword arguments on top of them, and the one list of collectors.

The Python API is public: ResourceMonitor(cache_ttl=..., collect_processes=...) must keep
meaning what it meant, and the CLI, the options' defaults and the collectors' registry must
agree on which collectors exist and which are on by default.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from resmon_exporter import ResourceMonitor
from resmon_exporter.cli import FLAGS, parse_config
from resmon_exporter.collectors.registry import REGISTRY
from resmon_exporter.config import (
    COLLECTORS,
    DEFAULT_COLLECTORS,
    KubernetesOptions,
    MonitorOptions,
    ProcessesOptions,
    options_from_keywords,
)

# every keyword ResourceMonitor took before MonitorOptions, a value unlike its default, and
# where that value must land
OLD_KEYWORDS = {
    "cache_ttl": (7.0, lambda o: o.cache_ttl),
    "collect_timeout": (3.0, lambda o: o.collect_timeout),
    "gpu_backend": ("none", lambda o: o.gpu_backend),
    "sysfs": ("/host/sys", lambda o: o.sysfs),
    "collect_gpu": (False, lambda o: o.enabled("gpu")),
    "collect_host": (False, lambda o: o.enabled("host")),
    "collect_health": (False, lambda o: o.enabled("health")),
    "collect_nvlink": (False, lambda o: o.enabled("nvlink")),
    "collect_xid": (False, lambda o: o.enabled("xid")),
    "collect_profiling": (False, lambda o: o.enabled("profiling")),
    "collect_mig": (False, lambda o: o.enabled("mig")),
    "collect_processes": (True, lambda o: o.enabled("processes")),
    "collect_kubernetes": (False, lambda o: o.enabled("kubernetes")),
    "processes_group_by": ("container", lambda o: o.processes.group_by),
    "processes_max_per_gpu": (5, lambda o: o.processes.max_per_gpu),
    "procfs": ("/host/proc", lambda o: o.processes.procfs),
    "pod_resources_socket": ("/k/sock", lambda o: o.kubernetes.pod_resources_socket),
    "kubernetes_cache_ttl": (9.0, lambda o: o.kubernetes.cache_ttl),
    "pod_logs_dir": ("/k/pods", lambda o: o.kubernetes.pod_logs_dir),
    "container_logs_dir": ("/k/containers", lambda o: o.kubernetes.container_logs_dir),
}


@pytest.mark.parametrize("keyword", sorted(OLD_KEYWORDS))
def test_each_old_keyword_lands_in_its_option_and_nowhere_else(keyword: str) -> None:
    value, get = OLD_KEYWORDS[keyword]
    options = options_from_keywords(None, {keyword: value})
    assert get(options) == value
    assert get(MonitorOptions()) != value  # the test's value really differs from the default
    for other, (other_value, other_get) in OLD_KEYWORDS.items():
        if other != keyword:
            assert other_get(options) == other_get(MonitorOptions()), f"{keyword} also changed {other}"


def test_keywords_apply_on_top_of_given_options() -> None:
    base = MonitorOptions(cache_ttl=2.0, collectors={"gpu", "processes"}, processes=ProcessesOptions(max_per_gpu=3))
    options = options_from_keywords(base, {"collect_gpu": False, "procfs": "/p"})
    assert options.cache_ttl == 2.0 and options.collectors == frozenset({"processes"})
    assert (options.processes.max_per_gpu, options.processes.procfs) == (3, "/p")


def test_an_unknown_keyword_is_a_type_error_as_it_was() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'collect_gpus'"):
        ResourceMonitor(collect_gpus=False)


def test_bad_options_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown collector gpus: choose from gpu, health"):
        MonitorOptions(collectors={"gpus"})
    with pytest.raises(ValueError, match="unknown collector nvlinks"):
        MonitorOptions().with_collectors(nvlinks=True)
    with pytest.raises(ValueError, match="group_by 'pod'"):
        ProcessesOptions(group_by="pod")


def test_the_monitor_is_built_from_its_options() -> None:
    options = MonitorOptions(gpu_backend="none", cache_ttl=0.0, collectors={"host"},
                             processes=ProcessesOptions(group_by="container", max_per_gpu=7))
    with ResourceMonitor(options=options, logger=logging.getLogger("test")) as monitor:
        assert monitor.options is options
        assert (monitor.processes_group_by, monitor.processes_max_per_gpu) == ("container", 7)
        snap = monitor.snapshot()
        assert snap.gpu is None and snap.gpu_status is None  # the gpu collector is off
        assert snap.host is not None and snap.kubernetes_status is None


def test_the_old_positional_thresholds_still_work() -> None:
    with ResourceMonitor(55.0, 65.0, gpu_backend="none") as monitor:
        assert (monitor.memory_threshold, monitor.cpu_threshold) == (55.0, 65.0)
        assert monitor.options.gpu_backend == "none"


def test_cli_flags_registry_and_options_name_the_same_collectors_with_the_same_defaults() -> None:
    flags = {f.name.removeprefix("collector."): f.default for f in FLAGS if f.boolean and f.name.startswith("collector.")}
    specs = {c.name: c.default for c in COLLECTORS}
    assert flags == specs
    assert [r.spec.name for r in REGISTRY] == [c.name for c in COLLECTORS]
    assert MonitorOptions().collectors == DEFAULT_COLLECTORS == {name for name, on in specs.items() if on}
    assert "processes" not in DEFAULT_COLLECTORS  # opt-in: names and users become visible


def test_the_cli_builds_the_options_the_flags_say() -> None:
    config, _ = parse_config([
        "--no-collector.health", "--collector.processes", "--collector.processes.group-by=container",
        "--collector.processes.max-per-gpu=9", "--path.procfs=/host/proc", "--path.sysfs=/host/sys",
        "--kubernetes.pod-resources-socket=/s", "--kubernetes.cache-ttl=2s", "--kubernetes.pod-logs-dir=/l",
        "--kubernetes.container-logs-dir=/c", "--collect.cache-ttl=250ms", "--collect.timeout=3s", "--gpu.backend=none",
    ], {})
    options = config.monitor_options()
    assert options == MonitorOptions(
        cache_ttl=0.25, collect_timeout=3.0, gpu_backend="none",
        collectors=DEFAULT_COLLECTORS - {"health"} | {"processes"}, sysfs="/host/sys",
        processes=ProcessesOptions(group_by="container", max_per_gpu=9, procfs="/host/proc"),
        kubernetes=KubernetesOptions(pod_resources_socket="/s", cache_ttl=2.0, pod_logs_dir="/l", container_logs_dir="/c"),
    )
    defaults, _ = parse_config([], {})
    assert defaults.monitor_options() == MonitorOptions()  # the CLI's defaults are the library's


def test_options_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        MonitorOptions().cache_ttl = 3.0  # type: ignore[misc]
