"""The one rate-limited logging helper: a line per key per period, and the next line that gets
through says how many were dropped."""

from __future__ import annotations

from structlog.testing import capture_logs

from gpu_exporter.logs import RateLimitedLog, get_logger
from tests.helpers import ManualClock


def test_repeats_within_the_period_are_dropped_and_counted_on_the_next_line() -> None:
    clock = ManualClock()
    log = RateLimitedLog(get_logger("test"), period=60.0, clock=clock)
    with capture_logs() as logs:
        assert log.warning("disk", "cannot write", path="/x")
        for _ in range(3):
            assert not log.warning("disk", "cannot write", path="/x")
        assert log.error("other", "another key is not held back")
        clock.advance(60.0)
        assert log.warning("disk", "cannot write", path="/x")
    lines = [(e["event"], e["suppressed"], e["log_level"]) for e in logs]
    assert lines == [
        ("cannot write", 0, "warning"),
        ("another key is not held back", 0, "error"),
        ("cannot write", 3, "warning"),
    ]
