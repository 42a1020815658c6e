"""The kubelet client against grpc-go, the kubelet's own gRPC (grpcgo/kubelet.go).

The server answers bytes written here with Python's protobuf, so what is checked is the
transport as a kubelet speaks it: answers and refusals, a restart, a 500-pod answer and the
16 MiB limit, and the graceful GOAWAY with which grpc-go drains a connection under
``MaxConnectionAge``: no answer may be thrown away (asked again) and nothing logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from grpclib.const import Status
from structlog.testing import capture_logs

from gpu_exporter.allocation.channel import MAX_MESSAGE, GRPCError, KubeletChannel
from gpu_exporter.allocation.podresources import (
    ClaimDevice,
    ContainerDevices,
    PodResourcesClient,
    PodResourcesError,
)
from gpu_exporter.allocation.proto import podresources_pb2 as pb
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.simulator.podresources_server import (
    allocatable_response,
    list_response,
)
from gpu_exporter.ticks import ticks

from .grpc_go import GoKubelet
from .helpers import MIG_2, UUID_A, UUID_C, devices, named, series

SOURCE_UP = 'gpu_exporter_source_up{source="pod_resources"}'
HOLDERS = [
    ContainerDevices("ml", "train", "main", "nvidia.com/gpu", (UUID_A,)),
    ContainerDevices("web", "share", "srv", "nvidia.com/gpu", (f"{UUID_C}::0", f"{UUID_C}::1")),
]
CLAIMS = [
    ClaimDevice(
        "batch", "dra", "main", "batch", "gpu-claim", "gpu.nvidia.com", "node-1", "gpu-1-mig-2",
        ("k8s.gpu.nvidia.com/device=gpu-1-mig-2",), "share-7",
    )
]  # fmt: skip
ALLOCATABLE = [("nvidia.com/gpu", UUID_A), ("nvidia.com/mig-1g.10gb", MIG_2)]


@pytest.fixture
async def go_kubelet(go_kubelet_binary: Path, short_dir: Path) -> AsyncIterator[GoKubelet]:
    kubelet = GoKubelet(go_kubelet_binary, short_dir / "go.sock")
    kubelet.answer("List", list_response(HOLDERS, CLAIMS))
    kubelet.answer("GetAllocatableResources", allocatable_response(ALLOCATABLE))
    await kubelet.start()
    yield kubelet
    await kubelet.stop()


@pytest.fixture
async def client(go_kubelet: GoKubelet) -> AsyncIterator[PodResourcesClient]:
    fetching = PodResourcesClient(go_kubelet.socket, timeout=5.0)
    yield fetching
    await fetching.close()


async def test_list_and_allocatable_from_grpc_go(client: PodResourcesClient) -> None:
    snapshot = await client.fetch()
    assert snapshot.containers == tuple(HOLDERS)
    assert snapshot.claims == tuple(CLAIMS), "the DRA fields (share_id included) were not read"
    assert snapshot.allocatable == tuple(ALLOCATABLE)


async def test_an_unimplemented_or_disabled_allocatable_leaves_list_standing(
    go_kubelet: GoKubelet, client: PodResourcesClient
) -> None:
    (go_kubelet.answers / "GetAllocatableResources.bin").unlink()  # grpc-go: UNIMPLEMENTED
    assert (await client.fetch()).allocatable is None
    go_kubelet.refuse(
        "GetAllocatableResources",
        Status.UNKNOWN,
        "Pod Resources API GetAllocatableResources disabled",
    )
    snapshot = await client.fetch(refresh_allocatable=True)
    assert (snapshot.containers, snapshot.allocatable) == (tuple(HOLDERS), None)


async def test_a_method_grpc_go_does_not_serve_is_unimplemented(go_kubelet: GoKubelet) -> None:
    channel = KubeletChannel(go_kubelet.socket)
    try:
        with pytest.raises(GRPCError) as caught:
            await channel.call("/v1.PodResourcesLister/Watch", b"", deadline=5.0)
    finally:
        channel.close()
    assert caught.value.status is Status.UNIMPLEMENTED, caught.value


async def test_permission_denied_takes_the_source_down_until_it_is_granted(
    go_kubelet: GoKubelet, short_dir: Path
) -> None:
    pool = WorkerPool(size=1, name="test-grpc-go")
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=go_kubelet.socket,
            call_timeout=5.0,
            process_interval=None,
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
    )
    try:
        go_kubelet.refuse("List", Status.PERMISSION_DENIED, "the exporter may not list pods")
        with capture_logs() as logs:
            await sub.poll()
        values = series(sub.samples())
        assert values[SOURCE_UP] == 0
        assert not named(values, "gpu_allocation_info")
        said = " ".join(str(entry.get("error")) for entry in logs)
        assert "PERMISSION_DENIED: the exporter may not list pods" in said, logs
        go_kubelet.answer("List", list_response(HOLDERS))
        await sub.poll()
        values = series(sub.samples())
        assert values[SOURCE_UP] == 1
        assert len(named(values, "gpu_allocation_info")) == 2
    finally:
        await sub.stop()
        pool.shutdown()


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful stop", "killed"])
async def test_a_grpc_go_restart_between_polls_is_no_outage(
    go_kubelet: GoKubelet, client: PodResourcesClient, graceful: bool
) -> None:
    await client.fetch()
    await go_kubelet.stop(graceful=graceful)
    go_kubelet.answer("List", list_response(HOLDERS[:1]))
    await go_kubelet.start()
    snapshot = await client.fetch()
    assert snapshot.containers == tuple(HOLDERS[:1]), "the restarted kubelet's answer was missed"
    assert go_kubelet.connections == 2


async def test_a_500_pod_answer_arrives_whole(
    go_kubelet: GoKubelet, client: PodResourcesClient
) -> None:
    pods = [
        ContainerDevices(
            f"ns-{i % 9}", f"pod-{i}", "main", "nvidia.com/gpu", (f"GPU-{i % 50:036d}::{i}",)
        )
        for i in range(500)  # 10 pods a device: within the holder bounds
    ]
    go_kubelet.answer("List", list_response(pods))
    assert (await client.fetch()).containers == tuple(pods)


def list_of_size(size: int) -> pb.ListPodResourcesResponse:
    """A List answer whose message is exactly ``size`` bytes (one pod, its name padded)."""
    name = "p" * size
    while True:
        message = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name=name)])
        over = message.ByteSize() - size
        if over == 0:
            return message
        name = name[: len(name) - over]


async def test_the_16_mib_limit_is_on_the_message_not_its_prefix(
    go_kubelet: GoKubelet, client: PodResourcesClient
) -> None:
    go_kubelet.answer("List", list_of_size(MAX_MESSAGE))
    snapshot = await client.fetch()
    assert not snapshot.containers  # one pod, no containers: read whole
    go_kubelet.answer("List", list_of_size(MAX_MESSAGE + 1))
    with pytest.raises(PodResourcesError, match="RESOURCE_EXHAUSTED"):
        await client.fetch()
    go_kubelet.answer("List", list_response(HOLDERS))
    assert (await client.fetch()).containers == tuple(HOLDERS), "no recovery after the refusal"


async def test_a_minute_of_polls_under_max_connection_age_loses_no_answer(
    go_kubelet_binary: Path, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """grpc-go drains a connection 10 s (+-10%) old with a graceful GOAWAY, whether or not a
    call is in flight. 61 polls a second apart: each answered once (none thrown away and asked
    again), the source never down, nothing logged, and several connections drained."""
    kubelet = GoKubelet(go_kubelet_binary, short_dir / "aged.sock", "-max-age=10s")
    kubelet.answer("List", list_response(HOLDERS))  # DRA claims would warn: no CDI specs here
    kubelet.answer("GetAllocatableResources", allocatable_response(ALLOCATABLE))
    await kubelet.start()
    pool = WorkerPool(size=1, name="test-grpc-go")
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket,
            call_timeout=5.0,
            process_interval=None,
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
    )
    polls, down = 0, []
    caplog.set_level(logging.WARNING)
    try:
        with capture_logs() as logs:
            async for _ in ticks(1.0):
                await sub.poll()
                polls += 1
                if not sub.published.up:
                    down.append(polls)
                if polls == 61:
                    break
    finally:
        await sub.stop()
        pool.shutdown()
        await kubelet.stop()
    assert not down, f"polls {down} found the source down"
    assert kubelet.answered["List"] == polls, (
        f"{kubelet.answered['List']} List answers for {polls} polls: answers were thrown away"
    )
    assert kubelet.connections >= 5, f"only {kubelet.connections} connections: no GOAWAY seen"
    noisy = [e for e in logs if e.get("log_level") in ("warning", "error", "critical")]
    assert not noisy, noisy
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@contextlib.contextmanager
def exporter_on(socket: Path) -> Iterator[tuple[int, list[dict[str, object]]]]:
    """``gpu-exporter --simulate`` on the kubelet socket ``socket``: its port and its log."""
    process = subprocess.Popen(
        [
            sys.executable, "-m", "gpu_exporter", "--log-format=json", "--listen=127.0.0.1:0",
            "--simulate", f"--pod-resources-socket={socket}", "--pod-resources-interval=1s",
        ],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stderr is not None
    log: list[dict[str, object]] = []
    port = None
    for line in process.stderr:  # each log line is an event; no polling needed
        log.append(json.loads(line))
        if log[-1].get("event") == "listening":
            port = int(str(log[-1]["address"]).rsplit(":", 1)[1])
            break
    stderr = process.stderr
    reader = threading.Thread(target=lambda: log.extend(json.loads(line) for line in stderr))
    reader.start()
    try:
        assert port is not None, f"the exporter exited with {process.wait()} before listening"
        yield port, log
    finally:
        process.kill()
        process.wait()
        reader.join()


def source_up(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return next(
        float(v) for k, _, v in (ln.rpartition(" ") for ln in body.splitlines()) if k == SOURCE_UP
    )


@pytest.mark.parametrize("drain", ["-max-age=3s", "-max-idle=500ms"])
async def test_the_exporter_process_sees_every_poll_answered_under_goaway(
    go_kubelet_binary: Path, short_dir: Path, drain: str
) -> None:
    """The exporter as a process on a grpc-go kubelet that drains connections (after 3 s, or
    idle for half a second: between every two polls): each scrape in 12 s sees the source up,
    the kubelet answers about one List a second (no poll asked twice), and the exporter logs no
    warning."""
    kubelet = GoKubelet(go_kubelet_binary, short_dir / "proc.sock", drain)
    # No holders: the simulated GPUs are not this file's, and unknown ids are warned about.
    kubelet.answer("List", list_response([]))
    kubelet.answer("GetAllocatableResources", allocatable_response([]))
    await kubelet.start()
    try:
        with exporter_on(kubelet.socket) as (port, log):
            ups = []
            first, started = kubelet.answered["List"], time.monotonic()
            async for _ in ticks(1.0):
                ups.append(await asyncio.to_thread(source_up, port))
                if len(ups) == 12:
                    break
            answered, elapsed = kubelet.answered["List"] - first, time.monotonic() - started
    finally:
        await kubelet.stop()
    assert ups == [1.0] * 12, f"source_up over 12 scrapes: {ups}"
    assert elapsed - 2 <= answered <= elapsed + 1, f"{answered} List answers in {elapsed:.1f} s"
    assert kubelet.connections >= 3, f"{kubelet.connections} connections: no drain happened"
    noisy = [e for e in log if e.get("level") in ("warning", "error", "critical")]
    assert not noisy, noisy
