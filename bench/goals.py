"""The benchmark's goals and their verdicts, judged on one run's report (``run.py``).

Every goal is judged on numbers measured in the same run, so a slow or busy machine moves a goal
and what it is compared with alike. A goal whose numbers the run did not measure (a part
skipped, a shape not run) is ``None``: neither met nor missed. This is a benchmark: nothing here
fails a build. docs/performance.md ("Goals") says why each goal is what it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GOAL_SHAPE = "mig56"  # the goals' node: 8 GPUs x 7 MIG instances, 100 pods
GOAL_CONCURRENCY = 8  # scrapers in the scrape-latency goal
CPU_RATIO_LIMIT = 0.8  # resting CPU net of the simulator, against nvitop-exporter's
RSS_LIMIT_MIB = 64.0
SCRAPE_P99_LIMIT_MS = 10.0
STALL_LIMIT_MS = 20.0

# peer.py's names for the two servers of the resting-CPU goal.
OURS = "gpu-exporter"
PEER = "nvitop-exporter"


@dataclass(frozen=True)
class Verdict:
    goal: str
    measured: float | None
    limit: float
    unit: str
    met: bool | None  # None: not measured in this run
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _at_most(goal: str, measured: float | None, limit: float, unit: str, note: str = "") -> Verdict:
    return Verdict(
        goal, measured, limit, unit, None if measured is None else measured <= limit, note
    )


def resting_cpu(peer: dict[str, Any] | None) -> Verdict:
    """Our resting CPU net of the simulator as a multiple of nvitop-exporter's, same windows."""
    goal = f"resting CPU net of the simulator, against {PEER}'s"
    try:
        ours = peer["servers"][OURS]["idle"]["share_percent_net_p50"]  # type: ignore[index]
        theirs = peer["servers"][PEER]["idle"]["share_percent_net_p50"]  # type: ignore[index]
    except (KeyError, TypeError):
        return _at_most(goal, None, CPU_RATIO_LIMIT, "x")
    if theirs <= 0:
        return _at_most(goal, None, CPU_RATIO_LIMIT, "x", note=f"{PEER} measured at 0% of a core")
    note = f"{ours:.2f}% against {theirs:.2f}% of a core"
    return _at_most(goal, ours / theirs, CPU_RATIO_LIMIT, "x", note)


def peak_rss(shapes: dict[str, Any]) -> Verdict:
    rss = shapes.get(GOAL_SHAPE, {}).get("rss", {}).get("exporter_peak_mib")
    return _at_most(
        f"{GOAL_SHAPE}: peak RSS, every default feature on",
        rss,
        RSS_LIMIT_MIB,
        "MiB",
        note="the in-process simulator and simulated kubelet included" if rss else "",
    )


def scrape_p99(shapes: dict[str, Any], encoding: str) -> Verdict:
    cell = (
        shapes.get(GOAL_SHAPE, {})
        .get("latency", {})
        .get("exporter", {})
        .get(f"{encoding}/{GOAL_CONCURRENCY}", {})
    )
    cells = cell.get("p99_ms_cells")
    note = "median cell of " + " ".join(f"{p:.2f}" for p in cells) if cells else ""
    return _at_most(
        f"{GOAL_SHAPE}: scrape p99 at {GOAL_CONCURRENCY} scrapers ({encoding})",
        cell.get("p99_ms"),
        SCRAPE_P99_LIMIT_MS,
        "ms",
        note,
    )


def longest_stall(stall: dict[str, Any] | None) -> Verdict:
    goal = f"{GOAL_SHAPE}: longest event-loop stall, scraped every second"
    lag = (stall or {}).get("loop_lag", {})
    if stall is None or lag.get("max_ms") is None:
        return _at_most(goal, None, STALL_LIMIT_MS, "ms")
    note = (
        f"p99 {lag['p99_ms']:.1f} ms over {lag['wakeups']} wake-ups of a "
        f"{lag['interval_ms']:g} ms timer in {stall['seconds']:g} s"
    )
    return _at_most(goal, lag["max_ms"], STALL_LIMIT_MS, "ms", note)


def judge(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal's verdict on ``report`` (``shapes``, ``stall``, ``peer``), as JSON rows."""
    shapes = report.get("shapes", {})
    verdicts = [
        resting_cpu(report.get("peer")),
        peak_rss(shapes),
        scrape_p99(shapes, "plain"),
        scrape_p99(shapes, "gzip"),
        longest_stall(report.get("stall")),
    ]
    return [v.as_dict() for v in verdicts]
