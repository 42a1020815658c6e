"""Coverage-guided fuzzing (atheris/libFuzzer) of the kernel-log parsers: ``make fuzz``.

Every input is fed raw to every parser (a record or None, never an exception), and the first byte
picks a round trip the rest of the input drives: a /dev/kmsg record, a syslog(2) line, an NVRM
Xid line or an NVSwitch SXid line rendered as the kernel and the drivers do must parse back to its
fields. The checks are
the hypothesis tests' (tests/fuzz/kernel_text.py); see docs/fuzzing.md.

    python -m fuzz.kmsg_parser --seconds 600          # search; crashes go to fuzz/crashes/
    python -m fuzz.kmsg_parser fuzz/crashes/crash-... # replay one input
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["gpu_exporter.xid.parser"]):
    from gpu_exporter.xid import parser

from tests.fuzz.kernel_text import (
    check_any_bytes,
    check_kmsg_round_trip,
    check_sxid_round_trip,
    check_syslog_round_trip,
    check_xid_round_trip,
    kmsg_line,
    syslog_line,
)

from gpu_exporter.simulator.kmsg import (
    XID_TEXT,
    KmsgLog,
    sxid_details,
    sxid_message,
    xid_message,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ROUND_TRIPS = 5  # first byte % 5: 0 raw only, 1 kmsg, 2 syslog, 3 Xid line, 4 SXid line


def test_one_input(data: bytes) -> None:
    check_any_bytes(data)
    if len(data) < 2:
        return
    fields = atheris.FuzzedDataProvider(data[1:])
    mode = data[0] % ROUND_TRIPS
    if mode == 1:
        check_kmsg_round_trip(
            fields.ConsumeIntInRange(0, 2**20),
            fields.ConsumeIntInRange(0, 7),
            fields.ConsumeIntInRange(0, 2**63 - 1),
            fields.ConsumeIntInRange(0, 10**15),
            fields.PickValueInList(["-", "c", "+"]),
            fields.ConsumeBytes(fields.remaining_bytes()),
        )
    elif mode == 2:
        facility, level = fields.ConsumeIntInRange(0, 2**20), fields.ConsumeIntInRange(0, 7)
        seconds, micro = fields.ConsumeIntInRange(0, 10**11), fields.ConsumeIntInRange(0, 999_999)
        message = fields.ConsumeBytes(fields.remaining_bytes()).replace(b"\n", b"").rstrip(b"\r")
        if message.startswith((b"[", b"<")):  # would read as a caller id or a prefix
            message = b"x" + message
        check_syslog_round_trip(facility, level, seconds, micro, message)
    elif mode == 3:
        check_xid_round_trip(*xid_fields(fields))
    elif mode == 4:
        switch, code = fields.ConsumeIntInRange(0, 15), fields.ConsumeIntInRange(1, parser.MAX_XID)
        severity = fields.PickValueInList(["fatal", "non_fatal", "correctable"])
        link = fields.ConsumeIntInRange(0, 63)
        check_sxid_round_trip(switch, code, severity, link, printable(fields))


def xid_fields(
    fields: atheris.FuzzedDataProvider,
) -> tuple[int, int, tuple[int, str] | None, int | None, str]:
    bus, code = fields.ConsumeIntInRange(0, 255), fields.ConsumeIntInRange(1, parser.MAX_XID)
    who = None
    if fields.ConsumeBool():
        name = re.sub(r"[^\x21-\x7e]|[,'\"<]", "", fields.ConsumeUnicodeNoSurrogates(15))
        who = (fields.ConsumeIntInRange(1, 2**22), name or "x")
    gpu_instance = fields.ConsumeIntInRange(0, 9999) if fields.ConsumeBool() else None
    return bus, code, who, gpu_instance, printable(fields)


def printable(fields: atheris.FuzzedDataProvider) -> str:
    """The rest of the input as one line of text (no control characters), as drivers print."""
    text = fields.ConsumeUnicodeNoSurrogates(fields.remaining_bytes())
    return "".join(c for c in text if unicodedata.category(c) != "Cc").strip()


def real_lines() -> list[str]:
    """Kernel log lines from the docs, the simulator and the parser tests' reference table."""
    lines: list[str] = []
    for doc in sorted((REPO / "docs").glob("*.md")):
        lines += re.findall(r"NVRM: [^`|\n]+", doc.read_text("utf-8"))
    lines += [
        xid_message(0x18, code, 1234, "python", text, None) for code, text in XID_TEXT.items()
    ]
    from tests.xid.test_parser import LINES  # the variations in reference/xid.md

    lines += [line for line, *_ in LINES]
    lines += [sxid_message(3, 12028, "non_fatal", 32, "egress non-posted PRIV error")]
    lines += [sxid_message(0, 24007, "fatal", 5, "sourcetrack timeout")]
    lines += sxid_details(0, 24007, "fatal", 5)
    lines += [
        "NVRM: The NVIDIA GPU 0000:18:00.0",
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    ]
    return lines


def write_seeds(directory: Path) -> int:
    """Each real line as raw text, a kmsg record, a syslog line and the simulator's record."""
    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    for n, line in enumerate(real_lines()):
        raw = line.encode()
        seeds = {
            "raw": b"\x00" + raw,
            "kmsg": b"\x00" + kmsg_line(0, 3, 1200 + n, 5_000_000 + n, "-", raw),
            "syslog": b"\x00" + syslog_line(0, 3, 5, n, raw) + b"\n",
            "sim": b"\x00" + KmsgLog(uptime=5.0).emit(line, n).encode(),
        }
        for kind, seed in seeds.items():
            (directory / f"{kind}-{n:03d}").write_bytes(seed)
            count += 1
    return count


def main(argv: list[str]) -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seconds", type=int, default=60, help="stop after this long (default 60)")
    cli.add_argument(
        "--crashes", type=Path, default=HERE / "crashes", help="where failing inputs go"
    )
    cli.add_argument("--corpus", type=Path, default=HERE / "corpus" / "kmsg", help="working corpus")
    cli.add_argument("inputs", nargs="*", help="replay these inputs instead of searching")
    args, libfuzzer_flags = cli.parse_known_args(argv[1:])
    atheris.enabled_hooks.add("RegEx")  # let libFuzzer see what the parser's regexes compare
    if args.inputs:
        atheris.Setup([argv[0], *libfuzzer_flags, *args.inputs], test_one_input)
    else:
        args.crashes.mkdir(parents=True, exist_ok=True)
        seeds = write_seeds(HERE / "corpus" / "seeds")
        print(f"{seeds} seed inputs from the docs and the simulator", file=sys.stderr)
        args.corpus.mkdir(parents=True, exist_ok=True)
        atheris.Setup(
            [
                argv[0],
                f"-max_total_time={args.seconds}",
                f"-artifact_prefix={args.crashes}/",
                *libfuzzer_flags,
                str(args.corpus),  # new interesting inputs are written to the first directory
                str(HERE / "corpus" / "seeds"),
            ],
            test_one_input,
        )
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
