"""Bounds on the label values a kernel log or NVML can create (docs/xid.md, "Series lifetime").

An Xid code is any integer the driver (or a broken NVML) reports, and an SXid names any code
and any bus id: kept as they come, a flood of distinct values grows the exposition, the journal
and memory without bound. Codes the classifier knows always keep their label; beyond that each
GPU keeps its first few unknown codes (a newer driver's new code stays visible) and each
NVSwitch its first few dozen codes; the rest are counted under ``"other"`` (the raw value is in
the event's log line). Which values were seen is read from the state (its last-seen keys), so
the choice survives restarts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from ..logs import RateLimitedLog, get_logger
from .ops import CountKey, SxidKey
from .parser import SxidLine
from .state import LastKey

OTHER = "other"
MAX_UNKNOWN_XIDS_PER_GPU = 8  # distinct codes not in the class table, per GPU
MAX_NVSWITCHES = 16  # distinct NVSwitch bus ids (an HGX baseboard has at most 6 switches)
MAX_SXIDS_PER_SWITCH = 64  # distinct SXid codes per NVSwitch
FOLDED_LABELS = ("xid", "sxid", "pci_bus_id")

_log = get_logger("xid")


class LabelBounds:
    """Applies the bounds, counts what it folded (``folded``, by label) and logs it, at most once
    a minute per label. Called under the Xid core's lock."""

    def __init__(self, known: Callable[[int], bool]) -> None:
        self._known = known
        self._rlog = RateLimitedLog(_log, period=60.0)
        self.folded: Counter[str] = Counter({label: 0 for label in FOLDED_LABELS})

    def xid(self, labels: CountKey, code: int, seen: Iterable[LastKey]) -> CountKey:
        bounded = bound_xid(labels, self._known, seen)
        if bounded is not labels:
            self._fold("xid", gpu=labels.gpu, uuid=labels.uuid, xid=code)
        return bounded

    def sxid(self, line: SxidLine, seen: Iterable[SxidKey]) -> SxidKey:
        key = (line.switch, line.bus_id, str(line.sxid), line.severity)
        bounded, folded = bound_sxid(key, seen)
        if folded is not None:
            self._fold(folded, pci_bus_id=line.bus_id, sxid=line.sxid)
        return bounded

    def _fold(self, label: str, **raw: object) -> None:
        self.folded[label] += 1
        self._rlog.warning(
            label,
            f'label values beyond the cap counted as {label}="other"',
            label=label,
            **raw,
        )


def bound_xid(labels: CountKey, known: Callable[[int], bool], seen: Iterable[LastKey]) -> CountKey:
    """``labels`` with its code folded into ``"other"`` when the GPU has used up its unknown
    codes; ``labels`` itself when it passes."""
    code = labels.xid
    if known(int(code)):
        return labels
    unknown = {
        key[2]
        for key in seen
        if key[:2] == (labels.gpu, labels.uuid) and key[2] != OTHER and not known(int(key[2]))
    }
    if code in unknown or len(unknown) < MAX_UNKNOWN_XIDS_PER_GPU:
        return labels
    return labels._replace(xid=OTHER)


def bound_sxid(key: SxidKey, seen: Iterable[SxidKey]) -> tuple[SxidKey, str | None]:
    """``key`` bounded, and which label was folded (None when it passes)."""
    switch, bus_id, code, severity = key
    seen = list(seen)
    switches = {other[1] for other in seen if other[1] != OTHER}
    if bus_id not in switches and len(switches) >= MAX_NVSWITCHES:
        return ("", OTHER, OTHER, severity), "pci_bus_id"
    codes = {other[2] for other in seen if other[1] == bus_id and other[2] != OTHER}
    if code not in codes and len(codes) >= MAX_SXIDS_PER_SWITCH:
        return (switch, bus_id, OTHER, severity), "sxid"
    return key, None
