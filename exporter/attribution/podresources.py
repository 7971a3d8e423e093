"""A client for the kubelet's PodResources v1 API: which container holds which device.

The messages come from a FileDescriptorProto built here, not from protoc output: generated
code pins the protobuf runtime to the generator's major version, a hand descriptor works on
every protobuf from 4.25 on. Only the fields List needs are declared; the rest of a newer
kubelet's answer (cpu_ids, memory, topology's users, CDI device names ...) is skipped as
unknown fields. DRA devices (dynamic_resources, kubelet 1.34+) come back as allocations whose
resource is the driver and device_id the device name, with their claim and share_id.
grpc and google.protobuf are imported on the first call (or by preload()), so the exporter
runs without them.

Memory: a decoded answer costs about 450 bytes of Python objects per device id (the parse
itself is lazy and nearly free), so only the ids a keep() predicate accepts become
Allocations, decided while the answer is walked, and an answer is refused over
MAX_RECEIVE_BYTES (4 MiB: at worst some 70,000 ids, well inside the DaemonSet's 256Mi).
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LIST_METHOD = "/v1.PodResourcesLister/List"
# gRPC's own default; the kubelet's client helper takes 16 MiB, which costs up to 20x its size
# in RSS if it were all GPU ids, over the DaemonSet's memory limit. A node's List is some KiB
# per pod (110 pods by default): 4 MiB is room for hundreds of pods.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
_INSTALL_HINT = "pip install 'resmon-exporter[kubernetes]'"
_MAX_DETAILS = 300  # characters of the server's error text kept in a message

# field: (name, number, repeated, type, message type); types as FieldDescriptorProto names them
_Field = tuple[str, int, bool, str, str]
_MESSAGES: dict[str, tuple[_Field, ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, True, "TYPE_MESSAGE", "PodResources"),),
    "PodResources": (
        ("name", 1, False, "TYPE_STRING", ""),
        ("namespace", 2, False, "TYPE_STRING", ""),
        ("containers", 3, True, "TYPE_MESSAGE", "ContainerResources"),
    ),
    "ContainerResources": (
        ("name", 1, False, "TYPE_STRING", ""),
        ("devices", 2, True, "TYPE_MESSAGE", "ContainerDevices"),
        ("dynamic_resources", 5, True, "TYPE_MESSAGE", "DynamicResource"),
    ),
    # field 1 (class_name) was removed in 1.31
    "DynamicResource": (
        ("claim_name", 2, False, "TYPE_STRING", ""),
        ("claim_namespace", 3, False, "TYPE_STRING", ""),
        ("claim_resources", 4, True, "TYPE_MESSAGE", "ClaimResource"),
    ),
    # share_id is "optional" upstream: declared plain here (the same wire format), unset reads ""
    "ClaimResource": (
        ("driver_name", 2, False, "TYPE_STRING", ""),
        ("pool_name", 3, False, "TYPE_STRING", ""),
        ("device_name", 4, False, "TYPE_STRING", ""),
        ("share_id", 5, False, "TYPE_STRING", ""),
    ),
    "ContainerDevices": (
        ("resource_name", 1, False, "TYPE_STRING", ""),
        ("device_ids", 2, True, "TYPE_STRING", ""),
        ("topology", 3, False, "TYPE_MESSAGE", "TopologyInfo"),
    ),
    "TopologyInfo": (("nodes", 1, True, "TYPE_MESSAGE", "NUMANode"),),
    "NUMANode": (("ID", 1, False, "TYPE_INT64", ""),),
}

# what a status code means here, where the bare code name would leave the reader guessing
_HINTS = {
    "UNAVAILABLE": "kubelet not reachable",
    "DEADLINE_EXCEEDED": "kubelet did not answer in time",
    "UNIMPLEMENTED": "kubelet has no v1 PodResources API",
    "RESOURCE_EXHAUSTED": f"kubelet rate limit, or an answer over {MAX_RECEIVE_BYTES // 2**20} MiB",
    "PERMISSION_DENIED": "no permission on the kubelet socket (the exporter needs uid 0)",
}


@dataclass(frozen=True, slots=True)
class Allocation:
    namespace: str
    pod: str
    container: str
    resource: str  # device plugin: the resource name; DRA: the driver
    device_id: str  # device plugin: the device id; DRA: the device name
    claim: str = ""  # DRA: the ResourceClaim's name
    share: str = ""  # DRA: share_id (a shared device); "" otherwise
    dra: bool = False  # from dynamic_resources


class Refused:
    """DRA devices a List's keep_dra() refused while decoding: a count per driver and the
    first device name of each (for the warning). Filled by one List on its own thread."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, driver: str, device: str) -> None:
        self.counts[driver] = self.counts.get(driver, 0) + 1
        self.examples.setdefault(driver, device)


class PodResourcesError(Exception):
    """List failed; str() is one line saying why."""


_classes_lock = threading.Lock()
_classes: tuple[Any, Any] | None = None  # (request class, response class)


def _file_proto(descriptor_pb2: Any) -> Any:
    field_proto = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="resmon/kubelet/podresources/v1/api.proto", package="v1", syntax="proto3"
    )
    for message_name, fields in _MESSAGES.items():
        message = file_proto.message_type.add(name=message_name)
        for name, number, repeated, type_name, message_type in fields:
            field = message.field.add(name=name, number=number, json_name=_json_name(name))
            field.label = field_proto.LABEL_REPEATED if repeated else field_proto.LABEL_OPTIONAL
            field.type = getattr(field_proto, type_name)
            if message_type:
                field.type_name = ".v1." + message_type
    return file_proto


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _message_class(pool: Any, message_factory: Any, full_name: str) -> Any:
    descriptor = pool.FindMessageTypeByName(full_name)
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:
        return get_class(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf < 4.22


def _message_classes() -> tuple[Any, Any]:
    """(ListPodResourcesRequest, ListPodResourcesResponse), built once per process."""
    global _classes
    with _classes_lock:
        if _classes is None:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

            # a private pool: the default one may already hold another "v1" package
            pool = descriptor_pool.DescriptorPool()
            pool.AddSerializedFile(_file_proto(descriptor_pb2).SerializeToString())
            _classes = (
                _message_class(pool, message_factory, "v1.ListPodResourcesRequest"),
                _message_class(pool, message_factory, "v1.ListPodResourcesResponse"),
            )
        return _classes


Keep = Callable[[str, str], bool]  # (resource name, device id) -> whether to keep it
# (driver, device name) -> whether to keep a DRA device; one refused is counted, not dropped
KeepDra = Callable[[str, str], bool]


def _allocations(
    response: Any, keep: Keep | None = None, keep_dra: KeepDra | None = None, refused: Refused | None = None
) -> tuple[Allocation, ...]:
    """The allocations keep() (device plugins) and keep_dra() (DRA) accept; the DRA devices
    keep_dra() refuses are counted in refused. Each pod's and container's names are read once
    and shared by its allocations; nothing is built for an id that is not kept."""
    out: list[Allocation] = []
    for pod in response.pod_resources:
        names: tuple[str, str] | None = None
        for container in pod.containers:
            container_name: str | None = None
            for devices in container.devices:
                resource = devices.resource_name
                for device_id in devices.device_ids:
                    if keep is not None and not keep(resource, device_id):
                        continue
                    if names is None:
                        names = (pod.namespace, pod.name)
                    if container_name is None:
                        container_name = container.name
                    out.append(Allocation(names[0], names[1], container_name, resource, device_id))
            for claim in container.dynamic_resources:
                for device in claim.claim_resources:
                    driver, name = device.driver_name, device.device_name
                    if keep_dra is not None and not keep_dra(driver, name):
                        if refused is not None:
                            refused.add(driver, name)
                        continue
                    if names is None:
                        names = (pod.namespace, pod.name)
                    if container_name is None:
                        container_name = container.name
                    out.append(Allocation(names[0], names[1], container_name, driver, name,
                                          claim=claim.claim_name, share=device.share_id, dra=True))
    return tuple(out)


def decode_list_response(
    data: bytes, keep: Keep | None = None, keep_dra: KeepDra | None = None, refused: Refused | None = None
) -> tuple[Allocation, ...]:
    """The allocations in a serialized ListPodResourcesResponse (raises protobuf's DecodeError)."""
    _, response_class = _message_classes()
    return _allocations(response_class.FromString(data), keep, keep_dra, refused)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_DETAILS else line[: _MAX_DETAILS - 3] + "..."


def _rpc_error(err: Any, socket_path: str) -> PodResourcesError:
    code = err.code() if callable(getattr(err, "code", None)) else None
    name = getattr(code, "name", "UNKNOWN")
    details = err.details() if callable(getattr(err, "details", None)) else ""
    hint = _HINTS.get(name, "kubelet PodResources List failed")
    return PodResourcesError(_one_line(f"{hint} at {socket_path} ({name})" + (f": {details}" if details else "")))


def _import_grpc() -> Any:
    try:
        import google.protobuf  # noqa: F401  (checked here: the descriptor needs it)
        import grpc
    except ImportError as err:
        raise PodResourcesError(
            f"the kubernetes collector needs grpcio and protobuf ({err}): {_INSTALL_HINT}"
        ) from None
    return grpc


def preload() -> None:
    """Import grpc and build the message classes now (about 0.1 s and 17 MiB), off the
    scrape path: the CLI calls it at start where the socket exists, so the first List is not
    slowed past a refresh's brief wait for it. Raises PodResourcesError without grpcio."""
    _import_grpc()
    _message_classes()


def _call_list(
    grpc: Any, socket_path: str, timeout: float, keep: Keep | None, keep_dra: KeepDra | None, refused: Refused | None
) -> tuple[Allocation, ...]:
    request_class, response_class = _message_classes()
    channel = grpc.insecure_channel(
        "unix://" + urllib.parse.quote(os.path.abspath(socket_path)),  # "?", "#", "%" are URI syntax
        options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            # a restarted kubelet is a new socket: never reuse another channel's connection
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.enable_http_proxy", 0),
            ("grpc.enable_retries", 0),
        ],
    )
    try:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        return _allocations(call(request_class(), timeout=timeout), keep, keep_dra, refused)
    except grpc.RpcError as err:
        raise _rpc_error(err, socket_path) from None
    finally:
        channel.close()


def list_allocations(
    socket_path: str, timeout: float, keep: Keep | None = None, keep_dra: KeepDra | None = None,
    refused: Refused | None = None,
) -> tuple[Allocation, ...]:
    """One Allocation per (container, resource, device id) keep() accepts (all without it),
    then per DRA device keep_dra() accepts (those it refuses counted in refused), in the
    kubelet's order.

    A fresh channel per call, closed after; waits at most timeout seconds. Raises
    PodResourcesError only.
    """
    grpc = _import_grpc()
    if "," in socket_path:  # gRPC reads a unix target with a comma as a list of addresses
        raise PodResourcesError(f"cannot connect to {socket_path}: gRPC takes a comma for an address separator")
    if not os.path.exists(socket_path):
        raise PodResourcesError(f"no kubelet socket at {socket_path} (UNAVAILABLE)")
    try:
        return _call_list(grpc, socket_path, timeout, keep, keep_dra, refused)
    except PodResourcesError:
        raise
    except Exception as err:  # the collector's contract: a broken kubelet or runtime is an error, not a crash
        message = f"kubelet PodResources List at {socket_path} failed: {type(err).__name__}: {err}"
        raise PodResourcesError(_one_line(message)) from None
