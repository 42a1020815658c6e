"""What the kit answers on the e2e stack: every dashboard query, every recorded series and the set
of firing alerts, as a comparable record (``tests/ops/data/answers.json``).

The record was taken on the code before the series cut of issue 34 (docs/migration.md); the e2e
test evaluates today's queries on the same stack and compares. A result is a set of label sets
with a value each; a node's address (an ephemeral port, in ``instance`` and in the ``domain``
named after it) is written as the scenario's name.

The recorded series over an Xid's window are compared by whether they evaluate
(:data:`INCIDENT_WINDOWS`).

``GPU_EXPORTER_RECORD_ANSWERS=SECONDS`` writes the record instead of comparing, SECONDS after the
tests above are done. Recording again merges: a query whose values moved between the runs
(wall-clock timestamps, ages, counters' totals, idle time that accumulates, a workload's
periodic phases) is marked ``labels`` and compared by its label sets only. The record was taken
twice, 0 and 30 s late, the second compared with the first, so a value that depends on how
long the stack has run is marked (moved by over :data:`MOVED`). Every other one is compared by
value as well, within
:data:`RELATIVE` (or :data:`ABSOLUTE` near zero): the simulated signals are constant or
periodic, rates over a 15 s window of them agree between runs to within 6% (a workload's
phases), and an instant gauge with the rate of its counter (the ratios of docs/migration.md) to
under 1%; a wrong replacement query is off by far more (a missing label, a factor).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

RECORD = Path(__file__).parent / "data" / "answers.json"
RECORD_ENV = "GPU_EXPORTER_RECORD_ANSWERS"
RELATIVE = 0.10
ABSOLUTE = 0.005
MOVED = 0.01  # while recording: a value that moved more than this between runs is time-varying
# Recorded series over an Xid's window ("15m", "1h": 15 s on the e2e stack): whether the injected
# Xid is still inside it depends on when the comparison runs, so only that they evaluate is
# compared (the e2e alert tests check what they say).
INCIDENT_WINDOWS = re.compile(r"^rule:.*gpu_xid.*:(recent15m|increase1h)$")

Result = list[tuple[tuple[tuple[str, str], ...], float]]
# Every alert that fired since the stack started (a fresh Prometheus): an alert on an increase
# fires and resolves again within the test's shortened windows.
FIRED = 'max_over_time(ALERTS{alertstate="firing"}[1h])'
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
        if INCIDENT_WINDOWS.match(f"rule:{name}"):
            answers[f"rule:{name}"]["compare"] = "evaluates"
    alerts = normalise(await query(FIRED), nodes)
    answers["alerts"] = {"expr": FIRED, "result": alerts}
    return answers


def close(a: float, b: float, relative: float = RELATIVE) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(ABSOLUTE * relative / RELATIVE, relative * max(abs(a), abs(b)))


def differs(expected: Mapping[str, Any], result: Result, relative: float = RELATIVE) -> str:
    """Why ``result`` is not ``expected``'s answer; "" when it is."""
    if expected.get("compare") == "evaluates":
        return ""
    want = {tuple(map(tuple, labels)): value for labels, value in expected["result"]}
    got = dict(result)
    if set(want) != set(got):
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        return f"label sets differ: missing {missing}, unexpected {extra}"
    if expected.get("compare") == "labels":
        return ""
    wrong = [(k, want[k], got[k]) for k in want if not close(want[k], got[k], relative)]
    return f"values differ (labels, before, now): {wrong[:3]}" if wrong else ""


def merge(first: Mapping[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    """Keep the first run's answers in ``new``, marking each whose values have moved since."""
    for key, answer in new.items():
        before = first.get(key)
        if before is None:
            continue
        result = [(tuple(map(tuple, labels)), value) for labels, value in answer["result"]]
        if before.get("compare") == "evaluates":
            new[key] = dict(before)
            continue
        moved = before.get("compare") == "labels" or differs(before, result, MOVED)
        new[key] = dict(before, compare="labels") if moved else dict(before)


def load() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(RECORD.read_text())
    return data


def write(answers: dict[str, dict[str, Any]]) -> None:
    previous = load() if RECORD.exists() else {}
    merge(previous, answers)
    RECORD.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
