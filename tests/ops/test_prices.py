"""The price per GPU-hour is set in one file, alerts/gpu_prices.yml, rendered into rules; a bad
file is refused with what is wrong and where, and nothing is written."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from .helpers import ALERTS


def _load_script_module(name: str) -> object:
    """The generators are scripts beside the rule files, not a package: load one by path."""
    spec = importlib.util.spec_from_file_location(name, ALERTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prices: Any = _load_script_module("prices")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpu_prices.yml"
    path.write_text(text)
    return path


def test_the_shipped_price_file_loads() -> None:
    currency, default, models = prices.load_prices(ALERTS / "gpu_prices.yml")
    assert currency
    assert default >= 0
    assert all(price >= 0 for price in models.values())


def test_a_model_name_is_quoted_safely_into_promql(tmp_path: Path) -> None:
    path = write(tmp_path, "currency: USD\ndefault: 1\nmodels: {'A \"quoted\" GPU': 2}\n")
    rules = {rule["record"]: rule["expr"] for rule in prices.price_group(path)["rules"]}
    assert '"A \\"quoted\\" GPU"' in rules["model:gpu_price_per_hour:value"]


def test_without_listed_models_every_device_costs_the_default(tmp_path: Path) -> None:
    group = prices.price_group(write(tmp_path, "currency: USD\ndefault: 2.5\n"))
    rules = {rule["record"]: rule["expr"] for rule in group["rules"]}
    assert "model:gpu_price_per_hour:value" not in rules, "no model listed, no per-model rule"
    assert rules["device:gpu_model_price_per_hour:value"].endswith("* 0 + 2.5")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("currency: USD\ndefault: -1\n", "default: a price cannot be negative"),
        ("currency: USD\ndefault: 1\nmodels: {H100: cheap}\n", "models['H100']: want a price"),
        ("currency: USD\ndefault: .nan\n", "default: want a price"),
        ("default: 1\n", "currency: want a name"),
        ("currency: USD\ndefault: 1\nprice: 3\n", "want the keys"),
    ],
)
def test_a_bad_price_file_says_what_and_where(tmp_path: Path, text: str, complaint: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(prices.PriceError, match=str(path)) as error:
        prices.load_prices(path)
    assert complaint in str(error.value)
