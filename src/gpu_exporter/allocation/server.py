"""A pod-resources server (the kubelet's side of the API) for the simulator and tests.

It serves whatever ``provider`` returns at each call, so allocations can change over time:
device-plugin devices and DRA claims (``dynamic_resources``, grouped by claim as the kubelet
does). With ``allocatable=None`` it refuses GetAllocatableResources with ``allocatable_refusal``:
UNIMPLEMENTED as kubelets before 1.23 do, or UNKNOWN "Pod Resources API GetAllocatableResources
disabled" as a kubelet with the feature gate off does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .podresources import ClaimDevice, ContainerDevices
from .proto import podresources_pb2 as pb
from .proto import podresources_pb2_grpc as pb_grpc

UNIMPLEMENTED = (grpc.StatusCode.UNIMPLEMENTED, "not served by this kubelet")
ALLOCATABLE_DISABLED = (
    grpc.StatusCode.UNKNOWN,
    "Pod Resources API GetAllocatableResources disabled",
)


@dataclass(frozen=True)
class KubeletState:
    containers: Sequence[ContainerDevices] = ()
    allocatable: Sequence[tuple[str, str]] | None = ()  # (resource, device id)
    claims: Sequence[ClaimDevice] = ()
    allocatable_refusal: tuple[grpc.StatusCode, str] = UNIMPLEMENTED


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


class _Servicer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, provider: Callable[[], KubeletState]) -> None:
        self._provider = provider

    async def List(self, request: Any, context: Any) -> pb.ListPodResourcesResponse:
        state = self._provider()
        return list_response(state.containers, state.claims)

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> pb.AllocatableResourcesResponse:
        state = self._provider()
        if state.allocatable is None:
            await context.abort(*state.allocatable_refusal)
        return allocatable_response(state.allocatable or ())

    async def Get(self, request: Any, context: Any) -> pb.GetPodResourcesResponse:
        state = self._provider()
        listed = list_response(state.containers, state.claims)
        for pod in listed.pod_resources:
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(  # the kubelet answers with a plain error: status UNKNOWN
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")  # abort raises


class PodResourcesServer:
    """A ``grpc.aio`` server on a unix socket; start and stop it as often as needed."""

    def __init__(self, socket_path: Path, provider: Callable[[], KubeletState]) -> None:
        self.socket_path = Path(socket_path)
        self._provider = provider
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale socket from a previous run
        server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self._provider), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
