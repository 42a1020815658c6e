"""The whole exposition for tests/golden/scenario.yaml at a fixed simulated time equals the
committed tests/golden/exposition.txt: a change to any series (a name, a label, a value, the
order) is a reviewable diff of that file. Regenerate with ``make golden`` and read the diff."""

from __future__ import annotations

import difflib

from tests.conftest import promtool_check_metrics
from tests.golden.exposition import GOLDEN, golden_exposition


async def test_the_exposition_is_the_committed_golden_file() -> None:
    actual = await golden_exposition()
    expected = GOLDEN.read_text()
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), "golden", "now", lineterm="", n=1
        )
        shown = "\n".join(list(diff)[:80])
        raise AssertionError(
            "the exposition differs from tests/golden/exposition.txt; if the change is meant, "
            f"run `make golden` and commit the file with its diff reviewed:\n{shown}"
        )


async def test_the_golden_exposition_is_valid_for_promtool() -> None:
    promtool_check_metrics((await golden_exposition()).replace("<timing>", "0"))
