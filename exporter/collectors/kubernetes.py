"""The kubernetes collector: the devices the kubelet assigned to containers (PodResources List),
through device plugins and through Dynamic Resource Allocation.

Inactive (no families) without the kubelet's socket; its status is the List's.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..samples import AllocationSample, CollectorStatus
from .series import GPU_LABELS, Scrape
from .series import put as _put

FAMILIES: dict[str, str] = {"resmon_gpu_allocation_info": "gauge", "resmon_kubernetes_unresolved_devices": "gauge"}
# no pod holding a GPU is itself an answer
DECLARED_WHEN_EMPTY = frozenset({"resmon_gpu_allocation_info"})


def families(scrape: Scrape) -> Iterator[Metric]:
    yield from allocation_families(scrape.snap.allocations)
    yield from unresolved_families(scrape.snap.unresolved_devices)


def allocation_families(allocations: tuple[AllocationSample, ...] | None) -> Iterator[Metric]:
    if allocations is None:
        return
    info = GaugeMetricFamily(
        "resmon_gpu_allocation_info",
        "A device the kubelet assigned to a container (PodResources List: a device plugin's id, "
        "or a DRA driver's device with its claim and share), value 1.",
        labels=GPU_LABELS + ["namespace", "pod", "container", "resource", "device_id", "claim", "share"],
    )
    for a in allocations:
        _put(info, {"gpu": str(a.gpu), "uuid": a.uuid, "namespace": a.namespace, "pod": a.pod,
                    "container": a.container, "resource": a.resource, "device_id": a.device_id,
                    "claim": a.claim, "share": a.share}, 1)
    yield info


def unresolved_families(unresolved: tuple[tuple[str, int], ...] | None) -> Iterator[Metric]:
    """One series per DRA driver the kubelet's List named (0 while all its devices resolve)."""
    if not unresolved:
        return
    gauge = GaugeMetricFamily(
        "resmon_kubernetes_unresolved_devices",
        "DRA devices the kubelet lists that resolve to no GPU of this host (left out of "
        "resmon_gpu_allocation_info), by driver.",
        labels=["resource"],
    )
    for resource, count in unresolved:
        _put(gauge, {"resource": resource}, count)
    yield gauge


def status(scrape: Scrape) -> CollectorStatus | None:
    return scrape.snap.kubernetes_status
