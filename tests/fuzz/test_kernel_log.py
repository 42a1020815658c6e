"""Properties of the kernel-log parsers: total on any bytes, and what the kernel (or the simulator's
kmsg writer) renders parses back to the same fields."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.simulator.kmsg import KmsgLog
from gpu_exporter.xid.parser import (
    normalize_bus_id,
    parse_record,
    parse_syslog,
)

from .kernel_text import (
    check_any_bytes,
    check_kmsg_round_trip,
    check_sxid_round_trip,
    check_syslog_round_trip,
    check_xid_round_trip,
)

# A kmsg (and syslog) prefix is `facility << 3 | level`.
facilities = st.integers(0, 2**20)
levels = st.integers(0, 7)
sequence_numbers = st.integers(0, 2**63 - 1)
timestamps_usec = st.integers(0, 10**15)
# printk text: any bytes but the line end (a record is one line; its newlines come escaped).
message_bytes = st.binary(max_size=200)


@given(st.binary(max_size=500))
@example(b"6,1,2,-;\\x\\xzz\\x41\xff\xfe")
@example(b"<99999999999>[99999999999999.999999] x")
def test_every_parser_takes_any_bytes(data: bytes) -> None:
    check_any_bytes(data)


@given(facilities, levels, sequence_numbers, timestamps_usec, st.sampled_from("-c+"), message_bytes)
@example(0, 3, 1, 0, "-", b"NVRM: Xid (PCI:0000:18:00): 79, \\x0a\n and a new line")
@example(0, 6, 5, 5, "c", b" starts with a space")
def test_a_kmsg_record_parses_back_to_what_the_kernel_wrote(
    facility: int, level: int, seq: int, usec: int, flags: str, message: bytes
) -> None:
    check_kmsg_round_trip(facility, level, seq, usec, flags, message)


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
    check_syslog_round_trip(facility, level, seconds, micro, message)


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
    check_xid_round_trip(bus, code, who, gpu_instance, text)


@given(
    switch=st.integers(0, 15),
    code=st.integers(1, 99_999),
    severity=st.sampled_from(["fatal", "non_fatal", "correctable"]),
    link=st.integers(0, 63),
    text=xid_texts,
)
@example(switch=3, code=12028, severity="non_fatal", link=32, text="egress non-posted PRIV error")
@example(switch=0, code=1, severity="fatal", link=0, text="Fatal, Link 9 not the severity")
@example(switch=10, code=44244, severity="fatal", link=34, text="3;NVRM: Xid (PCI:0000:07:04): 79")
def test_an_sxid_line_parses_back_to_its_fields(
    switch: int, code: int, severity: str, link: int, text: str
) -> None:
    check_sxid_round_trip(switch, code, severity, link, text)


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
