"""Bounded label values: a flood of distinct Xid codes, NVSwitch bus ids or SXid codes cannot grow
the exposition, the journal or memory without bound; known codes always keep their label, and
every event is still counted."""

from __future__ import annotations

from pathlib import Path

from gpu_exporter.devices import DeviceId
from gpu_exporter.xid import XidCore, load_classifier
from gpu_exporter.xid.bounds import MAX_NVSWITCHES, MAX_SXIDS_PER_SWITCH, MAX_UNKNOWN_XIDS_PER_GPU
from gpu_exporter.xid.core import SOURCE_NVML, Observation, SxidObservation
from gpu_exporter.xid.journal import Journal
from gpu_exporter.xid.parser import SxidLine

from .conftest import KmsgFile, Make, exposition, value, wait_until, xid_count

GPU = DeviceId(index=0, uuid="GPU-0000", pci_bus_id="00000000:18:00.0")
DAY = 86400.0
T0 = 1_700_000_000.0
UNKNOWN = range(20_000, 20_000 + 3000)  # codes no table knows


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def make_core(state_dir: Path, clock: Clock | None = None) -> XidCore:
    core = XidCore(load_classifier(), Journal(state_dir), clock=clock or Clock())
    core.load("boot-1")
    return core


def nvml_xid(code: int, when: float = T0) -> Observation:
    return Observation(
        source=SOURCE_NVML, channel="nvml", xid=code, when=when, device=GPU, gpu_uuid=GPU.uuid
    )


def sxid(bus: str, code: int, when: float = T0) -> SxidObservation:
    return SxidObservation(SxidLine(code, bus, "0", "non_fatal"), when)


def codes(core: XidCore) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, count in core.published.counts.items():
        found[key[2]] = found.get(key[2], 0.0) + count
    return found


async def test_a_flood_of_distinct_codes_folds_into_other(
    make_subsystem: Make, kmsg: KmsgFile
) -> None:
    for code in UNKNOWN:
        kmsg.write(f"NVRM: Xid (PCI:0000:18:00): {code}, forged")
    kmsg.write("NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable DBE")  # known: its own label
    xid = make_subsystem()
    await xid.start()
    try:
        await wait_until(lambda: xid_count(xid) == len(UNKNOWN) + 1, within=30.0)
        series = [s for s in xid.samples() if s.family.name == "gpu_xid_errors_total"]
        assert len(series) == MAX_UNKNOWN_XIDS_PER_GPU + 2, "one series per code, unbounded"
        assert value(xid, "gpu_xid_errors_total", xid="other") == len(UNKNOWN) - 8
        assert value(xid, "gpu_xid_errors_total", xid=str(UNKNOWN[0])) == 1  # the first 8 stay
        assert value(xid, "gpu_xid_errors_total", xid="48") == 1
        folded = len(UNKNOWN) - MAX_UNKNOWN_XIDS_PER_GPU
        assert value(xid, "gpu_exporter_xid_label_values_folded_total", label="xid") == folded
        assert value(xid, "gpu_xid_class_errors_total", gpu="", **{"class": "unknown"}) == 3000
        assert len(exposition(xid)) < 64 * 1024
    finally:
        await xid.stop()


def test_which_codes_keep_a_label_survives_a_restart(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    core.observe([nvml_xid(code, T0 + i * 10) for i, code in enumerate(UNKNOWN[:9])])
    core.close()
    again = make_core(tmp_path)
    again.observe([nvml_xid(UNKNOWN[3], T0 + 200), nvml_xid(UNKNOWN[100], T0 + 210)])
    found = codes(again)
    assert found[str(UNKNOWN[3])] == 2, "a code that had its label before a restart lost it"
    assert found["other"] == 2  # the 9th before the restart, the new one after it
    assert sum(found.values()) == 11


def test_nvml_codes_of_any_size_are_bounded_too(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    core.observe([nvml_xid(2**40 + i, T0 + i * 10) for i in range(50)])
    assert len(core.published.counts) == MAX_UNKNOWN_XIDS_PER_GPU + 1
    assert core.published.folded["xid"] == 50 - MAX_UNKNOWN_XIDS_PER_GPU


def test_sxid_bus_ids_and_codes_are_bounded(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    core.observe([sxid(f"0000:{i:02x}:00.0", 12028) for i in range(40)])
    core.observe([sxid("0000:00:00.0", 10_000 + i) for i in range(100)])
    buses = {key[1] for key in core.published.sxid_counts}
    assert len(buses) == MAX_NVSWITCHES + 1
    assert "other" in buses
    on_first = {key[2] for key in core.published.sxid_counts if key[1] == "0000:00:00.0"}
    assert len(on_first) == MAX_SXIDS_PER_SWITCH + 1
    assert "other" in on_first
    assert sum(core.published.sxid_counts.values()) == 140, "an SXid went uncounted"
    assert core.published.folded["pci_bus_id"] == 40 - MAX_NVSWITCHES
    assert core.published.folded["sxid"] == 100 - (MAX_SXIDS_PER_SWITCH - 1)


def test_sxid_series_expire_like_pod_series(tmp_path: Path) -> None:
    clock = Clock()
    core = make_core(tmp_path, clock)
    core.observe([sxid("0000:05:00.0", 12028, T0), sxid("0000:06:00.0", 12028, T0 + 5 * DAY)])
    clock.now = T0 + 8 * DAY
    core.expire_pod_series(7 * DAY)
    assert [key[1] for key in core.published.sxid_counts] == ["0000:06:00.0"]
    assert [key[1] for key in core.published.sxid_last] == ["0000:06:00.0"]
    core.close()
    again = make_core(tmp_path, clock)
    assert [key[1] for key in again.published.sxid_counts] == ["0000:06:00.0"], "came back"
