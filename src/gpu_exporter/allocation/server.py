"""A pod-resources server (the kubelet's side of the API) for the simulator and tests.

It speaks gRPC on a unix socket through :mod:`.grpcwire` (asyncio and HTTP/2, no gRPC runtime:
the simulator's kubelet costs the exporter's process no gRPC threads or memory).

It serves whatever ``provider`` returns at each call, so allocations can change over time:
device-plugin devices and DRA claims (``dynamic_resources``, grouped by claim as the kubelet
does). With ``allocatable=None`` it refuses GetAllocatableResources with ``allocatable_refusal``:
UNIMPLEMENTED as kubelets before 1.23 do, or UNKNOWN "Pod Resources API GetAllocatableResources
disabled" as a kubelet with the feature gate off does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .grpcwire import Handler, RpcError, StatusCode, serve_connection
from .podresources import GET, GET_ALLOCATABLE, LIST, ClaimDevice, ContainerDevices
from .proto import podresources_pb2 as pb

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


def list_response(
    containers: Sequence[ContainerDevices], claims: Sequence[ClaimDevice] = ()
) -> pb.ListPodResourcesResponse:
    """Group container devices and claims into pods and containers, as the kubelet does."""
    pods: dict[tuple[str, str], dict[str, list[_Entry]]] = {}
    every: list[_Entry] = [*containers, *claims]
    for entry in every:
        by_container = pods.setdefault((entry.namespace, entry.pod), {})
        by_container.setdefault(entry.container, []).append(entry)
    response = pb.ListPodResourcesResponse()
    for (namespace, name), by_container in pods.items():
        pod = response.pod_resources.add(name=name, namespace=namespace)
        for container_name, entries in by_container.items():
            _fill_container(pod.containers.add(name=container_name), entries)
    return response


def _fill_container(container: pb.ContainerResources, entries: Sequence[_Entry]) -> None:
    claims: dict[tuple[str, str], pb.DynamicResource] = {}
    for entry in entries:
        if isinstance(entry, ContainerDevices):
            container.devices.add(resource_name=entry.resource, device_ids=list(entry.device_ids))
            continue
        key = (entry.claim_namespace, entry.claim_name)
        if key not in claims:
            claims[key] = container.dynamic_resources.add(
                claim_name=entry.claim_name, claim_namespace=entry.claim_namespace
            )
        resource = claims[key].claim_resources.add(
            driver_name=entry.driver, pool_name=entry.pool, device_name=entry.device
        )
        resource.cdi_devices.extend(pb.CDIDevice(name=n) for n in entry.cdi_devices)
        if entry.share_id is not None:
            resource.share_id = entry.share_id


def allocatable_response(
    allocatable: Sequence[tuple[str, str]],
) -> pb.AllocatableResourcesResponse:
    by_resource: dict[str, list[str]] = {}
    for resource, device_id in allocatable:
        by_resource.setdefault(resource, []).append(device_id)
    response = pb.AllocatableResourcesResponse()
    for resource, ids in by_resource.items():
        response.devices.add(resource_name=resource, device_ids=ids)
    return response


def _handlers(provider: Callable[[], KubeletState]) -> dict[str, Handler]:
    """The kubelet's three calls, each answering from ``provider()`` at the time of the call."""

    async def list_pods(request: bytes) -> bytes:
        state = provider()
        return bytes(list_response(state.containers, state.claims).SerializeToString())

    async def get_allocatable(request: bytes) -> bytes:
        state = provider()
        if state.allocatable is None:
            raise RpcError(*state.allocatable_refusal)
        return bytes(allocatable_response(state.allocatable).SerializeToString())

    async def get_pod(request: bytes) -> bytes:
        wanted = pb.GetPodResourcesRequest.FromString(request)
        state = provider()
        for pod in list_response(state.containers, state.claims).pod_resources:
            if (pod.namespace, pod.name) == (wanted.pod_namespace, wanted.pod_name):
                answer = pb.GetPodResourcesResponse(pod_resources=pod)
                return bytes(answer.SerializeToString())
        raise RpcError(  # the kubelet answers with a plain error: status UNKNOWN
            StatusCode.UNKNOWN,
            f"pod {wanted.pod_name} in namespace {wanted.pod_namespace} not found",
        )

    return {LIST: list_pods, GET_ALLOCATABLE: get_allocatable, GET: get_pod}


class PodResourcesServer:
    """A gRPC server on a unix socket; start and stop it as often as needed."""

    def __init__(self, socket_path: Path, provider: Callable[[], KubeletState]) -> None:
        self.socket_path = Path(socket_path)
        self._handlers = _handlers(provider)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

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
        for task in list(self._connections):  # a stopped kubelet drops its connections too
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's callback as a task
        self._connections.add(task)
        try:
            await serve_connection(reader, writer, self._handlers)
        finally:
            self._connections.discard(task)
