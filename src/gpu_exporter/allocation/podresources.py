"""A kubelet pod-resources client (``v1.PodResourcesLister``) over its unix socket.

A snapshot carries what device plugins hand out (``devices``) and what Dynamic Resource
Allocation hands out (``dynamic_resources``: one :class:`ClaimDevice` per device of each claim a
container names), as the kubelet lists them; :mod:`.model` and :mod:`.dra` resolve them.

The calls are made by grpclib through :mod:`.channel` (its bounds against a broken or hostile
kubelet are listed there); they never block the event loop and each has a deadline. The
connection is kept from one fetch to the next (a connection set up per poll cost as much again
as the call: the HTTP/2 preface and settings both ways). A kept connection that fails (the
kubelet restarted: a closed connection, a new socket file; a GOAWAY that cut the call) is
replaced at once within the same fetch, and any failure drops it, so a socket that appears late
or comes back is picked up by the next poll, with no reconnect backoff in the way.

The answers are decoded by protobuf's runtime with the generated ``proto/podresources_pb2``
(one larger than :data:`DECODE_ON_LOOP` on a worker thread); a ``List`` answer byte for byte the
same as the previous one is not decoded again.

``GetAllocatableResources`` changes only with the device plugins (a MIG reconfiguration, a new
sharing config), so its answer is kept and asked again only when ``List``'s answer changed, when
the caller says so (its devices changed), every ``allocatable_interval`` seconds, or after a
failed fetch (a restarted kubelet): one call per poll at rest instead of two.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError

from .channel import GRPCError, KubeletChannel, Status
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
    # Every pod the kubelet lists, devices or none: (namespace, name). What tells a GPU process
    # of a running pod that holds nothing from a zombie of a deleted one (docs/allocation.md).
    pods: frozenset[tuple[str, str]] = frozenset()


class PodResourcesError(RuntimeError):
    """The kubelet did not answer (socket missing, refused, deadline, bad response)."""


# What a kubelet whose KubeletPodResourcesGetAllocatable gate is off answers (status UNKNOWN:
# the kubelet returns a plain Go error), while List still works.
_ALLOCATABLE_DISABLED = "GetAllocatableResources disabled"

SERVICE = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]


def method_path(name: str) -> str:
    """A method's request path, ``/v1.PodResourcesLister/List``."""
    return f"/{SERVICE.full_name}/{SERVICE.methods_by_name[name].name}"


LIST = method_path("List")
GET_ALLOCATABLE = method_path("GetAllocatableResources")
GET = method_path("Get")
_EMPTY_REQUEST = b""  # ListPodResourcesRequest and AllocatableResourcesRequest have no fields
# An answer this large is decoded on a worker thread: 500 pods (~50 KB) decode in about a
# millisecond, 100,000 (~9 MB) in over a second.
DECODE_ON_LOOP = 1 << 16
_T = TypeVar("_T")


class PodResourcesClient:
    def __init__(
        self,
        socket_path: Path,
        *,
        timeout: float = 2.0,
        allocatable_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A relative path is taken relative to the working directory at start.
        self._socket = Path(socket_path).absolute()
        self._timeout = timeout
        self._allocatable_interval = allocatable_interval
        self._clock = clock
        self._last: PodResourcesSnapshot | None = None  # with the allocatable answer it holds
        self._last_list = b""  # the List answer it was read from
        self._allocatable_at: float | None = None  # when that answer came; None: ask next time
        self._channel = KubeletChannel(self._socket)  # its connection is kept between fetches
        self._connected = False  # the last fetch succeeded: its connection is kept

    async def fetch(self, *, refresh_allocatable: bool = False) -> PodResourcesSnapshot:
        """List allocations, with the allocatable devices (asked again when due, see the module
        docstring, or when ``refresh_allocatable``); raises PodResourcesError on failure. An
        answer equal to the previous one is that same snapshot object."""
        try:
            snapshot, answer = await self._fetch_connected(refresh_allocatable)
        except GRPCError as exc:
            self._allocatable_at = None
            raise PodResourcesError(f"{exc.status.name}: {exc.message or ''}") from exc
        except DecodeError as exc:
            self._allocatable_at = None
            raise PodResourcesError(f"INTERNAL: undecodable answer: {exc}") from exc
        self._last_list = answer
        if snapshot == self._last:
            return self._last
        self._last = snapshot
        return snapshot

    async def _fetch_connected(self, refresh: bool) -> tuple[PodResourcesSnapshot, bytes]:
        """:meth:`_fetch` on the kept connection, or a new one; a kept connection the kubelet
        closed since (it restarted) is replaced once."""
        kept = self._connected
        try:
            return await self._fetch_once(refresh)
        except GRPCError as exc:
            if not kept or exc.status is not Status.UNAVAILABLE:
                raise
        return await self._fetch_once(refresh)

    async def _fetch_once(self, refresh: bool) -> tuple[PodResourcesSnapshot, bytes]:
        """Any failure drops the connection: its state is unknown after a deadline or a
        protocol error."""
        try:
            result = await self._fetch(refresh)
        except BaseException:
            self._channel.close()
            self._connected = False
            raise
        self._connected = True
        return result

    async def _fetch(self, refresh: bool) -> tuple[PodResourcesSnapshot, bytes]:
        """The snapshot, and the List answer it was read from."""
        answer = await self._channel.call(LIST, _EMPTY_REQUEST, deadline=self._timeout)
        last = self._last
        if last is not None and answer == self._last_list:
            containers, claims = last.containers, last.claims  # the same answer: not read again
            pods = last.pods
        else:
            listed, claimed, pods = await _decoded(read_list_with_pods, answer)
            containers, claims = tuple(listed), tuple(claimed)
        if last is not None and not refresh and self._current(last, containers, claims):
            allocatable = last.allocatable
        else:
            allocatable = await self._allocatable()
            self._allocatable_at = self._clock()
        return PodResourcesSnapshot(containers, allocatable, claims, pods), answer

    def _current(
        self,
        last: PodResourcesSnapshot,
        containers: tuple[ContainerDevices, ...],
        claims: tuple[ClaimDevice, ...],
    ) -> bool:
        """Whether ``last``'s allocatable answer still stands: recent, and nothing listed moved."""
        at = self._allocatable_at
        if at is None or self._clock() - at >= self._allocatable_interval:
            return False
        return containers == last.containers and claims == last.claims

    async def close(self) -> None:
        """Close the kept connection (the subsystem's shutdown); a later fetch opens another."""
        self._channel.close()
        self._connected = False

    async def _allocatable(self) -> tuple[tuple[str, str], ...] | None:
        try:
            answer = await self._channel.call(
                GET_ALLOCATABLE, _EMPTY_REQUEST, deadline=self._timeout
            )
        except GRPCError as exc:
            if _not_served(exc):
                return None
            raise
        return tuple(await _decoded(read_allocatable, answer))


async def _decoded(read: Callable[[bytes], _T], answer: bytes) -> _T:
    if len(answer) <= DECODE_ON_LOOP:
        return read(answer)
    return await asyncio.to_thread(read, answer)


def read_list(data: bytes) -> tuple[list[ContainerDevices], list[ClaimDevice]]:
    """A ListPodResourcesResponse: device-plugin devices and DRA claim devices, in order;
    DecodeError when it is not one (a string that is not UTF-8 included)."""
    devices, claims, _ = read_list_with_pods(data)
    return devices, claims


def read_list_with_pods(
    data: bytes,
) -> tuple[list[ContainerDevices], list[ClaimDevice], frozenset[tuple[str, str]]]:
    """:func:`read_list`, and every pod listed (namespace, name), with devices or without."""
    devices: list[ContainerDevices] = []
    claims: list[ClaimDevice] = []
    pods: set[tuple[str, str]] = set()
    for pod in pb.ListPodResourcesResponse.FromString(data).pod_resources:
        pods.add((pod.namespace, pod.name))
        for container in pod.containers:
            where = (pod.namespace, pod.name, container.name)
            devices.extend(
                ContainerDevices(*where, d.resource_name, tuple(d.device_ids))
                for d in container.devices
            )
            claims.extend(_claims(where, container.dynamic_resources))
    return devices, claims, frozenset(pods)


def _claims(
    where: tuple[str, str, str], entries: Iterable[pb.DynamicResource]
) -> Iterator[ClaimDevice]:
    for claim in entries:
        for resource in claim.claim_resources:
            yield ClaimDevice(
                *where,
                claim.claim_namespace,
                claim.claim_name,
                resource.driver_name,
                resource.pool_name,
                resource.device_name,
                tuple(d.name for d in resource.cdi_devices),
                resource.share_id if resource.HasField("share_id") else None,
            )


def read_allocatable(data: bytes) -> list[tuple[str, str]]:
    """An AllocatableResourcesResponse: (resource, device id) of each schedulable device."""
    return [
        (entry.resource_name, device_id)
        for entry in pb.AllocatableResourcesResponse.FromString(data).devices
        for device_id in entry.device_ids
    ]


def _not_served(exc: GRPCError) -> bool:
    """GetAllocatableResources is absent (before 1.23) or switched off by its feature gate."""
    if exc.status is Status.UNIMPLEMENTED:
        return True
    return exc.status is Status.UNKNOWN and _ALLOCATABLE_DISABLED in (exc.message or "")
