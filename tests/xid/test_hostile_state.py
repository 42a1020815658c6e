"""A state directory others tampered with: planted symlinks, loose permissions, a torn line of
hundreds of megabytes, values no exporter writes. The exporter must neither follow nor trust
them: what fails is left out and counted, and nothing outside the directory is touched."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpu_exporter.xid import XidCore, load_classifier
from gpu_exporter.xid.core import SOURCE_KMSG, Observation
from gpu_exporter.xid.journal import LOG_NAME, MAX_OP_BYTES, SNAPSHOT_NAME, Journal
from gpu_exporter.xid.ops import CountKey

from .conftest import GPU0, KmsgFile, Make, value, wait_until, xid_count

XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE"
SECRET = "root:x:0:0:precious\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the state directory that a planted link points at."""
    path = tmp_path / "victim"
    path.write_text(SECRET)
    return path


def plant(state_dir: Path, name: str, target: Path) -> None:
    state_dir.mkdir(mode=0o700)
    (state_dir / name).symlink_to(target)


def untouched(victim: Path) -> bool:
    return victim.read_text() == SECRET


def is_link(path: Path) -> bool:
    return path.is_symlink()


@pytest.mark.parametrize("planted", [LOG_NAME, SNAPSHOT_NAME, f".{SNAPSHOT_NAME}.tmp"])
async def test_a_planted_symlink_is_never_followed(
    make_subsystem: Make, kmsg: KmsgFile, state_dir: Path, victim: Path, planted: str
) -> None:
    plant(state_dir, planted, victim)
    kmsg.write(XID48)
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)
        kmsg.write(XID48)
        await wait_until(lambda: xid_count(xid) == 2)
    finally:
        await xid.stop()
    assert untouched(victim), f"the target of a planted {planted} was written"
    assert not is_link(state_dir / planted), "the link is still in use"
    again = make_subsystem()  # and the journal works: the counts survive a restart
    await again.start()
    try:
        await wait_until(lambda: xid_count(again) == 2)
    finally:
        await again.stop()


async def test_a_state_dir_others_may_write_is_refused(
    make_subsystem: Make, kmsg: KmsgFile, state_dir: Path
) -> None:
    os.mkdir(state_dir)
    os.chmod(state_dir, 0o777)
    kmsg.write(XID48)
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)  # counting goes on, in memory
        assert value(xid, "gpu_exporter_state_journal_ok") == 0
        assert value(xid, "gpu_exporter_state_journal_errors_total", operation="load") == 1
    finally:
        await xid.stop()
    assert os.listdir(state_dir) == [], "wrote into a directory others can write"


def test_a_state_dir_that_is_a_symlink_is_refused(tmp_path: Path, state_dir: Path) -> None:
    """The link could be swapped for one to any directory on the node: the journal would write
    its files there as root. So the directory itself, like every file in it, is never reached
    through a link."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    state_dir.symlink_to(target, target_is_directory=True)
    core, journal = load(state_dir)
    core.observe([xid48_from_kmsg()])
    assert sum(core.published.counts.values()) == 1, "counting goes on, in memory"
    assert not core.published.journal_ok
    assert journal.errors["load"] == 1
    assert os.listdir(target) == [], "wrote through a symlinked state directory"


def test_an_op_log_removed_under_a_running_journal_is_written_again_whole(
    state_dir: Path,
) -> None:
    core, journal = load(state_dir)
    core.observe([xid48_from_kmsg(seq=1)])
    (state_dir / LOG_NAME).unlink()
    core.observe([xid48_from_kmsg(seq=2)])
    assert core.published.journal_ok, "the whole state was written at once"
    assert journal.errors["append"] == 1, "the lost op log is counted"
    again, _ = load(state_dir)
    assert sum(again.published.counts.values()) == 2


def xid48_from_kmsg(seq: int = 1) -> Observation:
    return Observation(
        source=SOURCE_KMSG,
        channel="kmsg",
        xid=48,
        when=1000.0 + seq,
        device=GPU0,
        gpu_uuid=GPU0.uuid,
        bus_id="0000:18:00",
        kmsg=("boot-1", seq, 0.0, None, None),
    )


def load(state_dir: Path) -> tuple[XidCore, Journal]:
    journal = Journal(state_dir)
    core = XidCore(load_classifier(), journal)
    core.load("boot-1")
    return core, journal


def test_a_huge_torn_line_is_skipped_without_holding_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    count = {"op": "count", "n": 1, "l": ["0", "GPU-0", "48", "hardware", "reset_gpu", "", ""],
             "w": 1.0, "r": [1, "GPU-0", ["kmsg"]], "k": None}  # fmt: skip
    with (state / LOG_NAME).open("wb") as out:
        out.write(json.dumps(count).encode() + b"\n")
        out.write(b'{"op": "count", "x": "' + b"A" * (32 * 2**20))  # 32 MiB, no newline
    tracemalloc.start()
    try:
        core, journal = load(state)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.0f} MiB to read past a 32 MiB line"
    assert sum(core.published.counts.values()) == 1
    assert journal.errors["load"] == 1
    assert list(state.glob(f"{LOG_NAME}.corrupt-*")), "the damaged journal is not kept aside"


def test_an_overlong_line_in_the_middle_is_left_out_and_the_rest_read(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    latch = {"op": "latch", "u": "GPU-0", "g": "0", "why": "device_lost", "on": True, "t": 1.0}
    boot = json.dumps({"op": "boot", "n": 1, "b": "boot-1"}).encode()
    lines = [boot, b"x" * (MAX_OP_BYTES + 10), json.dumps({**latch, "n": 3}).encode()]
    (state / LOG_NAME).write_bytes(b"\n".join(lines) + b"\n")
    core, journal = load(state)
    assert core.published.latches == (("GPU-0", "0", "device_lost"),)
    assert journal.errors["load"] == 1


def snapshot(**tables: object) -> dict[str, object]:
    return {"version": 1, "n": 0, "boot_id": "boot-1", "kmsg_seq": -1, "kmsg_offset": None,
            "kmsg_file": "", "kmsg_file_pos": -1, "next_id": 1, "counts": [],
            "last_seen": [], "latches": [], "recent": [], **tables}  # fmt: skip


LABELS = ["0", "GPU-0", "48", "hardware", "reset_gpu", "", ""]


def test_tampered_values_are_left_out_and_counted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    counts = [
        [*LABELS, 3.0],  # the one good row
        [*LABELS[:2], "13", "application", "restart_app", "", "", -5],
        [*LABELS[:2], "31", "application", "restart_app", "", "", float("nan")],
        [*LABELS[:2], "43", "informational", "ignore", "", "", float("inf")],
        [*LABELS[:2], "94", "catastrophic", "x", "", "", 1.0],  # no such class
        [*LABELS[:2], {"a": 1}, "hardware", "x", "", "", 1.0],  # not a string
    ]
    (state / SNAPSHOT_NAME).write_text(json.dumps(snapshot(counts=counts)))
    ops = [
        {"op": "boot", "n": 1, "b": {"id": "x"}},
        {"op": "count", "n": 2, "l": [*LABELS[:3], "bogus", "", "", ""], "w": 1.0,
         "r": [5, "GPU-0", ["kmsg"]]},
        {"op": "count", "n": 3, "l": LABELS, "w": float("inf"), "r": [6, "GPU-0", ["kmsg"]]},
        {"op": "latch", "n": 4, "u": "GPU-0", "why": "tired", "on": True, "g": "0", "t": 1.0},
        {"op": "count", "n": 5, "l": LABELS, "w": 2.0, "r": [7, "GPU-0", ["kmsg"]]},
    ]  # fmt: skip
    (state / LOG_NAME).write_text("".join(json.dumps(op) + "\n" for op in ops))
    core, journal = load(state)
    assert dict(core.published.counts) == {CountKey(*LABELS): 4.0}, "a tampered value was served"
    assert core.published.latches == ()
    assert journal.errors["load"] == 5 + 4
    assert list(state.glob(f"{SNAPSHOT_NAME}.corrupt-*"))
    assert list(state.glob(f"{LOG_NAME}.corrupt-*"))
    again, journal = load(state)  # rewritten clean at once
    assert dict(again.published.counts) == {CountKey(*LABELS): 4.0}
    assert journal.errors["load"] == 0


def test_files_stay_private(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    load(state)
    assert (state.stat().st_mode & 0o777) == 0o700
    for name in (LOG_NAME, SNAPSHOT_NAME):
        assert (os.stat(state / name).st_mode & 0o777) == 0o600


def latch_line(number: int, uuid: str, gpu: str, reason: str) -> bytes:
    latch = {"op": "latch", "n": number, "u": uuid, "g": gpu, "why": reason, "on": True, "t": 1.0}
    return json.dumps(latch).encode()


async def test_latches_for_gpus_the_node_does_not_have_are_dropped_at_load(
    make_subsystem: Make, state_dir: Path
) -> None:
    """A tampered journal could recommend draining a GPU that does not exist (and hide among
    those latches); only the node's GPUs, and the index of one lost since before the start, keep
    theirs."""
    os.mkdir(state_dir, 0o700)
    lines = [
        json.dumps({"op": "boot", "n": 1, "b": "boot-1"}).encode(),
        latch_line(2, "GPU-zzz", "9", "hardware_xid"),  # no such GPU, no such index
        latch_line(3, "GPU-zzz", "0", "device_lost"),  # index 0 is GPU-0000
        latch_line(4, GPU0.uuid, "0", "row_remap_failure"),
        latch_line(5, "GPU-2222", "2", "device_lost"),  # GPU 2 has not answered since the start
    ]
    (state_dir / LOG_NAME).write_bytes(b"\n".join(lines) + b"\n")
    with capture_logs() as logs:
        xid = make_subsystem(kmsg_path=None, unidentified_lost=lambda: [2])
        await xid.start()
    try:
        assert sorted(xid.core.published.latches) == [
            (GPU0.uuid, "0", "row_remap_failure"),
            ("GPU-2222", "2", "device_lost"),
        ]
        assert value(xid, "gpu_drain_recommended", uuid="GPU-zzz", reason="hardware_xid") is None
        assert value(xid, "gpu_exporter_state_journal_errors_total", operation="load") == 2
        assert value(xid, "gpu_exporter_state_journal_ok") == 1, "rewritten without them at once"
    finally:
        await xid.stop()
    dropped = [log for log in logs if log["event"].startswith("journal drain latches name GPUs")]
    assert [log["dropped"] for log in dropped] == [2], "one line for the whole load"
    again = make_subsystem(kmsg_path=None, unidentified_lost=lambda: [2])
    await again.start()
    try:
        assert value(again, "gpu_exporter_state_journal_errors_total", operation="load") == 0
        assert len(again.core.published.latches) == 2
    finally:
        await again.stop()
