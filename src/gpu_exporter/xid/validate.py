"""Every field of a journalled op and of a snapshot checked before it is applied: the state
directory is a file on the node that others may tamper with, and what it holds is served
(docs/xid.md, "Persistence"). A value of the wrong type is an error, never coerced (a dict as a
boot id, ``"-5"`` as a count); counts are finite and not negative, times finite, classes and
drain reasons from their lists. The file format is unchanged: this reads the compact keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .classes import CLASSES
from .ops import BadOp
from .state import REASONS

Check = Callable[[Any, str], None]


def check_op(op: Any) -> None:
    """Raises :class:`BadOp` saying which field of ``op`` is wrong."""
    if not isinstance(op, dict):
        raise BadOp("not a JSON object")
    kind = op.get("op")
    checks = _OPS.get(kind) if isinstance(kind, str) else None
    if checks is None:
        raise BadOp(f"unknown op {str(kind)[:40]!r}")
    if "n" in op:
        _whole(op["n"], "n")
    for key, (check, required) in checks.items():
        if key in op and op[key] is not None:
            check(op[key], f"{kind}.{key}")
        elif required:
            raise BadOp(f"{kind}.{key}: missing")


def check_snapshot(data: Any) -> tuple[dict[str, Any], list[str]]:
    """``data`` with the table rows that fail their checks left out, and why each was (a header
    field that fails raises :class:`BadOp`: the whole snapshot is unusable)."""
    if not isinstance(data, dict):
        raise BadOp("not a JSON object")
    for key, check in _HEADER.items():
        if key not in data:
            raise BadOp(f"{key}: missing")
        check(data[key], key)
    for key in ("kmsg_mark", "kmsg_file_hash"):
        if data.get(key) is not None:
            (_mark if key == "kmsg_mark" else _text)(data[key], key)
    kept = dict(data)
    problems: list[str] = []
    for key, row_check in _ROWS.items():
        rows = data.get(key, [])
        if not isinstance(rows, list):
            raise BadOp(f"{key}: not a list")
        good = []
        for index, row in enumerate(rows):
            try:
                row_check(row, f"{key}[{index}]")
            except BadOp as exc:
                problems.append(str(exc))
                continue
            good.append(row)
        kept[key] = good
    return kept, problems


# -- field checks --------------------------------------------------------------------------


def _fail(where: str, what: str) -> None:
    raise BadOp(f"{where}: {what}")


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        _fail(where, f"expected a string, got {type(value).__name__}")


def _whole(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(where, f"expected an integer, got {type(value).__name__}")


def _time(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        _fail(where, "expected a finite number")


def _count(value: Any, where: str) -> None:
    _time(value, where)
    if value < 0:
        _fail(where, "a count cannot be negative")


def _flag(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        _fail(where, "expected true or false")


def _reason(value: Any, where: str) -> None:
    if value not in REASONS:
        _fail(where, f"unknown drain reason (one of {', '.join(REASONS)})")


def _row(*checks: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list) or len(value) != len(checks):
            _fail(where, f"expected a list of {len(checks)}")
        for index, (item, item_check) in enumerate(zip(value, checks, strict=True)):
            item_check(item, f"{where}[{index}]")

    return check


def _optional(check: Check) -> Check:
    def optional(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)

    return optional


def _texts(value: Any, where: str) -> None:
    if not isinstance(value, list):
        _fail(where, "expected a list")
    for index, item in enumerate(value):
        _text(item, f"{where}[{index}]")


def _class(value: Any, where: str) -> None:
    if value not in CLASSES:
        _fail(where, f"unknown class (one of {', '.join(CLASSES)})")


def _recent(value: Any, where: str) -> None:
    """``[id, key, channels]``, and the raw code after them when the label is folded."""
    if not isinstance(value, list) or len(value) not in (3, 4):
        _fail(where, "expected [id, key, channels, code]")
    _whole(value[0], f"{where}[0]")
    _text(value[1], f"{where}[1]")
    _texts(value[2], f"{where}[2]")
    if len(value) == 4:
        _whole(value[3], f"{where}[3]")


_S = _text
_LABELS = _row(_S, _S, _S, _class, _S, _S, _S)  # gpu, uuid, xid, class, action, namespace, pod
_SXID = _row(_S, _S, _S, _S)
_mark = _row(_optional(_whole), _S, _whole)
_POSITION = _row(_S, _optional(_whole), _optional(_time), _optional(_S), _optional(_whole))
_KMSG = {"k": (_POSITION, False), "m": (_mark, False), "fh": (_text, False)}
_OPS: dict[str, dict[str, tuple[Check, bool]]] = {
    "count": {
        "l": (_LABELS, True),
        "j": (_text, False),
        "w": (_time, True),
        "r": (_recent, True),
        **_KMSG,
    },
    "dup": {"r": (_whole, True), "c": (_text, True), **_KMSG},
    "sxid": {"l": (_SXID, True), "w": (_time, True), **_KMSG},
    "expire": {"l": (_LABELS, True), "j": (_text, False)},
    "sxid_expire": {"l": (_SXID, True)},
    "latch": {
        "u": (_text, True),
        "why": (_reason, True),
        "on": (_flag, True),
        "g": (_text, False),
        "t": (_time, False),
    },
    "boot": {"b": (_text, True)},
}
_HEADER: dict[str, Check] = {
    "n": _whole,
    "boot_id": _text,
    "kmsg_seq": _whole,
    "kmsg_offset": _optional(_time),
    "kmsg_file": _text,
    "kmsg_file_pos": _whole,
    "next_id": _whole,
}
_ROWS: dict[str, Check] = {
    "counts": _row(_S, _S, _S, _class, _S, _S, _S, _count),
    "count_last": _row(_S, _S, _S, _class, _S, _S, _S, _time),
    "job_counts": _row(_S, _S, _S, _class, _S, _S, _S, _S, _count),  # ..., pod, job_id, value
    "job_count_last": _row(_S, _S, _S, _class, _S, _S, _S, _S, _time),
    "last_seen": _row(_S, _S, _S, _class, _time),
    "expired": _row(_S, _S, _class, _count),
    "sxid_counts": _row(_S, _S, _S, _S, _count),
    "sxid_last": _row(_S, _S, _S, _S, _time),
    "latches": _row(_S, _reason, _S, _time),
    "recent": _row(_whole, _S, _whole, _time, _texts),
}
