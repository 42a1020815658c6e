"""A pod-resources server (the kubelet's side of the API) for the simulator and tests.

It speaks gRPC on a unix socket through :mod:`.grpcwire` (asyncio and HTTP/2, no gRPC runtime)
and writes the answers with :mod:`.protowire` (no protobuf runtime): the simulator's kubelet
costs the exporter's process no threads and little memory.

It serves whatever ``provider`` returns at each call, so allocations can change over time:
device-plugin devices and DRA claims (``dynamic_resources``, grouped by claim as the kubelet
does). With ``allocatable=None`` it refuses GetAllocatableResources with ``allocatable_refusal``:
UNIMPLEMENTED as kubelets before 1.23 do, or UNKNOWN "Pod Resources API GetAllocatableResources
disabled" as a kubelet with the feature gate off does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .grpcwire import Handler, RpcError, StatusCode, serve_connection
from .podresources import GET, GET_ALLOCATABLE, LIST, ClaimDevice, ContainerDevices
from .protowire import WireError, field, parse, text

UNIMPLEMENTED = (StatusCode.UNIMPLEMENTED, "not served by this kubelet")
ALLOCATABLE_DISABLED = (
    StatusCode.UNKNOWN,
    "Pod Resources API GetAllocatableResources disabled",
)


@dataclass(frozen=True)
class KubeletState:
    containers: Sequence[ContainerDevices] = ()
    allocatable: Sequence[tuple[str, str]] | None = ()  # (resource, device id)
    claims: Sequence[ClaimDevice] = ()
    allocatable_refusal: tuple[StatusCode, str] = UNIMPLEMENTED


_Entry = ContainerDevices | ClaimDevice


def pod_messages(
    containers: Sequence[ContainerDevices], claims: Sequence[ClaimDevice] = ()
) -> list[tuple[tuple[str, str], bytes]]:
    """Each pod's PodResources, grouped into pods and containers as the kubelet does:
    ((namespace, name), message) in the order the pods first appear."""
    pods: dict[tuple[str, str], dict[str, list[_Entry]]] = {}
    every: list[_Entry] = [*containers, *claims]
    for entry in every:
        by_container = pods.setdefault((entry.namespace, entry.pod), {})
        by_container.setdefault(entry.container, []).append(entry)
    out = []
    for (namespace, name), by_container in pods.items():
        body = field("PodResources", "name", name) + field("PodResources", "namespace", namespace)
        for container, entries in by_container.items():
            body += field("PodResources", "containers", _container(container, entries))
        out.append(((namespace, name), body))
    return out


def _container(name: str, entries: Sequence[_Entry]) -> bytes:
    body = field("ContainerResources", "name", name)
    claims: dict[tuple[str, str], list[ClaimDevice]] = {}
    for entry in entries:
        if isinstance(entry, ContainerDevices):
            body += field(
                "ContainerResources", "devices", _device_list(entry.resource, entry.device_ids)
            )
        else:
            claims.setdefault((entry.claim_namespace, entry.claim_name), []).append(entry)
    for (namespace, claim), devices in claims.items():
        dynamic = field("DynamicResource", "claim_name", claim)
        dynamic += field("DynamicResource", "claim_namespace", namespace)
        for device in devices:
            dynamic += field("DynamicResource", "claim_resources", _claim_resource(device))
        body += field("ContainerResources", "dynamic_resources", dynamic)
    return body


def _device_list(resource: str, ids: Iterable[str]) -> bytes:
    body = field("ContainerDevices", "resource_name", resource)
    for device_id in ids:
        body += field("ContainerDevices", "device_ids", device_id, always=True)
    return body


def _claim_resource(device: ClaimDevice) -> bytes:
    body = b"".join(
        field("ClaimResource", "cdi_devices", field("CDIDevice", "name", n))
        for n in device.cdi_devices
    )
    body += field("ClaimResource", "driver_name", device.driver)
    body += field("ClaimResource", "pool_name", device.pool)
    body += field("ClaimResource", "device_name", device.device)
    if device.share_id is not None:
        body += field("ClaimResource", "share_id", device.share_id, always=True)
    return body


def list_response(
    containers: Sequence[ContainerDevices], claims: Sequence[ClaimDevice] = ()
) -> bytes:
    """A ListPodResourcesResponse: the pods of :func:`pod_messages`."""
    pods = pod_messages(containers, claims)
    message = "ListPodResourcesResponse"
    return b"".join(field(message, "pod_resources", pod) for _, pod in pods)


def allocatable_response(allocatable: Sequence[tuple[str, str]]) -> bytes:
    """An AllocatableResourcesResponse: one ContainerDevices per resource, ids in order."""
    by_resource: dict[str, list[str]] = {}
    for resource, device_id in allocatable:
        by_resource.setdefault(resource, []).append(device_id)
    return b"".join(
        field("AllocatableResourcesResponse", "devices", _device_list(r, ids))
        for r, ids in by_resource.items()
    )


def read_get_request(data: bytes) -> tuple[str, str]:
    """A GetPodResourcesRequest: (namespace, pod)."""
    fields = parse(data, "GetPodResourcesRequest")
    return text(fields, "pod_namespace"), text(fields, "pod_name")


def _handlers(provider: Callable[[], KubeletState]) -> dict[str, Handler]:
    """The kubelet's three calls, each answering from ``provider()`` at the time of the call."""

    # The last List answer and what it was written from: a node's holdings rarely change between
    # polls, and writing 100 pods' messages took the event loop ~3 ms a poll.
    last_from: tuple[_Entry | None, ...] | None = None
    last_answer = b""

    async def list_pods(request: bytes) -> bytes:
        nonlocal last_from, last_answer
        state = provider()
        written_from = (*state.containers, None, *state.claims)
        if written_from != last_from:
            last_from, last_answer = written_from, list_response(state.containers, state.claims)
        return last_answer

    async def get_allocatable(request: bytes) -> bytes:
        state = provider()
        if state.allocatable is None:
            raise RpcError(*state.allocatable_refusal)
        return allocatable_response(state.allocatable)

    async def get_pod(request: bytes) -> bytes:
        try:
            wanted = read_get_request(request)
        except WireError as exc:
            raise RpcError(StatusCode.INTERNAL, f"undecodable request: {exc}") from None
        state = provider()
        for key, pod in pod_messages(state.containers, state.claims):
            if key == wanted:
                return field("GetPodResourcesResponse", "pod_resources", pod)
        raise RpcError(  # the kubelet answers with a plain error: status UNKNOWN
            StatusCode.UNKNOWN, f"pod {wanted[1]} in namespace {wanted[0]} not found"
        )

    return {LIST: list_pods, GET_ALLOCATABLE: get_allocatable, GET: get_pod}


class PodResourcesServer:
    """A gRPC server on a unix socket; start and stop it as often as needed."""

    def __init__(self, socket_path: Path, provider: Callable[[], KubeletState]) -> None:
        self.socket_path = Path(socket_path)
        self._provider = provider  # looked up at each call (bench/simmeter.py wraps it)
        self._handlers = _handlers(lambda: self._provider())
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.accepted = 0  # connections accepted since construction (tests check reuse)

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale socket from a previous run
        self._server = await asyncio.start_unix_server(self._serve, str(self.socket_path))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        # A stopped kubelet drops its connections too: closed under each connection's reader,
        # which then ends (a cancelled connection task would be logged as an error by asyncio).
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's callback as a task
        self._connections[task] = writer
        self.accepted += 1
        try:
            await serve_connection(reader, writer, self._handlers)
        finally:
            del self._connections[task]
