"""What GPU a device plugin's id names.

The kubelet reports each allocated device by the string its device plugin chose:

- NVIDIA, deviceIDStrategy uuid: the NVML UUID ``GPU-<uuid>``; MIG devices ``MIG-<uuid>`` (R470+),
  very old drivers ``MIG-GPU-<uuid>/<gi>/<ci>``; time-slicing and MPS replicas append ``::<n>``;
- NVIDIA, deviceIDStrategy index: the NVML index ``3`` (MIG: ``<gpu>:<mig>``), ``::<n>`` as above;
- GKE's NVIDIA plugin: ``nvidia3``, shared ``nvidia3/vgpu2``, MIG ``nvidia3/gi1`` (+ ``/vgpuN``);
- ROCm's plugin: the PCI address ``0000:03:00.0``, time-slicing ``0000:03:00.0-slice-2``;
- Intel's plugin (``gpu.intel.com/i915``, ``gpu.intel.com/xe``): the DRM card and a share,
  ``card1-0`` (``card1-3`` with --shared-dev-num).

Replica and partition suffixes name the same physical GPU, so they are dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .draids import parse_dra_device

_REPLICA = re.compile(r"(?P<base>.+?)::\d+")  # the NVIDIA plugin's AnnotatedID, "%s::%d"
_GPU_UUID = re.compile(r"GPU-[0-9A-Za-z][0-9A-Za-z-]*")
_MIG_UUID = re.compile(r"MIG-(?!GPU-)[0-9A-Za-z][0-9A-Za-z-]*")
_OLD_MIG = re.compile(r"MIG-(?P<parent>GPU-[0-9A-Za-z][0-9A-Za-z-]*)/\d+/\d+")
_INDEX = re.compile(r"(?P<index>\d+)(?::\d+)?")  # "3", or a MIG device "3:1" on GPU 3
_GKE = re.compile(r"nvidia(?P<index>\d+)(?:/(?:vgpu|gi|ci)\d+)*")
_PCI = re.compile(
    r"(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2}):(?P<device>[0-9A-Fa-f]{1,2})\.(?P<function>[0-7])"
)
_AMD = re.compile(r"(?P<bdf>[0-9A-Fa-f:.]+?)(?:-slice-\d+)?")
_INTEL = re.compile(r"(?P<card>card\d+)-\d+")


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """One of the fields is set: the identity the id carries."""

    uuid: str = ""
    mig_uuid: str = ""
    index: int | None = None
    pci_bus_id: str = ""
    mig_parent_uuid: str = ""
    drm_card: str = ""  # card<N>: only under DRM_CARD_RESOURCES


def normalise_pci(bus_id: str) -> str:
    """A PCI address as sysfs writes it, ``0000:07:00.0``, from NVML's ``00000000:07:00.0``,
    ``0000:07:00.0`` or ``07:00.0``; text that is not a PCI address comes back lower-cased."""
    text = bus_id.strip()
    match = _PCI.fullmatch(text)
    if match is None:
        return text.lower()
    return _format_pci(match)


def _format_pci(match: re.Match[str]) -> str:
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{int(match['bus'], 16):02x}:{int(match['device'], 16):02x}.{match['function']}"


def _nvidia(device_id: str) -> DeviceRef | None:
    if _GPU_UUID.fullmatch(device_id):
        return DeviceRef(uuid=device_id)
    if _MIG_UUID.fullmatch(device_id):
        return DeviceRef(mig_uuid=device_id)
    if match := _OLD_MIG.fullmatch(device_id):
        return DeviceRef(mig_parent_uuid=match["parent"])
    if match := _INDEX.fullmatch(device_id) or _GKE.fullmatch(device_id):
        return DeviceRef(index=int(match["index"]))
    return None


def _amd(device_id: str) -> DeviceRef | None:
    match = _AMD.fullmatch(device_id)
    pci = _PCI.fullmatch(match["bdf"]) if match else None
    return DeviceRef(pci_bus_id=_format_pci(pci)) if pci else None


def _intel(device_id: str) -> DeviceRef | None:
    match = _INTEL.fullmatch(device_id)
    return DeviceRef(drm_card=match["card"]) if match else None


def parse_device_id(device_id: str) -> DeviceRef | None:
    """The GPU a kubelet device id names; None: not a GPU id we understand."""
    text = device_id.strip()
    replica = _REPLICA.fullmatch(text)
    base = replica["base"] if replica else text
    return _nvidia(base) or _amd(base) or _intel(base)


# Index-style ids ("0", "nvidia0") only mean a GPU under these resources; UUIDs and PCI ids
# are unique on the host whatever the resource is called (join.py resolves with this too).
INDEXED_RESOURCES = ("nvidia.com/",)
# DRM card names ("card1-0") mean a GPU under these only
DRM_CARD_RESOURCES = ("gpu.intel.com/",)


@dataclass(frozen=True, slots=True)
class HostGpus:
    """The GPUs this host has shown (UUIDs, MIG UUIDs, indices, PCI addresses as sysfs writes
    them): which kubelet device ids are worth keeping while a List is decoded. Empty (no GPU
    read yet): every id that names a GPU at all is kept, the rest (NICs, FPGAs ...) never."""

    uuids: frozenset[str] = frozenset()
    mig_uuids: frozenset[str] = frozenset()
    indices: frozenset[int] = frozenset()
    pci: frozenset[str] = frozenset()
    drm_cards: frozenset[str] = frozenset()
    minors: frozenset[int] = frozenset()  # NVML minor numbers (NVIDIA DRA names)

    @property
    def known(self) -> bool:
        return bool(self.uuids or self.indices or self.pci)

    def union(self, other: "HostGpus") -> "HostGpus":
        return HostGpus(self.uuids | other.uuids, self.mig_uuids | other.mig_uuids,
                        self.indices | other.indices, self.pci | other.pci, self.drm_cards | other.drm_cards,
                        self.minors | other.minors)

    def names_dra(self, driver: str, device: str) -> bool:
        """Whether a DRA driver's device name may name one of these GPUs (a MIG device: one of
        their MIG-capable parents, whose instances may be newer than the last MIG read)."""
        ref = parse_dra_device(driver, device)
        if ref is None:
            return False
        if not self.known:
            return True
        if ref.minor is not None:
            return ref.minor in self.minors
        if ref.drm_card:
            return ref.drm_card in self.drm_cards
        return ref.pci_bus_id in self.pci

    def names(self, resource: str, device_id: str) -> bool:
        """Whether the kubelet's (resource, device id) may name one of these GPUs."""
        ref = parse_device_id(device_id)
        if ref is None:
            return False
        if ref.index is not None and not resource.startswith(INDEXED_RESOURCES):
            return False
        if ref.drm_card and not resource.startswith(DRM_CARD_RESOURCES):
            return False
        if not self.known:
            return True
        if ref.uuid:
            return ref.uuid in self.uuids
        if ref.mig_uuid:
            return ref.mig_uuid in self.mig_uuids
        if ref.mig_parent_uuid:
            return ref.mig_parent_uuid in self.uuids
        if ref.pci_bus_id:
            return ref.pci_bus_id in self.pci
        if ref.drm_card:
            return ref.drm_card in self.drm_cards
        return ref.index in self.indices
