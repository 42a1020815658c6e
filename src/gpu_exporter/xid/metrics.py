"""The Xid subsystem's families and how its published state becomes samples (like
``allocation/metrics.py``). A new Xid metric: its family here, in ``FAMILIES``, and its samples in
:func:`render` from :class:`~gpu_exporter.xid.core.Published` (add the field there)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..exposition import Family, Sample, counter, gauge, label_string
from ..families import SOURCE_UP, source_up
from .bounds import FOLDED_LABELS
from .classes import CLASSES
from .core import IGNORED_REASONS, SOURCE_KMSG, SOURCE_NVML, Published
from .nvml_events import Inventory
from .ops import CountKey
from .state import REASONS, class_key

XID_ERRORS = counter(
    "gpu_xid_errors_total",
    "Xid errors by device, code, class (hardware|application|driver|informational|unknown), "
    "NVIDIA's immediate action, and the namespace/pod that held the device (empty if none); on "
    "a Slurm node the job_id that held it, with namespace and pod empty.",
)
XID_CLASS_ERRORS = counter(
    "gpu_xid_class_errors_total",
    "Xid errors by class: hardware per GPU (a MIG instance's count on its GPU), every other "
    "class once per node with gpu and uuid empty; all published from 0 so that increase() sees "
    "the first Xid.",
)
XID_LAST = gauge(
    "gpu_xid_last_timestamp_seconds",
    "When the latest Xid of this code happened on this device, in seconds since the epoch.",
)
DRAIN = gauge(
    "gpu_drain_recommended",
    "1 for each hardware condition that stands on the GPU (reason: hardware_xid, "
    "row_remap_failure, device_lost); one series at 0 without a reason while none does. Survives "
    "exporter restarts, clears on a new boot or an observed GPU reset.",
)
JOURNAL_OK = gauge(
    "gpu_exporter_state_journal_ok",
    "1 when the Xid journal under --state-dir holds the whole state: it loaded cleanly (or was "
    "rewritten since) and its last write succeeded.",
)
JOURNAL_ERRORS = counter(
    "gpu_exporter_state_journal_errors_total",
    "Failed Xid journal operations (load: unreadable or corrupt at start; append, snapshot: "
    "write failures such as a full or read-only disk), by operation.",
)
JOURNAL_OPERATIONS = ("load", "append", "snapshot")
DUPLICATES = counter(
    "gpu_exporter_xid_duplicates_total",
    "Xid reports dropped because another source already counted the same event, by source.",
)
KMSG_LOST = counter(
    "gpu_exporter_kmsg_lost_records_total",
    "Kernel log records overwritten before the exporter read them (sequence number gaps).",
)
IGNORED = counter(
    "gpu_exporter_kmsg_ignored_records_total",
    "Kernel log records not taken as Xid sources, by reason: not_kernel (written by a userspace "
    "process, which only the kernel facility is not; counted when it names an Xid or SXid), "
    "oversized (a file or FIFO line longer than the kernel's longest record, dropped).",
)
FOLDED = counter(
    "gpu_exporter_xid_label_values_folded_total",
    'Xids and SXids counted under "other" because a label had too many values: label xid (an '
    "unknown code beyond the GPU's first 8), sxid (beyond an NVSwitch's first 64 codes), "
    "pci_bus_id (beyond 16 NVSwitches). The raw values are in the events' log lines.",
)
UNPARSED = counter(
    "gpu_exporter_xid_unparsed_lines_total",
    "Kernel log lines that mention an Xid or an NVSwitch SXid but could not be parsed.",
)
SXID_ERRORS = counter(
    "gpu_nvswitch_sxid_errors_total",
    "NVSwitch SXid errors from the kernel log, by switch instance, the switch's PCI address, "
    "code and severity (fatal|non_fatal|correctable|unknown).",
)
SXID_LAST = gauge(
    "gpu_nvswitch_sxid_last_timestamp_seconds",
    "When the latest SXid of this code and severity happened on this NVSwitch, in seconds since "
    "the epoch.",
)
FAMILIES: tuple[Family, ...] = (
    XID_ERRORS,
    XID_CLASS_ERRORS,
    XID_LAST,
    DRAIN,
    SXID_ERRORS,
    SXID_LAST,
    SOURCE_UP,
    JOURNAL_OK,
    JOURNAL_ERRORS,
    DUPLICATES,
    KMSG_LOST,
    IGNORED,
    FOLDED,
    UNPARSED,
)
COUNT_LABELS = ("gpu", "uuid", "xid", "class", "action", "namespace", "pod")
SXID_LABELS = ("switch", "pci_bus_id", "sxid", "severity")


def render(
    published: Published,
    inventory: Inventory,
    up: Mapping[str, bool],
    unidentified: tuple[int, ...],
) -> list[Sample]:
    """Every Xid series from the core's published snapshot (rebuilt only when it changed)."""
    out = [
        Sample(XID_ERRORS, _count_labels(key), value)
        for key, value in sorted(published.counts.items())
    ]
    out += _class_samples(published, inventory)
    out += [
        Sample(SXID_ERRORS, label_string(zip(SXID_LABELS, key, strict=True)), value)
        for key, value in sorted(published.sxid_counts.items())
    ]
    out += [
        Sample(SXID_LAST, label_string(zip(SXID_LABELS, key, strict=True)), value)
        for key, value in sorted(published.sxid_last.items())
    ]
    out += [
        Sample(XID_LAST, label_string(zip(COUNT_LABELS[:4], key, strict=True)), value)
        for key, value in sorted(published.last_seen.items())
    ]
    out += _drain_samples(published, inventory)
    out += _unidentified_drain_samples(published, unidentified)
    for source, source_is_up in sorted(up.items()):
        out.append(source_up(source, source_is_up))
    out.append(Sample(JOURNAL_OK, "", 1.0 if published.journal_ok else 0.0))
    for operation in JOURNAL_OPERATIONS:
        labels = label_string({"operation": operation})
        out.append(Sample(JOURNAL_ERRORS, labels, published.journal_errors.get(operation, 0.0)))
    for source in (SOURCE_KMSG, SOURCE_NVML):
        labels = label_string({"source": source})
        out.append(Sample(DUPLICATES, labels, published.duplicates.get(source, 0.0)))
    if SOURCE_KMSG in up:
        out.append(Sample(KMSG_LOST, "", published.kmsg_lost))
        for reason in IGNORED_REASONS:
            labels = label_string({"reason": reason})
            out.append(Sample(IGNORED, labels, published.ignored.get(reason, 0.0)))
        out.append(Sample(UNPARSED, "", published.unparsed))
    for label in FOLDED_LABELS:
        labels = label_string({"label": label})
        out.append(Sample(FOLDED, labels, published.folded.get(label, 0.0)))
    return out


def _count_labels(key: CountKey) -> str:
    """A series' labels; ``job_id`` only where a job held the device (Kubernetes nodes' series
    keep their labels)."""
    labels = dict(zip(COUNT_LABELS, key[:7], strict=True))
    if key.job_id:
        labels["job_id"] = key.job_id
    return label_string(labels)


def _class_samples(published: Published, inventory: Inventory) -> list[Sample]:
    """Hardware Xids per GPU (a MIG instance's count on its GPU: ``gpu_xid_errors_total`` names
    the instance), every other class once per node with ``gpu`` and ``uuid`` empty: every reader
    sums by class, and a card's lifetime hardware count is the one a GPU's own series must keep.
    All are published from 0 so that ``increase()`` sees the first Xid: on a node of 8 GPUs,
    8 + 4 series instead of 40 (320 more on one split into 7 MIG instances each)."""
    parents = {uuid: device.parent_uuid for uuid, device in inventory.by_uuid.items()}
    gpu_by_index = {str(device.id.index): device.uuid for device in inventory.gpus}
    totals = {
        class_key(str(device.id.index), device.uuid, xid_class): 0.0
        for device in inventory.gpus
        for xid_class in CLASSES
    }
    for (gpu, uuid, xid_class), count in published.class_counts.items():
        # An instance no longer in the inventory (MIG reconfigured) still counts on its GPU.
        if uuid.startswith("MIG-"):
            uuid = parents.get(uuid) or gpu_by_index.get(gpu) or uuid
        key = class_key(gpu, uuid, xid_class)
        totals[key] = totals.get(key, 0.0) + count
    return [
        Sample(
            XID_CLASS_ERRORS,
            label_string({"gpu": gpu, "uuid": uuid, "class": xid_class}),
            count,
        )
        for (gpu, uuid, xid_class), count in sorted(totals.items())
    ]


def _drain_samples(published: Published, inventory: Inventory) -> list[Sample]:
    """Per GPU, a 1 for each reason latched, or one 0 without a reason: a reason that does not
    stand is not a series of its own (``gpu_drain_recommended == 1`` reads the same)."""
    latched: dict[str, set[str]] = {}
    for uuid, _gpu, reason in published.latches:
        latched.setdefault(uuid, set()).add(reason)
    gpus = {device.uuid: str(device.id.index) for device in inventory.gpus}
    for uuid, gpu, _reason in published.latches:
        gpus.setdefault(uuid, gpu)  # a latched GPU no longer in the inventory stays visible
    samples = []
    for uuid, gpu in sorted(gpus.items(), key=lambda item: (item[1], item[0])):
        reasons = [reason for reason in REASONS if reason in latched.get(uuid, ())]
        if not reasons:
            samples.append(Sample(DRAIN, label_string({"gpu": gpu, "uuid": uuid}), 0.0))
        for reason in reasons:
            labels = label_string({"gpu": gpu, "uuid": uuid, "reason": reason})
            samples.append(Sample(DRAIN, labels, 1.0))
    return samples


def _unidentified_drain_samples(published: Published, unidentified: Iterable[int]) -> list[Sample]:
    """``device_lost`` for GPUs lost since startup, under ``uuid=""``: without it a node whose GPU
    died before the exporter first saw it (a reboot clears the latches) would show no drain.
    Skipped for an index a journal latch already names: the same GPU in this boot."""
    named = {gpu for _uuid, gpu, _reason in published.latches}
    return [
        Sample(DRAIN, label_string({"gpu": str(index), "uuid": "", "reason": "device_lost"}), 1.0)
        for index in unidentified
        if str(index) not in named
    ]
