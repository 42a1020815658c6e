"""Unary gRPC over cleartext HTTP/2 on a unix socket, without gRPC's runtime.

The kubelet's pod-resources API is a handful of unary calls on a local socket. gRPC's own
runtime (``grpcio``) costs the exporter ~14 MiB of resident memory and six threads of its own
(event engine, timer, lifeguard) for that; this module speaks the same wire protocol with the
pure-Python ``h2`` state machine on asyncio streams instead (docs/performance.md, issue 18).

The protocol (gRPC's PROTOCOL-HTTP2.md): a request is a POST to ``/<package>.<Service>/<Method>``
with ``content-type: application/grpc`` and ``te: trailers``; each message travels as a 5-byte
prefix (compressed flag, big-endian length) and the protobuf bytes; the answer's status is the
``grpc-status`` trailer (or header, in a trailers-only response) with a percent-encoded
``grpc-message``. Neither side offers compression, so none is ever used.

:func:`call` is the client (one connection per :class:`Connection`); :func:`serve_connection`
is the server side for :class:`..server.PodResourcesServer` (the simulator's and the tests'
kubelet). Both are checked against ``grpcio`` itself in tests/allocation/test_grpcwire.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    RequestReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from h2.exceptions import H2Error

_READ_SIZE = 65536
# What this side lets the peer send before it reads (per stream and for the connection): a large
# answer then arrives without a window update per 64 KiB.
_WINDOW = 1 << 22
_MAX_MESSAGE = 16 << 20  # larger than any pod-resources answer a node can produce


class StatusCode(enum.IntEnum):
    """gRPC status codes (statuscodes.md), named as ``grpc.StatusCode``'s are."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call that did not end with status OK: the peer's status, or UNAVAILABLE / INTERNAL /
    DEADLINE_EXCEEDED for what went wrong on the way (as gRPC's own clients report them)."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def method_path(full_name: str) -> str:
    """``v1.PodResourcesLister.List`` (a method descriptor's full name) -> its request path."""
    service, _, method = full_name.rpartition(".")
    return f"/{service}/{method}"


def frame(message: bytes) -> bytes:
    """One length-prefixed, uncompressed message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def unframe(body: bytes) -> bytes:
    """The single message of a unary request or answer; RpcError(INTERNAL) when malformed."""
    if len(body) < 5:
        raise RpcError(StatusCode.INTERNAL, f"message of {len(body)} bytes: no gRPC prefix")
    length = int.from_bytes(body[1:5], "big")
    if body[0] != 0:
        raise RpcError(StatusCode.INTERNAL, "compressed message, none was offered")
    if len(body) != 5 + length:
        raise RpcError(StatusCode.INTERNAL, f"prefix says {length} bytes, {len(body) - 5} came")
    return body[5:]


class _H2Connection(H2Connection):
    """h2's connection, remembering the last few closed streams instead of 65,536.

    h2 keeps each closed stream's id, to tell a late frame on it from a protocol error. The
    kubelet connection is kept for days at one or two calls a second, so on each side that
    dict grew for most of a day, by 71 bytes a call, to about 4.5 MiB (tracemalloc in the soak).
    A unary call's peer sends nothing on a stream after ending it: a few dozen ids are plenty."""

    MAX_CLOSED_STREAMS = 64


def _config(client_side: bool) -> H2Configuration:
    return H2Configuration(client_side=client_side, header_encoding="utf-8")


def _grow_windows(conn: H2Connection) -> None:
    conn.update_settings({0x4: _WINDOW})  # SETTINGS_INITIAL_WINDOW_SIZE (streams)
    conn.increment_flow_control_window(_WINDOW - 65535)  # the connection's own window


@dataclass
class _Answer:
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False


class Connection:
    """One HTTP/2 connection to a unix socket; unary calls on it one after another."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conn = _H2Connection(config=_config(client_side=True))
        self._conn.initiate_connection()
        _grow_windows(self._conn)
        self._answers: dict[int, _Answer] = {}
        self._goaway: str | None = None  # why the server ended the connection, once it did

    @classmethod
    async def open(cls, socket_path: Path) -> Connection:
        """Connect; RpcError(UNAVAILABLE) when nothing listens there."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(socket_path))
        except OSError as exc:
            raise RpcError(StatusCode.UNAVAILABLE, f"connect {socket_path}: {exc}") from exc
        return cls(reader, writer)

    async def call(self, path: str, request: bytes, *, deadline: float) -> bytes:
        """The answer's message; RpcError unless the status is OK within ``deadline`` seconds."""
        try:
            async with asyncio.timeout(deadline):
                return await self._call(path, request, deadline)
        except TimeoutError:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"no answer in {deadline:g}s") from None
        except (OSError, H2Error, EOFError) as exc:
            raise RpcError(StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):  # the peer went first: nothing left to flush
            await self._writer.wait_closed()

    async def _call(self, path: str, request: bytes, deadline: float) -> bytes:
        stream = self._conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),  # no authority on a unix socket; kubelets accept this
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", f"{max(1, int(deadline * 1000))}m"),
        ]
        answer = self._answers[stream] = _Answer()
        self._conn.send_headers(stream, headers)
        self._conn.send_data(stream, frame(request), end_stream=True)
        while not answer.ended:
            if self._goaway is not None:  # an answer that ended with it still counts
                raise EOFError(self._goaway)
            await self._exchange()
        del self._answers[stream]
        return _result(answer)

    async def _exchange(self) -> None:
        self._writer.write(self._conn.data_to_send())
        await self._writer.drain()
        data = await self._reader.read(_READ_SIZE)
        if not data:
            raise EOFError("the server closed the connection")
        for event in self._conn.receive_data(data):
            self._on(event)

    def _on(self, event: Event) -> None:
        if isinstance(event, ConnectionTerminated):
            self._goaway = f"GOAWAY (error code {event.error_code})"
            return
        stream = getattr(event, "stream_id", None)
        answer = self._answers.get(stream) if stream is not None else None
        if answer is None:
            return
        if isinstance(event, ResponseReceived | TrailersReceived):
            answer.headers.update(_text_headers(event.headers))
        elif isinstance(event, DataReceived):
            answer.body += event.data
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if len(answer.body) > _MAX_MESSAGE:
                raise RpcError(StatusCode.RESOURCE_EXHAUSTED, "answer over 16 MiB")
        elif isinstance(event, StreamReset):
            raise RpcError(StatusCode.UNAVAILABLE, f"stream reset (error code {event.error_code})")
        elif isinstance(event, StreamEnded):
            answer.ended = True


def _text_headers(headers: Iterable[tuple[str | bytes, str | bytes]] | None) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in headers or ()}


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _result(answer: _Answer) -> bytes:
    headers = answer.headers
    if headers.get(":status") != "200":
        raise RpcError(StatusCode.UNAVAILABLE, f"HTTP status {headers.get(':status')}")
    status = headers.get("grpc-status")
    if status is None:
        raise RpcError(StatusCode.INTERNAL, "the answer ended without grpc-status")
    try:
        code = StatusCode(int(status))
    except ValueError:
        code = StatusCode.UNKNOWN
    if code is not StatusCode.OK:
        raise RpcError(code, urllib.parse.unquote(headers.get("grpc-message", "")))
    return unframe(bytes(answer.body))


async def call(socket_path: Path, path: str, request: bytes, *, deadline: float) -> bytes:
    """One unary call on a connection of its own."""
    connection = await Connection.open(socket_path)
    try:
        return await connection.call(path, request, deadline=deadline)
    finally:
        await connection.close()


# --- the server side ---------------------------------------------------------------------------

# A handler takes the request's message and returns the answer's, or raises RpcError.
Handler = Callable[[bytes], Awaitable[bytes]]


@dataclass
class _Request:
    path: str
    body: bytearray = field(default_factory=bytearray)


class _ServerConnection:
    def __init__(self, writer: asyncio.StreamWriter, handlers: Mapping[str, Handler]) -> None:
        self._writer = writer
        self._handlers = handlers
        self._conn = _H2Connection(config=_config(client_side=False))
        self._conn.initiate_connection()
        _grow_windows(self._conn)
        self._requests: dict[int, _Request] = {}
        self._outbound: dict[int, bytearray] = {}  # answers waiting for flow-control window
        writer.write(self._conn.data_to_send())  # the server's preface

    async def on_data(self, data: bytes) -> None:
        for event in self._conn.receive_data(data):
            await self._on(event)
        self._flush()
        self._writer.write(self._conn.data_to_send())
        await self._writer.drain()

    async def _on(self, event: Event) -> None:
        if isinstance(event, RequestReceived):
            headers = _text_headers(event.headers)
            self._requests[event.stream_id] = _Request(headers.get(":path", ""))
        elif isinstance(event, DataReceived):
            self._requests[event.stream_id].body += event.data
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, StreamEnded):
            await self._answer(event.stream_id, self._requests.pop(event.stream_id))
        elif isinstance(event, StreamReset):
            self._requests.pop(event.stream_id, None)
            self._outbound.pop(event.stream_id, None)
        elif isinstance(event, WindowUpdated):
            pass  # _flush, after every batch of events, sends what the new window allows

    async def _answer(self, stream: int, request: _Request) -> None:
        handler = self._handlers.get(request.path)
        try:
            if handler is None:
                raise RpcError(StatusCode.UNIMPLEMENTED, f"unknown method {request.path}")
            answer = await handler(unframe(bytes(request.body)))
        except RpcError as exc:  # trailers-only: the status in the one HEADERS frame
            headers = [(":status", "200"), ("content-type", "application/grpc")]
            self._conn.send_headers(stream, headers + _status(exc.code, exc.details), True)
            return
        self._conn.send_headers(stream, [(":status", "200"), ("content-type", "application/grpc")])
        self._outbound[stream] = bytearray(frame(answer))

    def _flush(self) -> None:
        for stream, pending in list(self._outbound.items()):
            while pending:
                size = min(self._conn.local_flow_control_window(stream), len(pending))
                size = min(size, self._conn.max_outbound_frame_size)
                if size <= 0:
                    break
                self._conn.send_data(stream, bytes(pending[:size]))
                del pending[:size]
            if not pending:
                del self._outbound[stream]
                self._conn.send_headers(stream, _status(StatusCode.OK, ""), end_stream=True)


def _status(code: StatusCode, details: str) -> list[tuple[str, str]]:
    trailers = [("grpc-status", str(int(code)))]
    if details:
        trailers.append(("grpc-message", urllib.parse.quote(details, safe=" ")))
    return trailers


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handlers: Mapping[str, Handler],
) -> None:
    """Answer unary calls on one accepted connection until the client goes away."""
    connection = _ServerConnection(writer, handlers)
    try:
        while data := await reader.read(_READ_SIZE):
            await connection.on_data(data)
    except (OSError, H2Error):
        pass  # a client that breaks the protocol or the connection loses it, as with gRPC
    finally:
        writer.close()
