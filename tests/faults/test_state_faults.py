"""The state directory fails: full, read-only, in the way, or holding a corrupt journal. The
exporter keeps serving and counting, says so in a metric, and recovers without a restart."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_exporter.xid import XidSubsystem
from gpu_exporter.xid.journal import LOG_NAME, SNAPSHOT_NAME
from tests.helpers import Series, drained, one
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
        assert drained(series, "hardware_xid", gpu="1") == 1


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


GPU0_XID31 = "NVRM: Xid (PCI:0000:18:00): 31, pid=4242, name=python, MMU Fault"


def removed(state: Path) -> Callable[[], None]:
    """``rm -rf`` of the state directory; it is made again by hand (mkdir) later."""
    shutil.rmtree(state)
    return lambda: state.mkdir(mode=0o700)


def renamed_away(state: Path) -> Callable[[], None]:
    """``mv state state.old``: the journal's open files now live under another name."""
    state.rename(state.with_name("state.old"))
    return lambda: state.mkdir(mode=0o700)


def replaced_by_a_symlink(state: Path) -> Callable[[], None]:
    """The directory swapped for a link to another one: never followed, so the link's target
    stays empty and the journal waits for a real directory."""
    elsewhere = state.with_name("elsewhere")
    elsewhere.mkdir(mode=0o700)
    shutil.rmtree(state)
    state.symlink_to(elsewhere, target_is_directory=True)

    def restore() -> None:
        assert not any(elsewhere.iterdir()), "the journal wrote through a symlink"
        state.unlink()
        state.mkdir(mode=0o700)

    return restore


@pytest.mark.parametrize("take_away", [removed, renamed_away, replaced_by_a_symlink])
async def test_a_state_dir_taken_away_while_running_loses_no_xid_once_it_is_back(
    tmp_path: Path, take_away: Callable[[Path], Callable[[], None]]
) -> None:
    kmsg, state = KmsgFile(tmp_path / "kmsg"), tmp_path / "state"
    xid = subsystem(tmp_path, FillableDisk())
    await xid.start()
    try:
        kmsg.write(GPU0_XID13)
        await wait_until(lambda: xid_count(xid) == 1 and journal_ok(xid))
        bring_back = take_away(state)
        await wait_until(lambda: not journal_ok(xid))  # seen without an Xid to write
        kmsg.write(GPU0_XID48)
        kmsg.write(GPU0_XID13)
        await wait_until(lambda: xid_count(xid) == 3)
        assert not journal_ok(xid), "a journal with no directory must not read as whole"
        assert value(xid, "gpu_exporter_state_journal_errors_total", operation="append") == 1
        assert not state.is_dir() or state.is_symlink(), "the directory was made again"
        bring_back()
        await wait_until(lambda: journal_ok(xid))  # a full snapshot, with no Xid to trigger it
        kmsg.write(GPU0_XID31)
        await wait_until(lambda: xid_count(xid) == 4)
    finally:
        await xid.stop()
    again = subsystem(tmp_path, FillableDisk())
    await again.start()
    try:
        kmsg.write(GPU0_XID31)  # read after the replay: once it counts, the replay is done
        await wait_until(lambda: xid_count(again) == 5)
        assert xid_counts_by_code(again) == {"13": 2, "48": 1, "31": 2}, "lost or counted twice"
        assert value(again, "gpu_drain_recommended", gpu="0", reason="hardware_xid") == 1
        assert journal_ok(again)
    finally:
        await again.stop()


async def test_a_state_dir_replaced_by_another_takes_the_next_write_whole(tmp_path: Path) -> None:
    kmsg, state = KmsgFile(tmp_path / "kmsg"), tmp_path / "state"
    xid = plain_subsystem(tmp_path)  # no housekeeping in this test: the append itself notices
    await xid.start()
    try:
        kmsg.write(GPU0_XID13)
        await wait_until(lambda: xid_count(xid) == 1)
        os.rename(state, tmp_path / "state.old")
        state.mkdir(mode=0o700)
        kmsg.write(GPU0_XID48)
        await wait_until(lambda: xid_count(xid) == 2)
        assert journal_ok(xid), "the new directory holds the whole state at once"
    finally:
        await xid.stop()
    old_log = (tmp_path / "state.old" / LOG_NAME).read_text()
    assert '"48"' not in old_log, "the op log moved away with its directory took a write"
    again = plain_subsystem(tmp_path)
    await again.start()
    try:
        kmsg.write(GPU0_XID31)
        await wait_until(lambda: xid_count(again) == 3)
        assert xid_counts_by_code(again) == {"13": 1, "48": 1, "31": 1}
    finally:
        await again.stop()


def xid_counts_by_code(xid: XidSubsystem) -> dict[str, float]:
    totals: dict[str, float] = {}
    for labels, count in xid.core.published.counts.items():
        totals[labels[2]] = totals.get(labels[2], 0) + count
    return totals
