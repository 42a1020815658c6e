"""Prometheus exposition rendered once per sample and served as cached bytes.

Scrapes never build metric objects: the sampler hands finished samples to :func:`render` (or
blocks of them to :func:`render_blocks`), which writes both the classic text format and
OpenMetrics into an :class:`Exposition`; the sampler keeps that until the next render, and every
scrape is served its bytes (and their gzip form, built once per render). Label strings are
escaped once when a device or a label set first appears, not on every sample.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property, lru_cache
from itertools import accumulate, chain

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class MetricType(Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True)
class Family:
    """A metric family: its exposed name (counters end in ``_total``), type and help text.

    ``served=False``: a family the status page reads and ``/metrics`` does not serve (an instant
    gauge whose counter twin already says it to Prometheus, docs/migration.md); its lines go to
    :attr:`Exposition.unserved`.
    """

    name: str
    type: MetricType
    help: str
    served: bool = True

    def __post_init__(self) -> None:
        if self.type is MetricType.COUNTER and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")
        if self.type is MetricType.GAUGE and self.name.endswith("_total"):
            raise ValueError(f"gauge {self.name!r} must not end in _total")

    @property
    def openmetrics_name(self) -> str:
        """OpenMetrics names a counter family without its ``_total`` sample suffix."""
        return self.name.removesuffix("_total") if self.type is MetricType.COUNTER else self.name

    @cached_property
    def headers(self) -> tuple[str, str]:
        """The ``# HELP``/``# TYPE`` lines in the classic text format and in OpenMetrics."""
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        kind = self.type.value
        text = f"# HELP {self.name} {help_text}\n# TYPE {self.name} {kind}\n"
        om_name = self.openmetrics_name
        return text, f"# HELP {om_name} {help_text}\n# TYPE {om_name} {kind}\n"


def gauge(name: str, help_text: str, *, served: bool = True) -> Family:
    return Family(name, MetricType.GAUGE, help_text, served)


def counter(name: str, help_text: str) -> Family:
    return Family(name, MetricType.COUNTER, help_text)


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_string(labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """Render ``k1="v1",k2="v2"`` once, so samples can reuse it."""
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return ",".join(f'{key}="{escape_label_value(value)}"' for key, value in pairs)


def join_labels(*parts: str) -> str:
    return ",".join(part for part in parts if part)


_INF = math.inf


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: integers without a point (below 1e15), NaN, +Inf.

    Called once per series and render, so the common cases (integer, finite) are tested first."""
    value = float(value)
    if value.is_integer():  # False for NaN and the infinities
        return str(int(value)) if -1e15 < value < 1e15 else repr(value)
    if value != value:
        return "NaN"
    if value == _INF:
        return "+Inf"
    if value == -_INF:
        return "-Inf"
    return repr(value)


@dataclass(frozen=True, slots=True)
class Sample:
    """One series value: ``labels`` is a pre-rendered label string (see :func:`label_string`)."""

    family: Family
    labels: str
    value: float


@dataclass
class Exposition:
    """Both encodings of one render, with gzip variants built lazily and kept; ``unserved`` is
    the classic text of the families only the status page reads (never in a response)."""

    text: bytes
    openmetrics: bytes
    unserved: bytes = b""
    _gzipped: dict[bool, bytes] = field(default_factory=dict)

    def gzipped_formats(self) -> tuple[bool, ...]:
        """The formats (``openmetrics``) whose gzip body was built: what scrapers asked for."""
        return tuple(self._gzipped)

    def cached_gzip(self, *, openmetrics: bool) -> bytes | None:
        """The gzip body if it was built already (see ``http/gzipped.py``)."""
        return self._gzipped.get(openmetrics)

    def body(self, *, openmetrics: bool, gzipped: bool) -> bytes:
        raw = self.openmetrics if openmetrics else self.text
        if not gzipped:
            return raw
        cached = self._gzipped.get(openmetrics)
        if cached is None:
            # Level 6 costs ~2x level 1 for ~15% smaller bodies; scrapes are local and frequent.
            cached = gzip.compress(raw, compresslevel=1, mtime=0)
            self._gzipped[openmetrics] = cached
        return cached


class Block:
    """One part's samples grouped by family (in first-appearance order): the families, each
    one's labels and values, and its exposition lines, written on first use and kept.

    Formatting is deferred to the first render that reads the block, so a round nobody scrapes
    formats nothing (at a 15 s scrape interval and 1 s rounds, 14 rounds in 15). A part whose
    samples did not change since it was last rendered (a slow-cadence collector's, renewed every
    30 s, or any part whose values stood still, see :meth:`BlockWriter.block`) keeps its block
    and hands the same one to every render: its values are formatted once, not once per render.
    Built on one thread, read on another only after it is handed over (a job's outcome). Two
    renders may read one block at once (one on a thread, see ``Sampler._publish_round``): both
    format the same lines, so the memo needs no lock.

    Every job keeps a block from one round to the next, so a block costs the garbage collector
    one object, whatever its size: the families are one tuple (shared with the part's previous
    block), and the rest are flat tuples of strings and numbers, which it stops tracking at the
    first collection that sees them (a tuple of tuples takes one collection per level, and by
    then it has been promoted to the old generation)."""

    __slots__ = ("_ends", "_labels", "_lines", "_prefix", "_values", "families")

    def __init__(
        self,
        families: tuple[Family, ...] = (),
        ends: tuple[int, ...] = (),
        labels: tuple[str, ...] = (),
        values: tuple[float, ...] = (),
        prefix: str = "",
    ) -> None:
        """``labels`` and ``values``: every sample's, family after family; ``ends``: where each
        family's samples end in them."""
        self.families = families
        self._ends = ends
        self._labels = labels
        self._values = values
        self._prefix = prefix
        self._lines: tuple[str, ...] | None = None if families else ()

    def format(self) -> Block:
        """Format the lines now, on this thread, rather than at the first read; returns self."""
        self.lines  # noqa: B018
        return self

    @property
    def lines(self) -> tuple[str, ...]:
        """Each family's sample lines (in :attr:`families` order), formatted now if this is the
        first read."""
        lines = self._lines
        if lines is None:
            labels, values, prefix = self._labels, self._values, self._prefix
            bodies = []
            start = 0
            for family, end in zip(self.families, self._ends, strict=True):
                samples = zip(labels[start:end], values[start:end], strict=True)
                bodies.append(_lines(family.name, prefix, samples))
                start = end
            lines = self._lines = tuple(bodies)
        return lines


def _lines(name: str, prefix: str, samples: Iterable[tuple[str, float]]) -> str:
    """One family's sample lines; ``prefix`` (a device's labels) leads every line's label set."""
    lines = []
    for labels, value in samples:
        if not labels:
            labels = prefix
        elif prefix:
            labels = f"{prefix},{labels}"
        text = format_value(value)
        lines.append(f"{name}{{{labels}}} {text}\n" if labels else f"{name} {text}\n")
    return "".join(lines)


EMPTY_BLOCK = Block()


class BlockWriter:
    """Builds a :class:`Block` sample by sample; ``prefix`` (a device's labels) leads every
    line's label set. The hot path of every collector: one call per series and round, kept flat;
    it only records the value (formatting waits for a render, see :class:`Block`)."""

    __slots__ = ("_families", "_labels", "_prefix", "_values")

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        # By family name, in first-appearance order: each sample's labels and value, in two
        # lists rather than a list of pairs (a pair is one more object per sample for the
        # garbage collector to count).
        self._families: dict[str, Family] = {}
        self._labels: dict[str, list[str]] = {}
        self._values: dict[str, list[float]] = {}

    def add(self, family: Family, value: float, labels: str = "") -> None:
        # float() now, not at render: a value that is not a number fails its collector, here,
        # instead of the render that every other part's series share.
        value = float(value)
        name = family.name
        values = self._values.get(name)
        if values is None:
            self._families[name] = family
            self._labels[name] = [labels]
            self._values[name] = [value]
        else:
            values.append(value)
            self._labels[name].append(labels)

    def block(self, previous: Block = EMPTY_BLOCK) -> Block:
        """The block of the samples added. ``previous``: this part's block from its last run,
        returned itself when the same samples were written (its lines, if formatted, are kept),
        and otherwise sharing its families tuple when the same families were (a collector
        writes the same ones round after round)."""
        if not self._values:
            return EMPTY_BLOCK
        families = tuple(self._families.values())
        ends = tuple(accumulate(map(len, self._values.values())))
        labels = tuple(chain.from_iterable(self._labels.values()))
        values = tuple(chain.from_iterable(self._values.values()))
        if families == previous.families:
            if (
                values == previous._values
                and labels == previous._labels
                and ends == previous._ends
                and self._prefix == previous._prefix
            ):
                return previous
            families = previous.families
        return Block(families, ends, labels, values, self._prefix)


def render_block(samples: Iterable[Sample]) -> Block:
    writer = BlockWriter()
    for sample in samples:
        writer.add(sample.family, sample.value, sample.labels)
    return writer.block()


def render(samples: Iterable[Sample], family_order: Sequence[Family] = ()) -> Exposition:
    """Group samples by family name (in ``family_order``, then first appearance) and encode both
    formats. A family with no samples is omitted entirely: an unsupported signal leaves no trace.

    Grouping is by name so that two parts declaring the same family (``gpu_exporter_source_up``
    from the sampler and from a log source, say) still yield one HELP/TYPE block.
    """
    return render_blocks((render_block(samples),), family_order)


def render_blocks(blocks: Iterable[Block], family_order: Sequence[Family] = ()) -> Exposition:
    """:func:`render` for samples already written as blocks; each family's lines come in block
    order, so a family several blocks write into is still one HELP/TYPE group."""
    families: dict[str, Family] = {}
    bodies: dict[str, list[str]] = {}
    for family in family_order:
        families.setdefault(family.name, family)
        bodies.setdefault(family.name, [])
    for block in blocks:
        for family, body in zip(block.families, block.lines, strict=True):
            parts = bodies.get(family.name)
            if parts is None:
                families[family.name] = family
                parts = bodies[family.name] = []
            parts.append(body)
    text_parts: list[str] = []
    om_parts: list[str] = []
    unserved_parts: list[str] = []
    for name, parts in bodies.items():
        if not parts:
            continue
        family = families[name]
        text_header, om_header = family.headers
        body = "".join(parts)
        if not family.served:
            unserved_parts += (text_header, body)
            continue
        text_parts += (text_header, body)
        om_parts += (om_header, body)
    om_parts.append("# EOF\n")
    return Exposition(
        text="".join(text_parts).encode(),
        openmetrics="".join(om_parts).encode(),
        unserved="".join(unserved_parts).encode(),
    )


# Negotiation is memoised: a scraper sends the same headers every time, and parsing them cost
# a scrape more than serving the cached body (bounded: odd headers cannot grow it).
@lru_cache(maxsize=256)
def wants_openmetrics(accept: str) -> bool:
    """True when the client's Accept header prefers OpenMetrics text over the classic format.

    OpenMetrics must be named (a wildcard means "your default", as in the Prometheus client
    libraries); the classic format takes the weight of its most specific range (RFC 9110 12.5.1:
    ``text/plain`` over ``text/*`` over ``*/*``). A tie goes to OpenMetrics.
    """
    weights: dict[str, float] = {}
    for item in accept.split(","):
        media, weight = _media_range(item)
        weights[media] = max(weight, weights.get(media, 0.0))
    openmetrics = weights.get("application/openmetrics-text", 0.0)
    text = next((weights[m] for m in ("text/plain", "text/*", "*/*") if m in weights), 0.0)
    return openmetrics > 0 and openmetrics >= text


@lru_cache(maxsize=256)
def accepts_gzip(accept_encoding: str) -> bool:
    """True when the client's Accept-Encoding allows gzip (RFC 9110 12.5.3): named with a
    non-zero weight (``x-gzip`` is the same coding), or not named and allowed by ``*``."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, weight = _media_range(item)  # a coding is weighted as a media range is
        weights[coding] = max(weight, weights.get(coding, 0.0))
    for name in ("gzip", "x-gzip"):
        if name in weights:
            return weights[name] > 0
    return weights.get("*", 0.0) > 0


def _media_range(item: str) -> tuple[str, float]:
    """``Type/Sub; version=1; Q=0.5`` -> ``("type/sub", 0.5)``: names are case-insensitive."""
    media, *params = item.split(";")
    weight = 1.0
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            weight = _qvalue(value.strip())
    return "/".join(part.strip() for part in media.lower().split("/", 1)), weight


def _qvalue(text: str) -> float:
    """A weight 0..1; anything else ("nan", "2", "high") refuses the range, as a malformed one."""
    try:
        weight = float(text)
    except ValueError:
        return 0.0
    return weight if 0.0 <= weight <= 1.0 else 0.0
