"""One status render per exposition render or process scan, whatever the number of viewers."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Protocol

from ...exposition import Exposition
from .model import NodeStatus, UnheldProcess, build_status
from .page import render_html, to_json
from .reader import read_exposition

MAX_CACHED_PAGES = 4


class StatusView(Protocol):
    """What the page needs from the sampler: its last render and its health, all in memory."""

    @property
    def exposition(self) -> Exposition: ...

    @property
    def ready(self) -> bool: ...

    def healthy(self) -> bool: ...

    def problems(self) -> list[str]: ...


class StatusPage:
    """Builds the page from the sampler's last exposition and keeps it until the next render, a
    change of health or a new process scan; the HTML for each ``refresh`` value asked for is kept
    alongside."""

    def __init__(
        self,
        view: StatusView,
        version: str,
        processes: Callable[[], Mapping[str, tuple[UnheldProcess, ...]]] | None = None,
    ) -> None:
        """``processes``: each device's GPU processes that do not hold it (the allocation
        subsystem's last scan), read with each new render."""
        self._view = view
        self._processes = processes
        self._version = version
        self._exposition: Exposition | None = None
        self._key: tuple[object, ...] = ()
        self._status: NodeStatus | None = None
        self._html: dict[int | None, bytes] = {}
        self._json: bytes = b""

    def status(self) -> NodeStatus:
        view = self._view
        exposition = view.exposition
        # The processes are part of the key: a scan lands between renders (and a round's render
        # may still be on its thread), so the last render's page would show the scan before.
        processes = self._processes() if self._processes is not None else None
        key = (view.ready, view.healthy(), tuple(view.problems()), processes)
        if self._status is None or exposition is not self._exposition or key != self._key:
            self._status = build_status(
                read_exposition((exposition.text + exposition.unserved).decode()),
                version=self._version,
                ready=key[0],
                healthy=key[1],
                problems=key[2],
                processes=processes,
            )
            self._exposition, self._key, self._html, self._json = exposition, key, {}, b""
        return self._status

    def html(self, refresh: int | None) -> bytes:
        status = self.status()
        body = self._html.get(refresh)
        if body is None:
            if len(self._html) >= MAX_CACHED_PAGES:  # one per refresh value asked for: bounded
                self._html.clear()
            body = self._html[refresh] = render_html(status, refresh=refresh).encode()
        return body

    def json(self) -> bytes:
        status = self.status()
        if not self._json:
            self._json = json.dumps(to_json(status), indent=1).encode() + b"\n"
        return self._json
