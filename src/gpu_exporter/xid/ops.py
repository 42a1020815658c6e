"""The Xid state's changes as typed values, and their compact form in the journal file.

In memory every change is one of the frozen dataclasses below (:data:`Op`); only
:func:`encode` and :func:`decode` know the file's one-letter keys, which must stay readable by
this version forever (an existing ``--state-dir`` keeps loading; ``tests/xid/test_ops.py`` has a
journal written by an earlier version). A key an older exporter does not know (``m``, ``fh``, the
raw code in ``r``) is ignored by it; a new *kind* of op would stop its replay, so ops that older
versions do not know are written into a snapshot instead (``XidCore.expire_pod_series``).

This module imports nothing of ours: the kernel-log identity types live here for every reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

# (switch, pci_bus_id, sxid, severity): the labels of gpu_nvswitch_sxid_errors_total.
SxidKey = tuple[str, str, str, str]


class CountKey(NamedTuple):
    """The label values of one ``gpu_xid_errors_total`` series, in the family's label order.

    The holder is a pod (``namespace``, ``pod``) or, on a Slurm node, a job (``job_id``, the
    pod labels empty); the journal writes ``job_id`` under a key of its own (``"j"``, see
    :func:`encode`) so the seven labels an older exporter reads keep their shape."""

    gpu: str
    uuid: str
    xid: str  # the code, or "other" once the GPU has used up its unknown codes
    xid_class: str
    action: str
    namespace: str
    pod: str
    job_id: str = ""


class BadOp(ValueError):
    """An op or snapshot that does not have the expected shape (a corrupt journal)."""


class KmsgPosition(NamedTuple):
    """Where a kernel-log record sits."""

    boot_id: str
    seq: int | None  # /dev/kmsg's sequence number (None from syslog(2) or a plain file)
    offset: float | None  # wall time of the kernel's usec 0, as anchored when it was read
    file_key: str | None  # "device:inode" of a regular file standing in for /dev/kmsg
    file_end: int | None  # the record's end offset in that file


class KmsgMark(NamedTuple):
    """A kernel-log record's identity without a sequence number (what syslog(2) gives)."""

    usec: int | None
    digest: str  # the text's hash
    occurrence: int  # among records with the same usec and text


@dataclass(frozen=True)
class Origin:
    """The kernel-log record an op came from (all None for an NVML event)."""

    position: KmsgPosition | None = None
    mark: KmsgMark | None = None
    file_hash: str | None = None  # the record's text hash, for a regular file


@dataclass(frozen=True)
class Count:
    """An Xid counted: ``event`` is the de-duplication entry (id, key, channels, raw code)."""

    labels: CountKey
    when: float
    event_id: int
    dedup_key: str
    channels: tuple[str, ...]
    xid: int | None  # None in journals written before the label could be "other"
    origin: Origin = Origin()


@dataclass(frozen=True)
class Duplicate:
    """Another channel reported the counted event ``target``."""

    target: int
    channel: str
    origin: Origin = Origin()


@dataclass(frozen=True)
class SxidCount:
    labels: SxidKey
    when: float
    origin: Origin = Origin()


@dataclass(frozen=True)
class Expire:
    """A pod's Xid series leaves the exposition (its count stays in its class's total)."""

    labels: CountKey


@dataclass(frozen=True)
class SxidExpire:
    labels: SxidKey


@dataclass(frozen=True)
class SetLatch:
    uuid: str
    gpu: str
    reason: str
    since: float


@dataclass(frozen=True)
class ClearLatch:
    uuid: str
    reason: str


@dataclass(frozen=True)
class Boot:
    """A new boot: the kernel log starts over and every drain latch clears."""

    boot_id: str


Op = Count | Duplicate | SxidCount | Expire | SxidExpire | SetLatch | ClearLatch | Boot


@dataclass(frozen=True)
class Numbered:
    """An op with its journal number (replay skips what the snapshot already holds)."""

    number: int
    op: Op


# -- the file format --------------------------------------------------------------------------


def encode(op: Op, number: int | None = None) -> dict[str, Any]:
    """The op as the journal writes it (compact keys)."""
    record = _encode(op)
    if number is not None:
        record["n"] = number
    return record


def _encode(op: Op) -> dict[str, Any]:
    match op:
        case Count():
            recent = [op.event_id, op.dedup_key, list(op.channels)]
            if op.xid is not None:
                recent.append(op.xid)  # last: an older exporter ignores it
            record = {"op": "count", **_labels(op.labels), "w": op.when, "r": recent}
            return _with_origin(record, op.origin)
        case Duplicate():
            return _with_origin({"op": "dup", "r": op.target, "c": op.channel}, op.origin)
        case SxidCount():
            return _with_origin({"op": "sxid", "l": list(op.labels), "w": op.when}, op.origin)
        case Expire():
            return {"op": "expire", **_labels(op.labels)}
        case SxidExpire():
            return {"op": "sxid_expire", "l": list(op.labels)}
        case SetLatch():
            return {"op": "latch", "u": op.uuid, "g": op.gpu, "why": op.reason, "on": True,
                    "t": op.since}  # fmt: skip
        case ClearLatch():
            return {"op": "latch", "u": op.uuid, "why": op.reason, "on": False}
        case Boot():
            return {"op": "boot", "b": op.boot_id}


def _labels(labels: CountKey) -> dict[str, Any]:
    """``"l"``: the seven labels every version reads; ``"j"``: a job holder's id, which an older
    exporter ignores (it counts the Xid unattributed rather than stopping its replay)."""
    record: dict[str, Any] = {"l": list(labels[:7])}
    if labels.job_id:
        record["j"] = labels.job_id
    return record


def _with_origin(record: dict[str, Any], origin: Origin) -> dict[str, Any]:
    record["k"] = list(origin.position) if origin.position is not None else None
    if origin.mark is not None:
        record["m"] = list(origin.mark)
    if origin.file_hash is not None:
        record["fh"] = origin.file_hash
    return record


def decode(record: Mapping[str, Any]) -> tuple[int | None, Op]:
    """``(number, op)`` from a journal record; :class:`BadOp` when it is malformed."""
    try:
        kind = record["op"]
        parse = _DECODERS[kind]
    except (KeyError, TypeError) as exc:
        raise BadOp(f"unknown op {record!r:.80}") from exc
    try:
        op = parse(record)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadOp(f"malformed {kind} op: {exc}") from exc
    number = record.get("n")
    return (number if isinstance(number, int) else None), op


def _count(r: Mapping[str, Any]) -> Count:
    recent = r["r"]
    return Count(
        labels=count_key(r["l"], r.get("j")),
        when=float(r["w"]),
        event_id=int(recent[0]),
        dedup_key=str(recent[1]),
        channels=tuple(str(c) for c in recent[2]),
        xid=int(recent[3]) if len(recent) > 3 else None,
        origin=_origin(r),
    )


def _latch(r: Mapping[str, Any]) -> SetLatch | ClearLatch:
    uuid, reason = str(r["u"]), str(r["why"])
    if r["on"]:
        return SetLatch(uuid, str(r["g"]), reason, float(r["t"]))
    return ClearLatch(uuid, reason)


def _origin(r: Mapping[str, Any]) -> Origin:
    return Origin(position(r.get("k")), mark(r.get("m")), _text(r.get("fh")))


def position(raw: Sequence[Any] | None) -> KmsgPosition | None:
    """``[boot id, seq | None, usec-0 wall time | None, file key | None, file end | None]``."""
    if raw is None:
        return None
    boot_id, seq, offset, file_key, file_end = raw
    return KmsgPosition(
        str(boot_id),
        None if seq is None else int(seq),
        None if offset is None else float(offset),
        _text(file_key),
        None if file_end is None else int(file_end),
    )


def mark(raw: Sequence[Any] | None) -> KmsgMark | None:
    """``[usec | None, text hash, occurrence]``."""
    if raw is None:
        return None
    usec, digest, occurrence = raw
    return KmsgMark(None if usec is None else int(usec), str(digest), int(occurrence))


def count_key(values: Sequence[Any], job_id: Any = None) -> CountKey:
    """The seven labels as the journal holds them, and a job holder's id (None: none)."""
    gpu, uuid, xid, xid_class, action, namespace, pod = (str(v) for v in values)
    job = "" if job_id is None else str(job_id)
    return CountKey(gpu, uuid, xid, xid_class, action, namespace, pod, job)


def sxid_key(values: Sequence[Any]) -> SxidKey:
    switch, bus_id, sxid, severity = (str(value) for value in values)
    return (switch, bus_id, sxid, severity)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


_DECODERS: dict[str, Any] = {
    "count": _count,
    "dup": lambda r: Duplicate(int(r["r"]), str(r["c"]), _origin(r)),
    "sxid": lambda r: SxidCount(sxid_key(r["l"]), float(r["w"]), _origin(r)),
    "expire": lambda r: Expire(count_key(r["l"], r.get("j"))),
    "sxid_expire": lambda r: SxidExpire(sxid_key(r["l"])),
    "latch": _latch,
    "boot": lambda r: Boot(str(r["b"])),
}
