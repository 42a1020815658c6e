"""The Xid state that must survive restarts, as a pure value changed only by *ops*.

Every change (an Xid or NVSwitch SXid counted, a duplicate matched, a pod's series expired, a
drain latch set or cleared, a new boot) is an op, a typed value (``ops.py``, which also holds the
journal's compact form). The live path applies
an op and appends it to the journal; startup replays the journal's ops onto the last snapshot
with the same :meth:`XidState.apply`, so the state after a crash is exactly the state before it,
up to the last op written. An op carries the kernel-log position (boot id, sequence number) of
the record it came from together with its count, so "counted" and "seen" can never disagree
after a crash. A kernel-log op also carries the record's *mark* (``"m"``: printk usec, text
hash, occurrence), the identity syslog(2) records have instead of a sequence number; an older
exporter ignores the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .ops import (
    BadOp,
    Boot,
    ClearLatch,
    Count,
    CountKey,
    Duplicate,
    Expire,
    KmsgPosition,
    Numbered,
    Op,
    Origin,
    SetLatch,
    SxidCount,
    SxidExpire,
    SxidKey,
    count_key,
    decode,
    mark,
)

# (gpu, uuid, xid, class): the labels of gpu_xid_last_timestamp_seconds.
LastKey = tuple[str, str, str, str]
# (gpu, uuid, class): the labels of gpu_xid_class_errors_total; gpu and uuid are empty outside
# the per-GPU class (see :func:`class_key`).
ClassKey = tuple[str, str, str]
# A GPU's lifetime count of hardware Xids is a property of the card (RMA decisions): that class
# is counted per GPU; every other class once per node, which is what every reader sums anyway.
PER_GPU_CLASS = "hardware"

REASONS = ("hardware_xid", "row_remap_failure", "device_lost")
RECENT_HORIZON_S = 3600.0  # older events cannot have a twin still to come
RECENT_MAX = 2048
SNAPSHOT_VERSION = 1


@dataclass
class Recent:
    """A counted event kept for de-duplication: which channels have reported it so far."""

    id: int
    key: str  # the whole GPU's uuid, or "bus:<bus id>" when no GPU matched
    xid: int
    when: float
    channels: set[str]


@dataclass
class Latch:
    gpu: str
    since: float


@dataclass
class XidState:
    counts: dict[CountKey, float] = field(default_factory=dict)
    count_last: dict[CountKey, float] = field(default_factory=dict)  # latest event of each count
    # What expired pod series had counted, so the per-class totals never go down.
    expired: dict[ClassKey, float] = field(default_factory=dict)
    last_seen: dict[LastKey, float] = field(default_factory=dict)
    sxid_counts: dict[SxidKey, float] = field(default_factory=dict)
    sxid_last: dict[SxidKey, float] = field(default_factory=dict)  # latest event of each
    latches: dict[str, dict[str, Latch]] = field(default_factory=dict)  # uuid -> reason -> latch
    recent: list[Recent] = field(default_factory=list)
    boot_id: str = ""
    kmsg_seq: int = -1  # highest kernel-log sequence number handled in ``boot_id``
    kmsg_offset: float | None = None  # wall time of usec 0 in ``boot_id``, as last anchored
    kmsg_file: str = ""  # a regular file standing in for /dev/kmsg: "device:inode"
    kmsg_file_pos: int = -1  # end offset of the last record handled in that file
    # The text hash of that record (op key "fh"): a file truncated or rewritten in place since
    # (copytruncate) has some other record there, or none; then the offset is not trusted.
    kmsg_file_hash: str | None = None
    # The latest kernel-log record handled in ``boot_id`` as [usec | None, text hash, occurrence]:
    # where a restart reading syslog(2), which has no sequence numbers, resumes.
    kmsg_mark: list[Any] | None = None  # a KmsgMark's fields, as the snapshot holds them
    next_id: int = 1
    op_number: int = 0  # the last op applied (ops numbered in the journal)

    # -- queries -------------------------------------------------------------------------

    def kmsg_seen(
        self,
        boot_id: str,
        seq: int | None,
        file_key: str | None,
        file_end: int | None,
        usec: int | None = None,
        digest: Callable[[], str] | None = None,
    ) -> bool:
        """Whether a replayed record was handled before: by file offset for a regular file (a
        file outlives reboots and may have several writers), else by (boot id, seq).

        For ``/dev/kmsg`` (no file key), a record at or before the mark also counts as seen: the
        records a syslog(2) run handled since the last sequence number (``usec``, and ``digest``
        for the record's text hash, compared on a timestamp tie)."""
        if file_key is not None and file_end is not None:
            if file_key == self.kmsg_file and self.kmsg_file_pos >= 0:
                return file_end <= self.kmsg_file_pos
            # A file not read before (new, rotated, or rewritten in place): its sequence numbers
            # say nothing about another file's; history without any is not counted.
            return seq is None
        if seq is None:
            return True  # no identity: history cannot be told from news, so it is not counted
        if boot_id != self.boot_id:
            return False
        if seq <= self.kmsg_seq:
            return True
        mark = self.kmsg_mark
        if file_key is not None or mark is None or mark[0] is None or usec is None:
            return False
        return usec < mark[0] or (usec == mark[0] and digest is not None and digest() == mark[1])

    def replay_start(self, boot_id: str, marks: Sequence[Sequence[Any]]) -> int:
        """Where new records start in a whole-buffer syslog(2) read of this boot (``marks`` in
        buffer order): after the record of the stored mark. See docs/xid.md ("Restarts")."""
        if boot_id != self.boot_id:
            return 0
        mark = self.kmsg_mark
        if mark is None:
            # Nothing handled in this boot; or only /dev/kmsg by an exporter that kept no marks:
            # then the buffer cannot be aligned, and history is not counted twice.
            return 0 if self.kmsg_seq < 0 else len(marks)
        wanted = (mark[0], mark[1], mark[2])
        for index in range(len(marks) - 1, -1, -1):
            if tuple(marks[index]) == wanted:
                return index + 1
        usec, digest = mark[0], mark[1]
        if usec is None:
            return len(marks)  # no timestamps and the record is gone: history cannot be told
        # The record itself is gone (overwritten, or the buffer was cleared): by timestamp.
        start = 0
        for index, (other, other_digest, _occurrence) in enumerate(marks):
            if other is not None and (other < usec or (other == usec and other_digest == digest)):
                start = index + 1
        return start

    def expirable(self, before: float) -> list[CountKey]:
        """The pod- or job-attributed counts whose latest event is older than ``before``."""
        return [
            key
            for key, when in self.count_last.items()
            if (key.namespace or key.pod or key.job_id) and when < before and key in self.counts
        ]

    def sxid_expirable(self, before: float) -> list[SxidKey]:
        """The SXid series whose latest event is older than ``before``."""
        return [key for key, when in self.sxid_last.items() if when < before]

    def class_totals(self) -> dict[ClassKey, float]:
        """Xids counted per class (per GPU for hardware, see :func:`class_key`), expired pod
        series included."""
        totals = dict(self.expired)
        for labels, value in self.counts.items():
            key = class_key(labels.gpu, labels.uuid, labels.xid_class)
            totals[key] = totals.get(key, 0.0) + value
        return totals

    def find_twin(self, key: str, xid: int, when: float, channel: str, window: float) -> int | None:
        """The id of a counted event this report duplicates, if any (see docs/xid.md)."""
        for recent in self.recent:
            if (
                recent.key == key
                and recent.xid == xid
                and channel not in recent.channels
                and abs(recent.when - when) <= window
            ):
                return recent.id
        return None

    # -- changes ---------------------------------------------------------------------------

    def apply(self, op: Op | Numbered | Mapping[str, Any]) -> None:
        """Apply one op (typed, numbered, or a journal record as the file holds it). Raises
        :class:`BadOp` when it is malformed (nothing is changed then)."""
        number: int | None = None
        if isinstance(op, Numbered):
            number, op = op.number, op.op
        elif isinstance(op, Mapping):
            number, op = decode(op)
        try:
            self._apply(op)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise BadOp(f"malformed {type(op).__name__} op: {exc}") from exc
        if number is not None:
            self.op_number = max(self.op_number, number)

    def _apply(self, op: Op) -> None:
        match op:
            case Count():
                self._count(op)
            case Duplicate():
                self._origin(op.origin)
                for recent in self.recent:
                    if recent.id == op.target:
                        recent.channels.add(op.channel)
                        break
            case SxidCount():
                self._origin(op.origin)
                self.sxid_counts[op.labels] = self.sxid_counts.get(op.labels, 0.0) + 1.0
                self.sxid_last[op.labels] = max(op.when, self.sxid_last.get(op.labels, op.when))
            case Expire():
                self._expire(op.labels)
            case SxidExpire():
                self.sxid_counts.pop(op.labels, None)
                self.sxid_last.pop(op.labels, None)
            case SetLatch() | ClearLatch():
                self._latch(op)
            case Boot():
                self._boot(op.boot_id)

    def _count(self, op: Count) -> None:
        labels, when = op.labels, op.when
        self._origin(op.origin)
        self.counts[labels] = self.counts.get(labels, 0.0) + 1.0
        self.count_last[labels] = max(when, self.count_last.get(labels, when))
        last_key = (labels.gpu, labels.uuid, labels.xid, labels.xid_class)
        self.last_seen[last_key] = max(when, self.last_seen.get(last_key, when))
        xid = op.xid if op.xid is not None else int(labels.xid)  # the label may be "other"
        self.recent.append(Recent(op.event_id, op.dedup_key, xid, when, set(op.channels)))
        self.next_id = max(self.next_id, op.event_id + 1)
        self._prune(when)

    def _expire(self, labels: CountKey) -> None:
        """A pod's series leaves the exposition; its count stays in its class's total."""
        self.count_last.pop(labels, None)
        value = self.counts.pop(labels, 0.0)
        if value:
            key = class_key(labels.gpu, labels.uuid, labels.xid_class)
            self.expired[key] = self.expired.get(key, 0.0) + value

    def _latch(self, op: SetLatch | ClearLatch) -> None:
        if op.reason not in REASONS:
            raise ValueError(f"unknown reason {op.reason!r}")
        if isinstance(op, SetLatch):
            self.latches.setdefault(op.uuid, {})[op.reason] = Latch(op.gpu, op.since)
            return
        reasons = self.latches.get(op.uuid, {})
        reasons.pop(op.reason, None)
        if not reasons:
            self.latches.pop(op.uuid, None)

    def _boot(self, boot_id: str) -> None:
        """A new boot: the kernel log starts over and every drain latch clears (a regular file
        standing in for the kernel log does not start over: its position is kept)."""
        self.boot_id = boot_id
        self.kmsg_seq = -1
        self.kmsg_offset = None
        self.kmsg_mark = None
        self.latches.clear()

    def _origin(self, origin: Origin) -> None:
        """Where the op's record was: the position, then (same boot) its mark."""
        position = origin.position
        if position is not None:
            self._position(position, origin.file_hash)
        if origin.mark is not None:
            self.kmsg_mark = list(origin.mark)

    def _position(self, position: KmsgPosition, file_hash: str | None) -> None:
        boot_id, seq, offset, file_key, file_end = position
        if boot_id != self.boot_id:
            self.boot_id, self.kmsg_seq, self.kmsg_mark = boot_id, -1, None
        if seq is not None:
            self.kmsg_seq = max(self.kmsg_seq, seq)
        if offset is not None:
            self.kmsg_offset = offset
        if file_key is not None and file_end is not None:
            if file_key != self.kmsg_file:
                self.kmsg_file, self.kmsg_file_pos = file_key, -1
            if file_end >= self.kmsg_file_pos:
                self.kmsg_file_pos = file_end
                self.kmsg_file_hash = file_hash

    def restart_file(self) -> None:
        """The file's records at or before the saved offset are not the ones handled (it was
        truncated or rewritten in place): trust no offset in it."""
        self.kmsg_file_pos, self.kmsg_file_hash = -1, None

    def _prune(self, newest: float) -> None:
        horizon = newest - RECENT_HORIZON_S
        if len(self.recent) > RECENT_MAX or self.recent[0].when < horizon:
            kept = [r for r in self.recent if r.when >= horizon]
            self.recent = kept[-RECENT_MAX:]

    # -- snapshots ---------------------------------------------------------------------------

    def to_snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "n": self.op_number,
            "boot_id": self.boot_id,
            "kmsg_seq": self.kmsg_seq,
            "kmsg_offset": self.kmsg_offset,
            "kmsg_file": self.kmsg_file,
            "kmsg_file_pos": self.kmsg_file_pos,
            "kmsg_file_hash": self.kmsg_file_hash,
            "kmsg_mark": self.kmsg_mark,
            "next_id": self.next_id,
            "counts": _rows(self.counts, jobs=False),
            "count_last": _rows(self.count_last, jobs=False),
            # A job holder's series in tables of their own (rows of eight labels): an older
            # exporter, whose count rows have seven, skips these tables rather than the file.
            "job_counts": _rows(self.counts, jobs=True),
            "job_count_last": _rows(self.count_last, jobs=True),
            "expired": [[*key, value] for key, value in self.expired.items()],
            "sxid_counts": [[*key, value] for key, value in self.sxid_counts.items()],
            "sxid_last": [[*key, value] for key, value in self.sxid_last.items()],
            "last_seen": [[*key, value] for key, value in self.last_seen.items()],
            "latches": [
                [uuid, reason, latch.gpu, latch.since]
                for uuid, reasons in self.latches.items()
                for reason, latch in reasons.items()
            ],
            "recent": [[r.id, r.key, r.xid, r.when, sorted(r.channels)] for r in self.recent],
        }

    @classmethod
    def from_snapshot(cls, data: Any) -> XidState:
        try:
            return cls._from_snapshot(data)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise BadOp(f"malformed snapshot: {exc}") from exc

    @classmethod
    def _from_snapshot(cls, data: Any) -> XidState:
        if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
            raise ValueError("not a version 1 snapshot")
        state = cls(
            boot_id=str(data["boot_id"]),
            kmsg_seq=int(data["kmsg_seq"]),
            kmsg_offset=None if data["kmsg_offset"] is None else float(data["kmsg_offset"]),
            kmsg_file=str(data["kmsg_file"]),
            kmsg_file_pos=int(data["kmsg_file_pos"]),
            next_id=int(data["next_id"]),
            op_number=int(data["n"]),
        )
        saved = mark(data.get("kmsg_mark"))  # absent in snapshots written before marks
        state.kmsg_mark = None if saved is None else list(saved)
        file_hash = data.get("kmsg_file_hash")  # absent before it was kept
        state.kmsg_file_hash = None if file_hash is None else str(file_hash)
        for row in data["counts"]:
            state.counts[count_key(row[:7])] = float(row[7])
        for row in data.get("job_counts", ()):  # absent before job holders
            state.counts[count_key(row[:7], row[7])] = float(row[8])
        for row in data["last_seen"]:
            state.last_seen[(str(row[0]), str(row[1]), str(row[2]), str(row[3]))] = float(row[4])
        # Absent from snapshots written before pod series expired: a count's latest event is
        # then taken as its code's latest on that GPU (never earlier than the truth).
        for row in data.get("count_last", ()):
            state.count_last[count_key(row[:7])] = float(row[7])
        for row in data.get("job_count_last", ()):
            state.count_last[count_key(row[:7], row[7])] = float(row[8])
        for key in state.counts:
            state.count_last.setdefault(key, state.last_seen.get(key[:4], 0.0))
        # A previous version kept every class per GPU: those rows add up into the node's count.
        for gpu, uuid, xid_class, value in data.get("expired", ()):
            counted_at = class_key(str(gpu), str(uuid), str(xid_class))
            state.expired[counted_at] = state.expired.get(counted_at, 0.0) + float(value)
        for switch, bus_id, sxid, severity, value in data.get("sxid_counts", ()):
            state.sxid_counts[(str(switch), str(bus_id), str(sxid), str(severity))] = float(value)
        for switch, bus_id, sxid, severity, value in data.get("sxid_last", ()):
            state.sxid_last[(str(switch), str(bus_id), str(sxid), str(severity))] = float(value)
        for uuid, reason, gpu, since in data["latches"]:
            state.latches.setdefault(str(uuid), {})[str(reason)] = Latch(str(gpu), float(since))
        for rid, key, xid, when, channels in data["recent"]:
            state.recent.append(Recent(int(rid), str(key), int(xid), float(when), set(channels)))
        return state

    def latched(self) -> Iterator[tuple[str, str, Latch]]:
        for uuid, reasons in self.latches.items():
            for reason, latch in reasons.items():
                yield uuid, reason, latch


def class_key(gpu: str, uuid: str, xid_class: str) -> ClassKey:
    """Where an Xid of this class on this device is counted: on its GPU for hardware Xids, on
    the node (empty gpu and uuid) for the other classes."""
    if xid_class == PER_GPU_CLASS:
        return (gpu, uuid, xid_class)
    return ("", "", xid_class)


def _rows(table: Mapping[CountKey, float], *, jobs: bool) -> list[list[Any]]:
    """A count table's rows as the snapshot holds them: the seven labels (and, for a job
    holder's series, its id), then the value."""
    if jobs:
        return [[*key, value] for key, value in table.items() if key.job_id]
    return [[*key[:7], value] for key, value in table.items() if not key.job_id]
