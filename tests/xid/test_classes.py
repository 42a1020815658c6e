"""Classification: the shipped table, line-based refinements, site overrides and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.xid import XidClassesError, load_classifier
from gpu_exporter.xid.classes import CLASSES, builtin_table


def test_builtin_table_covers_the_catalog() -> None:
    table = builtin_table()
    assert set(range(1, 173)) <= set(table)
    assert all(
        entry.xid_class in CLASSES and entry.xid_class != "unknown" for entry in table.values()
    )
    assert all(entry.rationale for entry in table.values())


@pytest.mark.parametrize(
    ("xid", "xid_class", "action"),
    [
        (13, "application", "restart_app"),
        (31, "application", "restart_app"),
        (43, "informational", "ignore"),
        (45, "informational", "workflow_xid_45"),
        (48, "hardware", "workflow_xid_48"),
        (63, "informational", "ignore"),
        (64, "hardware", "reset_gpu"),
        (74, "hardware", "workflow_nvlink_err"),
        (79, "hardware", "restart_bm"),
        (92, "informational", "ignore"),
        (94, "application", "restart_app"),
        (95, "hardware", "reset_gpu"),
        (109, "hardware", "reset_gpu"),
        (119, "hardware", "reset_gpu"),
        (120, "hardware", "reset_gpu"),
        (78, "driver", "update_swfw"),
        (154, "informational", "xid_154"),
        (999, "unknown", "unknown"),
        (4242, "unknown", "unknown"),
    ],
)
def test_builtin_classes(xid: int, xid_class: str, action: str) -> None:
    assert load_classifier().classify(xid) == (xid_class, action)


def test_line_refinements() -> None:
    classifier = load_classifier()
    assert classifier.classify(154, {"recovery_action": "Drain and Reset"}) == (
        "informational",
        "drain_and_reset",
    )
    assert classifier.classify(154, {"recovery_action": "Node Reboot Required"})[1] == "restart_bm"
    assert classifier.classify(154, {"recovery_action": "???"})[1] == "xid_154"
    assert classifier.classify(149, {"severity": "nonfatal"})[0] == "informational"
    assert classifier.classify(149, {"severity": "fatal"})[0] == "hardware"


def test_overrides(tmp_path: Path) -> None:
    path = tmp_path / "classes.yaml"
    path.write_text(
        "# site policy\n"
        "94: hardware\n"
        "109: {class: application}\n"
        "63:\n  class: hardware\n  action: reset_gpu\n"
        "4242: {action: contact_support}\n"
        "149: informational\n"
    )
    classifier = load_classifier(path)
    assert classifier.classify(94) == ("hardware", "restart_app")
    assert classifier.classify(109) == ("application", "reset_gpu")
    assert classifier.classify(63) == ("hardware", "reset_gpu")
    assert classifier.classify(4242) == ("unknown", "contact_support")
    # An override is final: line refinements do not second-guess it.
    assert classifier.classify(149, {"severity": "fatal"})[0] == "informational"
    assert classifier.classify(13) == ("application", "restart_app")


def test_empty_override_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_classifier(path).classify(94) == ("application", "restart_app")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("94: hardware\n63: bogus\n", ":2: Xid 63: invalid class 'bogus'"),
        ("94: hardware\nxid94: hardware\n", ":2: key 'xid94': an Xid code must be 1..99999"),
        ("0: hardware\n", ":1: key '0'"),
        ("94: hardware\n94: driver\n", ":2: Xid 94 is listed twice"),
        ("94:\n  class: hardware\n  severity: high\n", ":3: Xid 94: unknown key 'severity'"),
        ("94: {action: Reset-GPU}\n", ":1: Xid 94.action: invalid value 'Reset-GPU'"),
        ("94: {}\n", ":1: Xid 94: give a class and/or an action"),
        ("94: [hardware]\n", ":1: Xid 94: expected a class or {class, action}"),
        ("- 94\n- 63\n", ":1: expected a mapping"),
        ("94: hardware\n  63: x: y\n", ":2: invalid YAML"),
    ],
)
def test_override_errors_name_file_line_and_value(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "classes.yaml"
    path.write_text(content)
    with pytest.raises(XidClassesError) as info:
        load_classifier(path)
    text = str(info.value)
    assert text.startswith(str(path) + ":"), text
    assert message in text, text
    assert "\n" not in text


def test_missing_override_file(tmp_path: Path) -> None:
    with pytest.raises(XidClassesError, match=r"missing\.yaml: cannot read"):
        load_classifier(tmp_path / "missing.yaml")
