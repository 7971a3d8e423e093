"""The kubernetes collector: the devices the kubelet assigned to containers (PodResources List).

Inactive (no families) without the kubelet's socket; its status is the List's.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import AllocationSample, CollectorStatus
from .series import GPU_LABELS, Scrape
from .series import put as _put

FAMILIES: dict[str, str] = {"resmon_gpu_allocation_info": "gauge"}
# no pod holding a GPU is itself an answer
DECLARED_WHEN_EMPTY = frozenset(FAMILIES)


def families(scrape: Scrape) -> Iterator[Metric]:
    yield from allocation_families(scrape.snap.allocations)


def allocation_families(allocations: tuple[AllocationSample, ...] | None) -> Iterator[Metric]:
    if allocations is None:
        return
    info = GaugeMetricFamily(
        "resmon_gpu_allocation_info",
        "A device the kubelet assigned to a container (PodResources List), value 1.",
        labels=GPU_LABELS + ["namespace", "pod", "container", "resource", "device_id"],
    )
    for a in allocations:
        _put(info, {"gpu": str(a.gpu), "uuid": a.uuid, "namespace": a.namespace, "pod": a.pod,
                    "container": a.container, "resource": a.resource, "device_id": a.device_id}, 1)
    yield info


def status(scrape: Scrape) -> CollectorStatus | None:
    return scrape.snap.kubernetes_status
