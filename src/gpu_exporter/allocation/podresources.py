"""A kubelet pod-resources client (``v1.PodResourcesLister``) over its unix socket.

A snapshot carries what device plugins hand out (``devices``) and what Dynamic Resource
Allocation hands out (``dynamic_resources``: one :class:`ClaimDevice` per device of each claim a
container names), as the kubelet lists them; :mod:`.model` and :mod:`.dra` resolve them.

The calls are gRPC on the wire, made by :mod:`.grpcwire` (HTTP/2 on asyncio, no gRPC runtime:
~14 MiB less resident memory and no threads of its own). They never block the event loop and
each has a deadline. The connection is kept from one fetch to the next (a connection set up per
poll cost as much again as the call: the HTTP/2 preface and settings both ways); a kept
connection that fails at the transport (the kubelet restarted: a closed connection, a new socket
file) is replaced at once within the same fetch, and any failure drops it, so a socket that
appears late or comes back is picked up by the next poll, with no reconnect backoff in the way.
The answers are read by :mod:`.protowire` (no protobuf runtime); a ``List``
answer byte for byte the same as the previous one is not read again.

``GetAllocatableResources`` changes only with the device plugins (a MIG reconfiguration, a new
sharing config), so its answer is kept and asked again only when ``List``'s answer changed, when
the caller says so (its devices changed), every ``allocatable_interval`` seconds, or after a
failed fetch (a restarted kubelet): one call per poll at rest instead of two.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .grpcwire import Connection, RpcError, StatusCode, method_path
from .protowire import SERVICE, WireError, parse, text, utf8


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

LIST = method_path(f"{SERVICE}.List")
GET_ALLOCATABLE = method_path(f"{SERVICE}.GetAllocatableResources")
GET = method_path(f"{SERVICE}.Get")
_EMPTY_REQUEST = b""  # ListPodResourcesRequest and AllocatableResourcesRequest have no fields


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
        self._connection: Connection | None = None  # kept between fetches

    async def fetch(self, *, refresh_allocatable: bool = False) -> PodResourcesSnapshot:
        """List allocations, with the allocatable devices (asked again when due, see the module
        docstring, or when ``refresh_allocatable``); raises PodResourcesError on failure. An
        answer equal to the previous one is that same snapshot object."""
        try:
            snapshot, answer = await self._fetch_connected(refresh_allocatable)
        except RpcError as exc:
            self._allocatable_at = None
            raise PodResourcesError(f"{exc.code.name}: {exc.details}") from exc
        except WireError as exc:
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
        kept = self._connection is not None
        try:
            return await self._fetch_once(refresh)
        except RpcError as exc:
            if not kept or exc.code is not StatusCode.UNAVAILABLE:
                raise
        return await self._fetch_once(refresh)

    async def _fetch_once(self, refresh: bool) -> tuple[PodResourcesSnapshot, bytes]:
        """Any failure drops the connection: its state is unknown after a deadline or a
        protocol error."""
        try:
            return await self._fetch(await self._connected(), refresh)
        except BaseException:
            await self._disconnect()
            raise

    async def _connected(self) -> Connection:
        if self._connection is None:
            self._connection = await Connection.open(self._socket)
        return self._connection

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def _fetch(
        self, connection: Connection, refresh: bool
    ) -> tuple[PodResourcesSnapshot, bytes]:
        """The snapshot, and the List answer it was read from."""
        answer = await connection.call(LIST, _EMPTY_REQUEST, deadline=self._timeout)
        last = self._last
        if last is not None and answer == self._last_list:
            containers, claims = last.containers, last.claims  # the same answer: not read again
        else:
            listed, claimed = read_list(answer)
            containers, claims = tuple(listed), tuple(claimed)
        if last is not None and not refresh and self._current(last, containers, claims):
            allocatable = last.allocatable
        else:
            allocatable = await self._allocatable(connection)
            self._allocatable_at = self._clock()
        return PodResourcesSnapshot(containers, allocatable, claims), answer

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
        await self._disconnect()

    async def _allocatable(self, connection: Connection) -> tuple[tuple[str, str], ...] | None:
        try:
            answer = await connection.call(GET_ALLOCATABLE, _EMPTY_REQUEST, deadline=self._timeout)
        except RpcError as exc:
            if _not_served(exc):
                return None
            raise
        return tuple(read_allocatable(answer))


def read_list(data: bytes) -> tuple[list[ContainerDevices], list[ClaimDevice]]:
    """A ListPodResourcesResponse: device-plugin devices and DRA claim devices, in order."""
    devices: list[ContainerDevices] = []
    claims: list[ClaimDevice] = []
    for pod_bytes in parse(data, "ListPodResourcesResponse").get("pod_resources", ()):
        pod = parse(pod_bytes, "PodResources")
        namespace, name = text(pod, "namespace"), text(pod, "name")
        for container_bytes in pod.get("containers", ()):
            container = parse(container_bytes, "ContainerResources")
            where = (namespace, name, text(container, "name"))
            devices.extend(_devices(where, container.get("devices", ())))
            claims.extend(_claims(where, container.get("dynamic_resources", ())))
    return devices, claims


def _devices(where: tuple[str, str, str], entries: Iterable[bytes]) -> Iterator[ContainerDevices]:
    for entry in entries:
        fields = parse(entry, "ContainerDevices")
        ids = tuple(utf8(i) for i in fields.get("device_ids", ()))
        yield ContainerDevices(*where, text(fields, "resource_name"), ids)


def _claims(where: tuple[str, str, str], entries: Iterable[bytes]) -> Iterator[ClaimDevice]:
    for entry in entries:
        claim = parse(entry, "DynamicResource")
        names = (text(claim, "claim_namespace"), text(claim, "claim_name"))
        for resource_bytes in claim.get("claim_resources", ()):
            resource = parse(resource_bytes, "ClaimResource")
            cdi = tuple(
                text(parse(d, "CDIDevice"), "name") for d in resource.get("cdi_devices", ())
            )
            share = resource.get("share_id")
            yield ClaimDevice(
                *where,
                *names,
                text(resource, "driver_name"),
                text(resource, "pool_name"),
                text(resource, "device_name"),
                cdi,
                utf8(share[-1]) if share else None,
            )


def read_allocatable(data: bytes) -> list[tuple[str, str]]:
    """An AllocatableResourcesResponse: (resource, device id) of each schedulable device."""
    out: list[tuple[str, str]] = []
    for entry in parse(data, "AllocatableResourcesResponse").get("devices", ()):
        fields = parse(entry, "ContainerDevices")
        resource = text(fields, "resource_name")
        out.extend((resource, utf8(i)) for i in fields.get("device_ids", ()))
    return out


def read_get_request(data: bytes) -> tuple[str, str]:
    """A GetPodResourcesRequest: (namespace, pod)."""
    fields = parse(data, "GetPodResourcesRequest")
    return text(fields, "pod_namespace"), text(fields, "pod_name")


def _not_served(exc: RpcError) -> bool:
    """GetAllocatableResources is absent (before 1.23) or switched off by its feature gate."""
    if exc.code is StatusCode.UNIMPLEMENTED:
        return True
    return exc.code is StatusCode.UNKNOWN and _ALLOCATABLE_DISABLED in exc.details
