"""Parsing of kernel log records (``/dev/kmsg`` format, and the text that the ``syslog(2)``
system call returns) and of NVIDIA driver Xid lines.

Everything here is pure and total: any input (bytes from a file, a FIFO or the kernel) yields a
result or ``None``, never an exception, because one odd line must not stop the reader thread.
The driver's wording varies across versions (reference/xid.md), so the Xid parser anchors only
on ``Xid (<bus id>[ GPU-I:NN]): <code>`` and reads everything after it loosely.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

# `<prefix>,<seq>,<usec>,<flags>[,more];<message>`: unknown extra comma fields are allowed.
_KMSG_HEADER = re.compile(rb"^(\d{1,10}),(\d{1,20}),(\d{1,20}),([^,;]*)(?:,[^;]*)?;")
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# syslog(2) READ_ALL text: `<prefix>[optional "[sssss.uuuuuu]"][optional caller "[T123]"] message`.
_SYSLOG_PREFIX = re.compile(rb"^<(\d{1,10})>")
_SYSLOG_TIME = re.compile(rb"\[\s*(\d{1,12})\.(\d{6})\]")
_SYSLOG_CALLER = re.compile(rb"\[\s*[TC]\s*\d{1,10}\]")

# "SXid" (NVSwitch) must not match: require a non-letter before "Xid".
_XID = re.compile(
    r"(?<![A-Za-z])Xid\s*\(\s*(?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}"
    r"(?:\.[0-7])?)(?:\s+GPU-I:\s*(?P<gi>\d{1,4}))?[^)]{0,40}\)\s*:\s*(?P<code>\d{1,5})\b"
    r"(?P<rest>.*)$",
    re.DOTALL,
)
_PID = re.compile(r"^\s*,?\s*pid\s*=\s*(?P<pid>'[^']*'|\"[^\"]*\"|<[^>]*>|-?\d+)\s*(?:,|$)")
_NAME = re.compile(r"^\s*name\s*=\s*(?P<name>'[^']*'|\"[^\"]*\"|<[^>]*>|[^,]*?)\s*(?:,\s|,$|$)")
# NVLink5 (Xid 144-150): `<SUBUNIT> <Fatal|Nonfatal> <XC0|XC1> i<N> Link <n> (<intr> <status> ...)`
_NVLINK5 = re.compile(
    r"^(?P<subunit>[A-Z][A-Z0-9_]*)\s+(?P<severity>Fatal|Nonfatal|Non-fatal)\s+(?P<xc>XC\d)\s+"
    r"i(?P<instance>\d+)\s+Link\s+(?P<link>-?\d+)\s*(?:\((?P<regs>[^)]*)\))?",
    re.IGNORECASE,
)
_RECOVERY = re.compile(
    r"changed\s+from\s+0x[0-9a-fA-F]+\s*\((?P<old>[^)]*)\)\s+to\s+0x[0-9a-fA-F]+\s*\((?P<new>[^)]*)\)",
    re.IGNORECASE,
)
# The three-line report with no Xid number (nv.c): "The NVIDIA GPU <bus> ... fallen off the bus".
_FALLEN_START = re.compile(
    r"NVRM:\s+The NVIDIA GPU\s+(?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}"
    r"(?:\.[0-7])?)"
)
_FALLEN_END = re.compile(r"fallen off the bus", re.IGNORECASE)
# Newer drivers also print it on one line: "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."
_FALLEN_ONE_LINE = re.compile(
    r"NVRM:\s+GPU\s+(?:at\s+)?(?:PCI:)?(?P<bus>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}"
    r"(?:\.[0-7])?):?\s+GPU has fallen off the bus",
    re.IGNORECASE,
)
# NVSwitch: `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...` (the
# driver's NVSWITCH_PRINT_SXID: the code is printed `%05d`).
_SXID = re.compile(
    r"(?:nvidia-nvswitch(?P<switch>\d{1,3})\s*:\s*)?SXid\s*\(\s*(?:PCI:)?"
    r"(?P<bus>(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?)\s*\)\s*:\s*"
    r"(?P<code>\d{1,5})\b(?P<rest>.*)$",
    re.DOTALL,
)
_SXID_SEVERITY = re.compile(r"^\s*,\s*(?P<severity>Fatal|Non-?fatal|Correctable)\b", re.IGNORECASE)
# What the driver prints after a recorded error, under the same code: part of that report.
_SXID_DETAIL = re.compile(
    r"^\s*,\s*(?:Severity\s+\d+\s+Engine\s+instance|Data\s*\{)", re.IGNORECASE
)
# The driver's severity word, as the label value.
_SXID_SEVERITIES = {
    "fatal": "fatal",
    "non-fatal": "non_fatal",
    "nonfatal": "non_fatal",
    "correctable": "correctable",
}
_BUS = re.compile(
    r"^\s*(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})(?:\.[0-7])?\s*$"
)

MAX_XID = 99_999


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record. ``seq``/``usec`` are None for a line without a kmsg header."""

    message: str
    seq: int | None = None
    usec: int | None = None
    priority: int | None = None
    facility: int | None = None
    continuation: bool = False  # flags "c": a fragment of a longer line


@dataclass(frozen=True)
class XidLine:
    """What an NVRM Xid line (or a fallen-off-the-bus report) says."""

    xid: int
    bus_id: str  # normalised DDDD:BB:DD (see normalize_bus_id)
    gpu_instance_id: int | None = None
    pid: int | None = None
    process_name: str | None = None
    text: str = ""
    details: dict[str, str] = field(default_factory=dict)
    fallen_off_bus: bool = False  # from the multi-line report, not an "Xid" line


@dataclass(frozen=True)
class SxidLine:
    """What an NVSwitch SXid line says."""

    sxid: int
    bus_id: str  # the switch's normalised DDDD:BB:DD.F (see normalize_function_bus_id)
    switch: str  # the nvswitch instance number, "" when the line does not name it
    severity: str  # "fatal", "non_fatal", "correctable", or "unknown" when the line does not say
    text: str = ""
    # A "Severity N Engine instance ..." or "Data {...}" line: the driver prints these after an
    # error it records, with the same code; they belong to the report before them.
    detail: bool = False


def unescape(data: bytes) -> str:
    """Undo the kernel's ``\\xNN`` escaping and decode as UTF-8 (bad bytes are replaced)."""
    if b"\\x" in data:
        data = _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), data)
    return data.decode("utf-8", errors="replace")


def parse_record(data: bytes) -> KmsgRecord | None:
    """One ``/dev/kmsg`` record (its first line; continuation lines are ignored).

    A line with no kmsg header is returned with ``seq=None`` (some callers point the reader at a
    plain text log). Returns None for an empty line or a continuation ``KEY=value`` line.
    """
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    if not line or line[:1] in (b" ", b"\t"):
        return None
    match = _KMSG_HEADER.match(line)
    if match is None:
        return KmsgRecord(message=unescape(line))
    prefix = int(match.group(1))
    return KmsgRecord(
        message=unescape(line[match.end() :]),
        seq=int(match.group(2)),
        usec=int(match.group(3)),
        priority=prefix & 7,
        facility=prefix >> 3,
        continuation="c" in match.group(4).decode("ascii", errors="replace"),
    )


def parse_syslog_line(line: bytes) -> KmsgRecord | None:
    """One line of ``syslog(2)`` (``klogctl``) READ_ALL output, e.g.
    ``<3>[ 1234.567890] NVRM: Xid ...``: priority prefix, then the printk timestamp (absent with
    ``printk.time=0``) and the caller id (only with ``CONFIG_PRINTK_CALLER``).

    Returns None for a line without the ``<N>`` prefix: a continuation of the previous record
    (see :func:`parse_syslog`). ``seq`` is always None: this interface has no sequence numbers.
    """
    line = line.rstrip(b"\r")
    match = _SYSLOG_PREFIX.match(line)
    if match is None:
        return None
    prefix = int(match.group(1))
    pos = match.end()
    usec: int | None = None
    separated = False
    stamp = _SYSLOG_TIME.match(line, pos)
    if stamp is not None:
        usec = int(stamp.group(1)) * 1_000_000 + int(stamp.group(2))
        pos, separated = stamp.end(), True
    caller = _SYSLOG_CALLER.match(line, pos)
    if caller is not None:
        pos, separated = caller.end(), True
    if separated and line[pos : pos + 1] == b" ":
        pos += 1  # the one space the kernel puts after the timestamp / caller id
    return KmsgRecord(
        message=line[pos:].decode("utf-8", errors="replace"),
        usec=usec,
        priority=prefix & 7,
        facility=prefix >> 3,
    )


def parse_syslog(data: bytes) -> list[tuple[KmsgRecord, bytes]]:
    """Every record in a chunk of ``syslog(2)`` text, with the raw bytes of its first line.

    A line without the ``<N>`` prefix continues the record before it (an unterminated
    ``KERN_CONT`` fragment, printed by older kernels without a prefix) and is appended to its
    message; one at the very start of the chunk stands alone (no priority, no timestamp). Empty
    lines are skipped; the text after the last newline is ignored (the kernel ends every line).
    """
    out: list[tuple[KmsgRecord, bytes]] = []
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a fragment
    for line in lines:
        if not line:
            continue
        record = parse_syslog_line(line)
        if record is not None:
            out.append((record, line))
            continue
        text = line.rstrip(b"\r").decode("utf-8", errors="replace")
        if out:
            previous, first = out[-1]
            out[-1] = (
                KmsgRecord(
                    message=previous.message + text,
                    usec=previous.usec,
                    priority=previous.priority,
                    facility=previous.facility,
                ),
                first,
            )
        else:
            out.append((KmsgRecord(message=text), line))
    return out


def text_hash(message: str) -> str:
    """A short stable digest of a record's text (part of its identity without a sequence number).

    Computed on the decoded message's first line, so ``/dev/kmsg`` (escaped, a multi-line record
    in one) and ``syslog(2)`` (raw, one line each, each with the record's timestamp) agree."""
    first = message.partition("\n")[0]
    return hashlib.blake2b(first.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def normalize_bus_id(text: str) -> str | None:
    """``PCI:0000:18:00``, ``00000000:18:00.0``, ``18:00.0`` -> ``0000:18:00`` (domain 4 digits,
    function dropped: the Xid line has no function and a GPU is function 0)."""
    match = _BUS.match(text)
    if match is None:
        return None
    domain = int(match.group("domain") or "0", 16)
    return f"{domain:04x}:{int(match.group('bus'), 16):02x}:{int(match.group('device'), 16):02x}"


def normalize_function_bus_id(text: str) -> str | None:
    """``PCI:0000:05:00.0``, ``05:00.0``, ``00000000:05:00`` -> ``0000:05:00.0``: an NVSwitch
    is a PCI function of its own, so the function is kept (0 when the text has none)."""
    device = normalize_bus_id(text)
    if device is None:
        return None
    _, dot, function = text.strip().rpartition(".")
    return f"{device}.{function if dot else '0'}"


def parse_sxid(message: str) -> SxidLine | None:
    """An NVSwitch SXid line, or None when the message is not one."""
    if "SXid" not in message:
        return None
    match = _SXID.search(message)
    if match is None:
        return None
    bus = normalize_function_bus_id(match.group("bus"))
    code = int(match.group("code"))
    if bus is None or not 0 < code <= MAX_XID:
        return None
    rest = match.group("rest")
    detail = _SXID_DETAIL.match(rest) is not None
    severity = _SXID_SEVERITY.match(rest)
    if severity is None:
        level = "unknown"
    else:
        level = _SXID_SEVERITIES[severity.group("severity").lower()]
        rest = rest[severity.end() :]
    switch = match.group("switch")
    return SxidLine(
        sxid=code,
        bus_id=bus,
        switch=str(int(switch)) if switch is not None else "",
        severity=level,
        text=rest.strip().removeprefix(",").strip(),
        detail=detail,
    )


def parse_xid(message: str) -> XidLine | None:
    """An NVRM Xid line, or None when the message is not one."""
    if "Xid" not in message:
        return None
    match = _XID.search(message)
    if match is None:
        return None
    bus = normalize_bus_id(match.group("bus"))
    code = int(match.group("code"))
    if bus is None or not 0 < code <= MAX_XID:
        return None
    gi = match.group("gi")
    pid, name, text = _who(match.group("rest"))
    return XidLine(
        xid=code,
        bus_id=bus,
        gpu_instance_id=int(gi) if gi is not None else None,
        pid=pid,
        process_name=name,
        text=text,
        details=_details(code, text),
    )


def _who(rest: str) -> tuple[int | None, str | None, str]:
    """Split ``, pid=N, name=comm, text`` (each part optional) into pid, name and the text."""
    rest = rest.strip()
    rest = rest.removeprefix(",").strip()
    pid: int | None = None
    name: str | None = None
    match = _PID.match(rest)
    if match is not None:
        pid = _int_or_none(_unquote(match.group("pid")))
        rest = rest[match.end() :].strip()
    match = _NAME.match(rest)
    if match is not None:
        raw_name = _unquote(match.group("name"))
        name = None if raw_name in ("", "<unknown>") else raw_name
        rest = rest[match.end() :].strip()
    return pid, name, rest


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _int_or_none(value: str) -> int | None:
    try:
        number = int(value)
    except ValueError:
        return None  # "<unknown>"
    return number if number > 0 else None  # pid 0 means "no process" (kernel context)


def _details(code: int, text: str) -> dict[str, str]:
    """Structured fields some Xids carry: NVLink5 subunit fields, Xid 154's recovery action."""
    if 144 <= code <= 150:
        match = _NVLINK5.match(text)
        if match is None:
            return {}
        details = {
            "subunit": match.group("subunit"),
            "severity": "nonfatal" if match.group("severity").lower() != "fatal" else "fatal",
            "xc": match.group("xc"),
            "instance": match.group("instance"),
            "link": match.group("link"),
        }
        regs = (match.group("regs") or "").split()
        if regs:
            details["intr_info"] = regs[0]
        if len(regs) > 1:
            details["error_status"] = regs[1]
        return details
    if code == 154:
        match = _RECOVERY.search(text)
        if match is not None:
            return {
                "previous_recovery_action": match.group("old").strip(),
                "recovery_action": match.group("new").strip(),
            }
    return {}


class FallenOffBusTracker:
    """Assembles the multi-line "fallen off the bus" report (no Xid number) into one event.

    The report spans up to three records; a report whose end never comes is dropped when another
    one starts. Not thread-safe: one per reader.
    """

    def __init__(self) -> None:
        self._bus: str | None = None
        self._lines: list[str] = []

    def feed(self, message: str) -> XidLine | None:
        if "NVRM" not in message:
            if self._bus is not None:
                self._reset()  # an unrelated record interrupted the report
            return None
        one_line = _FALLEN_ONE_LINE.search(message)
        if one_line is not None:
            self._reset()
            bus = normalize_bus_id(one_line.group("bus"))
            if bus is None:
                return None
            return XidLine(xid=79, bus_id=bus, text=_strip_nvrm(message), fallen_off_bus=True)
        start = _FALLEN_START.search(message)
        if start is not None:
            self._bus = normalize_bus_id(start.group("bus"))
            self._lines = [message]
        elif self._bus is not None:
            self._lines.append(message)
        if self._bus is None or not _FALLEN_END.search(message):
            if len(self._lines) > 4:
                self._reset()
            return None
        line = XidLine(
            xid=79,
            bus_id=self._bus,
            text=" ".join(_strip_nvrm(part) for part in self._lines),
            fallen_off_bus=True,
        )
        self._reset()
        return line

    def _reset(self) -> None:
        self._bus = None
        self._lines = []


def _strip_nvrm(message: str) -> str:
    _, found, after = message.partition("NVRM:")
    return (after if found else message).strip()
