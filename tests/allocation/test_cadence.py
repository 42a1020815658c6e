"""When the allocation subsystem asks the kubelet and accounts: at rest, one gRPC call a poll
(``GetAllocatableResources`` only when due), accounting driven by the sampler's fast rounds, and
a poll that sees the holders change published at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

import gpu_exporter.simulator.podresources_server as server
from gpu_exporter.allocation.podresources import PodResourcesClient, PodResourcesError
from gpu_exporter.allocation.subsystem import AllocationSettings, AllocationSubsystem
from gpu_exporter.collectors import Cadence
from gpu_exporter.ledger import ActivityLedger
from gpu_exporter.nvml import WorkerPool
from gpu_exporter.sampler import Sampler
from gpu_exporter.simulator import SimulatedNode, install, load_scenario, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet
from tests.helpers import ManualClock, SharedState, make_config, parse_exposition, select

from .helpers import UUID_A, UUID_B, FakeClock, FakeKubelet, devices, named, series


@pytest.fixture
def allocatable_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Appends to the list each time the kubelet answers GetAllocatableResources."""
    calls: list[int] = []
    answer = server.allocatable_response

    def counted(allocatable: Sequence[tuple[str, str]]) -> object:
        calls.append(len(allocatable))
        return answer(allocatable)

    monkeypatch.setattr(server, "allocatable_response", counted)
    return calls


async def test_allocatable_is_asked_again_only_when_due(
    kubelet: FakeKubelet, allocatable_calls: list[int]
) -> None:
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)
    kubelet.allocatable = [("nvidia.com/gpu", UUID_A)]
    clock = FakeClock()
    client = PodResourcesClient(kubelet.socket_path, allocatable_interval=30.0, clock=clock)
    first = await client.fetch()
    assert first.allocatable == (("nvidia.com/gpu", UUID_A),)
    assert await client.fetch() is first, "an unchanged answer should be the same snapshot"
    assert len(allocatable_calls) == 1, "nothing changed: List alone should have been asked"

    kubelet.allocatable = [("nvidia.com/gpu", UUID_A), ("nvidia.com/gpu", UUID_B)]
    clock.advance(29)
    assert (await client.fetch()).allocatable == first.allocatable  # not due yet
    clock.advance(1)
    assert len((await client.fetch()).allocatable or ()) == 2, "not asked after the interval"

    kubelet.allocatable = [("nvidia.com/gpu", UUID_B)]
    kubelet.hold("ml", "eval", "main", "nvidia.com/gpu", UUID_B)  # List changed: ask at once
    assert (await client.fetch()).allocatable == (("nvidia.com/gpu", UUID_B),)
    kubelet.allocatable = [("nvidia.com/gpu", UUID_A)]
    fetched = await client.fetch(refresh_allocatable=True)  # the caller's devices changed
    assert fetched.allocatable == (("nvidia.com/gpu", UUID_A),)
    assert len(allocatable_calls) == 4

    await kubelet.stop()  # a failed call drops the channel; the reconnect asks afresh
    with pytest.raises(PodResourcesError):
        await client.fetch()
    await kubelet.start()
    await client.fetch()
    assert len(allocatable_calls) == 5
    await client.close()


async def test_a_poll_that_sees_a_new_holder_publishes_it_at_once(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)
    kubelet.allocatable = [("nvidia.com/gpu", UUID_A), ("nvidia.com/gpu", UUID_B)]
    wall = FakeClock(1_700_000_000.0)
    sub = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            process_interval=None,
        ),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        wall_clock=wall,
    )
    await sub.poll()
    assert len(named(series(sub.samples()), "gpu_allocation_info")) == 1
    kubelet.hold("ml", "eval", "main", "nvidia.com/gpu", UUID_B)
    wall.advance(5)
    await sub.poll()  # no round in between
    values = series(sub.samples())
    assert len(named(values, "gpu_allocation_info")) == 2, "the new holder waited for a round"
    holder = sub.holders().holder(UUID_B, wall.now)
    assert holder == ("ml", "eval"), "the history missed the new holder"
    await sub.stop()


async def test_rounds_account_time_and_a_poll_that_changes_nothing_does_not(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)
    clock = FakeClock()
    sub = AllocationSubsystem(
        AllocationSettings(socket_path=kubelet.socket_path, process_interval=None),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        clock=clock,
    )
    await sub.poll()  # the first answer is accounted at once: the tenure starts
    clock.advance(5)
    await sub.poll()  # the same answer
    allocated = named(series(sub.samples()), "gpu_allocated_seconds_total")
    assert list(allocated.values()) == [0], "a poll that changed nothing accounted time"
    sub.round_done()
    allocated = named(series(sub.samples()), "gpu_allocated_seconds_total")
    assert list(allocated.values()) == [5], "the round did not account the 5 s since the poll"
    await sub.stop()


async def test_each_round_publishes_a_new_snapshot_and_leaves_the_last_as_it_was(
    kubelet: FakeKubelet, pool: WorkerPool
) -> None:
    kubelet.hold("ml", "train", "main", "nvidia.com/gpu", UUID_A)
    clock = FakeClock()
    sub = AllocationSubsystem(
        AllocationSettings(socket_path=kubelet.socket_path, process_interval=None),
        devices=devices,
        ledger=ActivityLedger(),
        executor=pool,
        clock=clock,
    )
    await sub.poll()
    clock.advance(2)
    sub.round_done()
    kept = sub.published
    clock.advance(3)
    sub.round_done()
    kubelet.release("train")
    await sub.poll()
    assert sub.published is not kept
    assert kept.up, "a reader's snapshot changed under it"
    assert kept.allocations.holdings, "a reader's snapshot lost its holders"
    allocated = named(series(kept.samples()), "gpu_allocated_seconds_total")
    assert list(allocated.values()) == [2], "a reader's snapshot took later rounds' time"
    assert not sub.published.allocations.holdings, "the release was not published"
    await sub.stop()


@pytest.fixture
async def rounds_node(short_dir: Path) -> AsyncIterator[tuple[Sampler, ManualClock]]:
    """The built-in node, its kubelet, and allocation accounting on the sampler's rounds (as
    app.build_exporter wires it), rounds driven by the test."""
    clock = ManualClock()
    node = SimulatedNode(load_scenario(None), clock=clock)
    install(node)
    pool = WorkerPool(size=4)
    kubelet = SimulatedKubelet(node, short_dir / "kubelet.sock", files_root=short_dir / "host")
    shared = SharedState()
    sampler = shared.sampler(make_config(fast_interval=1.0, slow_interval=60.0), pool, clock=clock)
    allocation = AllocationSubsystem(
        AllocationSettings(
            socket_path=kubelet.socket_path,
            process_interval=None,
        ),
        devices=sampler.devices,
        ledger=shared.ledger,
        executor=pool,
        clock=clock,
    )
    sampler.add_source(allocation)
    sampler.add_round_listener(allocation)
    try:
        await kubelet.start()
        await sampler.start(background=False)
        await allocation.poll()
        yield sampler, clock
    finally:
        await allocation.stop()
        await sampler.stop()
        await kubelet.stop()
        pool.shutdown()
        node.close()
        uninstall()


async def test_each_fast_round_accounts_and_is_in_its_own_exposition(
    rounds_node: tuple[Sampler, ManualClock],
) -> None:
    sampler, clock = rounds_node
    await sampler.sample_round(Cadence.SLOW)
    await sampler.sample_round(Cadence.FAST)
    before = select(
        parse_exposition(sampler.exposition.text.decode()), "gpu_allocated_seconds_total"
    )
    assert before, "no allocated-seconds series after a round on the built-in node"
    for _ in range(3):
        clock.advance(1.0)
        await sampler.sample_round(Cadence.FAST)  # no round_done() call here: the round made it
    after = select(
        parse_exposition(sampler.exposition.text.decode()), "gpu_allocated_seconds_total"
    )
    gained = {key: after[key] - before[key] for key in before}
    assert gained == dict.fromkeys(before, pytest.approx(3.0)), "three rounds, not 3 s each"
    await sampler.sample_round(Cadence.SLOW)  # a slow round accounts nothing by itself
    again = select(
        parse_exposition(sampler.exposition.text.decode()), "gpu_allocated_seconds_total"
    )
    assert again == after
