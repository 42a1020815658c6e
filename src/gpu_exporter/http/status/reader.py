"""Read back the exposition this exporter rendered (the classic text format).

Only our own output is read here, so the grammar is the narrow one :func:`exposition.render`
writes: ``name{k="v",...} value`` lines and ``#`` comments. A line that does not fit is skipped
rather than trusted; the page then shows less, never something made up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

Labels = dict[str, str]

_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass
class Series:
    """Every sample of the exposition, grouped by family name."""

    by_name: dict[str, list[tuple[Labels, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def of(self, name: str) -> list[tuple[Labels, float]]:
        return self.by_name.get(name, [])

    _per_uuid: dict[str, dict[str, list[tuple[Labels, float]]]] = field(default_factory=dict)

    def of_device(self, name: str, uuid: str) -> list[tuple[Labels, float]]:
        """``name``'s samples for one device, from an index built on first use."""
        index = self._per_uuid.get(name)
        if index is None:
            index = defaultdict(list)
            for labels, value in self.of(name):
                index[labels.get("uuid", "")].append((labels, value))
            self._per_uuid[name] = index
        return index.get(uuid, [])


def read_exposition(text: str) -> Series:
    series = Series()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parsed = _parse_line(line)
        if parsed is not None:
            series.by_name[parsed[0]].append((parsed[1], parsed[2]))
    return series


def _parse_line(line: str) -> tuple[str, Labels, float] | None:
    brace = line.find("{")
    if brace < 0:
        name, _, raw_value = line.partition(" ")
        labels: Labels | None = {}
    else:
        name = line[:brace]
        labels, end = _parse_labels(line, brace + 1)
        raw_value = line[end + 2 :] if labels is not None else ""
    if labels is None:
        return None
    try:
        value = float(raw_value)
    except ValueError:
        return None
    return name, labels, value


def _parse_labels(line: str, pos: int) -> tuple[Labels | None, int]:
    """Labels from ``pos`` (just after ``{``) to the closing brace, and that brace's index."""
    labels: Labels = {}
    while pos < len(line) and line[pos] != "}":
        equals = line.find('="', pos)
        if equals < 0:
            return None, pos
        key = line[pos:equals]
        value, pos = _parse_value(line, equals + 2)
        if value is None:
            return None, pos
        labels[key] = value
        if pos < len(line) and line[pos] == ",":
            pos += 1
    return (labels, pos) if pos < len(line) else (None, pos)


def _parse_value(line: str, pos: int) -> tuple[str | None, int]:
    chars: list[str] = []
    while pos < len(line):
        char = line[pos]
        if char == '"':
            return "".join(chars), pos + 1
        if char == "\\" and pos + 1 < len(line):
            pos += 1
            chars.append(_UNESCAPE.get(line[pos], "\\" + line[pos]))
        else:
            chars.append(char)
        pos += 1
    return None, pos
