"""The journal: survives restarts exactly, tolerates torn, corrupt and unwritable state."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from gpu_exporter.devices import DeviceId
from gpu_exporter.xid import XidCore, load_classifier
from gpu_exporter.xid.core import SOURCE_KMSG, Observation
from gpu_exporter.xid.journal import LOG_NAME, SNAPSHOT_NAME, Journal

from .conftest import FillableDisk

GPU = DeviceId(index=0, uuid="GPU-0000", pci_bus_id="00000000:18:00.0")


def core_for(state_dir: Path, boot_id: str = "boot-1") -> XidCore:
    core = XidCore(load_classifier(), Journal(state_dir))
    core.load(boot_id)
    return core


def kmsg_xid(xid: int, seq: int, when: float = 1000.0) -> Observation:
    return Observation(
        source=SOURCE_KMSG,
        channel="kmsg",
        xid=xid,
        when=when + seq,
        device=GPU,
        gpu_uuid=GPU.uuid,
        bus_id="0000:18:00",
        kmsg=("boot-1", seq, 0.0, None, None),
    )


def total(core: XidCore) -> float:
    return sum(core.published.counts.values())


def test_counts_latches_and_position_survive_a_restart(state_dir: Path) -> None:
    core = core_for(state_dir)
    core.observe([kmsg_xid(13, 1), kmsg_xid(48, 2)])
    core.set_latch("GPU-0000", "0", "row_remap_failure")
    # No close(): a crash. Everything was fsynced op by op.
    again = core_for(state_dir)
    assert total(again) == 2
    assert again.kmsg_position()[:2] == ("boot-1", 2)
    assert {reason for _u, _g, reason in again.published.latches} == {
        "hardware_xid",
        "row_remap_failure",
    }
    assert again.published.journal_ok


def test_torn_last_line_is_ignored(state_dir: Path) -> None:
    core = core_for(state_dir)
    core.observe([kmsg_xid(13, 1)])
    with (state_dir / LOG_NAME).open("a") as log:
        log.write('{"op":"count","l":["0"')  # the crash cut this write short
    again = core_for(state_dir)
    assert total(again) == 1
    assert again.published.journal_ok


def test_corrupt_line_in_the_middle_is_reported(state_dir: Path) -> None:
    core = core_for(state_dir)
    core.observe([kmsg_xid(13, 1)])
    with (state_dir / LOG_NAME).open("a") as log:
        log.write("garbage\n")
    core.observe([kmsg_xid(31, 2)])
    again = core_for(state_dir)
    assert total(again) == 2
    assert again.published.journal_errors == {"load": 1}, "the damage must be exposed"
    assert again.published.journal_ok, "the whole state was written back at load"
    assert "garbage" not in (state_dir / LOG_NAME).read_text(), "the damaged log is replaced"


def test_corrupt_snapshot_is_set_aside_and_serving_continues(state_dir: Path) -> None:
    core_for(state_dir).observe([kmsg_xid(13, 1)])
    (state_dir / SNAPSHOT_NAME).write_text("{not json")
    (state_dir / LOG_NAME).write_text("")
    again = core_for(state_dir)
    assert total(again) == 0
    assert again.published.journal_errors == {"load": 1}, "the damage must be exposed"
    assert list(state_dir.glob(f"{SNAPSHOT_NAME}.corrupt-*"))
    again.observe([kmsg_xid(13, 5)])
    assert total(core_for(state_dir)) == 1  # and the fresh state is written again


def test_ops_already_in_the_snapshot_are_not_applied_twice(state_dir: Path) -> None:
    core = core_for(state_dir)
    core.observe([kmsg_xid(13, 1), kmsg_xid(13, 2)])
    log_before = (state_dir / LOG_NAME).read_text()
    # A crash after the snapshot was replaced but before the log was truncated.
    core_for(state_dir)  # loads, then compacts: snapshot includes both ops, log empty
    (state_dir / LOG_NAME).write_text(log_before)
    assert total(core_for(state_dir)) == 2


def test_unwritable_state_dir_keeps_counting_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    core = core_for(blocker / "state")  # cannot be created: a file is in the way
    core.observe([kmsg_xid(13, 1)])
    assert total(core) == 1
    assert not core.published.journal_ok


def test_no_state_dir(tmp_path: Path) -> None:
    core = XidCore(load_classifier(), Journal(None))
    core.load("boot-1")
    core.observe([kmsg_xid(13, 1)])
    assert total(core) == 1
    assert not core.published.journal_ok


def test_new_boot_clears_latches_but_keeps_counts(state_dir: Path) -> None:
    core_for(state_dir).observe([kmsg_xid(48, 1)])
    after_reboot = core_for(state_dir, boot_id="boot-2")
    assert after_reboot.published.latches == ()
    assert total(after_reboot) == 1
    assert after_reboot.kmsg_position() == ("boot-2", -1, None)


def test_journal_is_json_lines(state_dir: Path) -> None:
    core_for(state_dir).observe([kmsg_xid(13, 1)])
    lines = (state_dir / LOG_NAME).read_text().splitlines()
    assert [json.loads(line)["op"] for line in lines] == ["count"]


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS], ids=["full", "read-only"])
def test_a_failing_disk_keeps_counts_in_memory_and_a_repair_makes_them_durable(
    state_dir: Path, error: int
) -> None:
    disk = FillableDisk()
    core = XidCore(load_classifier(), Journal(state_dir, write=disk.write))
    core.load("boot-1")
    core.observe([kmsg_xid(13, 1)])
    disk.error = error
    core.observe([kmsg_xid(31, 2), kmsg_xid(48, 3)])
    assert total(core) == 3, "counting must go on while the disk fails"
    assert not core.published.journal_ok
    assert core.published.journal_errors.get("append") == 1
    core.repair_journal()  # still failing: nothing changes but the count of failures
    assert not core.published.journal_ok
    assert core.published.journal_errors.get("snapshot") == 1

    disk.error = None
    core.repair_journal()
    assert core.published.journal_ok, "a repair after the disk recovered must write the state"
    again = core_for(state_dir)
    assert total(again) == 3, "what was counted while the disk was full must survive a restart"
    assert {reason for _u, _g, reason in again.published.latches} == {"hardware_xid"}


def test_a_state_dir_that_appears_later_is_used(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("")  # a file where the directory should be: nothing can be written
    core = core_for(blocker)
    core.observe([kmsg_xid(13, 1)])
    assert not core.published.journal_ok
    blocker.unlink()
    core.repair_journal()
    assert core.published.journal_ok
    assert total(core_for(blocker)) == 1


def test_repair_is_a_no_op_while_the_journal_is_healthy(state_dir: Path) -> None:
    core = core_for(state_dir)
    core.observe([kmsg_xid(13, 1)])
    log_before = (state_dir / LOG_NAME).read_text()
    core.repair_journal()
    assert (state_dir / LOG_NAME).read_text() == log_before, "a healthy journal is not rewritten"
