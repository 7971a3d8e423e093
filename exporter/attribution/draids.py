"""What GPU a Dynamic Resource Allocation device name names.

A 1.34 kubelet lists each DRA device as (driver, pool, device name) with no GPU UUID; the name
is the driver's own convention (not an API), read from the drivers' sources:

- ``gpu.nvidia.com`` (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin,
  deviceinfo.go and mig.go at 88b3014f): a full GPU ``gpu-<minor>``, the /dev/nvidiaN minor
  (nvmlDeviceGetMinorNumber, not the NVML index); a MIG device
  ``gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement start>``
  (``MigSpecTuple.ToCanonicalName``; the driver's own parser reads minor, profile id and
  start and ignores the profile text). ``gpu-vfio-N`` (passthrough) names no GPU NVML sees.
- ``gpu.amd.com`` (ROCm/k8s-gpu-dra-driver, cmd/gpu-kubeletplugin/deviceinfo.go at c2b31bdd):
  ``gpu-<card index>-<renderD index>`` for a GPU and for a partition (each its own card).
- ``gpu.intel.com`` (intel/intel-resource-drivers-for-kubernetes, pkg/gpu/device/device.go at
  2dc4f335, the default "machine" naming): the device UID, the PCI address with ``:`` and
  ``.`` as ``-`` and the PCI device id, ``0000-03-00-0-0x56c0`` (a VF has its own address).

Anything else (another driver, another naming style, an older NVIDIA MIG name) parses to
None: the caller counts it as unresolved rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"
INTEL = "gpu.intel.com"
DRIVERS = (NVIDIA, AMD, INTEL)
# the GPU backend whose devices each driver's names refer to: a card number or PCI address
# named by one vendor's driver never lands on another vendor's GPU
BACKEND_OF = {NVIDIA: "nvml", AMD: "amdgpu", INTEL: "intel"}

_NVIDIA_GPU = re.compile(r"gpu-(?P<minor>\d+)")
# the driver's canonicalMigNameRegex, ^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$
_NVIDIA_MIG = re.compile(r"gpu-(?P<minor>\d+)-mig-(?P<profile>.+)-(?P<gi_profile>\d+)-(?P<start>\d+)")
_AMD_GPU = re.compile(r"gpu-(?P<card>\d+)-(?P<render>\d+)")
_INTEL_UID = re.compile(
    r"(?P<domain>[0-9a-f]{4})-(?P<bus>[0-9a-f]{2})-(?P<device>[0-9a-f]{2})-(?P<function>[0-7])-0x[0-9a-f]{4}"
)


@dataclass(frozen=True, slots=True)
class DraRef:
    """The identity a DRA device name carries; one kind of field set."""

    minor: int | None = None  # NVIDIA: the GPU's (or a MIG device's parent's) minor number
    mig_profile: str = ""  # NVIDIA MIG: the profile as the name writes it ("1g10gb")
    gi_profile_id: int | None = None  # NVIDIA MIG: the GPU instance profile id
    placement_start: int | None = None  # NVIDIA MIG: the GPU instance's placement start
    drm_card: str = ""  # AMD: card<N>
    pci_bus_id: str = ""  # Intel: 0000:03:00.0

    @property
    def mig(self) -> bool:
        return self.gi_profile_id is not None


def profile_in_name(profile: str) -> str:
    """A MIG profile ("1g.10gb") as the NVIDIA driver writes it into a device name ("1g10gb")."""
    return re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", "")).strip("-")


def parse_dra_device(driver: str, device: str) -> DraRef | None:
    """The GPU a DRA driver's device name names; None: a driver or name form we do not know."""
    if driver == NVIDIA:
        if match := _NVIDIA_GPU.fullmatch(device):
            return DraRef(minor=int(match["minor"]))
        if match := _NVIDIA_MIG.fullmatch(device):
            return DraRef(minor=int(match["minor"]), mig_profile=match["profile"],
                          gi_profile_id=int(match["gi_profile"]), placement_start=int(match["start"]))
        return None
    if driver == AMD:
        if match := _AMD_GPU.fullmatch(device):
            return DraRef(drm_card=f"card{int(match['card'])}")
        return None
    if driver == INTEL:
        if match := _INTEL_UID.fullmatch(device):
            return DraRef(pci_bus_id=f"{match['domain']}:{match['bus']}:{match['device']}.{match['function']}")
        return None
    return None
