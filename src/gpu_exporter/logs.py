"""Structured logging (structlog): JSON for machines, console for people, rate-limited repeats."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(log_format: str, level: str) -> None:
    """Configure structlog once for the process (called by the CLI, never at import)."""
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _route_standard_logging(renderer)


def _route_standard_logging(renderer: Any) -> None:
    """Libraries that log through the standard ``logging`` module (aiohttp, asyncio) write one
    line in the same format, warnings and worse only, instead of bare text and tracebacks that
    a log pipeline expecting JSON lines would split or drop."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(component=name)
    return logger


class RateLimitedLog:
    """The rate-limited logging helper: at most one line per key per ``period`` seconds, and the
    next line that gets through says how many were dropped meanwhile (``suppressed=N``).

    ``log.warning(key, "event", field=value)`` returns whether the line was written.
    """

    def __init__(
        self,
        logger: structlog.stdlib.BoundLogger,
        period: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._limiter = RateLimiter(period, clock)

    def info(self, key: object, event: str, **fields: Any) -> bool:
        return self._emit(self._log.info, key, event, fields)

    def warning(self, key: object, event: str, **fields: Any) -> bool:
        return self._emit(self._log.warning, key, event, fields)

    def error(self, key: object, event: str, **fields: Any) -> bool:
        return self._emit(self._log.error, key, event, fields)

    def _emit(
        self, write: Callable[..., Any], key: object, event: str, fields: dict[str, Any]
    ) -> bool:
        suppressed = self._limiter.allow(key)
        if suppressed is None:
            return False
        write(event, suppressed=suppressed, **fields)
        return True


class RateLimiter:
    """Allows one event per key per ``period`` seconds and counts what it suppressed.

    A failing GPU or source must not flood the log: the first failure is logged at once, repeats
    are summarised as ``suppressed=N`` on the next line that gets through.
    """

    def __init__(self, period: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._period = period
        self._clock = clock
        self._last: dict[object, float] = {}
        self._suppressed: dict[object, int] = {}

    def allow(self, key: object) -> int | None:
        """Return the number of suppressed repeats when the event may be logged, else None."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._period:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)
