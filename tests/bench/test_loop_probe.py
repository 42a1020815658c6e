"""The loop-lag probe of ``make bench`` (bench/loop_probe.py): how late each wake-up of its timer
was, summed up as a histogram whose percentiles and counts the stall goal reads, and dumped to
a file per request. The arithmetic is checked on made-up lateness, never on a clock; the stall
cell runs once, briefly, against the real exporter, so the launcher cannot rot."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from loop_probe import INTERVAL_S, LagHistogram, Probe, ProbedLoopPolicy, StallTrace
from run import measure_stall


def histogram_of(*late_ms: float) -> LagHistogram:
    histogram = LagHistogram(resolution_ms=0.1)
    for ms in late_ms:
        histogram.record(ms / 1000)
    return histogram


def test_the_maximum_is_exact_and_percentiles_are_bucket_upper_edges() -> None:
    histogram = histogram_of(*[0.25] * 98, 3.04, 17.321)
    assert histogram.max_ms == pytest.approx(17.321), "the longest stall must not be rounded"
    assert histogram.percentile(50) == pytest.approx(0.3), "0.25 ms lies in the 0.2-0.3 bucket"
    assert histogram.percentile(99) == pytest.approx(3.1), "the 99th of 100 is the 3.04 ms one"
    assert histogram.percentile(100) == pytest.approx(17.321), "no edge above the maximum"


def test_an_early_wake_up_counts_as_on_time() -> None:
    histogram = histogram_of(-0.002, 1.0)
    assert histogram.count == 2
    assert histogram.percentile(50) == pytest.approx(0.1), "an early wake-up is 0 ms late"
    assert histogram.total_ms == pytest.approx(1.0), "an early wake-up added negative lateness"


def test_at_least_counts_the_wake_ups_as_late_as_the_threshold_or_later() -> None:
    histogram = histogram_of(0.5, 4.99, 5.0, 9.7, 10.05, 25.0)
    assert histogram.at_least(5) == 4, "5.0, 9.7, 10.05 and 25 ms are at least 5 ms; 4.99 is not"
    assert histogram.at_least(10) == 2
    assert histogram.at_least(20) == 1
    assert histogram.summary()["at_least_ms"] == {"1": 5, "5": 4, "10": 2, "20": 1}


def test_a_summary_of_no_wake_up_has_no_numbers_rather_than_zeros() -> None:
    summary = LagHistogram().summary()
    assert summary["wakeups"] == 0
    assert (summary["p99_ms"], summary["max_ms"]) == (None, None), summary


def test_each_dump_holds_the_wake_ups_since_the_last_and_a_newer_sequence(tmp_path: Path) -> None:
    target = tmp_path / "lag.json"
    probe = Probe(target)
    for ms in (1.0, 2.0, 30.0):
        probe.histogram.record(ms / 1000)
    probe.dump()
    first = json.loads(target.read_text())
    probe.histogram.record(0.004)
    probe.dump()
    second = json.loads(target.read_text())
    assert (first["seq"], first["wakeups"], first["max_ms"]) == (1, 3, pytest.approx(30.0))
    assert (second["seq"], second["wakeups"], second["max_ms"]) == (2, 1, pytest.approx(4.0)), (
        "a dump must start a new distribution: the 30 ms stall belongs to the first window"
    )
    assert not list(tmp_path.glob("*.tmp")), "the dump is written atomically, no leftovers"


def test_the_policy_starts_the_probe_on_the_first_loop_only() -> None:
    started: list[asyncio.AbstractEventLoop] = []
    policy = ProbedLoopPolicy(started.append)
    first, second = policy.new_event_loop(), policy.new_event_loop()
    try:
        first.run_until_complete(asyncio.sleep(0))
        second.run_until_complete(asyncio.sleep(0))
    finally:
        first.close()
        second.close()
    assert started == [first], "the probe must run on the CLI's loop, and only there"


def test_a_late_wake_up_is_traced_with_what_ran_during_its_sleep(tmp_path: Path) -> None:
    trace = StallTrace(tmp_path / "trace.json", threshold_ms=2.0)
    sleep_began = 100.0
    due = sleep_began + INTERVAL_S
    woke = due + 0.030  # 30 ms late
    trace.callbacks = [
        {"at": sleep_began - 0.050, "wall_ms": 5.0, "cpu_ms": 5.0, "what": "ended before"},
        {"at": sleep_began + 0.002, "wall_ms": 25.0, "cpu_ms": 24.0, "what": "the culprit"},
        {"at": woke + 0.001, "wall_ms": 3.0, "cpu_ms": 3.0, "what": "began after"},
    ]
    trace.collections = [
        {"at": sleep_began - 0.001, "wall_ms": 4.0, "cpu_ms": 4.0, "generation": 2},
    ]
    trace.wakeup(due, woke, loop_cpu_s=0.024, process_cpu_s=0.028)
    trace.wakeup(due, due + 0.001, loop_cpu_s=0.0, process_cpu_s=0.0)  # under the threshold
    trace.dump(seq=3)
    data = json.loads((tmp_path / "trace.json").read_text())
    assert data["seq"] == 3
    [wake] = data["wakeups"]
    assert wake["late_ms"] == pytest.approx(30.0)
    assert (wake["loop_cpu_ms"], wake["process_cpu_ms"]) == (pytest.approx(24), pytest.approx(28))
    named = [event.get("what", event["kind"]) for event in wake["overlapping"]]
    assert named == ["the culprit", "gc"], (
        "only what overlapped the sleep names the stall: a callback that ended before the sleep "
        f"or began after the wake-up is not its cause: {named}"
    )
    assert (trace.callbacks, trace.wakeups) == ([], []), "a dump must start the next window"


def test_a_late_wake_up_names_the_threads_that_ran_over_its_sleep(tmp_path: Path) -> None:
    trace = StallTrace(tmp_path / "trace.json", threshold_ms=2.0)
    spinning = threading.Event()
    stop = threading.Event()

    def spin() -> None:
        spinning.set()
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin, name="busy-worker")
    worker.start()
    try:
        spinning.wait()
        before = trace.thread_cpu()
        began = time.monotonic()
        while time.monotonic() - began < 0.05:  # the worker has the GIL for some of this
            pass
        trace.wakeup(0.0, 0.030, loop_cpu_s=0.0, process_cpu_s=0.0, threads_before=before)
    finally:
        stop.set()
        worker.join()
    [wake] = trace.wakeups
    named = {t["thread"]: t for t in wake["threads"]}
    assert "busy-worker" in named, f"the spinning thread was not named: {wake['threads']}"
    assert named["busy-worker"]["cpu_ms"] >= 0.5
    assert any("spin" in frame for frame in named["busy-worker"]["now_at"]), named["busy-worker"]


def test_the_stall_cell_probes_the_real_exporters_loop_while_it_is_scraped(
    tmp_path: Path,
) -> None:
    stall = measure_stall("gpu8", seconds=1.5, warmup_s=0, trace=tmp_path / "trace.json")
    lag, scrapes = stall["loop_lag"], stall["scrapes"]
    assert lag["wakeups"] > 0, f"the probe never woke on the exporter's loop: {stall}"
    assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"], lag
    assert scrapes["count"] >= 1, f"the cell scraped nothing: {stall}"
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["seq"] == 2, "the trace is not the window's (the second dump)"
    assert {"wakeups", "callbacks", "collections", "gc_totals"} <= trace.keys(), trace.keys()


def test_each_dump_counts_the_garbage_collections_of_its_own_window(tmp_path: Path) -> None:
    target = tmp_path / "lag.json"
    probe = Probe(target)
    gc.collect()  # one full collection inside the first window
    probe.dump()
    first = json.loads(target.read_text())
    probe.dump()
    second = json.loads(target.read_text())
    assert first["collections"]["2"] >= 1, "the full collection in the window was not counted"
    assert second["collections"]["2"] == 0, (
        "a dump must count only its own window's collections, not those since the start"
    )
