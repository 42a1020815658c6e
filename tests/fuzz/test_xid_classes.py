"""Properties of the ``--xid-classes`` override file: any file loads or fails with one line naming
the file and line, and every valid file means what it says."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.xid.classes import CLASSES, XidClassesError, load_classifier, parse_overrides

Override = tuple[str | None, str | None]

# YAML pieces that reach every branch of the loader, joined at random.
_FRAGMENTS = [
    "13", "79", "0", "99999", "100000", "-1", "1.5", "0x1f", "²", "١٣", "1" * 5000, ": ", ":",
    "\n", "  ", "\t", "- ", "class", "action", "hardware", "application", "informational",
    "reset_gpu", "Reset GPU", "{", "}", "[", "]", ", ", "&a ", "*a", "!!binary ", "!!int ", "'",
    '"', "# note", "? ", "---\n", "...\n", "%YAML 1.1\n", "~", "null", "true", "\ufeff", "\x00",
]  # fmt: skip
yaml_like = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), max_size=25).map(
    "".join
)


# YAML 1.1 ends a line at NEL and the Unicode separators too (PyYAML counts them).
_YAML_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


@contextmanager
def override_file(content: bytes) -> Iterator[Path]:
    # A fresh directory per example: the tmp_path fixture is shared by all of a test's examples.
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "xid-classes.yaml"
        path.write_bytes(content)
        yield path


def assert_loads_or_says_where(content: bytes) -> dict[int, Override] | None:
    with override_file(content) as path:
        try:
            overrides = parse_overrides(path)
        except XidClassesError as exc:
            message = str(exc)
            assert "\n" not in message, f"not one line: {message!r}"
            match = re.match(rf"{re.escape(str(path))}:(\d+): \S", message)
            if match is None:
                assert message.startswith(f"{path}: cannot read: "), f"no file:line in {message!r}"
                return None
            line = int(match.group(1))
            last_line = len(_YAML_LINE_BREAK.split(content.decode("utf-8")))
            assert 1 <= line <= last_line, f"line {line} of a {last_line}-line file: {message}"
            return None
    for xid, (xid_class, action) in overrides.items():
        assert 0 < xid <= 99_999, f"Xid {xid} out of range was accepted"
        assert xid_class in (*CLASSES, None), f"Xid {xid}: class {xid_class!r} was accepted"
        assert (xid_class, action) != (None, None), f"Xid {xid}: an override that says nothing"
    return overrides


@given(yaml_like)
@example("²: hardware")  # a digit int() does not take
@example("1" * 5000 + ": hardware")  # too many digits for int()
@example("13: {class: hardware, class: driver}")  # one Xid says two things
@example("13: &a {class: *a}")
def test_any_text_loads_or_fails_naming_file_and_line(text: str) -> None:
    assert_loads_or_says_where(text.encode("utf-8", errors="surrogatepass"))


@given(st.binary(max_size=200))
def test_any_bytes_load_or_fail_naming_the_file(content: bytes) -> None:
    assert_loads_or_says_where(content)


actions = st.from_regex(r"[a-z][a-z0-9_]{0,63}", fullmatch=True)
override_values = st.tuples(st.one_of(st.none(), st.sampled_from(CLASSES)), st.none() | actions)
override_tables = st.dictionaries(
    st.integers(1, 99_999), override_values.filter(lambda v: v != (None, None)), max_size=12
)


def render(overrides: dict[int, Override], flow: bool) -> str:
    """The file an operator writes: ``13: hardware`` or ``13: {class: ..., action: ...}``."""
    lines: list[str] = []
    for xid, (xid_class, action) in overrides.items():
        if action is None and flow:
            lines.append(f"{xid}: {xid_class}")
            continue
        fields = {"class": xid_class, "action": action}
        pairs = [(k, v) for k, v in fields.items() if v is not None]
        if flow:
            lines.append(f"{xid}: {{{', '.join(f'{k}: {v}' for k, v in pairs)}}}")
        else:
            lines += [f"{xid}:", *(f"  {k}: {v}" for k, v in pairs)]
    return "\n".join(lines) + "\n"


@given(override_tables, st.booleans())
@example({13: ("application", None), 48: (None, "reset_gpu")}, True)
def test_valid_overrides_load_as_written(overrides: dict[int, Override], flow: bool) -> None:
    text = render(overrides, flow)
    assert assert_loads_or_says_where(text.encode()) == overrides, text
    with override_file(text.encode()) as path:
        classifier = load_classifier(path)
    for xid, (xid_class, action) in overrides.items():
        entry = classifier.entry(xid)
        assert xid_class in (None, entry.xid_class), f"Xid {xid}: class {entry.xid_class}"
        assert action in (None, entry.action), f"Xid {xid}: action {entry.action}"
        assert classifier.classify(xid, {"severity": "nonfatal"}) == (
            entry.xid_class,
            entry.action,
        ), f"Xid {xid}: an override is final, the line's details do not refine it"
