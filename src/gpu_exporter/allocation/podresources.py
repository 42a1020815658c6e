"""A kubelet pod-resources client (``v1.PodResourcesLister``) over its unix socket.

A snapshot carries what device plugins hand out (``devices``) and what Dynamic Resource
Allocation hands out (``dynamic_resources``: one :class:`ClaimDevice` per device of each claim a
container names), as the kubelet lists them; :mod:`.model` and :mod:`.dra` resolve them.

It uses ``grpc.aio``: calls never block the event loop, and each has a deadline. A failed call
drops the channel; the next poll opens a fresh one, so a kubelet restart (a new socket file) or a
socket that appears late is picked up within one poll interval, without gRPC's reconnect backoff
(up to two minutes) in the way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from .proto import podresources_pb2 as pb
from .proto import podresources_pb2_grpc as pb_grpc


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


_CHANNEL_OPTIONS = (
    # The kubelet socket has no TLS and no authority; "localhost" keeps :authority valid.
    ("grpc.default_authority", "localhost"),
    # gRPC shares subchannels process-wide: a new channel would inherit the failed one's
    # reconnect backoff. A channel-local pool makes "drop the channel" mean "connect afresh".
    ("grpc.use_local_subchannel_pool", 1),
)


# What a kubelet whose KubeletPodResourcesGetAllocatable gate is off answers (status UNKNOWN:
# the kubelet returns a plain Go error), while List still works.
_ALLOCATABLE_DISABLED = "GetAllocatableResources disabled"


class PodResourcesClient:
    def __init__(self, socket_path: Path, *, timeout: float = 2.0) -> None:
        # gRPC takes unix:// targets as absolute paths only: "unix://run/kubelet.sock" would
        # name the host "run". A relative path is taken relative to the working directory.
        self._target = f"unix://{Path(socket_path).absolute()}"
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def fetch(self) -> PodResourcesSnapshot:
        """List allocations and allocatable devices; raises PodResourcesError on failure."""
        stub = self._stub()
        try:
            listed = await stub.List(pb.ListPodResourcesRequest(), timeout=self._timeout)
            allocatable = await self._allocatable(stub)
        except grpc.aio.AioRpcError as exc:
            await self.close()  # reconnect from scratch next time
            raise PodResourcesError(f"{exc.code().name}: {exc.details()}") from exc
        return PodResourcesSnapshot(
            tuple(_containers(listed.pod_resources)),
            allocatable,
            tuple(_claims(listed.pod_resources)),
        )

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=None)

    def _stub(self) -> pb_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        return pb_grpc.PodResourcesListerStub(self._channel)

    async def _allocatable(
        self, stub: pb_grpc.PodResourcesListerStub
    ) -> tuple[tuple[str, str], ...] | None:
        try:
            response = await stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            if _not_served(exc):
                return None
            raise
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


def _not_served(exc: grpc.aio.AioRpcError) -> bool:
    """GetAllocatableResources is absent (before 1.23) or switched off by its feature gate."""
    code = exc.code()
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return True
    return code is grpc.StatusCode.UNKNOWN and _ALLOCATABLE_DISABLED in (exc.details() or "")
