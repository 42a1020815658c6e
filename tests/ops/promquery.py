"""Instant queries against an end-to-end stack's Prometheus, and polling one until it holds:
what every e2e module's stack asks its Prometheus."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, ClassVar

import aiohttp
import pytest
from demo.stack import PrometheusProcess


class PrometheusQueries:
    """Mixed into a stack (a dataclass with ``prometheus`` and ``session``); ``deadline`` is how
    long a condition may take to come true, ``diagnostics`` what a failure prints beside it."""

    prometheus: PrometheusProcess
    session: aiohttp.ClientSession
    deadline: ClassVar[float] = 45.0

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with self.session.get(
            f"{self.prometheus.url}/api/v1/query", params={"query": expr}
        ) as response:
            body = await response.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
        result = body["data"]["result"]
        return list(result) if isinstance(result, list) else [{"value": result}]

    async def eventually(
        self, expr: str, ok: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        """Poll an instant query until ``ok(result)`` (bounded: processes cannot be awaited)."""
        deadline = time.monotonic() + self.deadline
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = await self.query(expr)
            if ok(result):
                return result
            await asyncio.sleep(0.5)
        pytest.fail(f"{what}: {expr} -> {result} after {self.deadline:.0f}s\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        return ""
