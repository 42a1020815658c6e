"""Properties of the kernel-log parsers: total on any bytes, and what the kernel (or the simulator's
kmsg writer) renders parses back to the same fields."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.simulator.kmsg import KmsgLog, xid_message
from gpu_exporter.xid.parser import (
    FallenOffBusTracker,
    KmsgRecord,
    XidLine,
    normalize_bus_id,
    parse_record,
    parse_syslog,
    parse_syslog_line,
    parse_xid,
)

# A kmsg (and syslog) prefix is `facility << 3 | level`.
facilities = st.integers(0, 2**20)
levels = st.integers(0, 7)
sequence_numbers = st.integers(0, 2**63 - 1)
timestamps_usec = st.integers(0, 10**15)
# printk text: any bytes but the line end (a record is one line; its newlines come escaped).
message_bytes = st.binary(max_size=200)


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


@given(st.binary(max_size=500))
@example(b"6,1,2,-;\\x\\xzz\\x41\xff\xfe")
@example(b"<99999999999>[99999999999999.999999] x")
def test_every_parser_takes_any_bytes(data: bytes) -> None:
    assert_total(parse_record(data))
    assert_total(parse_syslog_line(data))
    for record, first_line in parse_syslog(data):
        assert_total(record)
        assert first_line in data, "the raw first line must come from the input"


@given(facilities, levels, sequence_numbers, timestamps_usec, st.sampled_from("-c+"), message_bytes)
@example(0, 3, 1, 0, "-", b"NVRM: Xid (PCI:0000:18:00): 79, \\x0a\n and a new line")
@example(0, 6, 5, 5, "c", b" starts with a space")
def test_a_kmsg_record_parses_back_to_what_the_kernel_wrote(
    facility: int, level: int, seq: int, usec: int, flags: str, message: bytes
) -> None:
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


@given(
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=120),
    st.floats(0, 10**7, allow_nan=False),
)
@example("back\\slash and \x00 NUL and é and \u2028", 1.5)
def test_the_simulator_writer_round_trips(message: str, t: float) -> None:
    written = KmsgLog(uptime=100.0).emit(message, t)
    record = parse_record(written.encode())
    assert record is not None, f"{written!r} not parsed"
    assert record.message == message, f"{message!r} -> {written!r}"
    assert (record.priority, record.facility) == (3, 0), "NVRM lines are kern.err"
    assert record.seq is not None


# syslog(2) text is not escaped: a record is its bytes up to the newline the kernel appends.
syslog_messages = st.binary(max_size=160).filter(
    lambda m: b"\n" not in m and not m.endswith(b"\r") and not m.startswith((b"[", b"<"))
)


@given(facilities, levels, st.integers(0, 10**11), st.integers(0, 999_999), syslog_messages)
@example(0, 3, 12, 5, b"NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
def test_a_syslog_line_parses_back_to_what_the_kernel_wrote(
    facility: int, level: int, seconds: int, micro: int, message: bytes
) -> None:
    line = b"<%d>[%5d.%06d] %s" % (facility << 3 | level, seconds, micro, message)
    expected = KmsgRecord(
        message=message.decode("utf-8", errors="replace"),
        usec=seconds * 1_000_000 + micro,
        priority=level,
        facility=facility,
    )
    assert parse_syslog_line(line) == expected, f"round trip of {line!r}"
    assert parse_syslog(line + b"\n") == [(expected, line)], "a one-line chunk is one record"


@given(st.lists(syslog_messages.filter(bool), min_size=1, max_size=8))
def test_a_syslog_chunk_keeps_every_record_in_order(messages: list[bytes]) -> None:
    chunk = b"".join(b"<6>[%5d.000000] %s\n" % (n, m) for n, m in enumerate(messages))
    records = parse_syslog(chunk)
    assert [r.message for r, _ in records] == [m.decode("utf-8", "replace") for m in messages]
    assert [r.usec for r, _ in records] == [n * 1_000_000 for n in range(len(messages))]


# The NVRM Xid line as the driver prints it (and the simulator renders it).
process_names = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=",'\"<"),
    min_size=1,
    max_size=15,  # TASK_COMM_LEN - 1
)
xid_texts = st.text(st.characters(blacklist_categories=["Cs", "Cc"]), max_size=80).map(str.strip)


@given(
    bus=st.integers(0, 255),
    code=st.integers(1, 99_999),
    who=st.one_of(st.none(), st.tuples(st.integers(1, 2**22), process_names)),
    gpu_instance=st.one_of(st.none(), st.integers(0, 9999)),
    text=xid_texts,
)
@example(bus=0x18, code=13, who=(1234, "python3"), gpu_instance=5, text="Graphics SM Warp")
@example(bus=0x18, code=48, who=None, gpu_instance=None, text="pid=7, name=x, not who it is")
def test_an_xid_line_parses_back_to_its_fields(
    bus: int, code: int, who: tuple[int, str] | None, gpu_instance: int | None, text: str
) -> None:
    pid, name = who if who is not None else (None, None)
    message = xid_message(bus, code, pid, name, text, gpu_instance)
    parsed = parse_xid(message)
    assert parsed is not None, f"not recognised: {message!r}"
    got = (parsed.xid, parsed.bus_id, parsed.gpu_instance_id, parsed.pid, parsed.process_name)
    assert got == (code, f"0000:{bus:02x}:00", gpu_instance, pid, name), message
    assert parsed.text == text, f"text of {message!r}"


@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 255),
    device=st.integers(0, 31),
    function=st.integers(0, 7),
    style=st.sampled_from(["{d:04x}:{b:02x}:{v:02x}", "PCI:{d:04x}:{b:02X}:{v:02x}.{f}",
                           "{d:08x}:{b:02x}:{v:02x}.{f}", "{b:02x}:{v:02x}.{f}"]),
)  # fmt: skip
def test_every_bus_id_spelling_normalises_to_one_form(
    domain: int, bus: int, device: int, function: int, style: str
) -> None:
    spelled = style.format(d=domain, b=bus, v=device, f=function)
    expected_domain = 0 if style.startswith("{b") else domain
    normal = normalize_bus_id(spelled)
    assert normal == f"{expected_domain:04x}:{bus:02x}:{device:02x}", spelled
    assert normalize_bus_id(normal) == normal, "normalising twice changes nothing"
