"""Faults of the sources beside NVML: the kubelet socket goes away and comes back; the kernel
overwrites log records under the reader."""

from __future__ import annotations

import errno
import os
import threading
from collections import deque
from pathlib import Path

from gpu_exporter.xid.kmsg import KmsgSyscalls
from tests.helpers import Series, one, select
from tests.xid.conftest import plain_subsystem, value, wait_until, xid_count

from .rig import fault_rig


def pods_of_xids(series: Series) -> set[tuple[str, str]]:
    return {
        (dict(labels)["namespace"], dict(labels)["pod"])
        for labels in select(series, "gpu_xid_errors_total")
    }


async def test_the_kubelet_socket_removed_and_recreated(tmp_path: Path) -> None:
    async with fault_rig(tmp_path) as rig:
        allocated = {"gpu": "0", "namespace": "ml", "pod": "trainer"}
        await rig.until(
            "GPU 0 allocated to ml/trainer",
            lambda s: len(select(s, "gpu_allocation_info", **allocated)) == 1,
        )
        rig.xid(0, 13)
        kubelet = rig.simulated.kubelet
        assert kubelet is not None, "allocation is on: the simulated node plays the kubelet"
        await kubelet.stop()  # the kubelet restarts: its socket is removed
        assert not kubelet.socket_path.exists()
        await rig.until(
            "pod-resources reported down",
            lambda s: one(s, "gpu_exporter_source_up", source="pod_resources") == 0,
        )
        rig.xid(0, 31)  # while the kubelet is away

        await kubelet.start()  # and creates a new socket
        back = await rig.until(
            "pod-resources back with the allocation",
            lambda s: (
                one(s, "gpu_exporter_source_up", source="pod_resources") == 1
                and len(select(s, "gpu_allocation_info", **allocated)) == 1
            ),
        )
        assert one(back, "gpu_allocated", gpu="0") == 1
        rig.xid(0, 43)
        series = await rig.assert_xids_exact()
        assert pods_of_xids(series) == {("ml", "trainer")}, (
            "Xids on GPU 0 belong to its holder, also while the kubelet was away"
        )


class OverwrittenKmsg:
    """``/dev/kmsg`` as the kernel's ring buffer overwrites it under a reader.

    A pty stands in for the character device (``fstat`` says so, and ``select`` waits on it:
    nothing is ever written to it); ``read`` hands out the queued records one per call, raises
    EPIPE where the kernel would, and EAGAIN when the queue is empty, as the device does.
    """

    def __init__(self) -> None:
        self._master, self._slave = os.openpty()
        self._queue: deque[bytes | OSError] = deque()
        self._lock = threading.Lock()
        self.syscalls = KmsgSyscalls(open=self._open, read=self._read)

    def record(self, seq: int, message: str) -> None:
        with self._lock:
            self._queue.append(f"3,{seq},{seq * 1000},-;{message}\n".encode())

    def overwritten(self) -> None:
        with self._lock:
            self._queue.append(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)))

    def close(self) -> None:
        os.close(self._master)
        os.close(self._slave)

    def _open(self, path: Path, flags: int) -> int:
        return os.dup(self._slave)

    def _read(self, fd: int, size: int) -> bytes:
        with self._lock:
            if not self._queue:
                raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
            item = self._queue.popleft()
        if isinstance(item, OSError):
            raise item
        return item


def gpu0_xid(code: int) -> str:
    return f"NVRM: Xid (PCI:0000:18:00): {code}, pid='<unknown>', name=<unknown>, test"


async def test_records_overwritten_under_the_reader_are_counted_and_reading_goes_on(
    tmp_path: Path,
) -> None:
    kmsg = OverwrittenKmsg()
    xid = plain_subsystem(tmp_path, kmsg_syscalls=kmsg.syscalls)
    await xid.start()
    try:
        kmsg.record(1, gpu0_xid(13))
        kmsg.record(2, gpu0_xid(48))
        kmsg.overwritten()  # records 3 to 5 were overwritten before they were read: EPIPE
        kmsg.record(6, gpu0_xid(31))
        kmsg.record(9, gpu0_xid(43))  # a gap with no EPIPE (7 and 8 overwritten between reads)
        await wait_until(lambda: xid_count(xid) == 4)
        assert value(xid, "gpu_exporter_kmsg_lost_records_total") == 5
        assert value(xid, "gpu_exporter_source_up", source="kmsg") == 1, "EPIPE is not an outage"
        assert xid._kmsg is not None
        assert xid._kmsg.mechanism == "device", "the pty must be read as /dev/kmsg is"
        kmsg.record(10, gpu0_xid(13))
        await wait_until(lambda: xid_count(xid) == 5)
        assert value(xid, "gpu_xid_errors_total", gpu="0", xid="13") == 2
    finally:
        await xid.stop()
        kmsg.close()
