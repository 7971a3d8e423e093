"""Device plugin ids -> the GPU they name (every id form in the research sheet's table, A.1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resmon_exporter.attribution.deviceids import DeviceRef, HostGpus, normalise_pci, parse_device_id

GPU = "GPU-8d1f3a2b-6c4e-11ee-9a4b-0242ac120002"
MIG = "MIG-2ce7a541-81ea-5f2d-a4d6-9c5e3b1f0a77"


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        # NVIDIA k8s-device-plugin, deviceIDStrategy uuid (also MIG strategy single: MIG uuids)
        (GPU, DeviceRef(uuid=GPU)),
        ("GPU-ABCDEF01-0000-0000-0000-000000000000", DeviceRef(uuid="GPU-ABCDEF01-0000-0000-0000-000000000000")),
        # deviceIDStrategy index; MIG as a "<gpu>:<mig>" index pair names GPU <gpu>
        ("0", DeviceRef(index=0)),
        ("13", DeviceRef(index=13)),
        ("2:1", DeviceRef(index=2)),
        # MIG strategy mixed (nvidia.com/mig-1g.10gb): R470+ MIG uuid; very old drivers name the parent
        (MIG, DeviceRef(mig_uuid=MIG)),
        (f"MIG-{GPU}/1/0", DeviceRef(mig_parent_uuid=GPU)),
        (f"MIG-{GPU}/13/2", DeviceRef(mig_parent_uuid=GPU)),
        # time-slicing / MPS replicas: the plugin's AnnotatedID "%s::%d"
        (f"{GPU}::3", DeviceRef(uuid=GPU)),
        (f"{GPU}::0", DeviceRef(uuid=GPU)),
        (f"{MIG}::7", DeviceRef(mig_uuid=MIG)),
        ("3::12", DeviceRef(index=3)),
        (f"MIG-{GPU}/1/0::2", DeviceRef(mig_parent_uuid=GPU)),
        # GKE's NVIDIA plugin: device names, sharing and MIG suffixes
        ("nvidia0", DeviceRef(index=0)),
        ("nvidia3", DeviceRef(index=3)),
        ("nvidia0/vgpu2", DeviceRef(index=0)),
        ("nvidia1/gi1", DeviceRef(index=1)),
        ("nvidia1/gi1/vgpu4", DeviceRef(index=1)),
        # ROCm k8s-device-plugin (amd.com/gpu): the PCI address, time-slicing "-slice-N"
        ("0000:03:00.0", DeviceRef(pci_bus_id="0000:03:00.0")),
        ("0000:c1:00.0", DeviceRef(pci_bus_id="0000:c1:00.0")),
        ("0000:C1:00.0", DeviceRef(pci_bus_id="0000:c1:00.0")),
        ("0000:03:00.0-slice-2", DeviceRef(pci_bus_id="0000:03:00.0")),
        ("00000000:07:00.0", DeviceRef(pci_bus_id="0000:07:00.0")),
        ("  GPU-1234abcd  ", DeviceRef(uuid="GPU-1234abcd")),
        # Intel's plugin (gpu.intel.com/i915, gpu.intel.com/xe): "<card>-<share>"
        ("card1-0", DeviceRef(drm_card="card1")),
        ("card12-3", DeviceRef(drm_card="card12")),
    ],
)
def test_parse_device_id(device_id: str, expected: DeviceRef) -> None:
    assert parse_device_id(device_id) == expected


@pytest.mark.parametrize(
    "device_id",
    [
        "",
        "foo",
        "GPU-",
        "MIG-",
        "GPU-abc/1",
        "MIG-GPU-8d1f3a2b",  # the old MIG form without its instance ids
        f"MIG-{GPU}/1",
        "nvidia",
        "nvidiax",
        "nvidia0/slice1",
        "-1",
        "::3",
        "3::",
        "0000:03:00",  # no function
        "0000:03:00.0-slice-",
        "0000:03:00.8",
        "gpu-0",  # a DRA device name: only the ResourceSlice objects say which GPU it is
        "/dev/dri/card0",
        "card1",  # no share number: not the Intel plugin's form
        "card-0",
        "renderD128-0",
    ],
)
def test_ids_we_do_not_understand(device_id: str) -> None:
    assert parse_device_id(device_id) is None


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        ("00000000:07:00.0", "0000:07:00.0"),  # NVML
        ("0000:07:00.0", "0000:07:00.0"),  # sysfs, the AMD plugin
        ("07:00.0", "0000:07:00.0"),  # lspci without the domain
        ("00000000:0A:1F.7", "0000:0a:1f.7"),
        ("0001:65:00.0", "0001:65:00.0"),
        ("00010000:01:00.0", "10000:01:00.0"),  # a VMD domain: sysfs writes it with 5 digits
        (" 0000:07:00.0\n", "0000:07:00.0"),
        ("Not-A-Bus-Id", "not-a-bus-id"),
        ("", ""),
    ],
)
def test_normalise_pci(bus_id: str, expected: str) -> None:
    assert normalise_pci(bus_id) == expected


def test_the_same_gpu_from_nvml_and_from_the_amd_plugin() -> None:
    ref = parse_device_id("0000:0a:00.0-slice-1")
    assert ref is not None and ref.pci_bus_id == normalise_pci("00000000:0A:00.0")


def test_intel_card_ids_name_a_gpu_only_under_intels_resources() -> None:
    host = HostGpus(uuids=frozenset({"0000:03:00.0"}), pci=frozenset({"0000:03:00.0"}), drm_cards=frozenset({"card1"}))
    assert host.names("gpu.intel.com/i915", "card1-0") and host.names("gpu.intel.com/xe", "card1-3")
    assert not host.names("gpu.intel.com/i915", "card2-0")  # not a card of this host
    assert not host.names("example.com/fpga", "card1-0")  # another vendor's "card1": not ours


@given(st.text(alphabet=st.sampled_from("GPUMIGnvida0123456789abcdef-:./slicer"), max_size=40) | st.text(max_size=40))
def test_never_raises(device_id: str) -> None:
    ref = parse_device_id(device_id)
    assert ref is None or isinstance(ref, DeviceRef)
    if ref is not None:  # exactly one identity is set
        assert (
            sum(bool(v) for v in (ref.uuid, ref.mig_uuid, ref.pci_bus_id, ref.mig_parent_uuid, ref.drm_card))
            + (ref.index is not None)
            == 1
        )
