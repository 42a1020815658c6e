"""Idle accounting with a fake clock and a hand-fed activity ledger: exact expectations."""

from __future__ import annotations

import gc
from collections.abc import Sequence

from gpu_exporter.allocation.accounting import IdleAccountant, PodUsage
from gpu_exporter.devices import DeviceId, idle_activity_source
from gpu_exporter.ledger import ActivityKind, ActivityLedger

from .helpers import GPU_A, GPU_B, GPU_C, MIG_B1, FakeClock

TRAIN = ("ml", "train")
NOTEBOOK = ("research", "notebook")
SHARE_A = ("web", "share-a")
SHARE_B = ("web", "share-b")
MIG_NO_GPM = DeviceId(
    5, "MIG-99999999-0000-4000-8000-000000000000", mig_mode="enabled",
    parent_uuid="GPU-99999999-0000-4000-8000-000000000000", gpu_instance_id=1,
    compute_instance_id=0, mig_profile="1g.10gb",
)  # fmt: skip


class Feed:
    """Plays a device's activity into the ledger as a collector would: integral at each sample."""

    def __init__(self, ledger: ActivityLedger, device: DeviceId, kind: ActivityKind) -> None:
        self.ledger, self.device, self.kind = ledger, device, kind
        self.total = 0.0
        self.last: float | None = None

    def sample(self, now: float, ratio: float) -> None:
        if self.last is not None:
            self.total += ratio * (now - self.last)
        self.last = now
        self.ledger.record(self.device.uuid, self.kind, now, self.total)


def usage(accountant: IdleAccountant, device: DeviceId, pod: tuple[str, str]) -> PodUsage:
    return next(u for u in accountant.usages() if u.device == device and u.pod == pod)


def run(
    ratios: Sequence[float],
    *,
    device: DeviceId = GPU_A,
    pods: Sequence[tuple[str, str]] = (TRAIN,),
    kind: ActivityKind = ActivityKind.SM_ACTIVE,
    step: float = 1.0,
) -> tuple[IdleAccountant, FakeClock]:
    """Sample and account once per ``step`` with the given activity ratios."""
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    feed = Feed(ledger, device, kind)
    feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {device: set(pods)})
    for ratio in ratios:
        clock.advance(step)
        feed.sample(clock.now, ratio)
        accountant.update(clock.now, {device: set(pods)})
    return accountant, clock


def test_idle_seconds_and_streak_are_exact() -> None:
    ratios = [0.9] * 5 + [0.0] * 10 + [0.5] * 3 + [0.01] * 4
    accountant, _ = run(ratios)
    train = usage(accountant, GPU_A, TRAIN)
    assert train.allocated == 22
    assert train.idle == 14
    assert train.streak == 4


def test_busy_job_accrues_no_idle() -> None:
    accountant, _ = run([0.92, 0.35, 0.92, 0.06] * 5)
    train = usage(accountant, GPU_A, TRAIN)
    assert (train.allocated, train.idle, train.streak) == (20, 0, 0)


def test_idle_notebook_accrues_one_second_per_second() -> None:
    accountant, _ = run([0.0] * 30, pods=(NOTEBOOK,))
    notebook = usage(accountant, GPU_A, NOTEBOOK)
    assert notebook.idle == notebook.allocated == notebook.streak == 30


def test_threshold_is_strict() -> None:
    accountant, _ = run([0.05, 0.049999])
    assert usage(accountant, GPU_A, TRAIN).idle == 1


def test_time_sliced_pods_accrue_idle_together() -> None:
    accountant, _ = run([0.0] * 3 + [0.4] * 2 + [0.0] * 1, device=GPU_C, pods=(SHARE_A, SHARE_B),
                        kind=ActivityKind.UTILIZATION)  # fmt: skip
    for pod in (SHARE_A, SHARE_B):
        shared = usage(accountant, GPU_C, pod)
        assert (shared.allocated, shared.idle, shared.streak) == (6, 4, 1)


def test_utilization_fallback_without_sm_activity() -> None:
    assert idle_activity_source(GPU_A) == "gpm"
    assert idle_activity_source(GPU_C) == "utilization"
    assert idle_activity_source(MIG_B1) == "gpm"
    assert idle_activity_source(MIG_NO_GPM) == "none"
    accountant, _ = run([0.0, 1.0], device=GPU_C, kind=ActivityKind.UTILIZATION)
    assert usage(accountant, GPU_C, TRAIN).idle == 1
    assert accountant.has_idle_signal(GPU_C.uuid)


def test_sm_activity_preferred_but_utilization_used_when_it_is_all_there_is() -> None:
    # A GPM device whose activity collector is switched off still has utilisation.
    accountant, _ = run([0.0, 0.0, 1.0], device=GPU_A, kind=ActivityKind.UTILIZATION)
    assert usage(accountant, GPU_A, TRAIN).idle == 2


def test_no_activity_source_means_no_idle_signal() -> None:
    accountant, clock = IdleAccountant(ActivityLedger(), threshold=0.05), FakeClock()
    for _ in range(4):
        accountant.update(clock.now, {MIG_NO_GPM: {TRAIN}})
        clock.advance(1)
    pod = usage(accountant, MIG_NO_GPM, TRAIN)
    assert pod.allocated == 3
    assert pod.idle == 0
    assert not accountant.has_idle_signal(MIG_NO_GPM.uuid)


def test_slow_updates_still_follow_every_ledger_interval() -> None:
    """Ledger samples each 0.5 s, accounting each 2 s: one interval per update.

    The ledger keeps only the latest point, so the accounting interval sets the resolution:
    update at least as often as the sampler samples (see the next test).
    """
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    feed = Feed(ledger, GPU_A, ActivityKind.SM_ACTIVE)
    feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    ratios = [0.0, 0.0, 0.0, 1.0] * 4  # 16 half-second samples: 6 s idle of 8 s
    for n, ratio in enumerate(ratios, 1):
        clock.advance(0.5)
        feed.sample(clock.now, ratio)
        if n % 4 == 0:  # the accountant only sees the latest point: one 2 s interval
            accountant.update(clock.now, {GPU_A: {TRAIN}})
    train = usage(accountant, GPU_A, TRAIN)
    assert train.allocated == 8
    # Each 2 s interval's mean is 0.25 (busy): sampling coarser than the activity hides idleness.
    assert train.idle == 0


def test_updates_twice_per_sample_see_every_sample_interval() -> None:
    """Unaligned with the sampler, updating at half the sample interval misses no interval."""
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    feed = Feed(ledger, GPU_A, ActivityKind.SM_ACTIVE)
    feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    for n in range(1, 61):  # a sample each second, idle during seconds 20..39
        for _ in range(2):
            clock.advance(0.25)
            accountant.update(clock.now, {GPU_A: {TRAIN}})
            clock.advance(0.25)
        feed.sample(clock.now, 0.0 if 20 <= n < 40 else 0.8)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    assert usage(accountant, GPU_A, TRAIN).idle == 20


def test_pod_joining_mid_way_counts_from_when_it_is_seen() -> None:
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    feed = Feed(ledger, GPU_C, ActivityKind.UTILIZATION)
    feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {GPU_C: {SHARE_A}})
    for second in range(10):
        clock.advance(1)
        feed.sample(clock.now, 0.0)
        accountant.update(clock.now, {GPU_C: {SHARE_A, SHARE_B} if second >= 4 else {SHARE_A}})
    assert usage(accountant, GPU_C, SHARE_A).idle == 10
    assert (
        usage(accountant, GPU_C, SHARE_B).idle == usage(accountant, GPU_C, SHARE_B).allocated == 5
    )


def test_outage_is_nobodys_time() -> None:
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    feed = Feed(ledger, GPU_A, ActivityKind.SM_ACTIVE)
    feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    for _ in range(3):
        clock.advance(1)
        feed.sample(clock.now, 0.0)
        accountant.update(clock.now, {GPU_A: {TRAIN}})
    accountant.pause()
    for _ in range(20):  # the kubelet is down; the GPU keeps being sampled
        clock.advance(1)
        feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    for _ in range(2):
        clock.advance(1)
        feed.sample(clock.now, 0.0)
        accountant.update(clock.now, {GPU_A: {TRAIN}})
    train = usage(accountant, GPU_A, TRAIN)
    assert (train.allocated, train.idle) == (5, 5)


def test_restarted_integral_is_skipped() -> None:
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    ledger.record(GPU_A.uuid, ActivityKind.SM_ACTIVE, clock.now, 100.0)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    clock.advance(1)
    ledger.record(GPU_A.uuid, ActivityKind.SM_ACTIVE, clock.now, 0.0)  # collector rebuilt
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    clock.advance(1)
    ledger.record(GPU_A.uuid, ActivityKind.SM_ACTIVE, clock.now, 0.0)
    accountant.update(clock.now, {GPU_A: {TRAIN}})
    train = usage(accountant, GPU_A, TRAIN)
    assert (train.allocated, train.idle) == (2, 1)


def test_mig_instances_are_accounted_separately() -> None:
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    busy = Feed(ledger, MIG_B1, ActivityKind.SM_ACTIVE)
    held = {MIG_B1: {TRAIN}, GPU_B: set[tuple[str, str]]()}
    busy.sample(clock.now, 0.0)
    accountant.update(clock.now, held)
    for _ in range(4):
        clock.advance(1)
        busy.sample(clock.now, 0.7)
        accountant.update(clock.now, held)
    assert usage(accountant, MIG_B1, TRAIN).idle == 0
    assert [u.device for u in accountant.usages()] == [MIG_B1]


def test_a_rounds_readings_are_plain_data_the_garbage_collector_stops_tracking() -> None:
    """Every holder's reading is new each round and lives until the next: were it tracked, each
    collection would move a round's worth into the old generation (and bring on the full
    collections that stall the event loop)."""
    ledger, clock = ActivityLedger(), FakeClock()
    accountant = IdleAccountant(ledger, threshold=0.05)
    feed = Feed(ledger, GPU_A, ActivityKind.SM_ACTIVE)
    for ratio in (0.0, 0.5, 0.9):
        feed.sample(clock.now, ratio)
        accountant.update(clock.now, {GPU_A: {TRAIN, NOTEBOOK}})
        clock.advance(1)
    gc.collect()  # the accountant's state is old, as in a running exporter
    feed.sample(clock.now, 0.0)
    accountant.update(clock.now, {GPU_A: {TRAIN, NOTEBOOK}})
    readings = accountant.readings()
    gc.collect(0)
    assert sorted(r[:2] for r in readings) == [(GPU_A.labels, TRAIN), (GPU_A.labels, NOTEBOOK)]
    assert all(r[5] is not None for r in readings), "no SM band was credited"
    assert not any(gc.is_tracked(r) for r in readings), "a reading stays tracked"
