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
same as the previous one is not decoded again. What a ``List`` answer turns into is bounded
(:func:`read_holdings`): containers holding no ``nvidia.com/`` device and no DRA device of an
NVIDIA driver become no object at all; a container keeps at most :data:`MAX_IDS_PER_CONTAINER`
device ids, a device at most :data:`MAX_HOLDERS_PER_DEVICE` holders (the first by namespace and
pod, so the choice is stable from poll to poll), an answer at most :data:`MAX_DEVICES` distinct
devices; what is left out is counted in :class:`Folded` (``gpu_exporter_allocation_folded``).

``GetAllocatableResources`` changes only with the device plugins (a MIG reconfiguration, a new
sharing config), so its answer is kept and asked again only when ``List``'s answer changed, when
the caller says so (its devices changed), every ``allocatable_interval`` seconds, or after a
failed fetch (a restarted kubelet): one call per poll at rest instead of two.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError

from .channel import GRPCError, KubeletChannel, Status
from .ids import is_gpu_resource
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
class Folded:
    """What the bounds left out of one ``List`` answer: device ids (past a container's bound, or
    of a holder left out), and (device, pod) holders (past a device's or the answer's bound)."""

    device_ids: int = 0
    holders: int = 0


@dataclass(frozen=True)
class ContainerCpus:
    """The CPUs and memory NUMA nodes the kubelet's static CPU manager and memory manager gave one
    container (``cpu_ids``, each ``memory[].topology.nodes[].ID``); listed only when not empty."""

    namespace: str
    pod: str
    container: str
    cpu_ids: tuple[int, ...] = ()
    memory_numa_nodes: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.container)


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
    folded: Folded = Folded()
    cpus: tuple[ContainerCpus, ...] = ()  # containers with CPU ids or memory nodes


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
# Bounds on what one List answer turns into (security.md). A node has at most a few dozen
# schedulable devices (8 GPUs of 7 MIG instances), and time-slicing rarely goes past 16
# replicas: each bound is several times what a real node lists.
MAX_IDS_PER_CONTAINER = 256
MAX_HOLDERS_PER_DEVICE = 64
MAX_DEVICES = 128
# dra.GPU_DRIVER and dra.COMPUTE_DOMAIN_DRIVER (dra reads this module's ClaimDevice: no import).
_OUR_DRIVERS = frozenset({"gpu.nvidia.com", "compute-domain.nvidia.com"})
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
            # the same answer: not read again
            containers, claims, pods = last.containers, last.claims, last.pods
            folded, cpus = last.folded, last.cpus
        else:
            containers, claims, pods, folded, cpus = await _decoded(read_holdings, answer)
        if last is not None and not refresh and self._current(last, containers, claims):
            allocatable = last.allocatable
        else:
            allocatable = await self._allocatable()
            self._allocatable_at = self._clock()
        return PodResourcesSnapshot(containers, allocatable, claims, pods, folded, cpus), answer

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


def read_pods(
    data: bytes,
) -> tuple[list[ContainerDevices], list[ClaimDevice], list[ContainerCpus]]:
    """:func:`read_list`, with the CPU ids and memory NUMA nodes of each container that holds a
    device and has any."""
    devices, claims = read_list(data)
    return devices, claims, list(read_holdings(data)[4])


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


_Holdings = tuple[
    tuple[ContainerDevices, ...],
    tuple[ClaimDevice, ...],
    frozenset[tuple[str, str]],
    Folded,
    tuple[ContainerCpus, ...],
]


def read_holdings(data: bytes) -> _Holdings:
    """A ListPodResourcesResponse as far as the exporter needs it, bounded (module docstring):
    the containers' ``nvidia.com/`` devices and NVIDIA drivers' DRA devices, and every pod
    listed with devices or without (namespace, name), and the CPU ids and memory NUMA nodes of
    the containers that hold one of them; DecodeError when the answer is not one.
    Entries are plain tuples until the bounds have chosen them: 30,000 holders made into
    objects first took three times as long."""
    entries: list[_Entry] = []
    claims: list[ClaimDevice] = []
    pods: set[tuple[str, str]] = set()
    cpus: list[ContainerCpus] = []
    cut = 0
    for pod in pb.ListPodResourcesResponse.FromString(data).pod_resources:
        namespace, name = pod.namespace, pod.name
        pods.add((namespace, name))
        for container in pod.containers:
            for entry in container.devices:
                resource = entry.resource_name
                if not is_gpu_resource(resource):
                    continue
                ids = entry.device_ids
                if len(ids) > MAX_IDS_PER_CONTAINER:
                    cut += len(ids) - MAX_IDS_PER_CONTAINER
                    ids = ids[:MAX_IDS_PER_CONTAINER]
                entries.append((namespace, name, container.name, resource, tuple(ids)))
            if container.dynamic_resources:
                where = (namespace, name, container.name)
                found = _claims(where, container.dynamic_resources)
                claims.extend(c for c in found if c.driver in _OUR_DRIVERS)
            if container.cpu_ids or container.memory:
                nodes = sorted({n.ID for m in container.memory for n in m.topology.nodes})
                if container.cpu_ids or nodes:
                    where = (namespace, name, container.name)
                    ids = tuple(sorted(container.cpu_ids))
                    cpus.append(ContainerCpus(*where, ids, tuple(nodes)))
    containers, bounded_claims, folded = _bounded(entries, claims, cut)
    holding = {(c.namespace, c.pod, c.container) for c in containers}
    holding.update((c.namespace, c.pod, c.container) for c in bounded_claims)
    placed = tuple(c for c in cpus if c.key in holding)
    return containers, bounded_claims, frozenset(pods), folded, placed


_Entry = tuple[str, str, str, str, tuple[str, ...]]  # namespace, pod, container, resource, ids


_Bounded = tuple[tuple[ContainerDevices, ...], tuple[ClaimDevice, ...], Folded]


def _bounded(entries: list[_Entry], claims: list[ClaimDevice], cut: int) -> _Bounded:
    """At most MAX_HOLDERS_PER_DEVICE pods per device and MAX_DEVICES devices, counted."""
    holders: dict[str, set[tuple[str, str]]] = {}
    for namespace, pod, _, _, ids in entries:
        for raw in ids:
            holders.setdefault(_base_id(raw), set()).add((namespace, pod))
    for claim in claims:
        holders.setdefault(_claim_key(claim), set()).add((claim.namespace, claim.pod))
    within = len(holders) <= MAX_DEVICES and all(
        len(pods) <= MAX_HOLDERS_PER_DEVICE for pods in holders.values()
    )
    if within:
        return tuple(ContainerDevices(*e) for e in entries), tuple(claims), Folded(cut, 0)
    # Ids a device plugin could have written go first: invented ones cannot push them out.
    chosen = sorted(holders, key=lambda key: (not key.startswith(("GPU-", "MIG-", "nvidia")), key))
    kept = {
        key: set(heapq.nsmallest(MAX_HOLDERS_PER_DEVICE, holders[key]))
        for key in chosen[:MAX_DEVICES]
    }
    folded_holders = sum(len(pods) - len(kept.get(key, ())) for key, pods in holders.items())
    bounded: list[ContainerDevices] = []
    for namespace, pod, container, resource, ids in entries:
        key = (namespace, pod)
        held = tuple(raw for raw in ids if key in kept.get(_base_id(raw), ()))
        cut += len(ids) - len(held)
        if held:
            bounded.append(ContainerDevices(namespace, pod, container, resource, held))
    bounded_claims = tuple(c for c in claims if (c.namespace, c.pod) in kept.get(_claim_key(c), ()))
    cut += len(claims) - len(bounded_claims)
    return tuple(bounded), bounded_claims, Folded(cut, folded_holders)


def _base_id(raw: str) -> str:
    """The device a device id names, without its replica (``<id>::<n>``, GKE's ``/vgpu<n>``)."""
    base = raw.partition("::")[0]
    head, sep, _ = base.rpartition("/vgpu")
    return head if sep else base


def _claim_key(claim: ClaimDevice) -> str:
    return f"{claim.driver}/{claim.pool}/{claim.device}"


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
