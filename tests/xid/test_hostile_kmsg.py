"""A kernel-log file or device that is rotated, lied to or flooded: truncation (copytruncate) and
replacement, userspace records posing as the driver, lines without an end."""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from pathlib import Path

import pytest

from gpu_exporter.xid.lines import MAX_RECORD, LineSplitter

from .conftest import KmsgFile, Make, caught_up, drain, value, wait_until, xid_count

XID13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics SM Warp Exception"
XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE"
XID31 = "NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=x, MMU Fault"


async def three_counted_then_stopped(make_subsystem: Make, kmsg: KmsgFile) -> None:
    """An exporter's life before the file is tampered with: three Xids read, the offset saved."""
    for _ in range(3):
        kmsg.write(XID13)
    first = make_subsystem()
    await first.start()
    await wait_until(lambda: xid_count(first) == 3)
    await first.stop()


def truncate(kmsg: KmsgFile) -> None:
    """What logrotate's copytruncate does: the same inode, emptied in place."""
    os.truncate(kmsg.path, 0)


async def test_records_written_after_a_truncation_while_running_are_counted(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    for _ in range(3):
        kmsg.write(XID13)
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 3)
        inode = kmsg.path.stat().st_ino
        truncate(kmsg)
        kmsg.write(XID48)  # at an offset far below the saved one
        assert kmsg.path.stat().st_ino == inode
        await wait_until(lambda: xid_count(xid) == 4)
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1
        kmsg.write(XID31)
        await wait_until(lambda: xid_count(xid) == 5)
    finally:
        await xid.stop()


async def test_a_truncation_while_the_exporter_was_down_loses_no_xid(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    await three_counted_then_stopped(make_subsystem, kmsg)

    truncate(kmsg)
    kmsg.write(XID48)  # shorter than before: below the saved offset
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 4)
        assert value(second, "gpu_xid_errors_total", xid="48") == 1
        assert value(second, "gpu_xid_errors_total", xid="13") == 3, "history recounted"
    finally:
        await second.stop()


async def test_a_file_rewritten_past_the_saved_offset_is_read_as_new(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write(XID13)
    first = make_subsystem()
    await first.start()
    await wait_until(lambda: xid_count(first) == 1)
    await first.stop()

    # Truncated, then more written than before: the size alone cannot tell.
    truncate(kmsg)
    for _ in range(4):
        kmsg.write(XID31)
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 5)
        assert value(second, "gpu_xid_errors_total", xid="31") == 4
        await caught_up(second)
    finally:
        await second.stop()
    # ... and the next start trusts the offset again: nothing counted twice.
    third = make_subsystem()
    await third.start()
    try:
        await caught_up(third)
        assert xid_count(third) == 5
    finally:
        await third.stop()


async def test_a_replaced_file_with_lower_sequence_numbers_is_read_as_new(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    await three_counted_then_stopped(make_subsystem, kmsg)

    kmsg.path.rename(kmsg.path.with_name("kmsg.1"))  # rotated by rename
    fresh = KmsgFile(kmsg.path, first_seq=1)  # a new file, its numbers start again
    fresh.write(XID48)
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 4)
        assert value(second, "gpu_xid_errors_total", xid="48") == 1
    finally:
        await second.stop()


async def test_userspace_records_posing_as_the_driver_are_not_counted(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    xid = make_subsystem()
    await xid.start()
    try:
        await caught_up(xid)
        # What `echo "<3>NVRM: Xid ..." > /dev/kmsg` produces: the kernel sets LOG_USER (1).
        kmsg.write(XID48, prefix=(1 << 3) | 3)
        kmsg.write("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Fatal, x", prefix=14)
        kmsg.write("systemd[1]: started something", prefix=(3 << 3) | 6)  # not Xid-like
        kmsg.write(XID13)  # the kernel's own, facility 0
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_xid_errors_total", xid="13") == 1
        assert value(xid, "gpu_xid_errors_total", xid="48") is None, "a spoofed Xid counted"
        assert drain(xid, "hardware_xid", uuid="GPU-0000") == 0
        assert value(xid, "gpu_exporter_kmsg_ignored_records_total", reason="not_kernel") == 2
        assert value(xid, "gpu_nvswitch_sxid_errors_total", sxid="12028") is None
    finally:
        await xid.stop()


async def test_a_line_without_an_end_is_dropped_and_the_xid_behind_it_is_counted(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    xid = make_subsystem()
    await xid.start()
    try:
        await caught_up(xid)
        with kmsg.path.open("ab") as out:
            out.write(b"3,1,1,-;" + b"A" * (8 * 1024 * 1024))  # 8 MiB, no newline yet
        await wait_until(
            lambda: value(xid, "gpu_exporter_kmsg_ignored_records_total", reason="oversized") == 1
        )
        with kmsg.path.open("ab") as out:
            out.write(b"B" * 100_000 + b"\n")  # its end: still the same line
        kmsg.write(XID48)
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1
        assert value(xid, "gpu_exporter_kmsg_ignored_records_total", reason="oversized") == 1
    finally:
        await xid.stop()


def test_line_splitter_keeps_offsets_and_bounds_memory() -> None:
    dropped: list[int] = []
    lines = LineSplitter(dropped.append, limit=10)
    assert lines.feed(b"one\ntw") == [(b"one", 4)]
    assert lines.feed(b"o\n" + b"x" * 25) == [(b"two", 8)]
    assert dropped == [25]  # dropped as soon as it is too long, not when it ends
    assert lines.feed(b"y" * 1000) == []
    assert lines.feed(b"z\nthree\n") == [(b"three", 8 + 25 + 1000 + 2 + 6)]
    assert lines.feed(b"a" * 11 + b"\nok\n") == [(b"ok", lines.position)]
    assert dropped == [25, 11]


def test_a_long_line_is_never_joined_whole() -> None:
    """64 MiB of one line in 64 KiB chunks: what is held stays under the limit, so each chunk is
    looked at once (joining every chunk onto everything before it took 50 s and 390 MB)."""
    lines = LineSplitter(lambda _length: None)
    chunk = b"A" * 65_536
    tracemalloc.start()
    try:
        for _ in range(1024):
            assert lines.feed(chunk) == []
            assert len(lines._pending) <= MAX_RECORD
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 65_536 + 2 * MAX_RECORD, f"peak {peak} bytes while splitting"


@pytest.mark.skipif(not Path("/proc/version").exists(), reason="needs procfs")
async def test_a_pseudo_file_is_read_once_not_reopened_in_a_loop(
    make_subsystem: Make, capfd: pytest.CaptureFixture[str]
) -> None:
    xid = make_subsystem(kmsg_path=Path("/proc/version"))
    await xid.start()
    try:
        reader = xid._kmsg
        assert reader is not None
        for _ in range(4):  # eight reads to the end: each used to reopen the file and log
            assert await asyncio.to_thread(reader.wait_drained, 3.0)
        assert value(xid, "gpu_exporter_source_up", source="kmsg") == 1
    finally:
        await xid.stop()
    out = capfd.readouterr()
    reopened = (out.out + out.err).count("truncated or replaced")
    assert reopened <= 1, f"/proc/version reopened {reopened} times"
