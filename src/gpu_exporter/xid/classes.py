"""Xid classification: the built-in table (``data/xid_classes.tsv``) plus a site override file.

A class says who acts (docs/xid.md): ``hardware`` (infra takes the GPU out of service),
``application`` (the owning team restarts or fixes the job), ``driver`` (infra fixes the software
stack), ``informational`` (nobody), ``unknown`` (a code the table does not know: counted, never
dropped). The action is NVIDIA's immediate action, lower case.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

CLASSES = ("hardware", "application", "driver", "informational", "unknown")
UNKNOWN_ACTION = "unknown"
MAX_CODE = 99_999
_ACTION = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# ASCII digits only: str.isdigit() also takes "²" and other digits int() refuses.
_XID_KEY = re.compile(r"[0-9]{1,5}")
# Xid 154 names the new recovery action; the label uses the catalog's action words.
RECOVERY_ACTIONS = {
    "none": "ignore",
    "drain p2p": "drain_p2p",
    "drain and reset": "drain_and_reset",
    "gpu reset required": "reset_gpu",
    "node reboot required": "restart_bm",
}
NVLINK5_XIDS = range(144, 151)


class XidClassesError(ValueError):
    """A bad classes file. ``str()`` is one line: ``file:line: reason``."""


@dataclass(frozen=True)
class XidClass:
    xid_class: str
    action: str
    rationale: str = ""


class Classifier:
    """Maps an Xid (and what its line says) to ``(class, action)``. Immutable, thread-safe."""

    def __init__(self, table: Mapping[int, XidClass], overridden: frozenset[int] = frozenset()):
        self._table = dict(table)
        self._overridden = overridden

    def known(self, xid: int) -> bool:
        """Whether the table (or a site override) names this code."""
        return xid in self._table

    def entry(self, xid: int) -> XidClass:
        return self._table.get(xid, XidClass("unknown", UNKNOWN_ACTION, "not in the catalog"))

    def classify(self, xid: int, details: Mapping[str, str] | None = None) -> tuple[str, str]:
        entry = self.entry(xid)
        if xid in self._overridden or not details:
            return entry.xid_class, entry.action
        return _refine(xid, entry, details)


def _refine(xid: int, entry: XidClass, details: Mapping[str, str]) -> tuple[str, str]:
    """Line content refines a few codes whose catalog action is "read the line"."""
    if xid == 154:
        action = RECOVERY_ACTIONS.get(details.get("recovery_action", "").strip().lower())
        return entry.xid_class, action or entry.action
    if xid in NVLINK5_XIDS and details.get("severity") == "nonfatal":
        return "informational", entry.action  # a non-fatal link event leaves the GPU in service
    return entry.xid_class, entry.action


def builtin_table() -> dict[int, XidClass]:
    """The table shipped in the package (read on call, never at import)."""
    text = resources.files("gpu_exporter").joinpath("data/xid_classes.tsv").read_text("utf-8")
    table: dict[int, XidClass] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#") or line.startswith("xid\t"):
            continue
        fields = line.split("\t")
        if len(fields) < 3 or fields[1] not in CLASSES or not fields[0].isdigit():
            raise XidClassesError(f"xid_classes.tsv:{number}: malformed row {line[:60]!r}")
        table[int(fields[0])] = XidClass(fields[1], fields[2], fields[4] if len(fields) > 4 else "")
    return table


def load_classifier(override_path: Path | None = None) -> Classifier:
    """The built-in table, with ``override_path`` (YAML) applied on top.

    Raises :class:`XidClassesError` with ``file:line: reason`` for any problem in the file.
    """
    table = builtin_table()
    if override_path is None:
        return Classifier(table)
    overrides = parse_overrides(override_path)
    for xid, (xid_class, action) in overrides.items():
        base = table.get(xid, XidClass("unknown", UNKNOWN_ACTION))
        table[xid] = XidClass(
            xid_class or base.xid_class, action or base.action, f"site override ({override_path})"
        )
    return Classifier(table, frozenset(overrides))


def parse_overrides(path: Path) -> dict[int, tuple[str | None, str | None]]:
    """Read ``{xid: class}`` or ``{xid: {class: ..., action: ...}}`` from a YAML file."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise XidClassesError(f"{path}: cannot read: {_reason(exc)}") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise XidClassesError(f"{path}:{line}: invalid YAML: {problem}") from exc
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise XidClassesError(
            f"{path}:{root.start_mark.line + 1}: expected a mapping of Xid code to class"
        )
    overrides: dict[int, tuple[str | None, str | None]] = {}
    for key_node, value_node in root.value:
        where = f"{path}:{key_node.start_mark.line + 1}"
        xid = _xid_key(key_node, where)
        if xid in overrides:
            raise XidClassesError(f"{where}: Xid {xid} is listed twice")
        overrides[xid] = _override_value(
            value_node, xid, f"{path}:{value_node.start_mark.line + 1}"
        )
    return overrides


def _xid_key(node: yaml.Node, where: str) -> int:
    value = node.value if isinstance(node, yaml.ScalarNode) else None
    text = str(value).strip() if value is not None else ""
    if not _XID_KEY.fullmatch(text) or not 0 < int(text) <= MAX_CODE:
        raise XidClassesError(f"{where}: key {text or '?'!r}: an Xid code must be 1..{MAX_CODE}")
    return int(text)


def _override_value(node: yaml.Node, xid: int, where: str) -> tuple[str | None, str | None]:
    if isinstance(node, yaml.ScalarNode):
        return _check_class(str(node.value), xid, where), None
    if not isinstance(node, yaml.MappingNode):
        raise XidClassesError(f"{where}: Xid {xid}: expected a class or {{class, action}}")
    found: dict[str, str] = {}
    for key_node, value_node in node.value:
        key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
        line_where = f"{where.rsplit(':', 1)[0]}:{key_node.start_mark.line + 1}"
        if key not in ("class", "action"):
            raise XidClassesError(
                f"{line_where}: Xid {xid}: unknown key {key!r} (allowed: class, action)"
            )
        if not isinstance(value_node, yaml.ScalarNode):
            raise XidClassesError(f"{line_where}: Xid {xid}.{key}: expected a string")
        if key in found:
            raise XidClassesError(f"{line_where}: Xid {xid}.{key} is given twice")
        found[key] = str(value_node.value)
    if not found:
        raise XidClassesError(f"{where}: Xid {xid}: give a class and/or an action")
    xid_class = _check_class(found["class"], xid, where) if "class" in found else None
    action = found.get("action")
    if action is not None and not _ACTION.match(action):
        raise XidClassesError(
            f"{where}: Xid {xid}.action: invalid value {action!r} "
            "(lower case letters, digits and _, e.g. reset_gpu)"
        )
    return xid_class, action


def _check_class(value: str, xid: int, where: str) -> str:
    if value not in CLASSES:
        raise XidClassesError(
            f"{where}: Xid {xid}: invalid class {value!r} (one of {', '.join(CLASSES)})"
        )
    return value


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
