"""The syslog(2) kernel-log source: READ_ALL line parsing, aligning successive whole-buffer reads,
record identity across restarts (marks), fallback selection, and the source end to end."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_exporter.xid import XidSubsystem
from gpu_exporter.xid.kmsg import Batch, KmsgReader
from gpu_exporter.xid.parser import parse_record, parse_syslog, parse_syslog_line, text_hash
from gpu_exporter.xid.state import XidState
from gpu_exporter.xid.syslog import MAX_OVERLAP_CANDIDATES, Klogctl, SyslogBuffer, overlap

from .conftest import (
    GPU0,
    Make,
    caught_up,
    drain,
    fail_next_observation,
    value,
    wait_until,
    xid_count,
)

XID13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics SM Warp Exception"
XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE"
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus."
SYSLOG = Path("syslog:")


def line(message: str, usec: int | None = None, prefix: int = 3) -> bytes:
    """One READ_ALL line as the kernel prints it."""
    if usec is None:
        return f"<{prefix}>{message}\n".encode()
    return f"<{prefix}>[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}] {message}\n".encode()


class FakeKlog:
    """The kernel ring buffer as syslog(2) READ_ALL shows it: appended to, oldest lines dropped."""

    def __init__(self, capacity: int = 10_000, timestamps: bool = True) -> None:
        self.lines: list[bytes] = []
        self.capacity = capacity
        self.timestamps = timestamps
        self.usec = 5_000_000
        self.reads = 0
        self.error: OSError | None = None
        self._lock = threading.Lock()

    def write(self, message: str, *, usec: int | None = None) -> None:
        with self._lock:
            self.usec = self.usec + 1000 if usec is None else usec
            self.lines.append(line(message, self.usec if self.timestamps else None))
            del self.lines[: max(0, len(self.lines) - self.capacity)]

    def drop_oldest(self, count: int) -> None:
        with self._lock:
            del self.lines[:count]

    def __call__(self) -> bytes:
        with self._lock:
            self.reads += 1
            if self.error is not None:
                raise self.error
            return b"".join(self.lines)


@pytest.fixture
def klog() -> FakeKlog:
    return FakeKlog()


@pytest.fixture
def make_syslog(make_subsystem: Make, klog: FakeKlog) -> Make:
    def make(**overrides: Any) -> XidSubsystem:
        params: dict[str, Any] = {"kmsg_path": SYSLOG, "syslog": klog, "syslog_poll": 0.02}
        params.update(overrides)
        return make_subsystem(**params)

    return make


# -- parsing READ_ALL lines ------------------------------------------------------------------


def test_line_with_timestamp_and_priority() -> None:
    record = parse_syslog_line(b"<3>[ 1234.567890] " + XID13.encode())
    assert record is not None
    assert (record.message, record.usec, record.priority, record.facility) == (
        XID13,
        1234567890,
        3,
        0,
    )
    assert record.seq is None


def test_line_without_timestamp_and_with_facility() -> None:
    record = parse_syslog_line(b"<14>user space said hi")  # facility 1 (user), level 6
    assert record is not None
    assert (record.message, record.usec, record.priority, record.facility) == (
        "user space said hi",
        None,
        6,
        1,
    )


def test_line_with_caller_id_and_wide_seconds() -> None:
    record = parse_syslog_line(b"<4>[1234567.000001][  T4242] " + XID48.encode())
    assert record is not None
    assert record.usec == 1234567_000001
    assert record.message == XID48
    only_caller = parse_syslog_line(b"<4>[    C3] hello")
    assert only_caller is not None
    assert (only_caller.usec, only_caller.message) == (None, "hello")


def test_line_without_prefix_is_a_continuation() -> None:
    assert parse_syslog_line(b"name=python, rest") is None
    records = parse_syslog(
        b"orphan fragment\n"
        + line("NVRM: Xid (PCI:0000:18:00): 13, pid=1, ", 10)
        + b"name=python, Graphics SM Warp Exception\n"
        + b"\n"
        + line("next", 11)
        + b"<3>[   0.000012] torn (no newline)"
    )
    messages = [record.message for record, _first in records]
    assert messages == [
        "orphan fragment",
        "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=python, Graphics SM Warp Exception",
        "next",
    ]
    orphan = records[0][0]
    assert (orphan.usec, orphan.priority) == (None, None)
    assert records[1][0].usec == 10
    assert records[1][1].startswith(b"<3>[    0.000010] NVRM")


def test_text_hash_agrees_between_kmsg_and_syslog() -> None:
    # /dev/kmsg escapes a multi-line record's newline; syslog(2) prints each line with a prefix.
    kmsg = parse_record(b"4,286,434570,-;caf\\xc3\\xa9 first\\x0asecond line\n")
    assert kmsg is not None
    lines = parse_syslog(line("caf\u00e9 first", 434570, 4) + line("second line", 434570, 4))
    assert kmsg.usec == lines[0][0].usec
    assert text_hash(kmsg.message) == text_hash(lines[0][0].message)
    assert text_hash("a") != text_hash("b")


# -- aligning successive reads -----------------------------------------------------------------


def new_messages(buffer: SyslogBuffer, data: bytes) -> list[str]:
    records, _marks, _lost = buffer.update(data)
    return [record.message for record in records]


def test_same_buffer_read_twice_is_new_once() -> None:
    data = line("a", 1) + line(XID13, 2)
    buffer = SyslogBuffer()
    assert new_messages(buffer, data) == ["a", XID13]
    assert new_messages(buffer, data) == []
    assert new_messages(buffer, data + line("b", 3)) == ["b"]
    assert new_messages(buffer, data + line("b", 3)) == []


def test_identical_text_at_different_times_is_new_each_time() -> None:
    buffer = SyslogBuffer()
    data = line(XID13, 1)
    assert new_messages(buffer, data) == [XID13]
    data += line(XID13, 2)
    assert new_messages(buffer, data) == [XID13]
    data += line(XID13, 3) + line(XID13, 4)
    assert new_messages(buffer, data) == [XID13, XID13]


def test_ring_buffer_rotation_yields_only_the_appended_lines() -> None:
    lines = [line(f"m{i}", i) for i in range(10)]
    buffer = SyslogBuffer()
    assert len(new_messages(buffer, b"".join(lines))) == 10
    # 3 oldest overwritten, 2 appended
    lines = [*lines[3:], line("m10", 10), line("m11", 11)]
    records, _marks, lost = buffer.update(b"".join(lines))
    assert [r.message for r in records] == ["m10", "m11"]
    assert not lost
    # everything overwritten between two reads: all is new, and the loss is reported
    records, _marks, lost = buffer.update(line("m20", 20) + line("m21", 21))
    assert [r.message for r in records] == ["m20", "m21"]
    assert lost
    # cleared (dmesg -C): nothing new, nothing lost
    assert buffer.update(b"") == ([], [], False)


def test_marks_count_identical_lines_in_the_buffer() -> None:
    buffer = SyslogBuffer()
    same = line(XID13, 7)
    _records, marks, _lost = buffer.update(same + line("x", 8) + same)
    digest = text_hash(XID13)
    assert marks == [(7, digest, 0), (8, text_hash("x"), 0), (7, digest, 1)]
    _records, marks, _lost = buffer.update(same + line("x", 8) + same + same)
    assert marks == [(7, digest, 2)]
    # the first copy rotates out: a new copy's occurrence counts only those still there, as a
    # fresh read (a restart) would number it
    _records, marks, _lost = buffer.update(line("x", 8) + same + same + same)
    assert marks == [(7, digest, 2)]
    assert SyslogBuffer().update(line("x", 8) + same + same + same)[1][-1] == (7, digest, 2)


def test_no_timestamps_many_identical_lines_rotate_without_recounting() -> None:
    same = line(XID13)
    count = MAX_OVERLAP_CANDIDATES * 3
    buffer = SyslogBuffer()
    assert len(new_messages(buffer, same * count)) == count
    # half rotated out, one different line and two copies appended
    rotated = same * (count // 2) + line("other") + same * 2
    assert new_messages(buffer, rotated) == ["other", XID13, XID13]
    assert new_messages(buffer, rotated) == []


def brute_overlap(previous: bytes, data: bytes) -> tuple[int, int]:
    starts = [0] + [i + 1 for i, byte in enumerate(previous) if byte == 0x0A]
    for start in starts:
        rest = previous[start:]
        if rest and data.startswith(rest):
            return start, len(rest)
    return len(previous), 0


@given(
    old=st.lists(st.sampled_from([b"a", b"b", b"cc"]), max_size=12),
    dropped=st.integers(0, 12),
    appended=st.lists(st.sampled_from([b"a", b"b", b"d"]), max_size=6),
)
def test_overlap_is_the_longest_line_aligned_one(
    old: list[bytes], dropped: int, appended: list[bytes]
) -> None:
    previous = b"".join(x + b"\n" for x in old)
    data = b"".join(x + b"\n" for x in old[dropped:] + appended)
    expected = brute_overlap(previous, data) if previous else (0, 0)
    assert overlap(previous, data) == expected
    from gpu_exporter.xid.syslog import _overlap_by_lines

    if previous:
        assert _overlap_by_lines(previous, data) == expected


# -- identity across restarts ----------------------------------------------------------------


def replay_state(mark: list[Any] | None, kmsg_seq: int = -1) -> XidState:
    return XidState(boot_id="boot-1", kmsg_seq=kmsg_seq, kmsg_mark=mark)


def test_replay_resumes_after_the_stored_mark() -> None:
    marks = [(1, "a", 0), (2, "b", 0), (3, "c", 0), (3, "c", 1), (4, "d", 0)]
    assert replay_state([3, "c", 0]).replay_start("boot-1", marks) == 3
    assert replay_state([3, "c", 1]).replay_start("boot-1", marks) == 4
    # the marked record was overwritten: what is newer by timestamp is new
    assert replay_state([2, "x", 0]).replay_start("boot-1", marks[2:]) == 0
    assert replay_state([3, "c", 5]).replay_start("boot-1", marks) == 4
    # another boot, or nothing handled in this one: all is new
    assert replay_state([3, "c", 0]).replay_start("boot-2", marks) == 0
    assert replay_state(None).replay_start("boot-1", marks) == 0
    # /dev/kmsg was read in this boot without marks: nothing can be aligned, nothing recounted
    assert replay_state(None, kmsg_seq=40).replay_start("boot-1", marks) == len(marks)
    # no timestamps and the mark is gone: history cannot be told from news
    assert replay_state([None, "z", 0]).replay_start("boot-1", [(None, "a", 0)]) == 1
    assert (
        replay_state([None, "a", 0]).replay_start("boot-1", [(None, "a", 0), (None, "b", 0)]) == 1
    )


def test_kmsg_after_a_syslog_run_skips_what_the_mark_covers() -> None:
    state = replay_state([3_000, "c", 0], kmsg_seq=10)
    seen = state.kmsg_seen
    assert seen("boot-1", 10, None, None, 1_000, None)  # by sequence number
    assert seen("boot-1", 11, None, None, 2_000, None)  # before the mark
    assert seen("boot-1", 12, None, None, 3_000, lambda: "c")  # the mark itself
    assert not seen("boot-1", 13, None, None, 3_000, lambda: "d")
    assert not seen("boot-1", 14, None, None, 4_000, None)
    assert not seen("boot-1", 11, "1:2", 5, 2_000, None)  # a regular file: by offset only


def test_marks_survive_the_journal_and_clear_on_a_new_boot() -> None:
    state = XidState(boot_id="boot-1")
    count = {"op": "count", "l": ["0", "u", "13", "application", "restart_app", "", ""], "w": 1.0}
    state.apply({**count, "r": [1, "u", ["kmsg"]], "k": ["boot-1", None, 0.0, None, None],
                 "m": [5, "h", 0]})  # fmt: skip
    assert state.kmsg_mark == [5, "h", 0]
    assert XidState.from_snapshot(state.to_snapshot()).kmsg_mark == [5, "h", 0]
    old = state.to_snapshot()
    del old["kmsg_mark"]  # written by an exporter without marks
    assert XidState.from_snapshot(old).kmsg_mark is None
    state.apply({"op": "boot", "b": "boot-2"})
    assert state.kmsg_mark is None


# -- fallback selection ------------------------------------------------------------------------


def denied(errno_: int) -> Callable[[Path, int], int]:
    def opener(path: Path, flags: int) -> int:
        raise OSError(errno_, os.strerror(errno_), str(path))

    return opener


def run_reader(path: Path, opener: Callable[[Path, int], int], klog: FakeKlog) -> KmsgReader:
    batches: list[Batch] = []
    reader = KmsgReader(
        path, batches.append, on_up=lambda up: None, on_lost=lambda n: None,
        syslog=klog, syslog_poll=0.01, opener=opener,
    )  # fmt: skip
    reader.batches = batches  # type: ignore[attr-defined]
    reader.start()
    return reader


@pytest.mark.parametrize("code", [errno.EPERM, errno.EACCES, errno.ENOENT])
def test_denied_dev_kmsg_falls_back_to_syslog(klog: FakeKlog, code: int) -> None:
    klog.write(XID13)
    reader = run_reader(Path("/dev/kmsg"), denied(code), klog)
    try:
        assert reader.wait_drained(3.0)
        assert reader.mechanism == "syslog"
        assert reader.syslog_fallback
        batches = reader.batches  # type: ignore[attr-defined]
        assert [r.message for b in batches for r in b.records] == [XID13]
        assert batches[0].marks == [(klog.usec, text_hash(XID13), 0)]
        assert not batches[0].live
    finally:
        reader.stop()


def test_other_paths_and_errors_do_not_fall_back(klog: FakeKlog, tmp_path: Path) -> None:
    klog.write(XID13)
    for path, opener in (
        (tmp_path / "kmsg", denied(errno.EPERM)),  # a file: exactly as before
        (Path("/dev/kmsg"), denied(errno.EIO)),
    ):
        reader = run_reader(path, opener, klog)
        assert not reader.wait_drained(0.2)
        reader.stop()
        assert reader.mechanism is None
    assert klog.reads == 0


async def test_syslog_denied_too_keeps_the_source_down_then_recovers(
    make_syslog: Make, klog: FakeKlog
) -> None:
    klog.error = PermissionError(errno.EPERM, "Operation not permitted")
    xid = make_syslog()
    await xid.start()
    try:
        await wait_until(lambda: klog.reads >= 1)
        assert value(xid, "gpu_exporter_source_up", source="kmsg") == 0
        assert xid._kmsg is not None
        assert xid._kmsg.mechanism is None
    finally:
        await xid.stop()


# -- end to end --------------------------------------------------------------------------------


async def test_history_then_live_lines_each_count_once(make_syslog: Make, klog: FakeKlog) -> None:
    klog.write("unrelated")
    klog.write(XID13)
    xid = make_syslog()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_exporter_source_up", source="kmsg") == 1
        reads = klog.reads
        await caught_up(xid)
        await caught_up(xid)  # the same buffer, read again and again
        assert klog.reads > reads
        assert xid_count(xid) == 1
        klog.write(XID13)  # same text, later: another Xid
        klog.write(XID48)
        await wait_until(lambda: xid_count(xid) == 3)
        assert value(xid, "gpu_xid_errors_total", xid="13", pod="") == 2
        assert drain(xid, "hardware_xid", gpu="0") == 1
        stamp = value(xid, "gpu_xid_last_timestamp_seconds", gpu="0", xid="48")
        assert stamp is not None
        assert abs(stamp - time.time()) < 5
    finally:
        await xid.stop()


async def test_restart_counts_what_happened_while_down_and_nothing_twice(
    make_syslog: Make, klog: FakeKlog
) -> None:
    for _ in range(3):
        klog.write(XID13)
    first = make_syslog()
    await first.start()
    await wait_until(lambda: xid_count(first) == 3)
    klog.write(XID13)
    await wait_until(lambda: xid_count(first) == 4)
    klog.write("a line after the last Xid")
    await caught_up(first)
    await first.stop()

    klog.write(XID13)  # while the exporter is down
    second = make_syslog()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 5)
        klog.write(XID48)
        await wait_until(lambda: xid_count(second) == 6)
    finally:
        await second.stop()

    # While down again, the ring buffer overwrites everything read so far, the mark included.
    klog.drop_oldest(len(klog.lines))
    klog.write(XID13)
    third = make_syslog()
    await third.start()
    try:
        await wait_until(lambda: xid_count(third) == 7)
        await caught_up(third)
        assert value(third, "gpu_xid_errors_total", xid="13") == 6
        assert value(third, "gpu_xid_errors_total", xid="48") == 1
    finally:
        await third.stop()


async def test_a_failed_handler_rereads_the_buffer_without_recounting(
    make_syslog: Make, klog: FakeKlog
) -> None:
    klog.write(XID48)
    xid = make_syslog()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)
        failures = fail_next_observation(xid)
        klog.write(XID13)
        await wait_until(lambda: xid_count(xid) == 2)  # after the reader's restart
        await caught_up(xid)
        assert failures == [1]
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1
        assert value(xid, "gpu_xid_errors_total", xid="13") == 1
    finally:
        await xid.stop()


async def test_rotation_while_running_never_recounts(make_syslog: Make) -> None:
    klog = FakeKlog(capacity=5)
    xid = make_syslog(syslog=klog)
    await xid.start()
    try:
        await caught_up(xid)
        for round_ in range(1, 5):
            for _ in range(3):
                klog.write("filler")
            klog.write(XID13)  # the buffer keeps only the last 5 lines
            await wait_until(lambda round_=round_: xid_count(xid) == round_)  # type: ignore[misc]
            await caught_up(xid)
        assert xid_count(xid) == 4
    finally:
        await xid.stop()


async def test_nvml_event_gets_a_prompt_read_and_the_kernel_line_wins(
    make_syslog: Make, klog: FakeKlog
) -> None:
    from .test_subsystem import PidHolder

    # Polled only every minute: only the read the NVML thread asks for can see the line in time.
    xid = make_syslog(holders=lambda: PidHolder(), syslog_poll=60.0, nvml_events=True)
    await xid.start()
    try:
        await wait_until(lambda: value(xid, "gpu_exporter_source_up", source="kmsg") == 1)
        klog.write(XID13)
        started = time.monotonic()
        await asyncio.to_thread(xid._on_nvml_xid, 13, GPU0, None, time.time())
        assert time.monotonic() - started < 1.0
        assert value(xid, "gpu_xid_errors_total", xid="13", pod="faulting-pod") == 1
        assert value(xid, "gpu_exporter_xid_duplicates_total", source="nvml_events") == 1
    finally:
        started = time.monotonic()
        await xid.stop()
        assert time.monotonic() - started < 1.0  # a stop does not wait out the poll


async def test_switch_from_dev_kmsg_to_syslog_resumes_at_the_same_record(
    make_subsystem: Make, make_syslog: Make, klog: FakeKlog, tmp_path: Path
) -> None:
    # A FIFO stands in for /dev/kmsg (records with sequence numbers, no file offsets).
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    first = make_subsystem(kmsg_path=fifo)
    await first.start()
    writer = -1
    try:
        await wait_until(lambda: value(first, "gpu_exporter_source_up", source="kmsg") == 1.0)
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        klog.write(XID13, usec=7_000_000)
        klog.write(XID48, usec=8_000_000)
        os.write(writer, f"3,1,7000000,-;{XID13}\n3,2,8000000,-;{XID48}\n".encode())
        await wait_until(lambda: xid_count(first) == 2)
    finally:
        if writer >= 0:
            os.close(writer)
        await first.stop()

    klog.write(XID13, usec=9_000_000)  # while down; now the device is denied: syslog(2)
    second = make_syslog()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 3)
        await caught_up(second)
        assert value(second, "gpu_xid_errors_total", xid="13") == 2
    finally:
        await second.stop()


def test_real_klogctl_reads_the_kernel_log() -> None:
    try:
        data = Klogctl()()
    except OSError as exc:
        pytest.skip(f"syslog(2) not allowed here: {exc}")
    records = SyslogBuffer().update(data)[0]
    if data:
        assert records, "READ_ALL text that parses to no record"
        assert any(record.priority is not None for record in records)
