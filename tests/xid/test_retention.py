"""Pod series retention: a pod's Xid series leaves the exposition some time after its latest
Xid, so pod churn does not grow the exposition and the journal for ever, while the per-class
totals never go down and nothing is counted twice across restarts."""

from __future__ import annotations

import errno
from pathlib import Path

from gpu_exporter.devices import DeviceId
from gpu_exporter.xid import XidCore, load_classifier
from gpu_exporter.xid.core import SOURCE_KMSG, Observation
from gpu_exporter.xid.journal import LOG_NAME, Journal
from gpu_exporter.xid.ops import CountKey
from gpu_exporter.xid.state import XidState

from .conftest import FillableDisk, Make, value, wait_until

GPU = DeviceId(index=0, uuid="GPU-0000", pci_bus_id="00000000:18:00.0")
DAY = 86400.0
RETENTION = 7 * DAY
T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class PodsByPid:
    """pid 1 and 2 belong to pods of team-a; any other pid to no pod."""

    def holder(self, uuid: str, at_wall_time: float, pid: int | None) -> tuple[str, str] | None:
        return {1: ("team-a", "train-1"), 2: ("team-a", "train-2")}.get(pid or 0)


def core_for(state_dir: Path, clock: Clock, disk: FillableDisk | None = None) -> XidCore:
    journal = Journal(state_dir, write=(disk or FillableDisk()).write)
    core = XidCore(load_classifier(), journal, holders=lambda: PodsByPid(), clock=clock)
    core.load("boot-1")
    return core


def xid(code: int, seq: int, when: float, pid: int) -> Observation:
    return Observation(
        source=SOURCE_KMSG,
        channel="kmsg",
        xid=code,
        when=when,
        device=GPU,
        gpu_uuid=GPU.uuid,
        pid=pid,
        kmsg=("boot-1", seq, 0.0, None, None),
    )


def pods(core: XidCore) -> dict[str, float]:
    """Xid counts by pod ("" for unattributed)."""
    by_pod: dict[str, float] = {}
    for labels, count in core.published.counts.items():
        by_pod[labels[6]] = by_pod.get(labels[6], 0.0) + count
    return by_pod


def application_total(core: XidCore) -> float:
    return core.published.class_counts[("", "", "application")]  # counted once per node


def test_a_pods_series_expires_after_the_retention_and_its_class_total_stays(
    state_dir: Path,
) -> None:
    clock = Clock()
    core = core_for(state_dir, clock)
    core.observe([xid(13, 1, T0, pid=1), xid(31, 2, T0 + DAY, pid=2), xid(13, 3, T0, pid=9)])
    assert pods(core) == {"train-1": 1, "train-2": 1, "": 1}

    clock.now = T0 + RETENTION - 1
    core.expire_pod_series(RETENTION)
    assert pods(core) == {"train-1": 1, "train-2": 1, "": 1}, "nothing is due before retention"

    clock.now = T0 + RETENTION + 1
    core.expire_pod_series(RETENTION)
    assert pods(core) == {"train-2": 1, "": 1}, (
        "train-1's latest Xid is older than the retention: only its series goes; train-2's is a "
        "day younger, and unattributed series are bounded by GPUs and codes, so they stay"
    )
    assert application_total(core) == 3, "a class total is a counter: it must never go down"
    assert core.published.last_seen[("0", GPU.uuid, "13", "application")] == T0


def test_expiry_survives_a_restart_and_a_later_xid_starts_a_new_series(state_dir: Path) -> None:
    clock = Clock()
    core = core_for(state_dir, clock)
    core.observe([xid(13, 1, T0, pid=1), xid(13, 2, T0 + 1, pid=1)])
    clock.now = T0 + RETENTION + 2
    core.expire_pod_series(RETENTION)
    assert pods(core) == {}

    assert (state_dir / LOG_NAME).read_text() == "", (
        "the withdrawal goes into a snapshot, never as an op an older exporter cannot replay"
    )

    again = core_for(state_dir, clock)  # a crash: no close()
    assert pods(again) == {}, "an expired series must not come back after a restart"
    assert application_total(again) == 2

    again.observe([xid(13, 3, clock.now, pid=1)])
    assert pods(again) == {"train-1": 1}, "the pod's next Xid starts its series anew"
    assert application_total(again) == 3
    assert pods(core_for(state_dir, clock)) == {"train-1": 1}


def test_an_expiry_on_a_full_disk_is_kept_in_memory_and_written_by_the_repair(
    state_dir: Path,
) -> None:
    clock, disk = Clock(), FillableDisk()
    core = core_for(state_dir, clock, disk)
    core.observe([xid(13, 1, T0, pid=1)])
    disk.error = errno.ENOSPC
    clock.now = T0 + RETENTION + 1
    core.expire_pod_series(RETENTION)
    assert pods(core) == {}
    assert not core.published.journal_ok

    disk.error = None
    core.repair_journal()
    assert core.published.journal_ok
    assert pods(core_for(state_dir, clock)) == {}, "the repair must write the withdrawal"


def test_a_snapshot_from_before_retention_takes_each_codes_latest_event() -> None:
    state = XidState()
    labels = ["0", GPU.uuid, "13", "application", "restart_app", "team-a", "train-1"]
    state.apply({"op": "count", "l": labels, "w": T0, "r": [1, GPU.uuid, ["kmsg"]]})
    old = state.to_snapshot()
    del old["count_last"], old["expired"]  # what an exporter before retention wrote

    loaded = XidState.from_snapshot(old)
    assert loaded.expirable(T0 + 1) == [CountKey(*labels)]
    assert loaded.expirable(T0) == []
    assert loaded.class_totals() == {("", "", "application"): 1.0}


def test_a_snapshot_with_per_gpu_classes_folds_them_into_the_nodes_count() -> None:
    """A previous version kept every class's expired count per GPU; hardware stays per GPU (the
    card's lifetime count), the other classes add up into the node's."""
    old = XidState().to_snapshot()
    old["expired"] = [
        ["0", "GPU-0000", "application", 2.0],
        ["1", "GPU-1111", "application", 3.0],
        ["1", "GPU-1111", "driver", 1.0],
        ["1", "GPU-1111", "hardware", 4.0],
    ]
    state = XidState()
    state.apply(
        {
            "op": "count",
            "l": ["0", GPU.uuid, "13", "application", "restart_app", "", ""],
            "w": T0,
            "r": [1, GPU.uuid, ["kmsg"]],
        }
    )
    old["counts"] = state.to_snapshot()["counts"]

    loaded = XidState.from_snapshot(old)
    assert loaded.expired == {
        ("", "", "application"): 5.0,
        ("", "", "driver"): 1.0,
        ("1", "GPU-1111", "hardware"): 4.0,
    }
    assert loaded.class_totals() == {
        ("", "", "application"): 6.0,
        ("", "", "driver"): 1.0,
        ("1", "GPU-1111", "hardware"): 4.0,
    }, "a live pod series' count joins its class's node count"


async def test_the_subsystem_expires_pod_series_on_its_own(make_subsystem: Make) -> None:
    clock = Clock()
    subsystem = make_subsystem(
        kmsg_path=None,
        holders=lambda: PodsByPid(),
        clock=clock,
        housekeeping_interval=0.01,
        pod_series_retention=RETENTION,
    )
    await subsystem.start()
    try:
        subsystem.core.observe([xid(13, 1, T0, pid=1)])
        assert value(subsystem, "gpu_xid_errors_total", pod="train-1") == 1
        clock.now = T0 + RETENTION + 1
        await wait_until(lambda: value(subsystem, "gpu_xid_errors_total", pod="train-1") is None)
        node_wide = {"gpu": "", "uuid": "", "class": "application"}
        assert value(subsystem, "gpu_xid_class_errors_total", **node_wide) == 1
    finally:
        await subsystem.stop()
