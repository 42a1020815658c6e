"""Headless Chromium against a page on loopback: the DOM it built, or a screenshot."""

from __future__ import annotations

import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from tests.conftest import require_binary

CHROMIUM_TIMEOUT_SECONDS = 90


def _chromium(url: str, *args: str) -> str:
    chromium = require_binary("chromium")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
                "--disable-gpu",
                "--no-first-run",
                f"--user-data-dir={profile}",
                *args,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=CHROMIUM_TIMEOUT_SECONDS,
            check=False,
        )
    assert result.returncode == 0, f"chromium failed on {url}: {result.stderr[-2000:]}"
    return result.stdout


def rendered_dom(url: str) -> str:
    """The DOM after Chromium loaded and laid out ``url`` (``--dump-dom``)."""
    return _chromium(url, "--dump-dom")


def screenshot(url: str, path: Path, width: int = 1500, height: int = 1100) -> None:
    _chromium(url, "--hide-scrollbars", f"--window-size={width},{height}", f"--screenshot={path}")


class Elements(HTMLParser):
    """Every element's tag, attributes and the text directly inside it, in document order."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.rows: list[tuple[dict[str, str], str]] = []  # <tr> attributes and all their text
        self._row: list[str] | None = None
        self._row_attrs: dict[str, str] = {}
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes))
        if tag == "tr":
            self._row, self._row_attrs = [], attributes

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._row is not None:
            self.rows.append((self._row_attrs, " ".join(self._row)))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and data.strip():
            self._row.append(data.strip())

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if name in a.get("class", "").split()]
