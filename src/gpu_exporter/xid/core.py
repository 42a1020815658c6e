"""The Xid core: de-duplicates, classifies, attributes, counts, latches drains, and persists.
NVSwitch SXids (kernel log only) are counted and persisted alongside.

Called from the reader threads (kernel log, NVML events) and from a control thread (device
listener calls); one lock serialises every change, and the journal is written under it so the
file's order is the order of changes. What the event loop reads is :attr:`XidCore.published`, an
immutable snapshot replaced after each change: a render never waits for a reader or for fsync.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..devices import DeviceId
from ..logs import RateLimitedLog, get_logger
from .bounds import LabelBounds
from .classes import Classifier
from .journal import Journal
from .ops import (
    Boot,
    ClearLatch,
    Count,
    CountKey,
    Duplicate,
    Expire,
    KmsgMark,
    KmsgPosition,
    Numbered,
    Op,
    Origin,
    SetLatch,
    SxidCount,
    SxidExpire,
    SxidKey,
)
from .parser import SxidLine, text_hash
from .state import REASONS, LastKey, XidState

SOURCE_KMSG = "kmsg"
SOURCE_NVML = "nvml_events"
# Why a kernel-log record was not taken as an Xid source (gpu_exporter_kmsg_ignored_records_total).
IGNORED_REASONS = ("not_kernel", "oversized")
MAX_QUOTED = 256  # characters of a hostile record quoted in a log line
MAX_QUOTED_ID = 80  # characters of a journal's gpu or uuid quoted in a log line
MAX_QUOTED_LATCHES = 8  # dropped latches listed in the log line (all are counted)
_LEVEL_BY_CLASS = {"hardware": "error", "informational": "info"}

_log = get_logger("xid")


class HolderLookup(Protocol):
    """Who held a device at a time: ``(namespace, pod)`` or None (on a Slurm node, whose
    holders are jobs, ``("", job id)``: :class:`XidCore`'s ``job_holders`` labels it ``job_id``).

    In production the allocation subsystem's latest holder snapshot, an immutable value the
    reader threads read directly (no thread waits on the event loop); it must be cheap (no I/O).
    ``uuid`` is the device's uuid (a MIG instance's own ``MIG-...`` uuid when the Xid names the
    instance). When ``pid`` is given (the kernel line names the faulting process) and maps to a
    pod, that pod must win over the device's allocation: on a shared (time-sliced) GPU it is the
    one that faulted.
    """

    def holder(self, uuid: str, at_wall_time: float, pid: int | None) -> tuple[str, str] | None: ...


@dataclass(frozen=True)
class Observation:
    """One Xid as one source reported it, before de-duplication."""

    source: str  # SOURCE_KMSG | SOURCE_NVML
    channel: str  # "kmsg", "kmsg_fallen" (the no-Xid "fallen off the bus" report) or "nvml"
    xid: int
    when: float  # wall time of the event
    device: DeviceId | None  # the GPU or MIG instance, None when the bus id matched no GPU
    gpu_uuid: str  # the whole GPU's uuid ("" when unknown)
    bus_id: str = ""
    pid: int | None = None
    process_name: str | None = None
    text: str = ""
    raw: str = ""
    details: Mapping[str, str] = field(default_factory=dict)
    kmsg: KmsgPosition | None = None
    kmsg_mark: KmsgMark | None = None

    @property
    def dedup_key(self) -> str:
        return self.gpu_uuid or f"bus:{self.bus_id}"


@dataclass(frozen=True)
class SxidObservation:
    """One NVSwitch SXid kernel-log record."""

    line: SxidLine
    when: float  # wall time of the event
    raw: str = ""
    kmsg: KmsgPosition | None = None
    kmsg_mark: KmsgMark | None = None


@dataclass(frozen=True)
class Published:
    """An immutable view of the state for the event loop (``xid/metrics.render`` reads it).

    No field has a default: :meth:`XidCore._publish`, the one place that builds it, cannot
    leave a new one out."""

    counts: Mapping[CountKey, float]
    last_seen: Mapping[LastKey, float]
    class_counts: Mapping[tuple[str, str, str], float]
    sxid_counts: Mapping[SxidKey, float]
    sxid_last: Mapping[SxidKey, float]
    latches: tuple[tuple[str, str, str], ...]  # (uuid, gpu, reason)
    duplicates: Mapping[str, float]  # by source
    kmsg_lost: float
    unparsed: float
    ignored: Mapping[str, float]  # kernel-log records, by reason
    folded: Mapping[str, float]  # label values beyond a cap
    journal_ok: bool
    journal_errors: Mapping[str, float]  # by operation


class XidCore:
    def __init__(
        self,
        classifier: Classifier,
        journal: Journal,
        *,
        holders: Callable[[], HolderLookup] | None = None,
        job_holders: bool = False,
        window: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``job_holders``: the holders are Slurm jobs, whose series say ``job_id`` with the
        Kubernetes labels empty (one label per kind of holder, as the allocation series)."""
        self._classifier = classifier
        self._journal = journal
        self._holders = holders
        self._job_holders = job_holders
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._state = XidState()
        self._duplicates: Counter[str] = Counter({SOURCE_KMSG: 0, SOURCE_NVML: 0})
        self._kmsg_lost = 0
        self._unparsed = 0
        self._ignored: Counter[str] = Counter({reason: 0 for reason in IGNORED_REASONS})
        self._bounds = LabelBounds(classifier.known)
        self._rlog = RateLimitedLog(_log, period=60.0)
        # Called (from whichever thread made the change) after each publication.
        self.on_publish: Callable[[], None] | None = None
        self._publish()

    # -- startup -----------------------------------------------------------------------------

    def load(self, boot_id: str, on_node: Callable[[str, str], bool] | None = None) -> None:
        """Read the journal (blocking I/O: call off the event loop) and start a new boot.

        ``on_node(uuid, gpu)``: whether the node has the GPU a drain latch names (asked once
        devices are discovered). Latches for any other GPU (a tampered or foreign journal:
        ``gpu="9"``, ``GPU-zzz``) would recommend draining a GPU that does not exist: they are
        dropped, counted as entries the load left out, and logged once."""
        with self._lock:
            self._state = self._journal.load()
            if self._state.boot_id != boot_id:
                if self._state.boot_id:
                    _log.info(
                        "new boot: drain latches cleared",
                        previous_boot_id=self._state.boot_id,
                        boot_id=boot_id,
                        cleared=len(list(self._state.latched())),
                    )
                self._state.apply(self._journal.number([Boot(boot_id)])[0])
            if on_node is not None:
                self._drop_foreign_latches(on_node)
            self._journal.compact(self._state.to_snapshot())
            self._publish()

    def _drop_foreign_latches(self, on_node: Callable[[str, str], bool]) -> None:
        foreign = [
            (uuid, reason, latch.gpu)
            for uuid, reason, latch in self._state.latched()
            if not on_node(uuid, latch.gpu)
        ]
        if not foreign:
            return
        self._apply([ClearLatch(uuid, reason) for uuid, reason, _gpu in foreign])
        self._journal.errors["load"] += len(foreign)
        _log.warning(
            "journal drain latches name GPUs this node does not have; dropped",
            dropped=len(foreign),
            latches=[
                {"gpu": gpu[:MAX_QUOTED_ID], "uuid": uuid[:MAX_QUOTED_ID], "reason": reason}
                for uuid, reason, gpu in foreign[:MAX_QUOTED_LATCHES]
            ],
        )

    def kmsg_position(self) -> tuple[str, int, float | None]:
        with self._lock:
            return self._state.boot_id, self._state.kmsg_seq, self._state.kmsg_offset

    def kmsg_seen(
        self,
        position: KmsgPosition,
        usec: int | None = None,
        digest: Callable[[], str] | None = None,
    ) -> bool:
        """Whether a replayed kernel-log record was handled before a restart."""
        boot_id, seq, _offset, file_key, file_end = position
        with self._lock:
            return self._state.kmsg_seen(boot_id, seq, file_key, file_end, usec, digest)

    def kmsg_file(self) -> tuple[str, int, str | None]:
        """The regular file standing in for the kernel log: its key, the end offset of the last
        record handled in it and that record's text hash."""
        with self._lock:
            state = self._state
            return state.kmsg_file, state.kmsg_file_pos, state.kmsg_file_hash

    def restart_kmsg_file(self, file_key: str, why: str) -> None:
        """The file was truncated or rewritten in place since its offset was saved: every record
        in it is new. Written as a snapshot (blocking I/O: the kernel-log thread)."""
        with self._lock:
            if self._state.kmsg_file != file_key or self._state.kmsg_file_pos < 0:
                return
            offset = self._state.kmsg_file_pos
            self._state.restart_file()
            self._journal.compact(self._state.to_snapshot())
            self._publish()
        _log.warning(
            "kernel log file no longer holds what was read: its records are read as new",
            file=file_key,
            saved_offset=offset,
            why=why,
        )

    def kmsg_replay_start(self, boot_id: str, marks: list[KmsgMark]) -> int:
        """The index of the first record not handled before in a whole syslog(2) buffer."""
        with self._lock:
            return self._state.replay_start(boot_id, marks)

    # -- events --------------------------------------------------------------------------------

    def observe(self, observations: Iterable[Observation | SxidObservation]) -> None:
        """Count what is new, drop duplicates, persist (one journal write for the batch, in
        record order: the journal's kernel-log position never passes an uncounted record); then
        log each counted event. NVSwitch SXids have one source: nothing to de-duplicate."""
        prepared = [
            (obs, None if isinstance(obs, SxidObservation) else self._labels(obs))
            for obs in observations
        ]
        if not prepared:
            return
        outcomes: list[bool] = []
        counted_labels: list[CountKey | None] = []
        with self._lock:
            applied: list[Numbered] = []
            for obs, labels in prepared:
                if isinstance(obs, SxidObservation):
                    key = self._bounds.sxid(obs.line, self._state.sxid_last)
                    applied += self._apply([_sxid_op(obs, key)])
                    outcomes.append(True)
                    counted_labels.append(None)
                    continue
                assert labels is not None
                labels = self._bounds.xid(labels, obs.xid, self._state.last_seen)
                counted_labels.append(labels)
                # Applied one by one: a later report in the same batch may be this one's twin.
                op = self._decide(obs, labels)
                counted = isinstance(op, Count)
                outcomes.append(counted)
                applied += self._apply([op, *self._latch_ops(obs, labels)] if counted else [op])
                if not counted:
                    self._duplicates[obs.source] += 1
            self._persist(applied)
        for (obs, _), labels, counted in zip(prepared, counted_labels, outcomes, strict=True):
            if isinstance(obs, SxidObservation):
                _log_sxid(obs)
            elif not counted:
                _log.debug("duplicate Xid dropped", source=obs.source, xid=obs.xid, raw=obs.raw)
            elif labels is not None:
                _log_xid(obs, labels)

    def _labels(self, obs: Observation) -> CountKey:
        xid_class, action = self._classifier.classify(obs.xid, obs.details)
        namespace, pod = self._lookup_holder(obs)
        device = obs.device
        gpu = str(device.index) if device is not None else ""
        uuid = device.uuid if device is not None else ""
        if self._job_holders:  # a job holder is ("", job id)
            return CountKey(gpu, uuid, str(obs.xid), xid_class, action, "", "", pod)
        return CountKey(gpu, uuid, str(obs.xid), xid_class, action, namespace, pod)

    def _lookup_holder(self, obs: Observation) -> tuple[str, str]:
        if self._holders is None or (obs.device is None and obs.pid is None):
            return "", ""
        uuid = obs.device.uuid if obs.device is not None else ""
        try:
            found = self._holders().holder(uuid, obs.when, obs.pid)
        except Exception as exc:  # attribution is best effort; the Xid must still count
            self._rlog.warning("holder", "holder lookup failed", uuid=uuid, error=repr(exc))
            return "", ""
        return found if found is not None else ("", "")

    def _decide(self, obs: Observation, labels: CountKey) -> Count | Duplicate:
        twin = self._state.find_twin(obs.dedup_key, obs.xid, obs.when, obs.channel, self._window)
        origin = _origin(obs.kmsg, obs.kmsg_mark, obs.raw)
        if twin is not None:
            return Duplicate(twin, obs.channel, origin)
        next_id = self._state.next_id
        return Count(labels, obs.when, next_id, obs.dedup_key, (obs.channel,), obs.xid, origin)

    def _latch_ops(self, obs: Observation, labels: CountKey) -> list[SetLatch]:
        if labels.xid_class != "hardware" or not obs.gpu_uuid:
            return []
        return self._latch_on(obs.gpu_uuid, labels.gpu, "hardware_xid")

    def note_lost_records(self, count: int) -> None:
        with self._lock:
            self._kmsg_lost += count
            self._publish()

    def note_unparsed(self, message: str) -> None:
        with self._lock:
            self._unparsed += 1
            self._publish()
        self._rlog.warning(
            "unparsed", "kernel log line mentions an Xid but could not be parsed", raw=message
        )

    def note_ignored(self, reason: str, message: str | None = None) -> None:
        """A kernel-log record not read as an Xid source: ``not_kernel`` (a userspace write to
        /dev/kmsg that looks like the driver's) or ``oversized`` (a file/FIFO line longer than
        any kernel record, logged by the reader)."""
        with self._lock:
            self._ignored[reason] += 1
            self._publish()
        if message is None:
            return
        self._rlog.warning(
            ("ignored", reason),
            "kernel log record not from the kernel names an Xid or SXid; not counted",
            reason=reason,
            raw=message[:MAX_QUOTED],
        )

    def expire_pod_series(self, retention: float) -> None:
        """Withdraw the series of pods (and Slurm jobs) whose latest Xid is older than
        ``retention`` seconds, so that pod or job churn does not grow the exposition (and the
        journal) for ever. Their counts stay
        in ``gpu_xid_class_errors_total``; a later Xid of the same pod starts a new series.
        NVSwitch SXid series (no pod) go the same way after their latest SXid."""
        with self._lock:
            before = self._clock() - retention
            expired = self._state.expirable(before)
            sxids = self._state.sxid_expirable(before)
            if expired or sxids:
                ops: list[Op] = [Expire(labels) for labels in expired]
                ops += [SxidExpire(key) for key in sxids]
                self._apply(ops)
                # Into a snapshot rather than the log: an older exporter reads the snapshot
                # (showing the series again) where an unknown op would stop its replay.
                self._journal.compact(self._state.to_snapshot())
                self._publish()
        if expired or sxids:
            _log.info(
                "Xid series expired",
                series=len(expired),
                sxid_series=len(sxids),
                retention_s=retention,
            )

    # -- drain latches ---------------------------------------------------------------------------

    def set_latch(self, gpu_uuid: str, gpu: str, reason: str) -> None:
        with self._lock:
            ops = self._latch_on(gpu_uuid, gpu, reason)
            if ops:
                self._commit(ops)
        if ops:
            _log.warning("drain recommended", gpu=gpu, uuid=gpu_uuid, reason=reason)

    def clear_latches(
        self, gpu_uuid: str, why: str, only: Iterable[str] | None = None
    ) -> list[str]:
        """Clear the GPU's latches (``only`` those reasons, if given); returns what was cleared."""
        wanted = None if only is None else set(only)
        with self._lock:
            latched = self._state.latches.get(gpu_uuid, {})
            reasons = [r for r in latched if wanted is None or r in wanted]
            ops: list[Op] = [ClearLatch(gpu_uuid, reason) for reason in reasons]
            if ops:
                self._commit(ops)
        if reasons:
            _log.info("drain recommendation cleared", uuid=gpu_uuid, reasons=reasons, why=why)
        return reasons

    def clear_lost_that_answer(self, gpu_uuids: Iterable[str]) -> None:
        """At startup: a GPU latched ``device_lost`` (in this boot) that answers now was brought
        back while the exporter was down: a lost GPU returns only through a reset, a driver
        reload or a power cycle, and a driver reload needs every client of the driver, the
        exporter among them, stopped. Its latches clear as an observed reset's would. Blocking
        I/O: call off the event loop."""
        for gpu_uuid in gpu_uuids:
            with self._lock:
                lost = "device_lost" in self._state.latches.get(gpu_uuid, {})
            if lost:
                self.clear_latches(gpu_uuid, "lost GPU answers after an exporter restart")

    def _latch_on(self, gpu_uuid: str, gpu: str, reason: str) -> list[SetLatch]:
        assert reason in REASONS
        if reason in self._state.latches.get(gpu_uuid, {}):
            return []
        return [SetLatch(gpu_uuid, gpu, reason, self._clock())]

    # -- persistence and publication -----------------------------------------------------------

    def _commit(self, ops: Sequence[Op]) -> None:
        self._persist(self._apply(ops))

    def _apply(self, ops: Sequence[Op]) -> list[Numbered]:
        numbered = self._journal.number(ops)
        for op in numbered:
            self._state.apply(op)
        return numbered

    def _persist(self, numbered: list[Numbered]) -> None:
        """Durable before the readers move on (the ops are already applied in memory)."""
        self._journal.append(numbered, self._state.to_snapshot)
        self._publish()

    def _publish(self) -> None:
        """Replace :attr:`published` (under the lock, or before any thread runs)."""
        state = self._state
        self.published = Published(
            counts=dict(state.counts),
            last_seen=dict(state.last_seen),
            class_counts=state.class_totals(),
            sxid_counts=dict(state.sxid_counts),
            sxid_last=dict(state.sxid_last),
            latches=tuple((uuid, latch.gpu, reason) for uuid, reason, latch in state.latched()),
            duplicates=dict(self._duplicates),
            kmsg_lost=float(self._kmsg_lost),
            unparsed=float(self._unparsed),
            ignored={reason: float(n) for reason, n in self._ignored.items()},
            folded={label: float(n) for label, n in self._bounds.folded.items()},
            journal_ok=self._journal.ok,
            journal_errors={op: float(n) for op, n in self._journal.errors.items()},
        )
        if self.on_publish is not None:
            self.on_publish()

    def repair_journal(self) -> None:
        """Check that the journal's files are still at its path, and rewrite it if they are not,
        a write failed or it loaded damaged (blocking I/O: call off the event loop). A state
        directory that is back, or writable again, is in use without waiting for the next Xid."""
        with self._lock:
            was_ok, errors = self._journal.ok, sum(self._journal.errors.values())
            if self._journal.repair(self._state.to_snapshot):
                _log.info("Xid journal written again; counts are durable once more")
            if self._journal.ok != was_ok or sum(self._journal.errors.values()) != errors:
                self._publish()

    def close(self) -> None:
        with self._lock:
            self._journal.close()


def _sxid_op(obs: SxidObservation, key: SxidKey) -> SxidCount:
    return SxidCount(key, obs.when, _origin(obs.kmsg, obs.kmsg_mark, obs.raw))


def _origin(position: KmsgPosition | None, mark: KmsgMark | None, raw: str) -> Origin:
    """The record's identity beside its position: its mark (no sequence numbers), or for a
    regular file the hash of its text, which tells a later start whether the file still holds
    that record at that offset."""
    position = None if position is None else KmsgPosition(*position)  # plain tuples too
    mark = None if mark is None else KmsgMark(*mark)
    in_file = position is not None and position.file_key is not None
    return Origin(position, mark, text_hash(raw) if in_file else None)


def _log_sxid(obs: SxidObservation) -> None:
    line = obs.line
    fields: dict[str, Any] = {
        "switch": line.switch,
        "pci_bus_id": line.bus_id,
        "sxid": line.sxid,
        "severity": line.severity,
        "event_time": obs.when,
        "raw": obs.raw,
    }
    if obs.kmsg is not None:
        fields["boot_id"], fields["seq"] = obs.kmsg[0], obs.kmsg[1]
    getattr(_log, "error" if line.severity == "fatal" else "warning")("sxid", **fields)


def _log_xid(obs: Observation, labels: CountKey) -> None:
    fields: dict[str, Any] = {
        "gpu": labels.gpu,
        "uuid": labels.uuid,
        "pci_bus_id": obs.bus_id,
        "xid": obs.xid,
        "class": labels.xid_class,
        "action": labels.action,
        "pid": obs.pid,
        "process_name": obs.process_name,
        "namespace": labels.namespace,
        "pod": labels.pod,
        "source": obs.source,
        "event_time": obs.when,
        "raw": obs.raw,
    }
    if labels.job_id:
        fields["job_id"] = labels.job_id
    if obs.device is not None and obs.device.is_mig:
        fields["gpu_instance_id"] = obs.device.gpu_instance_id
    if obs.details:
        fields["details"] = dict(obs.details)
    if obs.kmsg is not None:
        fields["boot_id"], fields["seq"] = obs.kmsg[0], obs.kmsg[1]
    if obs.kmsg_mark is not None and obs.kmsg_mark[0] is not None:
        fields["kernel_usec"] = obs.kmsg_mark[0]
    if not labels.uuid:
        fields["unmatched_bus_id"] = True
    if labels.xid != str(obs.xid):
        fields["xid_label"] = labels.xid  # folded: beyond the GPU's cap of unknown codes
    getattr(_log, _LEVEL_BY_CLASS.get(labels.xid_class, "warning"))("xid", **fields)
