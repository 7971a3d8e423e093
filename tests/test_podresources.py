"""The PodResources v1 client against a real grpc server on a real unix socket (tests/fake_kubelet.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_kubelet import (
    Claim,
    Container,
    Device,
    DraDevice,
    FakeKubelet,
    Pod,
    generated,
    list_response,
    short_socket_dir,
)

from resmon_exporter.attribution.deviceids import HostGpus, parse_device_id
from resmon_exporter.attribution.podresources import (
    MAX_RECEIVE_BYTES,
    Allocation,
    PodResourcesError,
    Refused,
    _message_classes,
    decode_list_response,
    list_allocations,
)

GPU_A = "GPU-8d1f3a2b-6c4e-11ee-9a4b-0242ac120002"
GPU_B = "GPU-5f0c9e21-1d2b-4a3c-8e7f-6a5b4c3d2e1f"
MIG = "MIG-2ce7a541-81ea-5f2d-a4d6-9c5e3b1f0a77"
TIMEOUT = 2.0
SLACK = 1.0  # seconds a failing call may take beyond its timeout


@pytest.fixture
def socket_dir() -> Iterator[str]:
    path = short_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def socket_path(socket_dir: str) -> str:
    return os.path.join(socket_dir, "kubelet.sock")


@pytest.fixture
def kubelet(socket_path: str) -> Iterator[FakeKubelet]:
    with FakeKubelet(socket_path) as server:
        yield server


def gpu_pod(namespace: str, name: str, container: str, resource: str, *ids: str) -> Pod:
    return Pod(namespace, name, [Container(container, [Device(resource, list(ids))])])


def failure(socket_path: str, timeout: float = TIMEOUT) -> tuple[str, float]:
    """The message of the PodResourcesError list_allocations raises, and how long it took."""
    started = time.monotonic()
    with pytest.raises(PodResourcesError) as raised:
        list_allocations(socket_path, timeout)
    message = str(raised.value)
    assert "\n" not in message and message
    return message, time.monotonic() - started


# -- what List answers -----------------------------------------------------------------------------


def test_exclusive_gpus_in_the_kubelets_order(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        Pod(
            "ml",
            "train-0",
            [
                Container("trainer", [Device("nvidia.com/gpu", [GPU_B, GPU_A])]),
                Container("eval", [Device("nvidia.com/gpu", ["GPU-3"])]),
            ],
        ),
        gpu_pod("web", "infer-1", "server", "nvidia.com/gpu", "GPU-4"),
    ]
    assert list_allocations(kubelet.socket_path, TIMEOUT) == (
        Allocation("ml", "train-0", "trainer", "nvidia.com/gpu", GPU_B),
        Allocation("ml", "train-0", "trainer", "nvidia.com/gpu", GPU_A),
        Allocation("ml", "train-0", "eval", "nvidia.com/gpu", "GPU-3"),
        Allocation("web", "infer-1", "server", "nvidia.com/gpu", "GPU-4"),
    )
    assert kubelet.calls == 1  # one List per call, no retries


def test_two_pods_time_sliced_on_one_gpu(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        gpu_pod("a", "p0", "c", "nvidia.com/gpu", f"{GPU_A}::0"),
        gpu_pod("b", "p1", "c", "nvidia.com/gpu", f"{GPU_A}::1"),
    ]
    allocations = list_allocations(kubelet.socket_path, TIMEOUT)
    assert [(a.namespace, a.pod, a.device_id) for a in allocations] == [
        ("a", "p0", f"{GPU_A}::0"),
        ("b", "p1", f"{GPU_A}::1"),
    ]
    assert {parse_device_id(a.device_id) for a in allocations} == {parse_device_id(GPU_A)}


def test_a_mig_device(kubelet: FakeKubelet) -> None:
    kubelet.pods = [gpu_pod("ml", "small", "main", "nvidia.com/mig-1g.10gb", MIG)]
    assert list_allocations(kubelet.socket_path, TIMEOUT) == (
        Allocation("ml", "small", "main", "nvidia.com/mig-1g.10gb", MIG),
    )


def test_an_amd_gpu(kubelet: FakeKubelet) -> None:
    kubelet.pods = [gpu_pod("rocm", "bench", "main", "amd.com/gpu", "0000:03:00.0")]
    assert list_allocations(kubelet.socket_path, TIMEOUT) == (
        Allocation("rocm", "bench", "main", "amd.com/gpu", "0000:03:00.0"),
    )


def dra_pod(namespace: str, name: str, container: str, claim: str, *devices: DraDevice) -> Pod:
    return Pod(namespace, name, [Container(container, [], claims=[Claim(claim, list(devices))])])


def test_dra_devices_as_a_1_34_kubelet_lists_them(kubelet: FakeKubelet) -> None:
    """dynamic_resources: the driver as resource, the device name as device_id, claim and share_id."""
    kubelet.pods = [
        dra_pod("ml", "train", "main", "gpus", DraDevice("gpu.nvidia.com", "gpu-1", cdi_devices=[
            "k8s.gpu.nvidia.com/claim=6f1c1c43-0d5b-4c1e-9f1e-2f6f0d6c7a11-gpu-1"]),
            DraDevice("gpu.nvidia.com", "gpu-0-mig-1g10gb-19-3")),
        dra_pod("ml", "infer", "server", "shared", DraDevice("gpu.nvidia.com", "gpu-2", share_id="2a9d6b0e")),
        Pod("mixed", "both", [Container("c", [Device("nvidia.com/gpu", [GPU_A])],
                                        claims=[Claim("amd", [DraDevice("gpu.amd.com", "gpu-1-129")], "mixed")])]),
    ]
    assert list_allocations(kubelet.socket_path, TIMEOUT) == (
        Allocation("ml", "train", "main", "gpu.nvidia.com", "gpu-1", claim="gpus", dra=True),
        Allocation("ml", "train", "main", "gpu.nvidia.com", "gpu-0-mig-1g10gb-19-3", claim="gpus", dra=True),
        Allocation("ml", "infer", "server", "gpu.nvidia.com", "gpu-2", claim="shared", share="2a9d6b0e", dra=True),
        Allocation("mixed", "both", "c", "nvidia.com/gpu", GPU_A),
        Allocation("mixed", "both", "c", "gpu.amd.com", "gpu-1-129", claim="amd", dra=True),
    )


def test_dra_devices_of_other_gpus_and_drivers_are_refused_and_counted_while_decoding(kubelet: FakeKubelet) -> None:
    host = HostGpus(uuids=frozenset({GPU_A}), indices=frozenset({0, 1}), pci=frozenset({"0000:03:00.0"}),
                    minors=frozenset({2, 5}), drm_cards=frozenset({"card1"}))
    kubelet.pods = [
        dra_pod("ml", "a", "c", "x",
                DraDevice("gpu.nvidia.com", "gpu-5"), DraDevice("gpu.nvidia.com", "gpu-0"),  # minor 0: none here
                DraDevice("gpu.nvidia.com", "gpu-2-mig-3g40gb-9-4"), DraDevice("gpu.nvidia.com", "gpu-vfio-0"),
                DraDevice("gpu.amd.com", "gpu-1-129"), DraDevice("gpu.amd.com", "gpu-3-131"),
                DraDevice("gpu.intel.com", "0000-03-00-0-0x56c0"), DraDevice("gpu.intel.com", "0000-04-00-0-0x56c0"),
                DraDevice("nic.example.com", "eth-0")),
    ]
    refused = Refused()
    kept = list_allocations(kubelet.socket_path, TIMEOUT, keep=host.names, keep_dra=host.names_dra, refused=refused)
    assert [(a.resource, a.device_id) for a in kept] == [
        ("gpu.nvidia.com", "gpu-5"), ("gpu.nvidia.com", "gpu-2-mig-3g40gb-9-4"), ("gpu.amd.com", "gpu-1-129"),
        ("gpu.intel.com", "0000-03-00-0-0x56c0"),
    ]
    assert refused.counts == {"gpu.nvidia.com": 2, "gpu.amd.com": 1, "gpu.intel.com": 1, "nic.example.com": 1}
    assert refused.examples["gpu.nvidia.com"] == "gpu-0"


def test_containers_without_devices_give_nothing(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        Pod("ml", "train", [Container("istio-proxy", []), Container("main", [Device("nvidia.com/gpu", [GPU_A])])]),
        Pod("kube-system", "coredns", [Container("coredns", [], cpu_ids=[2, 3])]),
        Pod("default", "no-containers", []),
        Pod("default", "empty-device-list", [Container("main", [Device("nvidia.com/gpu", [])])]),
    ]
    assert list_allocations(kubelet.socket_path, TIMEOUT) == (
        Allocation("ml", "train", "main", "nvidia.com/gpu", GPU_A),
    )


def test_an_empty_list(kubelet: FakeKubelet) -> None:
    kubelet.pods = []
    assert list_allocations(kubelet.socket_path, TIMEOUT) == ()
    assert kubelet.calls == 1


def many_pods(count: int, ids_per_pod: int = 8) -> list[Pod]:
    return [
        gpu_pod(
            f"team-{i % 50:02d}",
            f"train-job-{i:06d}-worker",
            "main",
            "nvidia.com/gpu",
            *(f"GPU-{i:08x}-6c4e-11ee-9a4b-0242ac120002::{r}" for r in range(ids_per_pod)),
        )
        for i in range(count)
    ]


def test_a_response_up_to_the_receive_limit(kubelet: FakeKubelet) -> None:
    pods = many_pods(9_000)
    size = list_response(pods).ByteSize()
    assert 3 * 2**20 < size < MAX_RECEIVE_BYTES
    kubelet.pods = pods
    allocations = list_allocations(kubelet.socket_path, 10.0)
    assert len(allocations) == 9_000 * 8
    assert allocations[0] == Allocation(
        "team-00", "train-job-000000-worker", "main", "nvidia.com/gpu", pods[0].containers[0].devices[0].ids[0]
    )
    assert allocations[-1].pod == "train-job-008999-worker" and allocations[-1].device_id.endswith("::7")


def test_a_response_over_4_mib_is_refused(kubelet: FakeKubelet) -> None:
    """The receive limit fits the DaemonSet's 256Mi memory limit (an answer costs a multiple
    of its size while it is decoded): 4 MiB, not the kubelet client's 16 MiB."""
    pods = many_pods(15_000)
    assert 4 * 2**20 < list_response(pods).ByteSize() < 16 * 2**20
    kubelet.pods = pods
    message, _ = failure(kubelet.socket_path, 10.0)
    assert "RESOURCE_EXHAUSTED" in message and "4 MiB" in message


def test_only_allocations_of_this_hosts_gpus_are_kept_while_decoding(kubelet: FakeKubelet) -> None:
    host = HostGpus(uuids=frozenset({GPU_A}), mig_uuids=frozenset({MIG}), indices=frozenset({0, 1}),
                    pci=frozenset({"0000:07:00.0"}))
    kubelet.pods = [
        gpu_pod("ml", "a", "c", "nvidia.com/gpu", GPU_A, f"{GPU_A}::3", GPU_B, "GPU-3"),  # GPU_B, GPU-3: not here
        gpu_pod("ml", "mig", "c", "nvidia.com/mig-1g.10gb", MIG, "MIG-99999999-0000-4000-8000-000000000000"),
        gpu_pod("ml", "idx", "c", "nvidia.com/gpu", "1", "7"),  # index 7: no such GPU
        gpu_pod("net", "sriov", "c", "intel.com/sriov", *(f"0000:3b:02.{f}" for f in range(8))),  # NIC VFs
        gpu_pod("x", "foo", "c", "example.com/foo", "0"),  # an index under a resource that is not a GPU
        gpu_pod("rocm", "b", "c", "amd.com/gpu", "07:00.0-slice-1"),
    ]
    assert list_allocations(kubelet.socket_path, TIMEOUT, keep=host.names) == (
        Allocation("ml", "a", "c", "nvidia.com/gpu", GPU_A),
        Allocation("ml", "a", "c", "nvidia.com/gpu", f"{GPU_A}::3"),
        Allocation("ml", "mig", "c", "nvidia.com/mig-1g.10gb", MIG),
        Allocation("ml", "idx", "c", "nvidia.com/gpu", "1"),
        Allocation("rocm", "b", "c", "amd.com/gpu", "07:00.0-slice-1"),
    )
    # before the first GPU read no GPU is known: every id that names a GPU is kept, no other
    kept = {a.pod for a in list_allocations(kubelet.socket_path, TIMEOUT, keep=HostGpus().names)}
    assert kept == {"a", "mig", "idx", "b", "sriov"}  # a PCI address could be a GPU's until one is known


# -- a failing kubelet ------------------------------------------------------------------------------


def test_a_slow_kubelet_runs_into_the_timeout(kubelet: FakeKubelet) -> None:
    kubelet.pods = [gpu_pod("ml", "p", "c", "nvidia.com/gpu", GPU_A)]
    kubelet.delay = 30.0
    message, took = failure(kubelet.socket_path, 0.5)
    assert "DEADLINE_EXCEEDED" in message
    assert 0.4 < took < 0.5 + SLACK
    kubelet.delay = 0.0  # the next call is not wedged by the first
    assert len(list_allocations(kubelet.socket_path, TIMEOUT)) == 1


def test_stop_does_not_wait_for_a_sleeping_call(kubelet: FakeKubelet) -> None:
    kubelet.delay = 30.0
    outcome: list[BaseException | tuple[Allocation, ...]] = []

    def call() -> None:
        try:
            outcome.append(list_allocations(kubelet.socket_path, 10.0))
        except BaseException as err:  # handed to the test's thread
            outcome.append(err)

    caller = threading.Thread(target=call)
    caller.start()
    while kubelet.calls == 0:
        time.sleep(0.01)
    started = time.monotonic()
    kubelet.stop()
    caller.join(5.0)
    assert time.monotonic() - started < 2.0
    assert len(outcome) == 1 and isinstance(outcome[0], PodResourcesError), outcome
    assert "UNAVAILABLE" in str(outcome[0])


def test_a_kubelet_that_accepts_but_never_speaks(socket_path: str) -> None:
    """A hung kubelet: the connection is accepted (listen backlog), no HTTP/2 ever comes back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(socket_path)
        listener.listen(8)
        message, took = failure(socket_path, 0.5)
    assert "DEADLINE_EXCEEDED" in message  # the lead's kubelet reader backs off on exactly this
    assert 0.4 < took < 0.5 + SLACK


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (grpc.StatusCode.UNIMPLEMENTED, "kubelet has no v1 PodResources API"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limit"),
        (grpc.StatusCode.PERMISSION_DENIED, "permission"),
        (grpc.StatusCode.UNAVAILABLE, "not reachable"),
        (grpc.StatusCode.UNKNOWN, "List failed"),
        (grpc.StatusCode.INTERNAL, "List failed"),
    ],
)
def test_status_codes(kubelet: FakeKubelet, code: grpc.StatusCode, says: str) -> None:
    kubelet.pods = [gpu_pod("ml", "p", "c", "nvidia.com/gpu", GPU_A)]
    kubelet.status = code
    # what is tested is the message for the kubelet's status: a 10 s deadline, so that a machine
    # loaded by xdist workers and two busy loops does not turn the answer into DEADLINE_EXCEEDED
    # (it did, at 2 s, in a fresh-clone run)
    message, took = failure(kubelet.socket_path, timeout=10.0)
    assert f"({code.name})" in message and says in message and kubelet.socket_path in message
    assert took < 10.0
    kubelet.status = None
    assert len(list_allocations(kubelet.socket_path, TIMEOUT)) == 1


def test_a_kubelet_without_the_v1_service(socket_path: str) -> None:
    """What a kubelet older than 1.20 (v1alpha1 only) answers: no handler for /v1.PodResourcesLister/List."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port("unix://" + socket_path)
    server.start()
    try:
        message, _ = failure(socket_path)
    finally:
        server.stop(0).wait(2.0)
    assert "(UNIMPLEMENTED)" in message and "kubelet has no v1 PodResources API" in message


def test_no_socket(socket_path: str) -> None:
    message, took = failure(socket_path)
    assert socket_path in message and "UNAVAILABLE" in message
    assert took < 0.5


def test_a_socket_file_nobody_listens_on(socket_path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(socket_path)  # the file stays after close: a kubelet that died without cleaning up
    message, took = failure(socket_path)
    assert "(UNAVAILABLE)" in message and "kubelet not reachable" in message
    assert took < TIMEOUT


def test_a_restarted_kubelet_is_a_new_socket_at_the_same_path(kubelet: FakeKubelet) -> None:
    path = kubelet.socket_path
    kubelet.pods = [gpu_pod("ml", "before", "c", "nvidia.com/gpu", GPU_A)]
    assert list_allocations(path, TIMEOUT)[0].pod == "before"
    first = os.stat(path)
    kubelet.stop()
    assert not os.path.exists(path)
    failure(path)
    kubelet.pods = [gpu_pod("ml", "after", "c", "nvidia.com/gpu", GPU_B)]
    kubelet.start()
    second = os.stat(path)
    assert (second.st_ino, second.st_ctime_ns) != (first.st_ino, first.st_ctime_ns)
    assert list_allocations(path, TIMEOUT) == (Allocation("ml", "after", "c", "nvidia.com/gpu", GPU_B),)
    assert kubelet.calls == 2


def test_pods_changing_while_calls_run(kubelet: FakeKubelet) -> None:
    one = [gpu_pod("ml", "one", "c", "nvidia.com/gpu", GPU_A)]
    two = [
        gpu_pod("ml", "two", "c", "nvidia.com/gpu", GPU_A),
        gpu_pod("ml", "two-b", "c", "amd.com/gpu", "0000:03:00.0"),
    ]
    done = threading.Event()

    def flip() -> None:
        while not done.is_set():
            kubelet.pods = one
            kubelet.pods = two

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        seen = {tuple(a.pod for a in list_allocations(kubelet.socket_path, TIMEOUT)) for _ in range(30)}
    finally:
        done.set()
        flipper.join()
    assert seen <= {("one",), ("two", "two-b")}
    assert kubelet.calls == 30


# -- the hand descriptor against the upstream proto -------------------------------------------------


def repeated(field: Any) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf 7 dropped FieldDescriptor.label
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def test_the_hand_descriptor_matches_the_upstream_proto() -> None:
    """Every field the client declares has the upstream field's number, type and label."""
    pb2, _ = generated()
    _, response_class = _message_classes()
    hand = response_class.DESCRIPTOR.file
    assert hand.package == pb2.DESCRIPTOR.package == "v1"
    checked = 0
    for name, message in hand.message_types_by_name.items():
        upstream = pb2.DESCRIPTOR.message_types_by_name[name]
        for field in message.fields:
            theirs = upstream.fields_by_name[field.name]
            assert (field.number, field.type, repeated(field)) == (theirs.number, theirs.type, repeated(theirs)), (
                field.full_name
            )
            if field.message_type is not None:
                assert field.message_type.full_name == theirs.message_type.full_name
            checked += 1
    assert checked >= 10


def rich_pods() -> list[Pod]:
    """Pods with every field a new kubelet sends, also those the client does not declare."""
    return [
        Pod(
            "ml",
            "train",
            [
                Container(
                    "main",
                    [
                        Device("nvidia.com/gpu", [GPU_A, f"{GPU_B}::3"], numa_nodes=[0, 1]),
                        Device("amd.com/gpu", ["0000:03:00.0"]),
                    ],
                    cpu_ids=[4, 5, 6],
                    memory_bytes=2**34,
                    dra_devices=["gpu-0", "gpu-1"],
                ),
                Container("dra-only", [], dra_devices=["gpu-2"]),
            ],
        ),
        gpu_pod("ml", "mig", "main", "nvidia.com/mig-1g.10gb", MIG),
    ]


RICH_ALLOCATIONS = (
    Allocation("ml", "train", "main", "nvidia.com/gpu", GPU_A),
    Allocation("ml", "train", "main", "nvidia.com/gpu", f"{GPU_B}::3"),
    Allocation("ml", "train", "main", "amd.com/gpu", "0000:03:00.0"),
    Allocation("ml", "train", "main", "gpu.nvidia.com", "gpu-0", claim="gpu-claim", dra=True),
    Allocation("ml", "train", "main", "gpu.nvidia.com", "gpu-1", claim="gpu-claim", dra=True),
    Allocation("ml", "train", "dra-only", "gpu.nvidia.com", "gpu-2", claim="gpu-claim", dra=True),
    Allocation("ml", "mig", "main", "nvidia.com/mig-1g.10gb", MIG),
)


def test_the_generated_servers_answer_decodes_to_the_same_pods(kubelet: FakeKubelet) -> None:
    kubelet.pods = rich_pods()
    assert list_allocations(kubelet.socket_path, TIMEOUT) == RICH_ALLOCATIONS


def test_the_generated_messages_bytes_decode_to_the_same_pods() -> None:
    response = list_response(rich_pods())
    assert len(response.pod_resources[0].containers[0].dynamic_resources[0].claim_resources) == 2  # really sent
    assert decode_list_response(response.SerializeToString()) == RICH_ALLOCATIONS
    _, response_class = _message_classes()
    hand = response_class.FromString(response.SerializeToString())
    assert [n.ID for n in hand.pod_resources[0].containers[0].devices[0].topology.nodes] == [0, 1]


# -- without grpc ---------------------------------------------------------------------------------


def test_without_grpc_the_error_says_what_to_install(kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # what "import grpc" sees when grpcio is not installed
    with pytest.raises(PodResourcesError, match=r"pip install 'resmon-exporter\[kubernetes\]'"):
        list_allocations(kubelet.socket_path, TIMEOUT)
    assert kubelet.calls == 0


def test_importing_the_package_does_not_import_grpc() -> None:
    code = (
        "import sys, resmon_exporter.attribution, resmon_exporter.attribution.podresources, resmon_exporter.attribution.deviceids\n"
        "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'google.protobuf'))))\n"
    )
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
