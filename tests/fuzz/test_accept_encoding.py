"""Properties of ``Accept-Encoding`` negotiation (RFC 9110 section 12.5.3): gzip is sent only
when the client allows it, whatever the spelling, and any header gives an answer."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.exposition import accepts_gzip

CODINGS = ["gzip", "x-gzip", "deflate", "br", "identity", "*", "zstd"]
codings = st.tuples(st.sampled_from(CODINGS), st.one_of(st.none(), st.integers(0, 1000)))


def spell(coding: str, weight: int | None, upper: bool) -> str:
    name = coding.upper() if upper else coding
    return name if weight is None else f"{name} ; Q={weight / 1000:.3f}"


def expected(items: list[tuple[str, int | None]]) -> bool:
    def quality(weight: int | None) -> float:
        return 1.0 if weight is None else weight / 1000

    for name in ("gzip", "x-gzip"):
        named = [quality(w) for c, w in items if c == name]
        if named:
            return max(named) > 0
    return max((quality(w) for c, w in items if c == "*"), default=0.0) > 0


@given(st.text(max_size=200))
@example("gzip;q=nan")
@example(",;=,q")
def test_any_header_gives_a_bool(header: str) -> None:
    assert isinstance(accepts_gzip(header), bool)


@given(st.lists(codings, max_size=6), st.booleans())
@example([("gzip", 0)], False)  # refused by weight: plain bytes, though "gzip" is in the header
@example([("*", None), ("gzip", 0)], False)  # named beats the wildcard
@example([], False)  # curl without --compressed sends no header
def test_the_clients_weights_decide(items: list[tuple[str, int | None]], upper: bool) -> None:
    header = ", ".join(spell(coding, weight, upper) for coding, weight in items)
    assert accepts_gzip(header) == expected(items), header
