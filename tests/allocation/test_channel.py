"""The kubelet channel (allocation/channel.py, grpclib) against grpcio, and the simulated kubelet
(simulator/podresources_server.py, grpclib) against grpcio's client.

A real kubelet is grpc-go (tests/allocation/test_grpc_go.py); grpcio (C core, a development
dependency only) is a second real peer: the client must understand what a real server sends
(answers larger than HTTP/2's default window, trailers-only errors with percent-encoded messages,
unknown methods, deadlines) and the simulated kubelet must answer a real client the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import StreamEnded
from hyperframe.frame import GoAwayFrame, PingFrame

import gpu_exporter.allocation.channel as channel_module
from gpu_exporter.allocation.channel import KubeletChannel
from gpu_exporter.allocation.podresources import (
    GET,
    GET_ALLOCATABLE,
    LIST,
    ContainerDevices,
    PodResourcesClient,
)
from gpu_exporter.allocation.proto import podresources_pb2 as pb
from gpu_exporter.simulator.podresources_server import (
    ALLOCATABLE_DISABLED,
    KubeletState,
    PodResourcesServer,
    list_response,
)

# Enough pods that List's answer (~300 KB) needs several flow-control windows of 64 KiB.
# 3000 pods on 100 time-sliced devices: a large answer, within the holder bounds (30 a device).
MANY = [
    ContainerDevices(
        f"ns-{i % 7}", f"pod-{i}", "main", "nvidia.com/gpu", (f"GPU-{i % 100:036d}::{i}",)
    )
    for i in range(3000)
]
REFUSAL = "Pod Resources API GetAllocatableResources disabled: 100% off, café"


class GrpcioKubelet:
    """A grpcio ``grpc.aio`` server with generic handlers (no generated stubs)."""

    def __init__(self) -> None:
        self.answer_never = asyncio.Event()  # set by no one: a call that waits past its deadline

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(fn, lambda b: b, lambda b: b)

        async def list_pods(request: bytes, context: Any) -> bytes:
            return list_response(MANY).SerializeToString()

        async def allocatable(request: bytes, context: Any) -> bytes:
            await context.abort(grpc.StatusCode.UNKNOWN, REFUSAL)

        async def get(request: bytes, context: Any) -> bytes:
            await self.answer_never.wait()
            return b""

        methods = {"List": list_pods, "GetAllocatableResources": allocatable, "Get": get}
        return grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {name: unary(fn) for name, fn in methods.items()}
        )


@pytest.fixture
async def grpcio_server(short_dir: Path) -> AsyncIterator[Path]:
    socket = short_dir / "grpcio.sock"
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((GrpcioKubelet().handler(),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    yield socket
    await server.stop(grace=None)


async def call(socket: Path, path: str, request: bytes, *, deadline: float) -> bytes:
    """One call on a channel of its own."""
    channel = KubeletChannel(socket)
    try:
        return await channel.call(path, request, deadline=deadline)
    finally:
        channel.close()


async def test_a_large_answer_from_grpcio_arrives_whole(grpcio_server: Path) -> None:
    answer = await call(grpcio_server, LIST, b"", deadline=5.0)
    listed = pb.ListPodResourcesResponse.FromString(answer)
    assert len(answer) > 3 * 65535, "the answer should be several default HTTP/2 windows"
    assert len(listed.pod_resources) == len(MANY)
    assert listed.pod_resources[-1].name == "pod-2999"


async def test_a_grpcio_error_keeps_its_code_and_message(grpcio_server: Path) -> None:
    with pytest.raises(GRPCError) as caught:
        await call(grpcio_server, GET_ALLOCATABLE, b"", deadline=5.0)
    assert (caught.value.status, caught.value.message) == (Status.UNKNOWN, REFUSAL)


async def test_an_unknown_method_is_unimplemented(grpcio_server: Path) -> None:
    with pytest.raises(GRPCError) as caught:
        await call(grpcio_server, "/v1.PodResourcesLister/Watch", b"", deadline=5.0)
    assert caught.value.status is Status.UNIMPLEMENTED


async def test_a_call_past_its_deadline_fails_as_deadline_exceeded(grpcio_server: Path) -> None:
    with pytest.raises(GRPCError) as caught:
        await call(grpcio_server, GET, b"", deadline=0.2)
    assert caught.value.status is Status.DEADLINE_EXCEEDED


async def test_no_server_is_unavailable(short_dir: Path) -> None:
    with pytest.raises(GRPCError) as caught:
        await call(short_dir / "absent.sock", LIST, b"", deadline=1.0)
    assert caught.value.status is Status.UNAVAILABLE


async def test_the_client_against_grpcio_lists_pods_without_allocatable(
    grpcio_server: Path,
) -> None:
    """REFUSAL says 'GetAllocatableResources disabled': List still counts, allocatable is None."""
    client = PodResourcesClient(grpcio_server, timeout=5.0)
    snapshot = await client.fetch()
    await client.close()
    assert len(snapshot.containers) == len(MANY)
    assert snapshot.allocatable is None


async def test_the_kept_connection_serves_fetch_after_fetch_and_outlives_a_grpcio_restart(
    short_dir: Path,
) -> None:
    # The client keeps its connection between polls; a restarted kubelet leaves it dead, and
    # the next fetch must reconnect on its own rather than report the kubelet down.
    socket = short_dir / "restart.sock"

    async def serve() -> grpc.aio.Server:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((GrpcioKubelet().handler(),))
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        return server

    server = await serve()
    client = PodResourcesClient(socket, timeout=5.0)
    try:
        for poll in range(3):
            listed = (await client.fetch()).containers
            assert len(listed) == len(MANY), f"poll {poll} on the kept connection lost pods"
        await server.stop(grace=None)
        server = await serve()
        listed = (await client.fetch()).containers
        assert len(listed) == len(MANY), "the fetch after a grpcio restart lost pods"
    finally:
        await client.close()
        await server.stop(grace=None)


@pytest.fixture
async def own_server(short_dir: Path) -> AsyncIterator[PodResourcesServer]:
    server = PodResourcesServer(
        short_dir / "own.sock",
        lambda: KubeletState(MANY, None, allocatable_refusal=ALLOCATABLE_DISABLED),
    )
    await server.start()
    yield server
    await server.stop()


async def test_a_kept_connection_is_replaced_after_its_share_of_calls(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h2 remembers every closed stream of a connection (up to 65,536, ~71 bytes each): a kept
    connection carries CALLS_PER_CONNECTION calls (1000; 3 here), then the next call opens
    another."""
    monkeypatch.setattr(channel_module, "CALLS_PER_CONNECTION", 3)
    server = PodResourcesServer(short_dir / "few.sock", KubeletState)
    await server.start()
    channel = KubeletChannel(server.socket_path)
    try:
        for _ in range(7):
            await channel.call(LIST, b"", deadline=5.0)
        assert server.accepted == 3, f"7 calls took {server.accepted} connections"
    finally:
        channel.close()
        await server.stop()


def grpcio_call(socket: Path, path: str, request: bytes) -> tuple[Any, ...]:
    """(code, details, answer) of one call made by grpcio's synchronous client."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        method = channel.unary_unary(path, lambda b: b, lambda b: b)
        try:
            return (grpc.StatusCode.OK, "", method(request, timeout=5.0))
        except grpc.RpcError as exc:
            return (exc.code(), exc.details(), None)


async def test_grpcio_reads_a_large_answer_of_the_own_server(
    own_server: PodResourcesServer,
) -> None:
    code, _, answer = await asyncio.to_thread(grpcio_call, own_server.socket_path, LIST, b"")
    assert code is grpc.StatusCode.OK
    assert len(pb.ListPodResourcesResponse.FromString(answer).pod_resources) == len(MANY)


async def test_grpcio_sees_the_own_servers_refusals(own_server: PodResourcesServer) -> None:
    socket = own_server.socket_path
    refused = await asyncio.to_thread(grpcio_call, socket, GET_ALLOCATABLE, b"")
    assert refused == (grpc.StatusCode.UNKNOWN, ALLOCATABLE_DISABLED[1], None)
    missing = pb.GetPodResourcesRequest(pod_name="gone", pod_namespace="ns").SerializeToString()
    code, details, _ = await asyncio.to_thread(grpcio_call, socket, GET, missing)
    assert (code, details) == (grpc.StatusCode.UNKNOWN, "pod gone in namespace ns not found")
    unknown = await asyncio.to_thread(grpcio_call, socket, "/v1.PodResourcesLister/Watch", b"")
    assert unknown[0] is grpc.StatusCode.UNIMPLEMENTED


async def test_an_answer_that_arrives_with_goaway_still_counts(short_dir: Path) -> None:
    """A server shutting down gracefully answers, then sends GOAWAY, all in one write: the
    answer is whole and must not be cancelled with the connection."""
    connections = 0

    async def answer_then_go_away(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal connections
        connections += 1
        conn = H2Connection(H2Configuration(client_side=False))
        conn.initiate_connection()
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, StreamEnded):
                    grpc_ok = [(":status", "200"), ("content-type", "application/grpc")]
                    conn.send_headers(event.stream_id, grpc_ok)
                    conn.send_data(event.stream_id, b"\x00\x00\x00\x00\x02hi")
                    conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
                    conn.close_connection()
            writer.write(conn.data_to_send())
        writer.close()

    socket = short_dir / "goaway.sock"
    server = await asyncio.start_unix_server(answer_then_go_away, str(socket))
    channel = KubeletChannel(socket)
    try:
        assert await channel.call(LIST, b"", deadline=5.0) == b"hi"
        assert await channel.call(LIST, b"", deadline=5.0) == b"hi", "no new connection"
        assert connections == 2, "the first answer was thrown away and asked again"
    finally:
        channel.close()
        server.close()


async def test_a_call_in_flight_when_the_server_drains_is_answered_on_that_connection(
    short_dir: Path,
) -> None:
    """grpc-go's drain (MaxConnectionAge, a graceful stop): a GOAWAY naming no stream and a
    PING, then the answers of calls in flight, then a GOAWAY with the last stream. The answer
    after the first GOAWAY is read, not thrown away and asked again."""
    connections = 0

    async def drain_then_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        conn = H2Connection(H2Configuration(client_side=False))
        conn.initiate_connection()
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if not isinstance(event, StreamEnded):
                    continue
                writer.write(conn.data_to_send())
                writer.write(GoAwayFrame(0, last_stream_id=2**31 - 1).serialize())
                writer.write(PingFrame(0, b"draining").serialize())
                grpc_ok = [(":status", "200"), ("content-type", "application/grpc")]
                conn.send_headers(event.stream_id, grpc_ok)
                conn.send_data(event.stream_id, b"\x00\x00\x00\x00\x02hi")
                conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
                writer.write(conn.data_to_send())
                writer.write(GoAwayFrame(0, last_stream_id=event.stream_id).serialize())
                await writer.drain()
                writer.close()
                return
            writer.write(conn.data_to_send())

    socket = short_dir / "drain.sock"
    server = await asyncio.start_unix_server(drain_then_answer, str(socket))
    channel = KubeletChannel(socket)
    try:
        assert await channel.call(LIST, b"", deadline=5.0) == b"hi"
        assert connections == 1, "the answer was thrown away and asked again"
        assert await channel.call(LIST, b"", deadline=5.0) == b"hi", "no new connection"
    finally:
        channel.close()
        server.close()
