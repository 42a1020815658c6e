"""Properties of ``Accept`` negotiation: any header gives an answer, and the answer follows the
client's weights (RFC 9110 section 12.5.1) whatever the spelling."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.exposition import wants_openmetrics


@given(st.text(max_size=200))
@example("application/openmetrics-text;q=nan")
@example(";;,,=;q=;q==1,/,*/")
def test_any_header_gives_a_bool(accept: str) -> None:
    assert isinstance(wants_openmetrics(accept), bool)


@dataclass(frozen=True)
class MediaRange:
    media: str  # lower case type/subtype
    weight: int | None  # thousandths; None: no q parameter (1.0)
    version: bool  # carries a version parameter, as Prometheus sends

    @property
    def quality(self) -> float:
        return 1.0 if self.weight is None else self.weight / 1000


MEDIA = ["application/openmetrics-text", "text/plain", "text/*", "*/*", "text/html", "image/*"]
media_ranges = st.builds(
    MediaRange,
    st.sampled_from(MEDIA),
    st.one_of(st.none(), st.integers(0, 1000)),
    st.booleans(),
)


def expected(ranges: list[MediaRange]) -> bool:
    """OpenMetrics only when named (wildcards mean "whatever you serve by default", as in the
    Prometheus client libraries) with a weight above zero and not below the classic format's."""
    openmetrics = max(
        (r.quality for r in ranges if r.media == "application/openmetrics-text"), default=0.0
    )
    # The classic format's weight comes from the most specific range that matches it.
    text = 0.0
    for media in ("*/*", "text/*", "text/plain"):
        if any(r.media == media for r in ranges):
            text = max(r.quality for r in ranges if r.media == media)
    return openmetrics > 0 and openmetrics >= text


@st.composite
def headers(draw: st.DrawFn, ranges: list[MediaRange]) -> str:
    """``ranges`` spelled as clients do: any case, optional spaces, q anywhere among the params."""

    def spell(text: str) -> str:
        flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
        return "".join(c.upper() if flip else c for c, flip in zip(text, flips, strict=True))

    space = st.sampled_from(["", " ", "  ", "\t"])
    items = []
    for r in ranges:
        params = [f"version={draw(st.sampled_from(['1.0.0', '0.0.4']))}"] if r.version else []
        if r.weight is not None:
            digits = draw(st.sampled_from([f"{r.quality:.3f}", f"{r.quality:g}"]))
            params.insert(draw(st.integers(0, len(params))), f"{spell('q')}={digits}")
        separator = draw(space) + ";" + draw(space)
        items.append(separator.join([spell(r.media), *params]))
    return ("," + draw(space)).join(items)


@given(st.data(), st.lists(media_ranges, max_size=6))
@example(None, [MediaRange("application/openmetrics-text", 0, False)])  # q=0: refused
@example(None, [MediaRange("*/*", None, False)])  # curl: the classic format
@example(  # text/plain's own weight counts, not the wildcard's
    None,
    [
        MediaRange("text/plain", 100, False),
        MediaRange("*/*", None, False),
        MediaRange("application/openmetrics-text", 500, False),
    ],
)
def test_the_clients_weights_decide(data: st.DataObject | None, ranges: list[MediaRange]) -> None:
    accept = data.draw(headers(ranges)) if data is not None else plain(ranges)
    assert wants_openmetrics(accept) is expected(ranges), f"Accept: {accept}"


def plain(ranges: list[MediaRange]) -> str:
    return ",".join(r.media + ("" if r.weight is None else f";q={r.quality:g}") for r in ranges)


@given(st.lists(media_ranges, max_size=6), st.integers(0, 6))
def test_a_refused_openmetrics_is_never_served(ranges: list[MediaRange], position: int) -> None:
    refused = MediaRange("application/openmetrics-text", 0, False)
    others = [r for r in ranges if r.media != refused.media]
    header = plain([*others[:position], refused, *others[position:]])
    assert not wants_openmetrics(header), f"OpenMetrics refused with q=0 but served: {header}"


@given(st.lists(media_ranges, max_size=6), st.randoms(use_true_random=False))
@example([MediaRange("application/openmetrics-text", 0, False)], None)  # "Q=0" was ignored
def test_case_does_not_matter(ranges: list[MediaRange], rng: random.Random | None) -> None:
    header = plain(ranges)
    shouted = header.upper() if rng is None else "".join(rng.choice([c, c.upper()]) for c in header)
    assert wants_openmetrics(shouted) is wants_openmetrics(header), f"{shouted!r} vs {header!r}"
