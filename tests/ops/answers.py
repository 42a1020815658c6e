"""What the kit answers on the e2e stack: every dashboard query, every recorded series and the set
of firing alerts, as a comparable record (``tests/ops/data/answers.json``).

The record was taken on the code before the series cut of issue 34 (docs/migration.md); the e2e
test evaluates today's queries on the same stack and compares. A result is a set of label sets
with a value each; a node's address (an ephemeral port, in ``instance`` and in the ``domain``
named after it) is written as the scenario's name.

``GPU_EXPORTER_RECORD_ANSWERS=1`` writes the record instead of comparing. Recording twice merges:
a query whose values moved between the two runs (wall-clock timestamps, ages, increases over a
window that an incident enters and leaves) is marked ``labels`` and compared by its label sets
only; every other one is compared by value as well, within :data:`RELATIVE` (or :data:`ABSOLUTE`
near zero): the simulated signals are constant, rates over a 15 s window of them agree to a few
parts in a thousand between runs, and an instant gauge against the rate of its counter (the
ratios of docs/migration.md) to under 1%.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

RECORD = Path(__file__).parent / "data" / "answers.json"
RECORD_ENV = "GPU_EXPORTER_RECORD_ANSWERS"
RELATIVE = 0.05
ABSOLUTE = 0.005

Result = list[tuple[tuple[tuple[str, str], ...], float]]
Query = Callable[[str], Awaitable[list[dict[str, Any]]]]

# Queries recorded beside the kit's own: what a panel that now reads a reshaped family must
# still answer, written against the families as they were (keys named in the test's BASELINE_FOR).
EQUIVALENTS = {
    # gpu_nvlink_links{state}: links per GPU by state, from the per-link gauge.
    "equivalent:nvlink links by state": (
        'label_replace(sum without (link) (gpu_nvlink_link_active), "state", "active", "", "")'
        ' or label_replace(sum without (link) (1 - gpu_nvlink_link_active), "state", "inactive",'
        ' "", "")'
    ),
}


def normalise(raw: list[dict[str, Any]], nodes: Mapping[str, str]) -> Result:
    """Sorted (labels, value) pairs; ``nodes`` maps an exporter's address to its name."""
    out = []
    for item in raw:
        labels = dict(item.get("metric", {}))
        labels.pop("__name__", None)
        for name, value in labels.items():
            if value in nodes:  # instance, and a domain named after its node
                labels[name] = nodes[value]
        value = float(item["value"][1])
        out.append((tuple(sorted(labels.items())), value))
    return sorted(out)


async def collect(
    query: Query,
    nodes: Mapping[str, str],
    panels: list[tuple[str, str]],
    records: list[str],
) -> dict[str, dict[str, Any]]:
    """``panels``: (key, expr); ``records``: recorded series names. Alerts under ``alerts``."""
    answers: dict[str, dict[str, Any]] = {}
    for key, expr in [*panels, *EQUIVALENTS.items()]:
        answers[key] = {"expr": expr, "result": normalise(await query(expr), nodes)}
    for name in records:
        answers[f"rule:{name}"] = {"expr": name, "result": normalise(await query(name), nodes)}
    alerts = normalise(await query('ALERTS{alertstate="firing"}'), nodes)
    answers["alerts"] = {"expr": "ALERTS", "result": [(labels, 1.0) for labels, _ in alerts]}
    return answers


def close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(ABSOLUTE, RELATIVE * max(abs(a), abs(b)))


def differs(expected: Mapping[str, Any], result: Result) -> str:
    """Why ``result`` is not ``expected``'s answer; "" when it is."""
    want = {tuple(map(tuple, labels)): value for labels, value in expected["result"]}
    got = dict(result)
    if set(want) != set(got):
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        return f"label sets differ: missing {missing}, unexpected {extra}"
    if expected.get("compare") == "labels":
        return ""
    wrong = [(k, want[k], got[k]) for k in want if not close(want[k], got[k])]
    return f"values differ (labels, before, now): {wrong[:3]}" if wrong else ""


def merge(previous: Mapping[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    """Mark in ``new`` each answer whose values moved since ``previous`` (see the module doc)."""
    for key, answer in new.items():
        before = previous.get(key)
        if before is None:
            continue
        result = [(tuple(map(tuple, labels)), value) for labels, value in answer["result"]]
        if before.get("compare") == "labels" or differs(before, result):
            answer["compare"] = "labels"


def load() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(RECORD.read_text())
    return data


def write(answers: dict[str, dict[str, Any]]) -> None:
    previous = load() if RECORD.exists() else {}
    merge(previous, answers)
    RECORD.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
