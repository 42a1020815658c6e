"""The kubelet client against a hostile pod-resources server, written with raw h2 as an attacker
writes it: one test per attack (issue 37). Each must end in a bounded failure of the poll (the
source down, its series withheld), never a traceback, a hang or an event loop held."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import RequestReceived
from hyperframe.frame import PingFrame, SettingsFrame
from structlog.testing import capture_logs

from gpu_exporter.allocation.channel import CONTROL_FRAMES_PER_CALL, SLICE
from gpu_exporter.allocation.podresources import PodResourcesClient, PodResourcesError
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.simulator.podresources_server import list_response

from .helpers import UUID_A, FakeKubelet, devices, named, series

SOURCE_UP = 'gpu_exporter_source_up{source="pod_resources"}'
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS, _PING, _ACK = 0x4, 0x6, 0x1
Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def hostile(short_dir: Path) -> Callable[[Behaviour], Awaitable[Path]]:
    """Serve ``behaviour`` on a unix socket of its own; its path."""
    servers: list[asyncio.Server] = []

    async def serve(behaviour: Behaviour) -> Path:
        socket = short_dir / f"hostile-{len(servers)}.sock"
        servers.append(await asyncio.start_unix_server(behaviour, str(socket)))
        return socket

    yield serve  # type: ignore[misc]
    for server in servers:
        server.close()


def frames_sent_back(data: bytes) -> Counter[tuple[int, int]]:
    """(frame type, flags) of each HTTP/2 frame a client sent, after its preface."""
    counted: Counter[tuple[int, int]] = Counter()
    position = len(PREFACE) if data.startswith(PREFACE) else 0
    while position + 9 <= len(data):
        length = int.from_bytes(data[position : position + 3], "big")
        counted[(data[position + 3], data[position + 4])] += 1
        position += 9 + length
    return counted


async def read_all(reader: asyncio.StreamReader) -> bytes:
    received = bytearray()
    try:
        while data := await reader.read(65536):
            received += data
    except ConnectionError:
        pass  # the client aborted the connection
    return bytes(received)


def no_traceback(caplog: pytest.LogCaptureFixture, logs: list[dict[str, object]]) -> None:
    raised = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not raised, caplog.text  # asyncio's "Fatal error: protocol.data_received()"
    assert not [e for e in logs if "exc_info" in e or e.get("log_level") == "error"], logs


@pytest.fixture
async def subsystem(short_dir: Path) -> AsyncIterator[Callable[[Path], AllocationSubsystem]]:
    pool = WorkerPool(size=1, name="test-hostile")
    made: list[AllocationSubsystem] = []

    def make(socket: Path) -> AllocationSubsystem:
        made.append(
            AllocationSubsystem(
                AllocationSettings(
                    socket_path=socket,
                    call_timeout=1.0,
                    process_interval=None,
                ),
                devices=devices,
                ledger=ActivityLedger(),
                executor=pool,
            )
        )
        return made[-1]

    yield make
    for sub in made:
        await sub.stop()
    pool.shutdown()


async def test_a_header_value_that_is_not_utf8_takes_the_source_down_without_a_traceback(
    short_dir: Path,
    hostile: Callable[[Behaviour], Awaitable[Path]],
    subsystem: Callable[[Path], AllocationSubsystem],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A kubelet that answers with a header h2 cannot decode (bytes 0xff 0xfe, not ASCII, not
    UTF-8): the poll fails as a broken connection; the series of the last good answer are
    withheld, not served as current."""
    good = FakeKubelet(short_dir / "kubelet.sock")
    good.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)
    await good.start()
    sub = subsystem(good.socket_path)
    await sub.poll()
    assert named(series(sub.samples()), "gpu_allocation_info"), "the good kubelet was not read"
    await good.stop()

    async def answer_with_bad_header(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        config = H2Configuration(client_side=False, validate_outbound_headers=False)
        conn = H2Connection(config)
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        answer = list_response(good.containers).SerializeToString()
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, RequestReceived):
                    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
                    conn.send_headers(event.stream_id, [*headers, (b"x-kubelet", b"\xff\xfe")])
                    conn.send_data(event.stream_id, b"\0" + len(answer).to_bytes(4, "big") + answer)
                    conn.send_headers(event.stream_id, [(b"grpc-status", b"0")], end_stream=True)
            writer.write(conn.data_to_send())

    bad = await hostile(answer_with_bad_header)
    good.socket_path.symlink_to(bad)  # the same socket path, now the hostile kubelet
    caplog.set_level(logging.DEBUG, logger="asyncio")
    with capture_logs() as logs:
        await sub.poll()
    values = series(sub.samples())
    assert values[SOURCE_UP] == 0
    assert not named(values, "gpu_allocation_info"), "the stale holders were served as current"
    no_traceback(caplog, logs)
    said = " ".join(str(e.get("error")) for e in logs)
    assert "UNAVAILABLE" in said, logs
    assert "UnicodeDecodeError" in said, logs


async def test_a_server_that_stops_reading_bounds_the_poll_and_the_close(
    hostile: Callable[[Behaviour], Awaitable[Path]],
) -> None:
    """It accepts, sends its settings, and then neither reads nor answers: the poll ends at its
    deadline and closing the client does not wait for the server to take anything."""
    stalled: list[asyncio.StreamWriter] = []

    async def stop_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SettingsFrame(0).serialize())
        stalled.append(writer)  # held open, never read

    socket = await hostile(stop_reading)
    client = PodResourcesClient(socket, timeout=0.5)
    async with asyncio.timeout(10):  # a hang fails here, not at the suite's timeout
        with pytest.raises(PodResourcesError, match="DEADLINE_EXCEEDED"):
            await client.fetch()
        await client.close()
    assert stalled, "the client never connected"


async def flood(
    hostile: Callable[[Behaviour], Awaitable[Path]], frame: bytes, copies: int
) -> tuple[Path, asyncio.Queue[Counter[tuple[int, int]]]]:
    """A server that answers every connection with ``copies`` of ``frame`` (after its
    settings) and counts the frames the client sends back, once the client is gone."""
    sent_back: asyncio.Queue[Counter[tuple[int, int]]] = asyncio.Queue()

    async def flood_it(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SettingsFrame(0).serialize() + frame * copies)
        sent_back.put_nowait(frames_sent_back(await read_all(reader)))
        writer.close()

    return await hostile(flood_it), sent_back


# What one call lets through: its share of control frames, and the rest of the slice of bytes
# in which that share ran out.
def most_handled(frame_size: int) -> int:
    return 2 * CONTROL_FRAMES_PER_CALL + SLICE // frame_size + 1


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        pytest.param(SettingsFrame(0, {0x3: 100}).serialize(), (_SETTINGS, _ACK), id="SETTINGS"),
        pytest.param(PingFrame(0, b"12345678").serialize(), (_PING, _ACK), id="PING"),
    ],
)
async def test_a_control_frame_flood_is_cut_after_a_bounded_number_of_frames(
    hostile: Callable[[Behaviour], Awaitable[Path]],
    caplog: pytest.LogCaptureFixture,
    frame: bytes,
    kind: tuple[int, int],
) -> None:
    """100,000 SETTINGS (or PING) frames, each of which h2 answers and spends 10-20 us on (1-2
    s of event loop): the client handles a bounded number per call, then ends the connection;
    the poll fails at once rather than at its deadline, and the next poll is bounded the same."""
    socket, sent_back = await flood(hostile, frame, 100_000)
    client = PodResourcesClient(socket, timeout=30.0)
    with capture_logs() as logs:
        async with asyncio.timeout(10):  # well before the call's deadline
            for _ in range(2):
                with pytest.raises(PodResourcesError, match=r"UNAVAILABLE: .*a flood"):
                    await client.fetch()
        await client.close()
    async with asyncio.timeout(10):
        answered = [(await sent_back.get())[kind] for _ in range(2)]
    assert all(n <= most_handled(len(frame)) for n in answered), (
        f"the client answered {answered} of 100,000 frames per connection"
    )
    no_traceback(caplog, logs)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x01\x00\x00\x00\x02hi", id="compressed, though not offered"),
        pytest.param(b"\x00\x00\x00\x00\x64short", id="a prefix announcing more than comes"),
        pytest.param(b"\x00\x00\x00\x00\x02hi\x00\x00\x00\x00\x02hi", id="two messages"),
        pytest.param(b"\x00\x00", id="a cut prefix"),
    ],
)
async def test_an_answer_that_lies_about_its_message_is_internal(
    hostile: Callable[[Behaviour], Awaitable[Path]], body: bytes
) -> None:
    async def lie(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = H2Connection(H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, RequestReceived):
                    grpc_ok = [(":status", "200"), ("content-type", "application/grpc")]
                    conn.send_headers(event.stream_id, grpc_ok)
                    conn.send_data(event.stream_id, body)
                    conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
            writer.write(conn.data_to_send())

    client = PodResourcesClient(await hostile(lie), timeout=5.0)
    with pytest.raises(PodResourcesError, match="INTERNAL"):
        await client.fetch()
    await client.close()
