"""A pod-resources server (the kubelet's side of the API) for the simulator and tests.

It serves whatever ``provider`` returns at each call, so allocations can change over time. With
``allocatable=None`` it answers GetAllocatableResources with UNIMPLEMENTED, like old kubelets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .podresources import ContainerDevices
from .proto import podresources_pb2 as pb
from .proto import podresources_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class KubeletState:
    containers: Sequence[ContainerDevices] = ()
    allocatable: Sequence[tuple[str, str]] | None = ()  # (resource, device id)


def list_response(containers: Sequence[ContainerDevices]) -> pb.ListPodResourcesResponse:
    """Group container devices into pods and containers, as the kubelet does."""
    pods: dict[tuple[str, str], dict[str, list[ContainerDevices]]] = {}
    for entry in containers:
        by_container = pods.setdefault((entry.namespace, entry.pod), {})
        by_container.setdefault(entry.container, []).append(entry)
    response = pb.ListPodResourcesResponse()
    for (namespace, name), by_container in pods.items():
        pod = response.pod_resources.add(name=name, namespace=namespace)
        for container_name, entries in by_container.items():
            container = pod.containers.add(name=container_name)
            for entry in entries:
                container.devices.add(
                    resource_name=entry.resource, device_ids=list(entry.device_ids)
                )
    return response


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
        return list_response(self._provider().containers)

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> pb.AllocatableResourcesResponse:
        allocatable = self._provider().allocatable
        if allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by this kubelet")
        return allocatable_response(allocatable or ())


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
