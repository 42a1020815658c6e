"""Kernel log text as the kernel renders it, and the parsers' totality check: shared by the
hypothesis tests and the coverage-guided harness (fuzz/kmsg_parser.py)."""

from __future__ import annotations

from gpu_exporter.simulator.kmsg import sxid_details, sxid_message, xid_message
from gpu_exporter.xid.parser import (
    FallenOffBusTracker,
    KmsgRecord,
    SxidLine,
    XidLine,
    parse_record,
    parse_sxid,
    parse_syslog,
    parse_syslog_line,
    parse_xid,
)


def kernel_escape(message: bytes) -> bytes:
    """What devkmsg_read does to a record's text (kernel/printk: msg_add_ext_text)."""
    return b"".join(
        b"\\x%02x" % byte if byte < 0x20 or byte >= 0x7F or byte == 0x5C else bytes((byte,))
        for byte in message
    )


def kmsg_line(facility: int, level: int, seq: int, usec: int, flags: str, message: bytes) -> bytes:
    prefix = facility << 3 | level
    return b"%d,%d,%d,%s;%s\n" % (prefix, seq, usec, flags.encode(), kernel_escape(message))


def assert_total(result: KmsgRecord | None) -> None:
    assert result is None or isinstance(result, KmsgRecord), f"not a record or None: {result!r}"
    if result is not None:
        assert isinstance(result.message, str)
        for outcome in (parse_xid(result.message), FallenOffBusTracker().feed(result.message)):
            assert outcome is None or isinstance(outcome, XidLine), f"odd Xid result {outcome!r}"
        sxid = parse_sxid(result.message)
        assert sxid is None or isinstance(sxid, SxidLine), f"odd SXid result {sxid!r}"


def syslog_line(facility: int, level: int, seconds: int, micro: int, message: bytes) -> bytes:
    """One line of syslog(2) READ_ALL text (kernel/printk: info_print_prefix), unescaped."""
    return b"<%d>[%5d.%06d] %s" % (facility << 3 | level, seconds, micro, message)


def check_any_bytes(data: bytes) -> None:
    """Every parser takes any bytes: a record or None, never an exception."""
    assert_total(parse_record(data))
    assert_total(parse_syslog_line(data))
    for record, first_line in parse_syslog(data):
        assert_total(record)
        assert first_line in data, "the raw first line must come from the input"


def check_kmsg_round_trip(
    facility: int, level: int, seq: int, usec: int, flags: str, message: bytes
) -> None:
    """A /dev/kmsg record (with the dictionary lines that may follow) parses back to its fields."""
    line = kmsg_line(facility, level, seq, usec, flags, message)
    record = parse_record(line + b" SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n")
    assert record == KmsgRecord(
        message=message.decode("utf-8", errors="replace"),
        seq=seq,
        usec=usec,
        priority=level,
        facility=facility,
        continuation=flags == "c",
    ), f"round trip of {line!r}"


def check_syslog_round_trip(
    facility: int, level: int, seconds: int, micro: int, message: bytes
) -> None:
    """A syslog(2) line (message: no newline, no trailing CR, not starting with [ or <)."""
    line = syslog_line(facility, level, seconds, micro, message)
    expected = KmsgRecord(
        message=message.decode("utf-8", errors="replace"),
        usec=seconds * 1_000_000 + micro,
        priority=level,
        facility=facility,
    )
    assert parse_syslog_line(line) == expected, f"round trip of {line!r}"
    assert parse_syslog(line + b"\n") == [(expected, line)], "a one-line chunk is one record"


def check_xid_round_trip(
    bus: int, code: int, who: tuple[int, str] | None, gpu_instance: int | None, text: str
) -> None:
    """The NVRM Xid line the driver prints (process name: no comma, quote or "<"; text stripped)."""
    pid, name = who if who is not None else (None, None)
    message = xid_message(bus, code, pid, name, text, gpu_instance)
    parsed = parse_xid(message)
    assert parsed is not None, f"not recognised: {message!r}"
    got = (parsed.xid, parsed.bus_id, parsed.gpu_instance_id, parsed.pid, parsed.process_name)
    assert got == (code, f"0000:{bus:02x}:00", gpu_instance, pid, name), message
    assert parsed.text == text, f"text of {message!r}"


def check_sxid_round_trip(switch: int, code: int, severity: str, link: int, text: str) -> None:
    """An SXid report as the simulator writes it (the nvswitch driver's format) parses back to
    its fields, and the detail lines after it parse as details of the same code."""
    message = sxid_message(switch, code, severity, link, text)
    parsed = parse_sxid(message)
    assert parsed is not None, message
    assert (parsed.switch, parsed.sxid) == (str(switch), code), message
    assert parsed.bus_id == f"0000:{0x05 + switch:02x}:00.0", message
    assert parsed.severity == severity, message
    assert parsed.text == f"Link {link:02d} {text}".strip(), message
    assert not parsed.detail, f"a report taken for a detail line: {message}"
    for line in sxid_details(switch, code, severity, link):
        detail = parse_sxid(line)
        assert detail is not None, line
        assert (detail.detail, detail.sxid) == (True, code), line
    if "Xid" not in text:  # free text may quote anything, an Xid line included
        assert parse_xid(message) is None, f"an SXid taken for a GPU Xid: {message}"
