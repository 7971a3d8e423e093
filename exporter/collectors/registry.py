"""The collectors, in the order a scrape serves them, and the prometheus_client Collector.

Each entry binds a --collector.X flag of config.COLLECTORS to the module that turns a
snapshot into that collector's families. A collector that is off has nothing in the
snapshot (the monitor did not read it), so its module yields nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import COLLECTORS, CollectorSpec, FamilyFilter
from ..monitor import ResourceMonitor
from ..samples import CollectorStatus, Snapshot
from . import gpu, health, host, kubernetes, mig, nvlink, processes, profiling, status, xid
from .series import Scrape


@dataclass(frozen=True)
class Registered:
    spec: CollectorSpec  # the flag: name, default, help
    families: Mapping[str, str]  # every family it can emit -> its type
    build: Callable[[Scrape], Iterator[Metric]]
    status: Callable[[Scrape], CollectorStatus | None]  # None: inactive in this snapshot
    # read along with the GPUs (a part of the NVML read): built only where that part ran
    gpu_part: bool = False

    def serve(self, scrape: Scrape) -> Iterator[Metric]:
        if not self.gpu_part or scrape.active(self.spec.name):
            yield from self.build(scrape)


def _spec(name: str) -> CollectorSpec:
    return next(c for c in COLLECTORS if c.name == name)


_GPU_PARTS = (health, nvlink, profiling, mig)
REGISTRY: tuple[Registered, ...] = tuple(
    Registered(_spec(module.__name__.rsplit(".", 1)[1]), module.FAMILIES, module.families, module.status, module in _GPU_PARTS)
    for module in (gpu, health, xid, nvlink, profiling, mig, processes, kubernetes, host)
)
assert [r.spec.name for r in REGISTRY] == [c.name for c in COLLECTORS], "every flag has its collector module"

# Every family the exporter can emit, with its type: describe() and docs/metrics.md use it.
FAMILIES: dict[str, str] = {name: kind for r in REGISTRY for name, kind in r.families.items()} | status.FAMILIES

# Families served even without a sample while their collector is active: identity and the
# collector status (the contract never removes them), and those whose empty state is itself an
# answer (no XID event yet, no process on a GPU, no pod holding one). Every other family is
# left out of a scrape where it has no sample: no device here has that value (issue 22 item 9).
DECLARED_WHEN_EMPTY = (
    gpu.DECLARED_WHEN_EMPTY | xid.DECLARED_WHEN_EMPTY | processes.DECLARED_WHEN_EMPTY
    | kubernetes.DECLARED_WHEN_EMPTY | status.DECLARED_WHEN_EMPTY
)


def snapshot_families(
    snap: Snapshot, group_by: str = "process", max_per_gpu: int = 64,
    metrics: FamilyFilter | None = None, collectors: frozenset[str] | None = None,
) -> Iterator[Metric]:
    """The snapshot's families. metrics: --metrics.include/exclude; collectors: only these
    collectors and their status series (/metrics?collect[]=...; None: all)."""
    scrape = Scrape.of(snap, group_by, max_per_gpu)
    chosen = [r for r in REGISTRY if collectors is None or r.spec.name in collectors]
    statuses = [(r.spec.name, s) for r in chosen if (s := r.status(scrape)) is not None]
    keeps = metrics.keeps_family if metrics is not None and metrics.active else None
    # the collectors, then the exporter's own families (served on every scrape)
    for families in (*(r.serve(scrape) for r in chosen), status.families(scrape, statuses)):
        for family in families:
            if (family.samples or family.name in DECLARED_WHEN_EMPTY) and (keeps is None or keeps(family.name, family.type)):
                yield family


class ResourceCollector(Collector):
    """Register with registry.register(ResourceCollector(monitor)).

    Families are built fresh on every collect() (no shared mutable metric objects), so it can
    be registered in any application's CollectorRegistry next to its own metrics."""

    def __init__(self, monitor: ResourceMonitor) -> None:
        self._monitor = monitor

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering touches no GPU and ?name[]= filtering works.
        for name, kind in FAMILIES.items():
            if kind == "counter":
                yield CounterMetricFamily(name, "")
            else:
                yield GaugeMetricFamily(name, "")

    def families(self, snap: Snapshot, collectors: frozenset[str] | None = None) -> list[Metric]:
        """The families of one given snapshot (of these collectors only; None: all): the HTTP
        router renders a pinned snapshot through this, so one scrape reads one snapshot."""
        # how process series are grouped, and which families are served, are the monitor's
        # settings (any object with snapshot() works)
        group_by = getattr(self._monitor, "processes_group_by", "process")
        options = getattr(self._monitor, "options", None)
        metrics = getattr(options, "metrics", None)
        return list(snapshot_families(snap, group_by, getattr(self._monitor, "processes_max_per_gpu", 64), metrics, collectors))

    def collect(self) -> Iterable[Metric]:
        return self.families(self._monitor.snapshot())
