"""Unary gRPC calls to the kubelet's unix socket: grpclib, with the bounds a node agent needs.

grpclib (asyncio gRPC on the h2 state machine) makes the calls and reads the socket all the time,
so a graceful GOAWAY between polls (grpc-go's ``MaxConnectionAge`` / ``MaxConnectionIdle``, a
kubelet shutting down) is seen when it arrives and the next call connects afresh. What this module
adds, because the peer is another process on the node and may be broken or hostile:

- **Every step bounded.** A call (connect, send, receive) ends within its deadline; closing never
  waits (the transport is aborted), so a server that stops reading cannot hold a poll or a close.
- **The answer's message at most 16 MiB** (:data:`MAX_MESSAGE`, the message itself, not its 5-byte
  prefix): RESOURCE_EXHAUSTED as soon as the prefix announces more, before anything is buffered; a
  compressed, truncated or second message is INTERNAL.
- **Broken HTTP/2 is UNAVAILABLE, never a traceback.** A header value that is not ASCII (h2 raises
  ``UnicodeDecodeError`` for it), a frame h2 refuses, a frame kind grpclib has no handler for: the
  connection ends and the call fails like any lost connection.
- **Floods are cut.** Bytes are fed to h2 :data:`SLICE` at a time, and the control frames they
  carry (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, unknown kinds) are counted: more than
  :data:`CONTROL_FRAMES_PER_CALL` for each call made on a connection, or more than
  :data:`BYTES_PER_CALL` received during one call, ends the connection. h2 spends 10-20 us per
  control frame, so what one flood costs the event loop is about one slice (~5 ms), not a read
  (256 KiB: ~0.3 s).
- **A graceful GOAWAY loses no answer.** grpc-go drains a connection (``MaxConnectionAge``, a
  graceful stop) with a GOAWAY naming no stream, a PING, the answers of calls in flight and a
  second GOAWAY; h2 parses nothing after the first GOAWAY and grpclib cancels every call with
  it. Here a GOAWAY with NO_ERROR leaves the connection readable: no call starts on it, calls up
  to its last stream id are answered on it. Answers that came whole are kept for their callers
  whatever ends the connection next (the server closing it right after its last answer). Any
  other GOAWAY ends the calls still in flight as UNAVAILABLE.

Answers are returned as bytes (a pass-through codec): the caller decodes them with protobuf,
where it likes (a large answer off the event loop).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from grpclib.client import Channel, Handler
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import AbstractHandler, Connection, EventsProcessor, H2Protocol
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes
from hyperframe.frame import Frame, GoAwayFrame

MAX_MESSAGE = 16 << 20  # larger than any pod-resources answer a node can produce
_PREFIX = 5  # the compressed flag and the message's big-endian length
SLICE = 4096  # bytes fed to h2 before the flood bounds are checked
CONTROL_FRAMES_PER_CALL = 100  # grpc-go sends a handful (SETTINGS, its ACK, a BDP or GOAWAY PING)
BYTES_PER_CALL = MAX_MESSAGE + (1 << 20)  # the largest answer, its frames' headers and trailers
# h2 remembers each closed stream of a connection (up to 65,536, ~71 bytes each: 4.5 MiB on each
# side of a connection kept for a day at two calls a second); a new connection every thousand
# calls (one connect in eight minutes) keeps that under 100 KB.
CALLS_PER_CONNECTION = 1000
# What an answer is made of; every other event is a control frame.
_ANSWER_EVENTS = (ResponseReceived, DataReceived, TrailersReceived, StreamEnded, StreamReset)

__all__ = ["MAX_MESSAGE", "GRPCError", "KubeletChannel", "Status"]


class _Bytes(CodecBase):
    """Messages as they are on the wire: the caller encodes and decodes them."""

    __content_subtype__ = "proto"  # content-type application/grpc, as protobuf's codec sends

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, bytes):
            raise TypeError(f"a message of bytes, not {type(message).__name__}")
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


class _Incoming:
    """What one stream's DATA frames carried so far (a unary answer: one message)."""

    def __init__(self) -> None:
        self.prefix = bytearray()
        self.length: int | None = None  # the message's, once its prefix is whole
        self.received = 0  # bytes of the message after its prefix

    def add(self, data: bytes) -> tuple[Status, str] | None:
        """Why the answer is refused, or None while it stays within bounds."""
        if self.length is None:
            need = _PREFIX - len(self.prefix)
            self.prefix += data[:need]
            data = data[need:]
            if len(self.prefix) < _PREFIX:
                return None
            if self.prefix[0] != 0:
                return Status.INTERNAL, "a compressed message, though none was offered"
            self.length = int.from_bytes(self.prefix[1:], "big")
            if self.length > MAX_MESSAGE:
                limit = f"over the {MAX_MESSAGE >> 20} MiB limit"
                return Status.RESOURCE_EXHAUSTED, f"a message of {self.length} bytes, {limit}"
        self.received += len(data)
        if self.received > self.length:
            return Status.INTERNAL, "more than one message in a unary answer"
        return None

    def short(self) -> str | None:
        """Why the answer, now ended, is incomplete, or None."""
        if self.length is None:
            return None if not self.prefix else "the answer ended inside its message prefix"
        if self.received < self.length:
            return f"the answer ended {self.length - self.received} bytes into its message"
        return None


class _H2Connection(H2Connection):
    """h2's connection, reading on after a graceful GOAWAY (RFC 9113 6.8: the streams up to its
    last stream id may still complete). h2 itself closes the connection at any GOAWAY, which
    makes the PING and the answers a draining grpc-go server sends after it protocol errors."""

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[Event]]:
        if frame.error_code != ErrorCodes.NO_ERROR:
            return super()._receive_goaway_frame(frame)
        event = ConnectionTerminated()
        event.error_code = ErrorCodes.NO_ERROR
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class _Connection(Connection):
    """grpclib's connection, writing nothing once its transport is closing: the answers it keeps
    are read after the server closed (a window update for them has nowhere to go)."""

    def flush(self) -> None:
        if not self.is_closing():
            super().flush()

    def ack(self, stream_id: int, size: int) -> None:
        if not self.is_closing():
            super().ack(stream_id, size)


class _Processor(EventsProcessor):
    """grpclib's event handling, with answers bounded, and answers that came whole kept for their
    callers when the connection ends (a GOAWAY, the server closing right after answering)."""

    closed = False

    def __init__(self, handler: AbstractHandler, connection: Any) -> None:
        super().__init__(handler, connection)
        self._incoming: dict[int, _Incoming] = {}
        self._ended: set[int] = set()  # streams whose answer came whole (at most one per call)
        self._refused: set[int] = set()

    def process_data_received(self, event: DataReceived) -> None:
        stream_id = event.stream_id
        if stream_id in self._refused:  # the rest of a refused answer: counted, dropped
            self.connection.ack(stream_id, event.flow_controlled_length or 0)
            return
        if stream_id in self.streams:
            refused = self._incoming.setdefault(stream_id, _Incoming()).add(event.data or b"")
            if refused is not None:
                self._refuse(stream_id, *refused)
                self.connection.ack(stream_id, event.flow_controlled_length or 0)
                return
        super().process_data_received(event)

    def process_stream_ended(self, event: StreamEnded) -> None:
        if event.stream_id in self._refused:
            return
        incoming = self._incoming.pop(event.stream_id, None)
        short = incoming.short() if incoming is not None else None
        if short is not None:
            self._refuse(event.stream_id, Status.INTERNAL, short)
            return
        self._ended.add(event.stream_id)
        super().process_stream_ended(event)

    def process_connection_terminated(self, event: ConnectionTerminated) -> None:
        self.handler.close()  # no call starts on this connection: the next one connects afresh
        graceful = event.error_code == ErrorCodes.NO_ERROR
        last = event.last_stream_id or 0
        reason = f"GOAWAY from the server (error code {event.error_code})"
        for stream_id, stream in list(self.streams.items()):
            answered = stream_id in self._ended or (graceful and stream_id <= last)
            if not answered:
                stream.__terminated__(reason)
        if not self.streams:
            self.close(reason)
        # else the answers still coming or not yet read are read by their callers; the server
        # closes the connection after them, or the channel does before its next call
        # (KubeletChannel._connection_for_call)

    def close(self, reason: str = "Connection closed") -> None:
        self.closed = True
        streams = self.streams  # release_stream pops from this dict: it stays the same one
        self.streams = {i: s for i, s in streams.items() if i not in self._ended}
        try:
            super().close(reason)  # terminates the calls still waiting for their answer
        finally:
            self.streams = streams

    def _refuse(self, stream_id: int, status: Status, message: str) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None and stream.wrapper is not None:
            stream.wrapper.cancel(GRPCError(status, message))
        self._incoming.pop(stream_id, None)
        self._refused.add(stream_id)


class _Protocol(H2Protocol):
    """grpclib's protocol, feeding h2 in slices within the flood bounds."""

    processor: _Processor

    calls = 0  # calls started on this connection (KubeletChannel counts them)

    def __init__(self, handler: AbstractHandler, config: Configuration, h2: H2Configuration):
        super().__init__(handler, config, h2)
        self._control_frames = 0
        self._received = 0  # bytes since the last call started
        self.failure: str | None = None  # why this side ended the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # grpclib's H2Protocol.connection_made, on _H2Connection and _Processor
        self._transport = transport
        h2_connection = _H2Connection(config=self.h2_config)
        h2_connection.initiate_connection()
        initial = h2_connection.local_settings.initial_window_size
        if self.config.http2_connection_window_size != initial:
            h2_connection.increment_flow_control_window(
                self.config.http2_connection_window_size - initial
            )
        if self.config.http2_stream_window_size != initial:
            h2_connection.update_settings(
                {SettingCodes.INITIAL_WINDOW_SIZE: self.config.http2_stream_window_size}
            )
        self.connection = _Connection(
            h2_connection, cast(asyncio.Transport, transport), config=self.config
        )
        self.connection.flush()
        self.connection.initialize()
        self.processor = _Processor(self.handler, self.connection)

    @property
    def ended(self) -> bool:
        """No call may start on this connection (it failed, closed, or had a GOAWAY)."""
        return isinstance(self.handler, Handler) and self.handler.connection_lost

    def call_started(self) -> None:
        self.calls += 1
        self._received = 0

    def data_received(self, data: bytes) -> None:
        for start in range(0, len(data), SLICE):
            if self.failure is not None or self.processor.closed:
                return
            piece = data[start : start + SLICE]
            self._received += len(piece)
            try:
                events = self.connection.feed(piece)
            except (H2Error, ValueError) as exc:  # ValueError: a header value that is not ASCII
                self.abort(f"the server broke HTTP/2: {type(exc).__name__}: {exc}")
                return
            self.connection.flush()
            for event in events:
                self._process(event)
            if self.processor.closed:
                return
            self.connection.flush()
            if self._control_frames > CONTROL_FRAMES_PER_CALL * (self.calls + 1):
                self.abort(f"{self._control_frames} control frames in {self.calls} calls: a flood")
                return
            if self._received > BYTES_PER_CALL:
                self.abort(f"over {BYTES_PER_CALL} bytes received during one call")
                return

    def _process(self, event: Event) -> None:
        if not isinstance(event, _ANSWER_EVENTS):
            self._control_frames += 1
        if self.processor.closed:
            return
        if type(event) in self.processor.processors:  # grpclib raises for kinds it lacks
            self.processor.process(event)

    def abort(self, reason: str) -> None:
        """End the connection now, whatever is left to send (a peer may have stopped reading)."""
        if self.failure is None:
            self.failure = reason
        transport = getattr(self, "_transport", None)  # both set once the connection is made
        processor = getattr(self, "processor", None)
        if transport is not None:
            transport.abort()
        if processor is not None:
            processor.close(reason)


class _Channel(Channel):
    """grpclib's channel, on :class:`_Protocol`."""

    protocol: _Protocol | None = None  # the current connection's

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self.protocol = _Protocol(protocol.handler, protocol.config, protocol.h2_config)
        return self.protocol


class KubeletChannel:
    """Unary calls on one kept connection to a unix socket, replaced when it ends."""

    def __init__(self, socket_path: Path) -> None:
        self._socket = socket_path
        self._channel: _Channel | None = None  # made on the event loop, at the first call

    async def call(self, path: str, request: bytes, *, deadline: float) -> bytes:
        """The answer's message; GRPCError unless the status is OK within ``deadline`` seconds
        (UNAVAILABLE for a connection that failed or ended, DEADLINE_EXCEEDED past it)."""
        channel = self._connection_for_call()
        try:
            async with asyncio.timeout(deadline):
                return await self._call(channel, path, request, deadline)
        except TimeoutError:
            raise GRPCError(Status.DEADLINE_EXCEEDED, f"no answer in {deadline:g}s") from None
        except StreamTerminatedError as exc:
            failure = channel.protocol.failure if channel.protocol is not None else None
            raise GRPCError(Status.UNAVAILABLE, failure or str(exc)) from None
        except (OSError, H2Error) as exc:
            raise GRPCError(Status.UNAVAILABLE, f"{type(exc).__name__}: {exc}") from None

    async def _call(self, channel: _Channel, path: str, request: bytes, deadline: float) -> bytes:
        stream = channel.request(path, Cardinality.UNARY_UNARY, bytes, bytes, timeout=deadline)
        async with stream:
            await stream.send_request()
            if channel.protocol is not None:
                channel.protocol.call_started()
            await stream.send_message(request, end=True)
            answer = await stream.recv_message()
            # grpclib would skip the status of an answer whose connection closed since:
            # read it here, whatever the connection's state.
            await stream.recv_trailing_metadata()
        if not isinstance(answer, bytes):
            raise GRPCError(Status.INTERNAL, "the answer ended without a message")
        return answer

    def _connection_for_call(self) -> _Channel:
        channel = self._channel
        protocol = channel.protocol if channel is not None else None
        worn = protocol is not None and (protocol.ended or protocol.calls >= CALLS_PER_CONNECTION)
        if channel is not None and protocol is not None and worn:
            protocol.abort("replaced")  # the answers it kept are read by now
            channel.protocol = None
            channel.close()  # grpclib's own reference to it
        if channel is None:
            channel = self._channel = _Channel(path=str(self._socket), codec=_Bytes())
        return channel

    def close(self) -> None:
        """End the connection at once (nothing is waited for); a later call opens another."""
        channel, self._channel = self._channel, None
        if channel is not None:
            if channel.protocol is not None:
                channel.protocol.abort("closed by the client")
            channel.close()
