"""NVLink: which links are up (slow), errors and traffic (fast, from the device's field batch).

Only links the GPU has are reported (field 91, the link count); a PCIe card without NVLink answers
NotSupported and has no NVLink series at all. Errors and traffic are summed over the links: 18
links x 5 types x 8 GPUs would be 720 mostly-zero series per node. ``--collector.nvlink.per-link``
adds a ``link`` label instead (errors and traffic per link) for nodes that want it; the runbook
says how to read the per-link counters on a node when a GPU's errors rise.

Link state is a count per GPU, ``gpu_nvlink_links{state="active"|"inactive"}``: 18 links that are
up are one fact, not 18 series of 1. A link that is not active is named, as
``gpu_nvlink_link_active{link} 0`` (what ``GPUNVLinkDown`` pages on); with per-link every link
has that series, 1 while active. A link that answered active once and is now down or unreadable
is inactive: a fault, not a GPU with fewer links.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pynvml

from ..devices import Device
from ..exposition import counter, gauge, label_string
from ..nvml import DeviceCalls
from ..nvml.calls import FieldKey
from .base import Cadence, Collector, CollectorContext, SampleWriter, option
from .counters import CounterField, fields_of
from .pcie_link import PcieCounters

LINKS = gauge(
    "gpu_nvlink_links",
    'The GPU\'s NVLink links that are up (state "active"); each link that is down, or lost after '
    "it was up, is named by gpu_nvlink_link_active at 0.",
)
LINK_ACTIVE = gauge(
    "gpu_nvlink_link_active",
    "0 for an NVLink link that is down or lost; with --collector.nvlink.per-link every link, "
    "1 while active.",
)
_ACTIVE_LABELS = label_string({"state": "active"})
ERRORS = counter(
    "gpu_nvlink_errors_total",
    "NVLink errors by type (crc: flit and data CRC errors together, replay, recovery, ecc; "
    "NVLink5 types on Blackwell), summed over the GPU's links; per link with per-link, where "
    "crc_flit and crc_data stay apart.",
)
TRANSMIT = counter(
    "gpu_nvlink_transmit_bytes_total", "Data transmitted over the GPU's NVLink links, in bytes."
)
RECEIVE = counter(
    "gpu_nvlink_receive_bytes_total", "Data received over the GPU's NVLink links, in bytes."
)
LINK_COUNT_FIELD = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
TX_FIELD, RX_FIELD = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, KiB, link as scope id
# nvml.h: a scope id of UINT_MAX asks the throughput fields for the sum over all links.
ALL_LINKS = 0xFFFFFFFF
KIB = 1024
# nvmlDeviceGetNvLinkErrorCounter's counters, for per-link legacy errors (slow cadence).
DL_COUNTERS = (
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("ecc", pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA),
)


# Summed per GPU, the flit and data CRC errors are one signal (the interconnect alert adds them
# up): one series; per link (--collector.nvlink.per-link) they stay apart, as the detail.
SUMMED_TYPES = {"crc_flit": "crc", "crc_data": "crc"}


def _type_labels(kind: str, link: int | None = None) -> str:
    pairs = {"type": kind} if link is None else {"link": str(link), "type": kind}
    return label_string(pairs)


def link_count(calls: DeviceCalls, values: Mapping[FieldKey, float]) -> int | None:
    """The GPU's NVLink links; 0 without NVLink; None while unknown (not answered yet)."""
    count = values.get(LINK_COUNT_FIELD)
    if count is not None:
        return int(count)
    return 0 if calls.lacks(f"field{LINK_COUNT_FIELD}") else None


@dataclass(frozen=True)
class InterconnectOptions:
    """Read by both NVLink collectors: the fast counters and the slow link state."""

    per_link: bool = option(
        "--collector.nvlink.per-link",
        False,
        help="NVLink errors and traffic per link (a link label) instead of summed per GPU",
    )


class InterconnectCollector(Collector):
    """The fast interconnect counters: NVLink errors and traffic, PCIe replays and traffic.

    One job per GPU for both (a job costs more than its few field lookups), all from the GPU's
    field batch: no NVML call of its own in a steady round.
    """

    name = "interconnect"
    help = "NVLink errors and traffic, PCIe replays and traffic (fast; field values)."
    cadence = Cadence.FAST
    families = (ERRORS, TRANSMIT, RECEIVE, *PcieCounters.families)
    options = (InterconnectOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._per_link = context.options.of(InterconnectOptions).per_link
        self._fields = context.field_batch(device, self.cadence)
        self._errors = fields_of("nvlink_errors")
        self._fields.want((LINK_COUNT_FIELD,))
        self._fields.want(f.field_id for f in self._errors if not f.per_link)
        self._links: int | None = None
        self._first_errors = True
        self._labels: dict[tuple[str, int | None], str] = {}
        self._pcie = PcieCounters(self._fields)

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        values = self._fields.read(calls, handle)
        if self._links is None:
            self._links = link_count(calls, values)
            if not self._links:
                self._pcie.emit(out, values)
                return
            links = range(self._links)
            scopes = links if self._per_link else (ALL_LINKS,)
            self._fields.want((f, scope) for f in (TX_FIELD, RX_FIELD) for scope in scopes)
            self._fields.want(
                (f.field_id, link) for f in self._errors if f.per_link for link in links
            )
            values = self._fields.read(calls, handle)  # the batch grew: read it again, once
        self._pcie.emit(out, values)
        if not self._links:
            return
        self._emit_errors(out, values)
        self._emit_traffic(out, values)

    def _emit_errors(self, out: SampleWriter, values: Mapping[FieldKey, float]) -> None:
        assert self._links is not None
        seen: set[str] = set()
        answered: list[CounterField] = []
        totals: dict[str, float] = {}  # per GPU, by the series' type
        for row in self._errors:
            if row.type in seen or (self._per_link and not row.per_link):
                continue  # per-link DL counters come from the nvlink_state collector
            answered.append(row)
            if row.per_link:
                per_link = self._per_link_values(values, row.field_id)
                if not per_link:
                    answered.pop()
                    continue
                seen.add(row.type)
                if self._per_link:
                    for link, value in per_link.items():
                        out.add(ERRORS, value, self._label(row.type, link))
                else:
                    _add(totals, row.type, sum(per_link.values()))
            elif (total := values.get(row.field_id)) is not None:
                seen.add(row.type)
                _add(totals, row.type, total)
            else:
                answered.pop()
        for kind, total in totals.items():
            out.add(ERRORS, total, self._label(kind, None))
        # The rows that answered on the first read are the device's set (legacy DL totals or
        # NVLink5 counters): later rounds do not look for the other set's 90 per-link values.
        if seen and self._first_errors:
            self._errors = tuple(answered)
            self._first_errors = False

    def _emit_traffic(self, out: SampleWriter, values: Mapping[FieldKey, float]) -> None:
        for family, field_id in ((TRANSMIT, TX_FIELD), (RECEIVE, RX_FIELD)):
            if not self._per_link:
                if (total := values.get((field_id, ALL_LINKS))) is not None:
                    out.add(family, total * KIB)
                continue
            for link, kib in self._per_link_values(values, field_id).items():
                out.add(family, kib * KIB, label_string({"link": str(link)}))

    def _per_link_values(self, values: Mapping[FieldKey, float], field_id: int) -> dict[int, float]:
        assert self._links is not None
        return {
            link: value
            for link in range(self._links)
            if (value := values.get((field_id, link))) is not None
        }

    def _label(self, kind: str, link: int | None) -> str:
        key = (kind, link)
        if key not in self._labels:
            self._labels[key] = _type_labels(kind, link)
        return self._labels[key]


def _add(totals: dict[str, float], field_type: str, value: float) -> None:
    kind = SUMMED_TYPES.get(field_type, field_type)
    totals[kind] = totals.get(kind, 0.0) + value


class NvLinkStateCollector(Collector):
    name = "nvlink_state"
    help = "NVLink links up, the inactive ones by link (slow cadence); per-link DL error "
    "counters with per-link."
    cadence = Cadence.SLOW
    families = (LINKS, LINK_ACTIVE, ERRORS)
    options = (InterconnectOptions,)

    def __init__(self, device: Device, context: CollectorContext) -> None:
        super().__init__(device, context)
        self._per_link = context.options.of(InterconnectOptions).per_link
        self._fields = context.field_batch(device, self.cadence)
        self._fields.want((LINK_COUNT_FIELD,))
        self._links: int | None = None
        self._seen_active: set[int] = set()

    def collect(self, calls: DeviceCalls, out: SampleWriter) -> None:
        handle = self.device.handle
        if self._links is None:
            self._links = link_count(calls, self._fields.read(calls, handle))
        active_links, reported = 0, False
        for link in range(self._links or 0):
            state = calls.get(
                pynvml.nvmlDeviceGetNvLinkState, handle, link, signal=f"nvlink_state.{link}"
            )
            if state is None and link not in self._seen_active:
                continue  # a link the GPU does not report
            active = state is not None and bool(state)
            if active:
                self._seen_active.add(link)
            active_links += active
            reported = True
            if self._per_link or not active:
                out.add(LINK_ACTIVE, 1.0 if active else 0.0, label_string({"link": str(link)}))
            if self._per_link:
                self._dl_errors(calls, out, link)
        if reported:
            out.add(LINKS, active_links, _ACTIVE_LABELS)

    def _dl_errors(self, calls: DeviceCalls, out: SampleWriter, link: int) -> None:
        for kind, dl_counter in DL_COUNTERS:
            value = calls.get(
                pynvml.nvmlDeviceGetNvLinkErrorCounter,
                self.device.handle,
                link,
                dl_counter,
                signal=f"nvlink_errors.{kind}",
            )
            if value is not None:
                out.add(ERRORS, value, _type_labels(kind, link))
