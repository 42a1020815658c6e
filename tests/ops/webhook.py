"""A receiver of Alertmanager's webhook notifications for the end-to-end tests: every receiver
of the example routing points at ``<url>/<receiver>`` (demo.stack.webhook_alertmanager_config)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

DEADLINE = 45.0  # seconds a notification may take to arrive


@dataclass
class Webhook:
    """Alertmanager webhook notifications, by receiver (the URL path)."""

    notifications: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        payload = await request.json()
        async with self.changed:
            self.notifications.append((request.match_info["receiver"], payload))
            self.changed.notify_all()
        return web.Response(text="ok")

    def alerts(self, receiver: str) -> list[dict[str, Any]]:
        return [
            alert
            for name, payload in self.notifications
            if name == receiver
            for alert in payload["alerts"]
            if alert["status"] == "firing"
        ]

    async def wait_for_alert(
        self, receiver: str, match: Callable[[dict[str, str]], bool], within: float = DEADLINE
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((a for a in self.alerts(receiver) if match(a["labels"])), None)

        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: found() is not None), within)
            except TimeoutError:
                seen = [(r, [a["labels"] for a in p["alerts"]]) for r, p in self.notifications]
                pytest.fail(f"no matching alert reached {receiver} in {within:.0f}s; got {seen}")
        alert = found()
        assert alert is not None
        return alert
