"""A kubelet pod-resources client (``v1.PodResourcesLister``) over its unix socket.

A snapshot carries what device plugins hand out (``devices``) and what Dynamic Resource
Allocation hands out (``dynamic_resources``: one :class:`ClaimDevice` per device of each claim a
container names), as the kubelet lists them; :mod:`.model` and :mod:`.dra` resolve them.

The calls are gRPC on the wire, made by :mod:`.grpcwire` (HTTP/2 on asyncio, no gRPC runtime:
~14 MiB less resident memory and no threads of its own). They never block the event loop and
each has a deadline. Each fetch opens its own connection and closes it, so a kubelet restart (a
new socket file) or a socket that appears late is picked up by the next poll, with no reconnect
backoff in the way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from .grpcwire import Connection, RpcError, StatusCode, method_path
from .proto import podresources_pb2 as pb


@dataclass(frozen=True)
class ContainerDevices:
    """One container's devices of one resource, as the kubelet lists them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA ResourceClaim that a container names (a ``ClaimResource``).

    (``driver``, ``pool``, ``device``) identifies the device; ``cdi_devices`` are the fully
    qualified CDI names the kubelet lists with it (possibly also other devices' of the same
    claim: reference/dra.md). ``share_id`` is None unless the kubelet (1.35+) set it.
    """

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class PodResourcesSnapshot:
    """One poll: devices held by containers, and the devices the kubelet can hand out.

    ``allocatable`` is None when the kubelet does not serve GetAllocatableResources (it never
    lists DRA devices either way). ``claims`` are the DRA devices containers hold.
    """

    containers: tuple[ContainerDevices, ...]
    allocatable: tuple[tuple[str, str], ...] | None  # (resource, device id)
    claims: tuple[ClaimDevice, ...] = ()


class PodResourcesError(RuntimeError):
    """The kubelet did not answer (socket missing, refused, deadline, bad response)."""


# What a kubelet whose KubeletPodResourcesGetAllocatable gate is off answers (status UNKNOWN:
# the kubelet returns a plain Go error), while List still works.
_ALLOCATABLE_DISABLED = "GetAllocatableResources disabled"

_METHODS = pb.DESCRIPTOR.services_by_name["PodResourcesLister"].methods_by_name
LIST = method_path(_METHODS["List"].full_name)
GET_ALLOCATABLE = method_path(_METHODS["GetAllocatableResources"].full_name)
GET = method_path(_METHODS["Get"].full_name)
_LIST_REQUEST = pb.ListPodResourcesRequest().SerializeToString()
_ALLOCATABLE_REQUEST = pb.AllocatableResourcesRequest().SerializeToString()


class PodResourcesClient:
    def __init__(self, socket_path: Path, *, timeout: float = 2.0) -> None:
        # A relative path is taken relative to the working directory at start.
        self._socket = Path(socket_path).absolute()
        self._timeout = timeout

    async def fetch(self) -> PodResourcesSnapshot:
        """List allocations and allocatable devices; raises PodResourcesError on failure."""
        try:
            connection = await Connection.open(self._socket)
            try:
                listed = pb.ListPodResourcesResponse.FromString(
                    await connection.call(LIST, _LIST_REQUEST, deadline=self._timeout)
                )
                allocatable = await self._allocatable(connection)
            finally:
                await connection.close()
        except RpcError as exc:
            raise PodResourcesError(f"{exc.code.name}: {exc.details}") from exc
        except DecodeError as exc:
            raise PodResourcesError(f"INTERNAL: undecodable answer: {exc}") from exc
        return PodResourcesSnapshot(
            tuple(_containers(listed.pod_resources)),
            allocatable,
            tuple(_claims(listed.pod_resources)),
        )

    async def close(self) -> None:
        """Nothing stays open between fetches (kept for the subsystem's shutdown)."""

    async def _allocatable(self, connection: Connection) -> tuple[tuple[str, str], ...] | None:
        try:
            answer = await connection.call(
                GET_ALLOCATABLE, _ALLOCATABLE_REQUEST, deadline=self._timeout
            )
        except RpcError as exc:
            if _not_served(exc):
                return None
            raise
        response = pb.AllocatableResourcesResponse.FromString(answer)
        return tuple((d.resource_name, i) for d in response.devices for i in d.device_ids)


def _containers(pods: Iterable[pb.PodResources]) -> Iterable[ContainerDevices]:
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                yield ContainerDevices(
                    pod.namespace,
                    pod.name,
                    container.name,
                    devices.resource_name,
                    tuple(devices.device_ids),
                )


def _claims(pods: Iterable[pb.PodResources]) -> Iterable[ClaimDevice]:
    for pod in pods:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    yield ClaimDevice(
                        pod.namespace,
                        pod.name,
                        container.name,
                        claim.claim_namespace,
                        claim.claim_name,
                        resource.driver_name,
                        resource.pool_name,
                        resource.device_name,
                        tuple(d.name for d in resource.cdi_devices),
                        resource.share_id if resource.HasField("share_id") else None,
                    )


def _not_served(exc: RpcError) -> bool:
    """GetAllocatableResources is absent (before 1.23) or switched off by its feature gate."""
    if exc.code is StatusCode.UNIMPLEMENTED:
        return True
    return exc.code is StatusCode.UNKNOWN and _ALLOCATABLE_DISABLED in exc.details
