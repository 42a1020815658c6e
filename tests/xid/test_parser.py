"""The kmsg record and NVRM Xid line parsers: every variation in reference/xid.md, and totality."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_exporter.xid.parser import (
    FallenOffBusTracker,
    normalize_bus_id,
    parse_record,
    parse_sxid,
    parse_xid,
)

LINES = [
    # (line, xid, bus, gpu instance, pid, name, text starts with)
    (
        "NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python, Graphics SM Warp Exception on "
        "(GPC 0, TPC 1, SM 0): Out Of Range Address",
        13,
        "0000:18:00",
        None,
        1234,
        "python",
        "Graphics SM Warp",
    ),
    (  # old driver: no PCI: prefix, no pid/name
        "NVRM: Xid (0000:03:00): 31, Ch 00000008, intr 10000000. MMU Fault",
        31,
        "0000:03:00",
        None,
        None,
        None,
        "Ch 00000008",
    ),
    (  # quoted unknown pid, unknown name
        "NVRM: Xid (PCI:0000:86:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
        "bit error (DBE) has been detected on GPU in the framebuffer at partition 6",
        48,
        "0000:86:00",
        None,
        None,
        None,
        "An uncorrectable",
    ),
    (  # MIG instance suffix; channel written as 0x...
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, pid=777, name=train.py, channel 0x0000000c, "
        "intr 00000000. MMU Fault: ENGINE GRAPHICS",
        31,
        "0000:3b:00",
        5,
        777,
        "train.py",
        "channel 0x0000000c",
    ),
    (  # pid without name (older 4xx drivers)
        "NVRM: Xid (PCI:0000:01:00): 43, pid=23950, Ch 00000008",
        43,
        "0000:01:00",
        None,
        23950,
        None,
        "Ch 00000008",
    ),
    (  # pid=0: the kernel's own context, not a process
        "NVRM: Xid (PCI:0000:00:04): 79, pid=0, GPU has fallen off the bus.",
        79,
        "0000:00:04",
        None,
        None,
        None,
        "GPU has fallen off the bus.",
    ),
    (
        "NVRM: Xid (PCI:0000:05:00): 119, pid=1582, name=nvidia-smi, Timeout after 6s of waiting "
        "for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).",
        119,
        "0000:05:00",
        None,
        1582,
        "nvidia-smi",
        "Timeout after 6s",
    ),
    (  # a kernel timestamp prefix (dmesg / journalctl style) before NVRM
        "[ 1234.567890] NVRM: Xid (PCI:0000:1a:00): 94, pid=3047, name=python, Contained: SM "
        "(0x1). RST: No, D-RST: No",
        94,
        "0000:1a:00",
        None,
        3047,
        "python",
        "Contained: SM",
    ),
    (  # a process name with a space, no trailing text
        "NVRM: Xid (PCI:0000:18:00): 45, pid=12, name=my job",
        45,
        "0000:18:00",
        None,
        12,
        "my job",
        "",
    ),
    (  # 8-digit domain (newer drivers print NVML's form)
        "NVRM: Xid (PCI:00000000:b5:00): 95, pid='<unknown>', name=<unknown>, Uncontained: FBHUB.",
        95,
        "0000:b5:00",
        None,
        None,
        None,
        "Uncontained",
    ),
    (  # Grace systems: non-zero domain
        "NVRM: Xid (PCI:0018:01:00): 62, 0000(0000) 00000000 00000000",
        62,
        "0018:01:00",
        None,
        None,
        None,
        "0000(0000)",
    ),
]


@pytest.mark.parametrize(("line", "xid", "bus", "gi", "pid", "name", "text"), LINES)
def test_xid_line_variations(
    line: str, xid: int, bus: str, gi: int | None, pid: int | None, name: str | None, text: str
) -> None:
    parsed = parse_xid(line)
    assert parsed is not None
    assert (parsed.xid, parsed.bus_id, parsed.gpu_instance_id) == (xid, bus, gi)
    assert (parsed.pid, parsed.process_name) == (pid, name)
    assert parsed.text.startswith(text)


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress error",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: Xid (PCI:zzzz): 13, broken",
        "usb 1-1: new high-speed USB device",
        "",
    ],
)
def test_not_an_xid(line: str) -> None:
    assert parse_xid(line) is None


def test_nvlink5_subunit_fields() -> None:
    parsed = parse_xid(
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 00 "
        "(0x0000000d 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    assert parsed is not None
    assert parsed.details == {
        "subunit": "NETIR_LINK_EVT",
        "severity": "fatal",
        "xc": "XC0",
        "instance": "0",
        "link": "00",
        "intr_info": "0x0000000d",
        "error_status": "0x00000000",
    }
    nonfatal = parse_xid(
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Nonfatal XC1 i1 Link 17 (0x00000002 0x00000100)"
    )
    assert nonfatal is not None
    assert nonfatal.details["severity"] == "nonfatal"


def test_xid_154_recovery_action() -> None:
    parsed = parse_xid(
        "NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 "
        "(Drain and Reset)"
    )
    assert parsed is not None
    assert parsed.details["recovery_action"] == "Drain and Reset"
    assert parsed.details["previous_recovery_action"] == "None"


def test_fallen_off_the_bus_report_without_xid() -> None:
    tracker = FallenOffBusTracker()
    assert tracker.feed("NVRM: The NVIDIA GPU 0000:18:00.0") is None
    assert tracker.feed("NVRM: (PCI ID: 10de:2901) installed in this system has") is None
    line = tracker.feed("NVRM: fallen off the bus and is not responding to commands.")
    assert line is not None
    assert (line.xid, line.bus_id, line.fallen_off_bus) == (79, "0000:18:00", True)
    assert "10de:2901" in line.text
    one = tracker.feed("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert one is not None
    assert one.bus_id == "0000:3b:00"


def test_fallen_off_the_bus_interrupted_report_is_dropped() -> None:
    tracker = FallenOffBusTracker()
    tracker.feed("NVRM: The NVIDIA GPU 0000:18:00.0")
    tracker.feed("e1000e: eth0 NIC Link is Up")
    assert tracker.feed("NVRM: fallen off the bus and is not responding to commands.") is None


def test_kmsg_record_format() -> None:
    record = parse_record(b"3,1200,5000000,-,caller=T1;NVRM: a \\x5c b\\x0a c\n SUBSYSTEM=pci\n")
    assert record is not None
    assert (record.seq, record.usec, record.priority, record.facility) == (1200, 5000000, 3, 0)
    assert record.message == "NVRM: a \\ b\n c"
    assert not record.continuation
    assert parse_record(b"12,5,6,c;fragment").continuation  # type: ignore[union-attr]
    assert parse_record(b" SUBSYSTEM=pci") is None
    assert parse_record(b"") is None
    plain = parse_record(b"NVRM: Xid (PCI:0000:18:00): 13, text")
    assert plain is not None
    assert plain.seq is None
    assert plain.message.startswith("NVRM")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000000:18:00.0", "0000:18:00"),
        ("0000:18:00", "0000:18:00"),
        ("PCI:0000:3B:00", "0000:3b:00"),
        ("18:00.0", "0000:18:00"),
        ("0018:01:00.1", "0018:01:00"),
        ("nonsense", None),
        ("", None),
    ],
)
def test_bus_id_normalisation(text: str, expected: str | None) -> None:
    assert normalize_bus_id(text) == expected


@given(st.binary(max_size=400))
def test_record_parser_never_raises(data: bytes) -> None:
    record = parse_record(data)
    if record is not None:
        parse_xid(record.message)
        FallenOffBusTracker().feed(record.message)


_fragments = st.sampled_from(
    ["NVRM: ", "Xid ", "(", ")", "PCI:", "0000:", "18:00", ".0", " GPU-I:", "05", ": ", "13",
     ", ", "pid=", "'<unknown>'", "name=", "<unknown>", "99999999999", "Fatal", " XC0 i0 Link ",
     "changed from 0x0 (None) to 0x4 (", "The NVIDIA GPU ", "fallen off the bus", "\\x00", "é"]
)  # fmt: skip


@given(st.lists(st.one_of(_fragments, st.text(max_size=5)), max_size=30))
def test_xid_parser_never_raises_on_near_misses(parts: list[str]) -> None:
    text = "".join(parts)
    parsed = parse_xid(text)
    if parsed is not None:
        assert parsed.xid > 0
        assert normalize_bus_id(parsed.bus_id) == parsed.bus_id
    tracker = FallenOffBusTracker()
    for part in (text, *parts):
        tracker.feed(part)
    parse_record(text.encode("utf-8", errors="surrogatepass"))


SXID_LINES = [
    # (line, sxid, switch, bus, severity, text)
    (
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
        "PRIV error",
        12028,
        "3",
        "0000:05:00.0",
        "non_fatal",
        "Link 32 egress non-posted PRIV error",
    ),
    (
        "nvidia-nvswitch11: SXid (PCI:0000:10:00.0): 24007, Fatal, Link 5 sourcetrack timeout",
        24007,
        "11",
        "0000:10:00.0",
        "fatal",
        "Link 5 sourcetrack timeout",
    ),
    (  # "Nonfatal" spelling, upper-case hex, no function
        "nvidia-nvswitch0: SXid (PCI:0000:0A:00): 20034, Nonfatal, LTSSM Fault Up",
        20034,
        "0",
        "0000:0a:00.0",
        "non_fatal",
        "LTSSM Fault Up",
    ),
    (  # the driver prints the code %05d; correctable is a severity of its own
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 01004, Correctable, Link 07 CRC error",
        1004,
        "1",
        "0000:06:00.0",
        "correctable",
        "Link 07 CRC error",
    ),
    (  # no device prefix, no severity
        "SXid (PCI:0000:07:00.0): 11004, Link 1",
        11004,
        "",
        "0000:07:00.0",
        "unknown",
        "Link 1",
    ),
]


@pytest.mark.parametrize(
    ("line", "sxid", "switch", "bus", "severity", "text"), SXID_LINES, ids=lambda v: str(v)[:40]
)
def test_sxid_lines(line: str, sxid: int, switch: str, bus: str, severity: str, text: str) -> None:
    parsed = parse_sxid(line)
    assert parsed is not None, line
    assert (parsed.sxid, parsed.switch, parsed.bus_id, parsed.severity, parsed.text) == (
        sxid,
        switch,
        bus,
        severity,
        text,
    )
    assert parse_xid(line) is None, "an SXid is not a GPU Xid"


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Severity 1 Engine instance 05 "
        "Sub-engine instance 00",
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Data {0x00000000, 0x00000002}",
    ],
)
def test_the_lines_after_an_sxid_report_are_its_details(line: str) -> None:
    parsed = parse_sxid(line)
    assert parsed is not None, line
    assert (parsed.detail, parsed.sxid) == (True, 24007), "a detail is not a new SXid"


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 0, Fatal",  # code out of range
        "nvidia-nvswitch3: SXid (PCI:zz:05:00.0): 12028, Fatal",  # not a bus id
        "nvidia-nvswitch3: probing SXid handling",  # mentions SXid, is not one
        "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics SM Warp Exception",
    ],
)
def test_lines_that_are_not_sxids(line: str) -> None:
    assert parse_sxid(line) is None
