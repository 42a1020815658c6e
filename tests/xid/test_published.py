"""Every field of the Xid core's published snapshot reaches the exposition: the check behind
docs/design.md's recipe "Adding an Xid counter" (a field on ``Published``, which mypy makes
``XidCore._publish`` fill, rendered by ``xid/metrics.render``). A field added without its
rendering, or without an example here, fails below and names the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.exposition import render as render_text
from gpu_exporter.xid.classes import load_classifier
from gpu_exporter.xid.core import SOURCE_KMSG, SOURCE_NVML, Published, XidCore
from gpu_exporter.xid.journal import Journal
from gpu_exporter.xid.metrics import FAMILIES, render
from gpu_exporter.xid.ops import CountKey
from gpu_exporter.xid.subsystem import build_inventory

from .conftest import GPU0, fake_devices

ROOT = Path(__file__).resolve().parents[2]
RECIPE = (ROOT / "docs" / "design.md").read_text().split("### Adding an Xid counter", 1)[-1]
RECIPE = RECIPE.split("\n#", 1)[0]
# What the recipe tells a newcomer to change, file by file.
RECIPE_FILES = {
    "xid/core.py": ("class Published", "def _publish", "def note_unparsed", "self._lock"),
    "xid/metrics.py": ("FAMILIES", "def render", "counter("),
    "xid/state.py": ("class XidState", "def _apply", "def to_snapshot", "def from_snapshot"),
    "xid/ops.py": ("def encode", "def decode"),
    "xid/validate.py": ("def check_op", "def check_snapshot"),
}
UUID = GPU0.uuid
# A value unlike the default for each field, as the core would publish it.
EXAMPLES: dict[str, Any] = {
    "counts": {CountKey("0", UUID, "13", "application", "restart_app", "ml", "train"): 1.0},
    "last_seen": {("0", UUID, "13", "application"): 1_700_000_000.0},
    "class_counts": {("0", UUID, "hardware"): 2.0},
    "sxid_counts": {("0", "0000:07:00.0", "11004", "fatal"): 1.0},
    "sxid_last": {("0", "0000:07:00.0", "11004", "fatal"): 1_700_000_000.0},
    "latches": ((UUID, "0", "hardware_xid"),),
    "duplicates": {SOURCE_NVML: 3.0},
    "kmsg_lost": 3.0,
    "unparsed": 3.0,
    "ignored": {"oversized": 3.0},
    "folded": {"xid": 3.0},
    "journal_ok": True,
    "journal_errors": {"append": 3.0},
}
FIELDS = [field.name for field in dataclasses.fields(Published)]


def exposition(published: Published) -> str:
    inventory = build_inventory(fake_devices(), 1)
    samples = render(published, inventory, {SOURCE_KMSG: True, SOURCE_NVML: True}, ())
    return render_text(samples, FAMILIES).text.decode()


def test_every_published_field_has_an_example() -> None:
    missing = sorted(set(FIELDS) - set(EXAMPLES))
    assert not missing, f"Published fields without an example value in this test: {missing}"


@pytest.mark.parametrize("name", FIELDS)
def test_a_published_field_changes_the_exposition(name: str) -> None:
    if name not in EXAMPLES:
        pytest.fail(f"Published.{name} has no example value in this test")
    empty = XidCore(load_classifier(), Journal(None)).published
    changed = dataclasses.replace(empty, **{name: EXAMPLES[name]})
    assert exposition(changed) != exposition(empty), (
        f"Published.{name} is not rendered: xid/metrics.render must turn it into samples"
    )


@pytest.mark.parametrize("path", sorted(RECIPE_FILES))
def test_the_recipe_names_files_that_hold_what_it_says(path: str) -> None:
    assert f"`{path}`" in RECIPE, f"docs/design.md's 'Adding an Xid counter' no longer names {path}"
    text = (ROOT / "src" / "gpu_exporter" / path).read_text()
    missing = [symbol for symbol in RECIPE_FILES[path] if symbol not in text]
    assert not missing, f"{path} lacks what the recipe points a newcomer to: {missing}"
