"""DRA device names -> the GPU they name (issue 38): the drivers' naming, pinned from their
sources (exporter/attribution/draids.py cites path and commit), and the join that puts a
kubelet's DRA devices on this host's GPUs or counts them as unresolved, never guessing.
The end-to-end run through the CLI, the fake NVML and the fake kubelet is in
tests/test_kubernetes_e2e.py."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resmon_exporter.attribution import join
from resmon_exporter.attribution.deviceids import HostGpus
from resmon_exporter.attribution.draids import DraRef, parse_dra_device, profile_in_name
from resmon_exporter.attribution.kubelet import KubeletState
from resmon_exporter.attribution.podresources import Allocation
from resmon_exporter.collectors.kubernetes import allocation_families, unresolved_families
from resmon_exporter.samples import AllocationSample, GpuIdentity, GpuReading, GpuSample, MigSlot

G0, G1, G2 = (f"GPU-{n}{n}{n}{n}{n}{n}{n}{n}-0000-4000-8000-000000000000" for n in range(3))
MIG_A, MIG_B = "MIG-aaaaaaaa-0000-4000-8000-000000000000", "MIG-bbbbbbbb-0000-4000-8000-000000000000"


@pytest.mark.parametrize(
    ("driver", "device", "expected"),
    [
        # dra-driver-nvidia-gpu deviceinfo.go GpuInfo.CanonicalName: "gpu-%d" of the minor
        ("gpu.nvidia.com", "gpu-0", DraRef(minor=0)),
        ("gpu.nvidia.com", "gpu-13", DraRef(minor=13)),
        # mig.go MigSpecTuple.ToCanonicalName: "gpu-%d-mig-%s-%d-%d" (minor, profile w/o dots, GI profile id, start)
        ("gpu.nvidia.com", "gpu-0-mig-1g12gb-19-0",
         DraRef(minor=0, mig_profile="1g12gb", gi_profile_id=19, placement_start=0)),
        ("gpu.nvidia.com", "gpu-3-mig-4g95gb-5-4", DraRef(minor=3, mig_profile="4g95gb", gi_profile_id=5, placement_start=4)),
        ("gpu.nvidia.com", "gpu-1-mig-1g10gb-me-20-6",
         DraRef(minor=1, mig_profile="1g10gb-me", gi_profile_id=20, placement_start=6)),
        # k8s-gpu-dra-driver deviceinfo.go AmdGpuInfo.CanonicalName: "gpu-%v-%v" (card, renderD)
        ("gpu.amd.com", "gpu-1-129", DraRef(drm_card="card1")),
        ("gpu.amd.com", "gpu-12-140", DraRef(drm_card="card12")),
        # intel-resource-drivers-for-kubernetes device.go DeviceInfo.UID ("machine" naming): PCI address + device id
        ("gpu.intel.com", "0000-03-00-0-0x56c0", DraRef(pci_bus_id="0000:03:00.0")),
        ("gpu.intel.com", "0000-4d-00-1-0x0bd5", DraRef(pci_bus_id="0000:4d:00.1")),
    ],
)
def test_dra_device_names_of_the_drivers(driver: str, device: str, expected: DraRef) -> None:
    assert parse_dra_device(driver, device) == expected


@pytest.mark.parametrize(
    ("driver", "device"),
    [
        ("gpu.nvidia.com", "gpu-vfio-0"),  # passthrough: NVML does not see it
        ("gpu.nvidia.com", "GPU-8d1f3a2b-6c4e-11ee-9a4b-0242ac120002"),  # a device plugin's id, not a DRA name
        ("gpu.nvidia.com", "gpu-"),
        ("gpu.nvidia.com", "gpu-0-mig-19-0"),
        ("gpu.amd.com", "gpu-1"),
        ("gpu.amd.com", "0000:03:00.0"),
        ("gpu.intel.com", "card0"),  # another naming style: not guessed
        ("gpu.intel.com", "0000:03:00.0"),
        ("gpu.intel.com", "0000-03-00-0"),
        ("example.com", "gpu-0"),  # a driver we do not know
        ("nvidia.com/gpu", "gpu-0"),
    ],
)
def test_names_that_are_not_understood(driver: str, device: str) -> None:
    assert parse_dra_device(driver, device) is None
    assert not HostGpus().names_dra(driver, device)


PROFILES = ("1g.10gb", "1g.12gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.24gb", "4g.95gb")


@given(minor=st.integers(0, 255), profile=st.sampled_from(PROFILES), gi_profile=st.integers(0, 63),
       start=st.integers(0, 15))
def test_mig_names_as_the_driver_formats_them_parse_back(minor: int, profile: str, gi_profile: int, start: int) -> None:
    """The driver's fmt.Sprintf("gpu-%d-mig-%s-%d-%d", minor, profile without dots, id, start)."""
    name = f"gpu-{minor}-mig-{profile_in_name(profile)}-{gi_profile}-{start}"
    assert parse_dra_device("gpu.nvidia.com", name) == DraRef(
        minor=minor, mig_profile=profile_in_name(profile), gi_profile_id=gi_profile, placement_start=start)


@given(domain=st.integers(0, 0xFFFF), bus=st.integers(0, 0xFF), device=st.integers(0, 0x1F),
       function=st.integers(0, 7), pci_id=st.integers(0, 0xFFFF))
def test_intel_uids_as_the_driver_formats_them_parse_back(domain: int, bus: int, device: int, function: int,
                                                          pci_id: int) -> None:
    """DeviceUIDFromPCIinfo: the sysfs PCI address with ':' and '.' as '-', then the device id."""
    pci = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    uid = pci.replace(":", "-").replace(".", "-") + f"-0x{pci_id:04x}"
    assert parse_dra_device("gpu.intel.com", uid) == DraRef(pci_bus_id=pci)


def test_profile_as_the_driver_writes_it() -> None:
    assert profile_in_name("1g.10gb") == "1g10gb"
    assert profile_in_name("1g.10gb+me") == "1g10gb-me"
    assert profile_in_name("4g.95gb") == "4g95gb"


def reading(*devices: GpuSample) -> GpuReading:
    return GpuReading(backend="nvml", success=True, device_count=len(devices), devices=devices)


def nvidia(index: int, uuid: str, minor: int, up: bool = True, **kw: object) -> GpuSample:
    return GpuSample(GpuIdentity(index=index, uuid=uuid, minor=minor), up=up, **kw)  # type: ignore[arg-type]


def dra(device: str, driver: str = "gpu.nvidia.com", pod: str = "p", claim: str = "c", share: str = "") -> Allocation:
    return Allocation("ns", pod, "main", driver, device, claim=claim, share=share, dra=True)


def state(*allocations: Allocation, refused: tuple[tuple[str, int, str], ...] = ()) -> KubeletState:
    return KubeletState(allocations, True, 0.0, 0.0, refused)


# minors differ from the indices (as on a host whose /dev/nvidiaN order is not NVML's PCI order)
H100 = reading(
    nvidia(0, G0, minor=2),
    nvidia(1, G1, minor=0, mig_uuids=(MIG_A, MIG_B), mig_slots=(
        MigSlot(MIG_A, "1g.10gb", gi_profile_id=19, placement_start=6),
        MigSlot(MIG_B, "3g.40gb", gi_profile_id=9, placement_start=0),
    )),
    nvidia(2, G2, minor=1),
)


def test_full_gpus_resolve_by_minor_not_index() -> None:
    missed: dict[str, list[str]] = {}
    got = join.allocations(H100, state(dra("gpu-0", pod="a"), dra("gpu-2", pod="b"), dra("gpu-1", pod="c")),
                           unresolved=missed)
    assert {(a.pod, a.gpu, a.uuid) for a in got} == {("a", 1, G1), ("b", 0, G0), ("c", 2, G2)}
    assert missed == {}


def test_mig_devices_resolve_by_slot_with_the_profile_checked() -> None:
    missed: dict[str, list[str]] = {}
    got = join.allocations(H100, state(
        dra("gpu-0-mig-1g10gb-19-6", pod="small"),
        dra("gpu-0-mig-3g40gb-9-0", pod="medium"),
        dra("gpu-0-mig-1g10gb-19-0", pod="no-such-slot"),  # placement 0 holds a 3g.40gb
        dra("gpu-2-mig-1g10gb-19-6", pod="other-parent"),  # the GPU of minor 2 has no MIG device there
        dra("gpu-0-mig-2g20gb-19-6", pod="wrong-profile"),  # the slot exists, the profile text disagrees
        dra("gpu-0-mig-19-6-1", pod="old-form"),  # an older driver's gpu-%d-mig-%d-%d-%d
    ), unresolved=missed)
    assert {(a.pod, a.gpu, a.uuid, a.device_id) for a in got} == {
        ("small", 1, G1, "gpu-0-mig-1g10gb-19-6"), ("medium", 1, G1, "gpu-0-mig-3g40gb-9-0")}
    assert sorted(missed["gpu.nvidia.com"]) == sorted([
        "gpu-0-mig-1g10gb-19-0", "gpu-2-mig-1g10gb-19-6", "gpu-0-mig-2g20gb-19-6", "gpu-0-mig-19-6-1"])


def test_a_down_gpu_keeps_its_last_mig_slots() -> None:
    slots = join.known_slots(H100, {})
    down = reading(nvidia(0, G0, minor=2), nvidia(1, G1, minor=0, up=False), nvidia(2, G2, minor=1))
    slots = join.known_slots(down, slots)
    got = join.allocations(down, state(dra("gpu-0-mig-1g10gb-19-6")), last_slots=slots)
    assert [(a.gpu, a.uuid) for a in got] == [(1, G1)]


def test_a_shared_device_gives_one_row_per_share_and_claim() -> None:
    got = join.allocations(H100, state(
        dra("gpu-2", pod="a", claim="shared-a", share="5c1d7e0a"),
        dra("gpu-2", pod="b", claim="shared-b", share="9e4f2b11"),
    ))
    assert {(a.pod, a.gpu, a.claim, a.share) for a in got} == {("a", 0, "shared-a", "5c1d7e0a"),
                                                               ("b", 0, "shared-b", "9e4f2b11")}


def test_amd_names_resolve_by_card_on_the_amdgpu_backend_only() -> None:
    amd = reading(GpuSample(GpuIdentity(index=0, uuid="amd-0", pci_bus_id="0000:c1:00.0", drm_card="card1"), up=True),
                  GpuSample(GpuIdentity(index=1, uuid="amd-1", pci_bus_id="0000:c2:00.0", drm_card="card2"), up=True))
    amd = GpuReading("amdgpu", True, 2, devices=amd.devices)
    missed: dict[str, list[str]] = {}
    got = join.allocations(amd, state(
        dra("gpu-2-130", "gpu.amd.com", pod="a"), dra("gpu-3-131", "gpu.amd.com", pod="gone"),
        dra("0000-c1-00-0-0x740f", "gpu.intel.com", pod="intel"),  # an Intel name of an AMD card's address
        dra("gpu-0", pod="nvidia"),
    ), unresolved=missed)
    assert {(a.pod, a.gpu, a.uuid) for a in got} == {("a", 1, "amd-1")}
    assert missed == {"gpu.amd.com": ["gpu-3-131"], "gpu.intel.com": ["0000-c1-00-0-0x740f"], "gpu.nvidia.com": ["gpu-0"]}


def test_intel_names_resolve_by_pci_address_on_the_intel_backend_only() -> None:
    intel = GpuReading("intel", True, 2, devices=(
        GpuSample(GpuIdentity(index=0, uuid="0000:03:00.0", pci_bus_id="0000:03:00.0", drm_card="card1"), up=True),
        GpuSample(GpuIdentity(index=1, uuid="0000:4d:00.1", pci_bus_id="0000:4d:00.1", drm_card="card2"), up=True),
    ))
    missed: dict[str, list[str]] = {}
    got = join.allocations(intel, state(
        dra("0000-4d-00-1-0x0bd5", "gpu.intel.com", pod="vf"), dra("0000-05-00-0-0x56c0", "gpu.intel.com", pod="gone"),
        dra("gpu-1-129", "gpu.amd.com", pod="amd"),  # card1 is Intel's: not an AMD driver's device
    ), unresolved=missed)
    assert {(a.pod, a.gpu) for a in got} == {("vf", 1)}
    assert missed == {"gpu.intel.com": ["0000-05-00-0-0x56c0"], "gpu.amd.com": ["gpu-1-129"]}


def test_an_unknown_driver_is_unresolved_not_dropped() -> None:
    missed: dict[str, list[str]] = {}
    assert join.allocations(H100, state(dra("gpu-0", "gpu.example.com")), unresolved=missed) == ()
    assert missed == {"gpu.example.com": ["gpu-0"]}


def test_device_plugin_and_dra_rows_side_by_side() -> None:
    got = join.allocations(H100, state(Allocation("ns", "old", "main", "nvidia.com/gpu", G0), dra("gpu-2", pod="new")))
    assert {(a.pod, a.gpu, a.resource, a.device_id, a.claim) for a in got} == {
        ("old", 0, "nvidia.com/gpu", G0, ""), ("new", 0, "gpu.nvidia.com", "gpu-2", "c")}


def test_the_families_carry_claim_share_and_the_unresolved_count() -> None:
    sample = AllocationSample(0, G0, "ns", "p", "main", "gpu.nvidia.com", "gpu-2", claim="c", share="s1")
    (info,) = allocation_families((sample,))
    assert info.samples[0].labels == {"gpu": "0", "uuid": G0, "namespace": "ns", "pod": "p", "container": "main",
                                      "resource": "gpu.nvidia.com", "device_id": "gpu-2", "claim": "c", "share": "s1"}
    (gauge,) = unresolved_families((("example.com", 1), ("gpu.nvidia.com", 0)))
    assert [(s.labels, s.value) for s in gauge.samples] == [({"resource": "example.com"}, 1),
                                                           ({"resource": "gpu.nvidia.com"}, 0)]
    assert list(unresolved_families(())) == [] and list(unresolved_families(None)) == []
