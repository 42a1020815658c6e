"""Typed journal operations: the journal files an earlier version wrote still load, and what this
version writes for them is the same bytes (so an older exporter reads it back too).

``data/journal-before-typed-ops`` was written by the exporter before ops were typed (the Xid core
driven through a kernel-log Xid, its NVML twin, a hardware Xid and its drain latch, an Xid from a
regular file, an SXid, a latch set and cleared); the last five lines are in the forms earlier
versions wrote (an event without its raw code, expiries written to the log)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpu_exporter.xid.journal import LOG_NAME, Journal
from gpu_exporter.xid.ops import (
    BadOp,
    Count,
    CountKey,
    Duplicate,
    KmsgMark,
    KmsgPosition,
    decode,
    encode,
)

DATA = Path(__file__).parent / "data" / "journal-before-typed-ops"
LINES = (DATA / LOG_NAME).read_text().splitlines()


def test_a_state_dir_written_before_typed_ops_loads_whole(tmp_path: Path) -> None:
    shutil.copytree(DATA, tmp_path / "state")
    journal = Journal(tmp_path / "state")
    state = journal.load()
    assert journal.ok, "nothing in it reads as corrupt"
    assert state.counts == {
        CountKey("0", "GPU-0000", "13", "application", "restart_app", "", ""): 1.0,
        CountKey("1", "GPU-1111", "48", "hardware", "workflow_xid_48", "", ""): 1.0,
        CountKey("1", "GPU-1111", "31", "application", "restart_app", "", ""): 1.0,
        CountKey("0", "GPU-0000", "79", "hardware", "reset_gpu", "ml", "trainer"): 1.0,
    }
    # That version kept every class per GPU; only hardware Xids are counted per GPU now.
    assert state.expired == {("", "", "application"): 1.0}
    assert state.sxid_counts == {("0", "0000:05:00.0", "12028", "non_fatal"): 1.0}
    assert {uuid: set(reasons) for uuid, reasons in state.latches.items()} == {
        "GPU-1111": {"hardware_xid"}
    }
    assert (state.boot_id, state.kmsg_seq, state.kmsg_offset) == ("boot-1", 103, 1799990000.0)
    assert (state.kmsg_file, state.kmsg_file_pos) == ("64768:1234", 4096)
    assert state.kmsg_file_hash == "8661a7370dc248f3"
    assert state.kmsg_mark == [5000000, "abc123", 0]
    first = state.recent[0]
    assert first.channels == {"kmsg", "nvml"}, "the duplicate added its channel"
    assert [r.xid for r in state.recent] == [13, 48, 31, 79, 13], "raw code, else the label's"
    assert state.op_number == 14


@pytest.mark.parametrize("line", LINES, ids=[json.loads(line)["op"] for line in LINES])
def test_each_op_is_written_back_as_the_same_bytes(line: str) -> None:
    number, op = decode(json.loads(line))
    assert json.dumps(encode(op, number), separators=(",", ":")) == line


def test_ops_are_typed_in_memory() -> None:
    _, count = decode(json.loads(LINES[0]))
    assert isinstance(count, Count)
    assert count.origin.position == KmsgPosition("boot-1", 100, 1799990000.0, None, None)
    assert count.origin.position.seq == 100
    assert count.origin.mark == KmsgMark(5000000, "abc123", 0)
    _, dup = decode(json.loads(LINES[1]))
    assert dup == Duplicate(target=1, channel="nvml")


@pytest.mark.parametrize(
    "record",
    [{"op": "nonsense"}, {"op": "count", "l": ["too", "few"]}, {"op": "latch", "u": "x"}, []],
)
def test_a_malformed_record_is_a_bad_op(record: object) -> None:
    with pytest.raises(BadOp):
        decode(record)  # type: ignore[arg-type]
