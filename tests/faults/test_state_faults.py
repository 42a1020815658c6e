"""The state directory fails: full, read-only, in the way, or holding a corrupt journal. The
exporter keeps serving and counting, says so in a metric, and recovers without a restart."""

from __future__ import annotations

import errno
from pathlib import Path

from gpu_exporter.xid import XidSubsystem
from gpu_exporter.xid.journal import LOG_NAME, SNAPSHOT_NAME
from tests.helpers import Series, one
from tests.xid.conftest import (
    FillableDisk,
    KmsgFile,
    plain_subsystem,
    value,
    wait_until,
    xid_count,
)

from .rig import fault_rig, xid_counts

GPU0_XID13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics Exception"
GPU0_XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE"


def subsystem(tmp_path: Path, disk: FillableDisk) -> XidSubsystem:
    return plain_subsystem(tmp_path, journal_write=disk.write, housekeeping_interval=0.05)


def journal_ok(xid: XidSubsystem) -> bool:
    return value(xid, "gpu_exporter_state_journal_ok") == 1


async def test_a_full_disk_loses_nothing_and_the_journal_recovers_by_itself(
    tmp_path: Path,
) -> None:
    kmsg, disk = KmsgFile(tmp_path / "kmsg"), FillableDisk()
    xid = subsystem(tmp_path, disk)
    await xid.start()
    try:
        kmsg.write(GPU0_XID13)
        await wait_until(lambda: xid_count(xid) == 1)
        disk.error = errno.ENOSPC
        kmsg.write(GPU0_XID48)
        kmsg.write(GPU0_XID13)
        await wait_until(lambda: xid_count(xid) == 3 and not journal_ok(xid))
        assert (value(xid, "gpu_exporter_state_journal_errors_total", operation="append") or 0) >= 1
        disk.error = None  # space freed: the next repair writes the whole state, no Xid needed
        await wait_until(lambda: journal_ok(xid))
    finally:
        await xid.stop()
    again = subsystem(tmp_path, FillableDisk())
    await again.start()
    try:
        assert xid_count(again) == 3, "what was counted while the disk was full was lost"
        assert value(again, "gpu_drain_recommended", gpu="0", reason="hardware_xid") == 1
    finally:
        await again.stop()


def journal_series_ok(series: Series) -> bool:
    return one(series, "gpu_exporter_state_journal_ok") == 1


async def test_an_unwritable_state_dir_keeps_the_exporter_serving_and_counting(
    tmp_path: Path,
) -> None:
    in_the_way = tmp_path / "not-a-dir"
    in_the_way.write_text("")
    async with fault_rig(tmp_path, state_dir=in_the_way / "state") as rig:
        rig.xid(0, 13)
        rig.xid(1, 48)
        series = await rig.assert_xids_exact()
        assert not journal_series_ok(series), "an unwritable journal must show in the metric"
        assert one(series, "gpu_exporter_state_journal_errors_total", operation="snapshot") >= 1
        assert one(series, "gpu_drain_recommended", gpu="1", reason="hardware_xid") == 1


async def test_a_corrupt_journal_is_reported_and_replaced_and_counting_goes_on(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / SNAPSHOT_NAME).write_text('{"version": 1, "counts": [[')
    (state / LOG_NAME).write_text('not json\n{"op": "nonsense", "n": 1}\n')
    async with fault_rig(tmp_path) as rig:
        rig.xid(0, 13)
        rig.xid(2, 31)
        series = await rig.assert_xids_exact()
        assert one(series, "gpu_exporter_state_journal_errors_total", operation="load") >= 1
        assert journal_series_ok(series), "the journal is whole again once rewritten"
    assert list(state.glob(f"{SNAPSHOT_NAME}.corrupt-*")), "the damaged snapshot is kept aside"
    async with fault_rig(tmp_path) as rig:  # the rewritten journal carries the counts over
        assert xid_counts(await rig.scrape()) == {("0", "13"): 1, ("2", "31"): 1}
