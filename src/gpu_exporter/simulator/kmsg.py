"""Kernel log records (``/dev/kmsg`` format) for Xids and NVSwitch SXids the simulator emits."""

from __future__ import annotations

import logging
import os
import pathlib
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
# Syslog priority of NVRM Xid lines: facility kern (0), level err (3).
PRIORITY = 3
# The ring buffer already holds the boot messages when the scenario starts.
FIRST_SEQ = 1200
# Plausible text after "<code>, " for common Xids (driver 5xx wording, shortened).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f1c_a4000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
    "partition 0, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping.",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c058",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20801348 0x4).",
    120: "GSP task exception: (reason 0x1)",
}
# Xids a driver attributes to a process (pid/name of the faulting context).
PROCESS_XIDS = frozenset({13, 31, 43, 45, 68, 69, 109})


def xid_message(
    bus: int, code: int, pid: int | None, name: str | None, text: str, gpu_instance: int | None
) -> str:
    """``NVRM: Xid (PCI:0000:18:00[ GPU-I:05]): 13, pid=1234, name=python, <text>``."""
    mig = f" GPU-I:{gpu_instance:02d}" if gpu_instance is not None else ""
    who = f"pid={pid}, name={name}, " if pid is not None else "pid='<unknown>', name=<unknown>, "
    return f"NVRM: Xid (PCI:0000:{bus:02x}:00{mig}): {code}, {who}{text}"


# PCI bus of NVSwitch 0; switch ``n`` sits on bus ``SWITCH_BUS + n``.
SWITCH_BUS = 0x05


# The word the nvswitch driver prints for each severity (error_nvswitch.h's REPORT macros).
SXID_SEVERITY_WORDS = {"fatal": "Fatal", "non_fatal": "Non-fatal", "correctable": "Correctable"}


def sxid_message(switch: int, code: int, severity: str, link: int, text: str) -> str:
    """``nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Non-fatal, Link 32 <text>``."""
    word = SXID_SEVERITY_WORDS[severity]
    return f"{_sxid_prefix(switch, code)}{word}, Link {link:02d} {text}"


def sxid_details(switch: int, code: int, severity: str, link: int) -> list[str]:
    """What the driver prints after the report of an error it records (nvswitch_record_error):
    the same code, then the severity (1 fatal, 0 otherwise), the link and the raw data."""
    level = 1 if severity == "fatal" else 0
    data = ", ".join(["0x00000000"] * 9)
    return [
        f"{_sxid_prefix(switch, code)}Severity {level} Engine instance {link:02d} "
        "Sub-engine instance 00",
        f"{_sxid_prefix(switch, code)}Data {{{data}}}",
    ]


def _sxid_prefix(switch: int, code: int) -> str:
    bus = f"0000:{SWITCH_BUS + switch:02x}:00.0"
    return f"nvidia-nvswitch{switch}: SXid (PCI:{bus}): {code:05d}, "


class KmsgLog:
    """Records the simulator wrote to its kernel log, and where else they go."""

    def __init__(self, uptime: float) -> None:
        self._uptime = uptime
        self._lock = threading.Lock()
        self._seq = FIRST_SEQ
        self._lines: list[str] = []
        self._sinks: list[Callable[[str], None]] = []
        self._files: list[pathlib.Path] = []

    @property
    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def add_sink(self, sink: Callable[[str], None]) -> None:
        """Call ``sink(record)`` for every record from now on (without trailing newline)."""
        with self._lock:
            self._sinks.append(sink)

    def add_file(self, path: pathlib.Path) -> None:
        """Append every record from now on to ``path`` (a file or FIFO), one per line."""
        with self._lock:
            self._files.append(pathlib.Path(path))

    def emit(self, message: str, t: float) -> str:
        """Record ``message`` at simulation time ``t``; returns the kmsg record."""
        with self._lock:
            usec = int((self._uptime + t) * 1_000_000)
            record = f"{PRIORITY},{self._seq},{usec},-;{_escape(message)}"
            self._seq += 1
            self._lines.append(record)
            sinks, files = list(self._sinks), list(self._files)
        for sink in sinks:
            sink(record)
        for path in files:
            _append(path, record + "\n")
        return record


def _append(path: pathlib.Path, line: str) -> None:
    """Append without ever blocking: a FIFO nobody reads yet just misses the record."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        log.warning("kmsg record not written to %s: %s", path, exc)
        return
    try:
        os.write(fd, line.encode())
    except OSError as exc:
        log.warning("kmsg record not written to %s: %s", path, exc)
    finally:
        os.close(fd)


def _escape(message: str) -> str:
    """Escape like the kernel does: non-printable bytes and backslash as ``\\xNN``."""
    out: list[str] = []
    for ch in message:
        if ch == "\\" or not ch.isprintable():
            out.extend(f"\\x{b:02x}" for b in ch.encode())
        else:
            out.append(ch)
    return "".join(out)
