"""A pod-resources server (the kubelet's side of the API) for the simulator and tests.

grpclib serves the generated ``PodResourcesListerBase`` on a unix socket, answering with the
protobuf messages of ``allocation/proto``: whatever ``provider`` returns at each call, so
allocations can change over time: device-plugin devices and DRA claims (``dynamic_resources``,
grouped by claim as the kubelet does). With ``allocatable=None`` it refuses
GetAllocatableResources with ``allocatable_refusal``: UNIMPLEMENTED as kubelets before 1.23 do,
or UNKNOWN "Pod Resources API GetAllocatableResources disabled" as a kubelet with the feature
gate off does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server

from gpu_exporter.allocation.podresources import ClaimDevice, ContainerCpus, ContainerDevices
from gpu_exporter.allocation.proto import podresources_pb2 as pb
from gpu_exporter.allocation.proto.podresources_grpc import PodResourcesListerBase

UNIMPLEMENTED = (Status.UNIMPLEMENTED, "not served by this kubelet")
ALLOCATABLE_DISABLED = (
    Status.UNKNOWN,
    "Pod Resources API GetAllocatableResources disabled",
)


@dataclass(frozen=True)
class KubeletState:
    containers: Sequence[ContainerDevices] = ()
    allocatable: Sequence[tuple[str, str]] | None = ()  # (resource, device id)
    claims: Sequence[ClaimDevice] = ()
    allocatable_refusal: tuple[Status, str] = UNIMPLEMENTED
    # Containers of running pods, devices or none (namespace, pod, container): a kubelet lists
    # every pod, and a container holding nothing with an empty resource list.
    running: Sequence[tuple[str, str, str]] = ()
    cpus: Sequence[ContainerCpus] = ()


_Entry = ContainerDevices | ClaimDevice | ContainerCpus


def pod_messages(
    containers: Sequence[ContainerDevices],
    claims: Sequence[ClaimDevice] = (),
    running: Sequence[tuple[str, str, str]] = (),
    cpus: Sequence[ContainerCpus] = (),
) -> list[pb.PodResources]:
    """Each pod's PodResources, grouped into pods and containers as the kubelet does, in the
    order the pods first appear; ``running`` containers holding nothing come last; ``cpus``:
    the CPU and memory managers' assignments."""
    pods: dict[tuple[str, str], dict[str, list[_Entry]]] = {}
    every: list[_Entry] = [*containers, *claims, *cpus]
    for entry in every:
        by_container = pods.setdefault((entry.namespace, entry.pod), {})
        by_container.setdefault(entry.container, []).append(entry)
    for namespace, pod, container in running:
        pods.setdefault((namespace, pod), {}).setdefault(container, [])
    return [
        pb.PodResources(
            name=name,
            namespace=namespace,
            containers=[_container(c, entries) for c, entries in by_container.items()],
        )
        for (namespace, name), by_container in pods.items()
    ]


def _container(name: str, entries: Sequence[_Entry]) -> pb.ContainerResources:
    container = pb.ContainerResources(name=name)
    claims: dict[tuple[str, str], list[ClaimDevice]] = {}
    for entry in entries:
        if isinstance(entry, ContainerDevices):
            container.devices.append(_device_list(entry.resource, entry.device_ids))
        elif isinstance(entry, ContainerCpus):
            container.cpu_ids.extend(entry.cpu_ids)
            if entry.memory_numa_nodes:
                container.memory.add(
                    memory_type="memory",
                    topology=pb.TopologyInfo(
                        nodes=[pb.NUMANode(ID=node) for node in entry.memory_numa_nodes]
                    ),
                )
        else:
            claims.setdefault((entry.claim_namespace, entry.claim_name), []).append(entry)
    for (namespace, claim), devices in claims.items():
        container.dynamic_resources.add(
            claim_name=claim,
            claim_namespace=namespace,
            claim_resources=[_claim_resource(device) for device in devices],
        )
    return container


def _device_list(resource: str, ids: Iterable[str]) -> pb.ContainerDevices:
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids))


def _claim_resource(device: ClaimDevice) -> pb.ClaimResource:
    resource = pb.ClaimResource(
        cdi_devices=[pb.CDIDevice(name=n) for n in device.cdi_devices],
        driver_name=device.driver,
        pool_name=device.pool,
        device_name=device.device,
    )
    if device.share_id is not None:
        resource.share_id = device.share_id
    return resource


def list_response(
    containers: Sequence[ContainerDevices],
    claims: Sequence[ClaimDevice] = (),
    running: Sequence[tuple[str, str, str]] = (),
    cpus: Sequence[ContainerCpus] = (),
) -> pb.ListPodResourcesResponse:
    """A ListPodResourcesResponse: the pods of :func:`pod_messages`."""
    return pb.ListPodResourcesResponse(
        pod_resources=pod_messages(containers, claims, running, cpus)
    )


def allocatable_response(
    allocatable: Sequence[tuple[str, str]],
) -> pb.AllocatableResourcesResponse:
    """An AllocatableResourcesResponse: one ContainerDevices per resource, ids in order."""
    by_resource: dict[str, list[str]] = {}
    for resource, device_id in allocatable:
        by_resource.setdefault(resource, []).append(device_id)
    return pb.AllocatableResourcesResponse(
        devices=[_device_list(r, ids) for r, ids in by_resource.items()]
    )


class _Lister(PodResourcesListerBase):
    """The kubelet's three calls, each answering from ``provider()`` at the time of the call."""

    def __init__(self, provider: Callable[[], KubeletState]) -> None:
        self._provider = provider
        # The last List answer and what it was built from: a node's holdings rarely change
        # between polls, and building 100 pods' messages took the event loop ~3 ms a poll.
        self._last_from: tuple[_Entry | tuple[str, str, str] | None, ...] | None = None
        self._last_answer = pb.ListPodResourcesResponse()

    async def List(self, stream: Any) -> None:
        await stream.recv_message()
        state = self._provider()
        written_from = (
            *state.containers,
            None,
            *state.claims,
            None,
            *state.running,
            None,
            *state.cpus,
        )
        if written_from != self._last_from:
            self._last_answer = list_response(
                state.containers, state.claims, state.running, state.cpus
            )
            self._last_from = written_from
        await stream.send_message(self._last_answer)

    async def GetAllocatableResources(self, stream: Any) -> None:
        await stream.recv_message()
        state = self._provider()
        if state.allocatable is None:
            raise GRPCError(*state.allocatable_refusal)
        await stream.send_message(allocatable_response(state.allocatable))

    async def Get(self, stream: Any) -> None:
        request = await stream.recv_message()
        state = self._provider()
        for pod in pod_messages(state.containers, state.claims, state.running, state.cpus):
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                await stream.send_message(pb.GetPodResourcesResponse(pod_resources=pod))
                return
        raise GRPCError(  # the kubelet answers with a plain error: status UNKNOWN
            Status.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )


class _Server(Server):
    """grpclib's server, keeping its connections: a stopped kubelet drops them too."""

    def __init__(self, handlers: Sequence[PodResourcesListerBase]) -> None:
        super().__init__(handlers)
        self.protocols: list[H2Protocol] = []  # the connections still open, and the new one
        self.accepted = 0

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self.protocols = [p for p in self.protocols if not _closed(p)] + [protocol]
        self.accepted += 1
        return protocol


def _closed(protocol: H2Protocol) -> bool:
    connection = getattr(protocol, "connection", None)  # set once the connection is made
    return connection is not None and connection.is_closing()


class PodResourcesServer:
    """A gRPC server on a unix socket; start and stop it as often as needed."""

    def __init__(self, socket_path: Path, provider: Callable[[], KubeletState]) -> None:
        self.socket_path = Path(socket_path)
        self._provider = provider  # looked up at each call (bench/simmeter.py wraps it)
        self._server: _Server | None = None
        self._accepted_before = 0  # by the servers of earlier starts

    @property
    def accepted(self) -> int:
        """Connections accepted since construction (tests check that one is kept)."""
        current = self._server.accepted if self._server is not None else 0
        return self._accepted_before + current

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale socket from a previous run
        self._server = _Server([_Lister(lambda: self._provider())])
        await self._server.start(path=str(self.socket_path))

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self._accepted_before += server.accepted
            server.close()
            for protocol in server.protocols:
                if not _closed(protocol):
                    protocol.processor.close("the kubelet stopped")
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
