"""A fake kubelet: a real grpc.server on a unix socket answering PodResources v1 List.

The servicer and messages are generated at test time by grpc_tools.protoc from the vendored
upstream tests/podresources/api.proto, so the exporter's hand-built descriptor is checked
against the kubelet's own definition rather than against itself. GetAllocatableResources and
Get answer UNIMPLEMENTED (the generated base servicer's default).

    kubelet = FakeKubelet(os.path.join(short_socket_dir(), "kubelet.sock")).start()
    kubelet.pods = [Pod("ml", "train-0", [Container("main", [Device("nvidia.com/gpu", ["GPU-1"])])])]
    kubelet.pods = [Pod("ml", "p", [Container("main", [], claims=[Claim("c", [DraDevice("gpu.nvidia.com", "gpu-0")])])])]
    kubelet.delay = 5.0                               # a slow kubelet
    kubelet.status = grpc.StatusCode.UNIMPLEMENTED    # List aborts with this code
    kubelet.stop()                                    # removes the socket; start() binds a new one
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

PROTO = Path(__file__).resolve().parent / "podresources" / "api.proto"
# unique names: the generated modules would otherwise be the very generic api_pb2 / api_pb2_grpc
_PB2 = "fake_kubelet_podresources_v1_pb2"
_PB2_GRPC = "fake_kubelet_podresources_v1_pb2_grpc"
_STOP_GRACE = 0.2  # seconds in-flight calls get at stop(); sleeping handlers are woken at once

_generated_lock = threading.Lock()
_generated: tuple[ModuleType, ModuleType] | None = None


@dataclass
class Device:
    resource: str
    ids: list[str]
    numa_nodes: list[int] = field(default_factory=list)  # ContainerDevices.topology


@dataclass
class DraDevice:
    """One ClaimResource: a device a DRA driver prepared for a claim, as a 1.34 kubelet lists it."""

    driver: str  # driver_name, e.g. gpu.nvidia.com
    device: str  # device_name, e.g. gpu-0
    pool: str = "node-1"  # pool_name (the node's name for node-local drivers)
    share_id: str | None = None  # set for a shared (consumable capacity) device
    cdi_devices: list[str] = field(default_factory=list)


@dataclass
class Claim:
    """One DynamicResource: a ResourceClaim the container uses."""

    name: str
    devices: list[DraDevice]
    namespace: str = "default"


@dataclass
class Container:
    name: str
    devices: list[Device]
    # fields the exporter does not read: a newer kubelet sends them, the client must skip them
    cpu_ids: list[int] = field(default_factory=list)
    memory_bytes: int = 0  # one ContainerMemory "memory" block when set
    dra_devices: list[str] = field(default_factory=list)  # one DynamicResource claim, these device names
    claims: list[Claim] = field(default_factory=list)  # dynamic_resources, as given


@dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Container]


def short_socket_dir() -> str:
    """A fresh temp dir short enough for AF_UNIX (paths over 107 characters cannot be bound)."""
    path = tempfile.mkdtemp(prefix="kl-", dir=tempfile.gettempdir())
    if len(os.path.join(path, "kubelet.sock")) > 107:
        shutil.rmtree(path)
        path = tempfile.mkdtemp(prefix="kl-", dir="/tmp")
    return path


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _generate(out: Path) -> None:
    from grpc_tools import protoc

    args = ["grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}")
    (out / "api_pb2.py").rename(out / f"{_PB2}.py")
    grpc_code = (out / "api_pb2_grpc.py").read_text()
    # the generated servicer imports its messages as a top-level "api_pb2"
    renamed = grpc_code.replace("import api_pb2 as", f"import {_PB2} as")
    if renamed == grpc_code:
        raise RuntimeError("generated api_pb2_grpc.py does not import api_pb2 as expected")
    (out / f"{_PB2_GRPC}.py").write_text(renamed)


def generated() -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc) generated from tests/podresources/api.proto, once per process."""
    global _generated
    with _generated_lock:
        if _generated is None:
            out = Path(tempfile.mkdtemp(prefix="podresources-gen-"))
            atexit.register(shutil.rmtree, out, True)
            _generate(out)
            pb2 = _load(_PB2, out / f"{_PB2}.py")
            _generated = (pb2, _load(_PB2_GRPC, out / f"{_PB2_GRPC}.py"))
        return _generated


def _container_message(pb2: ModuleType, container: Container) -> Any:
    message = pb2.ContainerResources(name=container.name, cpu_ids=container.cpu_ids)
    for device in container.devices:
        topology = pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=n) for n in device.numa_nodes])
        message.devices.add(resource_name=device.resource, device_ids=device.ids, topology=topology)
    if container.memory_bytes:
        message.memory.add(memory_type="memory", size=container.memory_bytes)
    if container.dra_devices:
        claim = message.dynamic_resources.add(claim_name="gpu-claim", claim_namespace="default")
        for name in container.dra_devices:
            claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-1", device_name=name)
    for c in container.claims:
        claim = message.dynamic_resources.add(claim_name=c.name, claim_namespace=c.namespace)
        for d in c.devices:
            resource = claim.claim_resources.add(driver_name=d.driver, pool_name=d.pool, device_name=d.device)
            resource.cdi_devices.extend(pb2.CDIDevice(name=n) for n in d.cdi_devices)
            if d.share_id is not None:
                resource.share_id = d.share_id
    return message


def list_response(pods: list[Pod]) -> Any:
    """The ListPodResourcesResponse (generated class) the fake answers for these pods."""
    pb2, _ = generated()
    response = pb2.ListPodResourcesResponse()
    for pod in pods:
        message = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
        message.containers.extend(_container_message(pb2, c) for c in pod.containers)
    return response


class FakeKubelet:
    """pods, delay and status may be changed at any time, also while a call is in flight."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._lock = threading.Lock()
        self._pods: list[Pod] = []
        self._delay = 0.0
        self._status: grpc.StatusCode | None = None
        self._calls = 0
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()

    @property
    def pods(self) -> list[Pod]:
        with self._lock:
            return self._pods

    @pods.setter
    def pods(self, pods: list[Pod]) -> None:
        with self._lock:
            self._pods = pods

    @property
    def delay(self) -> float:
        with self._lock:
            return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        with self._lock:
            self._delay = seconds

    @property
    def status(self) -> grpc.StatusCode | None:
        with self._lock:
            return self._status

    @status.setter
    def status(self, code: grpc.StatusCode | None) -> None:
        with self._lock:
            self._status = code

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls

    def _answer(self, stopping: threading.Event, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self._calls += 1
            pods, delay, status = list(self._pods), self._delay, self._status
        # stop() sets it: a sleeping call never holds up a stop, and a stopped kubelet answers nothing
        if delay > 0 and stopping.wait(delay):
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake kubelet stopped")
        if status is not None:
            context.abort(status, f"fake kubelet: {status.name}")
        return list_response(pods)

    def start(self) -> FakeKubelet:
        _, pb2_grpc = generated()
        if self._server is not None:
            raise RuntimeError("fake kubelet already started")
        stopping = threading.Event()
        kubelet = self

        class Servicer(pb2_grpc.PodResourcesListerServicer):  # type: ignore[name-defined,misc]
            def List(self, request: Any, context: grpc.ServicerContext) -> Any:
                return kubelet._answer(stopping, context)

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb2_grpc.add_PodResourcesListerServicer_to_server(Servicer(), server)
        if server.add_insecure_port("unix://" + self.socket_path) == 0:  # grpc < 1.6x returns 0 on failure
            raise RuntimeError(f"cannot bind {self.socket_path}")
        server.start()
        self._server, self._stopping = server, stopping
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self._stopping.set()
            server.stop(_STOP_GRACE).wait(_STOP_GRACE + 2.0)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
