"""XidSubsystem end to end on kmsg-format files: latency, mapping, restarts, dedup, drains."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from gpu_exporter.xid import XidSubsystem

from .conftest import (
    GPU0,
    GPU1,
    MIG1,
    KmsgFile,
    Make,
    caught_up,
    drain,
    exposition,
    fail_next_observation,
    fake_devices,
    value,
    wait_until,
    xid_count,
)

XID13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics SM Warp Exception"
XID48 = "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE"


async def test_live_record_appears_within_a_second(make_subsystem: Make, kmsg: KmsgFile) -> None:
    xid = make_subsystem()
    await xid.start()
    try:
        await caught_up(xid)
        written = time.monotonic()
        kmsg.write(XID13)
        await wait_until(lambda: xid_count(xid) == 1, within=1.0)
        assert time.monotonic() - written < 1.0
        labels = dict(gpu="0", uuid=GPU0.uuid, xid="13", namespace="", pod="")
        assert value(xid, "gpu_xid_errors_total", **labels, **{"class": "application"}) == 1
        assert 'action="restart_app"' in exposition(xid)
        assert value(xid, "gpu_xid_last_timestamp_seconds", gpu="0", xid="13") is not None
        # Counters for the other classes are published at 0 so increase() sees a first Xid:
        # hardware per GPU, the other classes once per node (gpu and uuid empty).
        assert value(xid, "gpu_xid_class_errors_total", gpu="0", **{"class": "hardware"}) == 0
        node_wide = {"gpu": "", "uuid": "", "class": "application"}
        assert value(xid, "gpu_xid_class_errors_total", **node_wide) == 1
        assert value(xid, "gpu_xid_class_errors_total", gpu="0", **{"class": "driver"}) is None
    finally:
        await xid.stop()


async def test_unknown_bus_id_and_unknown_code_are_counted(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write("NVRM: Xid (PCI:0000:99:00): 31, pid=1, name=x, MMU Fault")
    kmsg.write("NVRM: Xid (PCI:0000:18:00): 4242, something new")
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 2)
        assert value(xid, "gpu_xid_errors_total", gpu="", uuid="", xid="31") == 1
        assert value(xid, "gpu_xid_errors_total", xid="4242", **{"class": "unknown"}) == 1
    finally:
        await xid.stop()


async def test_mig_instance_and_domain_widths_map_to_devices(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write("NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, pid=9, name=t, MMU Fault")
    kmsg.write("NVRM: Xid (00000000:3B:00): 43, Ch 00000008")
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 2)
        assert value(xid, "gpu_xid_errors_total", gpu="1", uuid=MIG1.uuid, xid="31") == 1
        assert value(xid, "gpu_xid_errors_total", gpu="1", uuid=GPU1.uuid, xid="43") == 1
    finally:
        await xid.stop()


async def test_restart_counts_what_happened_while_down_and_nothing_twice(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    for _ in range(3):
        kmsg.write(XID13)
    first = make_subsystem()
    await first.start()
    await wait_until(lambda: xid_count(first) == 3)
    kmsg.write(XID13)
    await wait_until(lambda: xid_count(first) == 4)
    await first.stop()

    kmsg.write(XID13)  # while the exporter is down
    kmsg.write("NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=x, MMU Fault")
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 6)
        kmsg.write(XID13)
        await wait_until(lambda: xid_count(second) == 7)
        assert value(second, "gpu_xid_errors_total", xid="13") == 6
        assert value(second, "gpu_xid_errors_total", xid="31") == 1
    finally:
        await second.stop()


SXID_FATAL = "nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 24007, Fatal, Link 05 sourcetrack timeout"
SXID_NON_FATAL = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 PRIV error"
# What the driver prints after each recorded error, under the same code: details, not new SXids.
SXID_FATAL_DETAILS = [
    "nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 24007, Severity 1 Engine instance 05 "
    "Sub-engine instance 00",
    "nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 24007, Data {0x00000000, 0x00000001}",
]


def sxids(subsystem: XidSubsystem, **labels: str) -> float | None:
    return value(subsystem, "gpu_nvswitch_sxid_errors_total", **labels)


async def test_nvswitch_sxids_are_counted_once_across_restarts(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write(SXID_NON_FATAL)
    kmsg.write(XID13)
    kmsg.write(SXID_NON_FATAL)
    first = make_subsystem()
    await first.start()
    await wait_until(lambda: sxids(first, switch="0") == 2 and xid_count(first) == 1)
    assert sxids(first, pci_bus_id="0000:05:00.0", sxid="12028", severity="non_fatal") == 2
    await first.stop()

    for line in [SXID_FATAL, *SXID_FATAL_DETAILS]:  # while the exporter is down
        kmsg.write(line)
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: sxids(second, switch="3") == 1)
        for line in [SXID_FATAL, *SXID_FATAL_DETAILS]:
            kmsg.write(line)
        await wait_until(lambda: sxids(second, switch="3") == 2)
        await caught_up(second)
        assert sxids(second, switch="3", sxid="24007", severity="fatal") == 2, (
            "the Severity and Data lines after a report are part of it, not new SXids"
        )
        assert value(second, "gpu_exporter_xid_unparsed_lines_total") == 0
        fatal_at = value(second, "gpu_nvswitch_sxid_last_timestamp_seconds", switch="3")
        non_fatal_at = value(second, "gpu_nvswitch_sxid_last_timestamp_seconds", switch="0")
        assert fatal_at is not None
        assert non_fatal_at is not None
        assert fatal_at > non_fatal_at > 0, "each code's latest event time, as the kernel logs it"
        assert sxids(second, switch="0") == 2, "a restart must not count the replay again"
        assert xid_count(second) == 1
        assert value(second, "gpu_xid_class_errors_total", gpu="0", **{"class": "hardware"}) == 0, (
            "an NVSwitch error is not a GPU Xid"
        )
    finally:
        await second.stop()


async def test_an_sxid_line_that_cannot_be_parsed_is_counted(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): lost its code")
    kmsg.write(SXID_NON_FATAL)
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: sxids(xid) == 1)
        assert value(xid, "gpu_exporter_xid_unparsed_lines_total") == 1
    finally:
        await xid.stop()


async def test_kill_mid_stream_loses_nothing_and_counts_nothing_twice(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    first = make_subsystem()
    await first.start()
    for _ in range(20):
        kmsg.write(XID13)
    await wait_until(lambda: xid_count(first) >= 5)
    # kill -9: the reader thread dies wherever it is; nothing is flushed or closed.
    assert first._kmsg is not None
    first._kmsg.stop()
    for _ in range(5):
        kmsg.write(XID13)
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 25)
    finally:
        await second.stop()


async def test_same_xid_from_both_sources_counts_once(make_subsystem: Make, kmsg: KmsgFile) -> None:
    xid = make_subsystem()
    await xid.start()
    try:
        await caught_up(xid)
        # kernel log first, then NVML
        kmsg.write(XID48)
        await wait_until(lambda: xid_count(xid) == 1)
        await asyncio.to_thread(xid._on_nvml_xid, 48, GPU0, None, time.time())
        # NVML first (the reader is told to drain first; here the line comes a bit later)
        await asyncio.to_thread(xid._on_nvml_xid, 13, GPU0, None, time.time())
        kmsg.write(XID13)
        await wait_until(
            lambda: value(xid, "gpu_exporter_xid_duplicates_total", source="kmsg") == 1
        )
        assert value(xid, "gpu_exporter_xid_duplicates_total", source="nvml_events") == 1
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1
        assert value(xid, "gpu_xid_errors_total", xid="13") == 1
        # A different code on the same GPU is a different event.
        await asyncio.to_thread(xid._on_nvml_xid, 31, GPU0, None, time.time())
        assert value(xid, "gpu_xid_errors_total", xid="31") == 1
    finally:
        await xid.stop()


async def test_nvml_event_waits_for_the_kernel_line_to_get_the_pid(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    xid = make_subsystem(holders=lambda: PidHolder())
    await xid.start()
    try:
        await caught_up(xid)
        kmsg.write(XID13)  # the driver writes the line and raises the event together
        await asyncio.to_thread(xid._on_nvml_xid, 13, GPU0, None, time.time())
        assert value(xid, "gpu_xid_errors_total", xid="13", pod="faulting-pod") == 1
        assert value(xid, "gpu_exporter_xid_duplicates_total", source="nvml_events") == 1
    finally:
        await xid.stop()


async def test_nvml_twin_of_a_kernel_line_replayed_after_a_crash(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    now = time.time()
    first = make_subsystem(kmsg_path=None, clock=lambda: now)
    await first.start()
    await asyncio.to_thread(
        first._on_nvml_xid, 79, GPU0, None, now
    )  # counted from NVML; the exporter dies before
    await first.stop()  # reading the kernel line (same as a crash: ops are fsynced)
    # The kernel line has the same event time: usec since boot + (wall - uptime).
    kmsg.write("NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.", usec=10**9)
    second = make_subsystem(clock=lambda: now + 30, uptime=lambda: 1000.0 + 30)
    await second.start()
    try:
        await wait_until(
            lambda: value(second, "gpu_exporter_xid_duplicates_total", source="kmsg") == 1
        )
        assert value(second, "gpu_xid_errors_total", xid="79") == 1
    finally:
        await second.stop()


async def test_fallen_off_the_bus_report_and_xid_79_count_once(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.")
    kmsg.write("NVRM: The NVIDIA GPU 0000:3b:00.0")
    kmsg.write("NVRM: (PCI ID: 10de:2330) installed in this system has")
    kmsg.write("NVRM: fallen off the bus and is not responding to commands.")
    kmsg.write("NVRM: The NVIDIA GPU 0000:18:00.0")  # a report with no Xid line: counted as 79
    kmsg.write("NVRM: (PCI ID: 10de:2330) installed in this system has")
    kmsg.write("NVRM: fallen off the bus and is not responding to commands.")
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(
            lambda: value(xid, "gpu_exporter_xid_duplicates_total", source="kmsg") == 1
        )
        await wait_until(lambda: xid_count(xid) == 2)
        assert value(xid, "gpu_xid_errors_total", gpu="1", xid="79") == 1
        assert value(xid, "gpu_xid_errors_total", gpu="0", xid="79") == 1
    finally:
        await xid.stop()


async def test_drain_latch_survives_restart_and_clears_on_new_boot(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write(XID48)
    first = make_subsystem()
    await first.start()
    await wait_until(lambda: xid_count(first) == 1)
    assert drain(first, "hardware_xid", gpu="0") == 1
    assert drain(first, "hardware_xid", gpu="1") == 0
    await first.stop()

    second = make_subsystem()
    await second.start()
    assert drain(second, "hardware_xid", gpu="0") == 1
    await second.stop()

    kmsg.path.write_text("")  # a reboot empties the ring buffer
    rebooted = make_subsystem(boot_id="boot-2")
    await rebooted.start()
    try:
        assert drain(rebooted, "hardware_xid", gpu="0") == 0
        assert value(rebooted, "gpu_xid_errors_total", xid="48") == 1  # counters never go back
    finally:
        await rebooted.stop()


async def test_device_listener_and_remap_failure(make_subsystem: Make) -> None:
    xid = make_subsystem(kmsg_path=None)
    await xid.start()
    try:
        xid.note_remap_failure(MIG1)  # a MIG instance's failure drains its whole GPU
        xid.device_lost(GPU0)
        await wait_until(
            lambda: (
                drain(xid, "device_lost", gpu="0") == 1
                and drain(xid, "row_remap_failure", uuid=GPU1.uuid) == 1
            )
        )
        xid.device_recovered(GPU0)
        await wait_until(lambda: drain(xid, "device_lost", gpu="0") == 0)
        assert drain(xid, "row_remap_failure", uuid=GPU1.uuid) == 1
    finally:
        await xid.stop()


async def test_a_lost_gpu_that_answers_after_a_restart_was_reset_while_the_exporter_was_down(
    make_subsystem: Make,
) -> None:
    first = make_subsystem(kmsg_path=None)
    await first.start()
    await asyncio.to_thread(first._on_nvml_xid, 48, GPU1, None, time.time())  # hardware
    first.device_lost(GPU0)
    first.device_lost(GPU1)
    first.note_remap_failure(GPU0)
    await wait_until(lambda: len(first.core.published.latches) == 4)
    await first.stop()  # e.g. stopped for a driver reload, which brings GPU 1 back

    still_lost = {GPU0.uuid}
    second = make_subsystem(
        kmsg_path=None,
        devices=lambda: [d for d in fake_devices() if d.gpu_uuid not in still_lost],
        unidentified_lost=lambda: [GPU0.index],  # as the sampler reports a GPU lost at start
    )
    await second.start()
    try:
        assert drain(second, "device_lost", uuid=GPU1.uuid) == 0
        assert drain(second, "hardware_xid", uuid=GPU1.uuid) == 0, (
            "a GPU that was lost and answers again was reset: all its latches clear"
        )
        assert drain(second, "device_lost", uuid=GPU0.uuid) == 1
        assert drain(second, "row_remap_failure", uuid=GPU0.uuid) == 1, (
            "a GPU that is still lost keeps its latches"
        )
    finally:
        await second.stop()


async def test_a_gpu_that_never_answered_gets_an_unnamed_drain(make_subsystem: Make) -> None:
    unidentified = [2]
    xid = make_subsystem(kmsg_path=None, unidentified_lost=lambda: unidentified)
    await xid.start()
    try:
        assert drain(xid, "device_lost", gpu="2", uuid="") == 1
        assert drain(xid, "hardware_xid", gpu="2", uuid="") == 0

        # A latch from earlier in this boot (journal) already names the GPU at that index.
        await asyncio.to_thread(xid.core.set_latch, "GPU-2222", "2", "hardware_xid")
        assert drain(xid, "hardware_xid", gpu="2") == 1
        assert drain(xid, "device_lost", uuid="") is None, (
            "a GPU already shown under its uuid must not be shown twice"
        )

        unidentified.clear()  # identified at last
        await asyncio.to_thread(xid.core.clear_latches, "GPU-2222", "gpu reset observed")
        assert drain(xid, "device_lost", gpu="2") is None
    finally:
        await xid.stop()


class PidHolder:
    """Allocation says team-a/trainer holds GPU 0; pid 4242 belongs to another pod (sharing)."""

    def holder(self, uuid: str, at_wall_time: float, pid: int | None) -> tuple[str, str] | None:
        if pid == 4242:
            return "team-b", "faulting-pod"
        if uuid == GPU0.uuid:
            return "team-a", "trainer"
        return None


async def test_attribution_pid_wins_over_allocation(make_subsystem: Make, kmsg: KmsgFile) -> None:
    kmsg.write(XID13)  # pid=4242
    kmsg.write("NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=x, MMU Fault")
    xid = make_subsystem(holders=lambda: PidHolder())
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 2)
        assert value(xid, "gpu_xid_errors_total", xid="13", namespace="team-b") == 1
        assert value(xid, "gpu_xid_errors_total", xid="31", pod="trainer") == 1
    finally:
        await xid.stop()


async def test_attribution_does_not_wait_for_the_event_loop(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    """The kernel-log reader reads the allocation's holder snapshot on its own thread: an Xid is
    attributed while the event loop is busy."""
    asked = threading.Event()

    def holders() -> PidHolder:
        asked.set()
        return PidHolder()

    xid = make_subsystem(holders=holders)
    await xid.start()
    try:
        await caught_up(xid)
        kmsg.write(XID13)
        # Held here, on the loop, until the reader has asked who holds the GPU.
        assert asked.wait(3.0), "the kernel-log reader waited on the event loop for the holder"
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_xid_errors_total", xid="13", pod="faulting-pod") == 1
    finally:
        await xid.stop()


async def test_failing_holder_lookup_does_not_lose_the_xid(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    class Broken:
        def holder(self, uuid: str, at_wall_time: float, pid: int | None) -> None:
            raise RuntimeError("allocation state not ready")

    kmsg.write(XID13)
    xid = make_subsystem(holders=lambda: Broken())
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_xid_errors_total", xid="13", pod="") == 1
    finally:
        await xid.stop()


async def test_missing_kmsg_then_created(make_subsystem: Make, tmp_path: Path) -> None:
    path = tmp_path / "later"
    xid = make_subsystem(kmsg_path=path)
    await xid.start()
    try:
        assert value(xid, "gpu_exporter_source_up", source="kmsg") == 0
        late = KmsgFile(path)
        late.write(XID13)
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_exporter_source_up", source="kmsg") == 1
    finally:
        await xid.stop()


async def test_plain_lines_without_kmsg_header(make_subsystem: Make, kmsg: KmsgFile) -> None:
    with kmsg.path.open("a") as out:
        out.write(XID13 + "\n")  # history without sequence numbers: cannot be de-duplicated
    xid = make_subsystem()
    await xid.start()
    try:
        await caught_up(xid)
        with kmsg.path.open("a") as out:
            out.write("[  12.3] " + XID48 + "\n")
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1
    finally:
        await xid.stop()


async def test_gaps_unparsed_lines_and_overrides(
    make_subsystem: Make, kmsg: KmsgFile, tmp_path: Path
) -> None:
    classes = tmp_path / "classes.yaml"
    classes.write_text("13: hardware\n")
    kmsg.write(XID13)
    kmsg.write("NVRM: Xid (garbled")
    xid = make_subsystem(classes_path=classes)
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)
        assert value(xid, "gpu_exporter_xid_unparsed_lines_total") == 1
        assert value(xid, "gpu_xid_errors_total", xid="13", **{"class": "hardware"}) == 1
    finally:
        await xid.stop()


async def test_fifo_and_sequence_gaps(make_subsystem: Make, tmp_path: Path) -> None:
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    xid = make_subsystem(kmsg_path=path)
    await xid.start()
    writer = -1
    try:
        await wait_until(lambda: value(xid, "gpu_exporter_source_up", source="kmsg") == 1.0)
        writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        records = [f"3,10,1000,-;{XID13}\n", f"3,16,2000,-;{XID48}\n"]  # 11..15 were lost
        os.write(writer, "".join(records).encode())
        await wait_until(lambda: xid_count(xid) == 2)
        assert value(xid, "gpu_exporter_kmsg_lost_records_total") == 5
    finally:
        if writer >= 0:
            os.close(writer)
        await xid.stop()


async def test_interleaved_writers_restart_by_file_offset(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    # A test harness and the simulator append to one file with their own sequence numbers.
    harness = KmsgFile(kmsg.path, first_seq=1)
    sim = KmsgFile(kmsg.path, first_seq=1200)
    sim.write(XID48)
    harness.write(XID13)
    first = make_subsystem()
    await first.start()
    await wait_until(lambda: xid_count(first) == 2)
    harness.write(XID13)  # live, seq 2 < 1200: still new
    await wait_until(lambda: xid_count(first) == 3)
    await first.stop()
    harness.write(XID13)  # while down
    second = make_subsystem()
    await second.start()
    try:
        await wait_until(lambda: xid_count(second) == 4)
        assert value(second, "gpu_xid_errors_total", xid="13") == 3
    finally:
        await second.stop()


async def test_on_change_hook_runs_on_the_loop(make_subsystem: Make, kmsg: KmsgFile) -> None:
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def on_change() -> None:
        assert asyncio.get_running_loop() is loop
        if xid_count(xid) == 1:
            changed.set()

    xid = make_subsystem(on_change=on_change)
    await xid.start()
    try:
        kmsg.write(XID13)
        await asyncio.wait_for(changed.wait(), 2.0)
    finally:
        await xid.stop()


async def test_a_failed_handler_reopens_the_log_without_recounting(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    kmsg.write(XID48)
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == 1)
        failures = fail_next_observation(xid)
        kmsg.write(XID13)
        await wait_until(lambda: xid_count(xid) == 2)  # after the reader reopened the log
        await caught_up(xid)
        assert failures == [1]
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1, "history recounted on reopen"
        assert value(xid, "gpu_xid_errors_total", xid="13") == 1
    finally:
        await xid.stop()
