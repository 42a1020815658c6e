"""The soak's verdicts (bench/soak.py): what counts as an exact Xid count, a whole scrape and flat
memory. The soak itself runs for minutes and is not part of the suite (``make soak``)."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from soak import check_response, rss_verdict, xid_counts, xid_verdict

EXPOSITION = """\
# TYPE gpu_xid_errors_total counter
gpu_xid_errors_total{gpu="3",uuid="GPU-a",xid="48",class="hardware",namespace="",pod=""} 2
gpu_xid_errors_total{gpu="3",uuid="GPU-a",xid="48",class="hardware",namespace="s",pod="p"} 1
gpu_xid_errors_total{gpu="4",uuid="GPU-b",xid="13",class="application",namespace="",pod=""} 1
gpu_xid_class_errors_total{gpu="3",uuid="GPU-a",class="hardware"} 3
gpu_xid_last_timestamp_seconds{gpu="3",uuid="GPU-a",xid="48",class="hardware"} 1.7e9
gpu_info{gpu="3",uuid="GPU-a"} 1
gpu_nvswitch_sxid_errors_total{switch="2",pci_bus_id="0000:07:00.0",sxid="24007",severity="fatal"} 2
"""


def test_xid_counts_sum_every_pod_of_one_gpu_and_code() -> None:
    assert xid_counts(EXPOSITION) == {
        ("3", "48"): 3.0,
        ("4", "13"): 1.0,
        ("nvswitch2", "24007"): 2.0,
    }, (
        "only gpu_xid_errors_total counts, summed over pods, kept apart by (gpu, xid); "
        "NVSwitch SXids by (switch, sxid)"
    )


def test_an_exact_count_passes() -> None:
    injected = {("3", "48"): 3, ("4", "13"): 1, ("nvswitch2", "24007"): 2}
    verdict = xid_verdict(injected, xid_counts(EXPOSITION))
    assert verdict["ok"], f"equal counts must pass: {verdict}"
    assert (verdict["injected"], verdict["counted"]) == (6, 6)


def test_a_missing_and_a_double_count_both_fail() -> None:
    injected = {("3", "48"): 2, ("4", "13"): 2, ("nvswitch2", "24007"): 2}
    verdict = xid_verdict(injected, xid_counts(EXPOSITION))
    assert not verdict["ok"], "a double count on one GPU must not hide a lost one on another"
    assert [(m["gpu"], m["xid"], m["injected"], m["counted"]) for m in verdict["mismatches"]] == [
        ("3", "48", 2, 3.0),
        ("4", "13", 2, 1.0),
    ]


def test_an_xid_counted_but_never_injected_fails() -> None:
    verdict = xid_verdict({}, {("1", "79"): 1.0})
    assert not verdict["ok"], "a count nobody injected is a double count"
    assert verdict["mismatches"][0]["injected"] == 0


def test_flat_memory_passes_and_the_warm_up_is_ignored() -> None:
    samples = [(0.0, 40.0), (5.0, 55.0)] + [(10.0 + t, 60.0 + (t % 3) * 0.1) for t in range(20)]
    verdict = rss_verdict(samples, warmup=10.0, tolerance_pct=5.0)
    assert verdict["ok"], f"growth during the warm-up must not count: {verdict}"
    assert (verdict["samples"], verdict["per_fifth"]) == (20, 4)


def test_steady_growth_beyond_the_tolerance_fails() -> None:
    samples = [(float(t), 60.0 + 0.5 * t) for t in range(20)]  # +60% over the run
    verdict = rss_verdict(samples, warmup=0.0, tolerance_pct=5.0)
    assert not verdict["ok"], f"a leak must fail: {verdict}"
    assert verdict["last_mib"] > verdict["first_mib"]


def test_too_few_samples_after_the_warm_up_fail() -> None:
    verdict = rss_verdict([(float(t), 60.0) for t in range(10)], warmup=8.0, tolerance_pct=5.0)
    assert not verdict["ok"], "two samples cannot show a trend"
    assert "only 2 samples" in verdict["reason"]


def _check(body: bytes, *, gzipped: bool, openmetrics: bool, status: int = 200) -> str | None:
    headers = {
        "content-type": "application/openmetrics-text; version=1.0.0"
        if openmetrics
        else "text/plain; version=0.0.4",
        **({"content-encoding": "gzip"} if gzipped else {}),
    }
    return check_response(
        gzipped=gzipped, openmetrics=openmetrics, status=status, headers=headers, body=body
    )


def test_a_whole_answer_passes_in_every_variant() -> None:
    text = EXPOSITION.encode()
    om = text + b"# EOF\n"
    assert _check(text, gzipped=False, openmetrics=False) is None
    assert _check(gzip.compress(text), gzipped=True, openmetrics=False) is None
    assert _check(om, gzipped=False, openmetrics=True) is None
    assert _check(gzip.compress(om), gzipped=True, openmetrics=True) is None


def test_truncated_or_wrong_answers_are_errors() -> None:
    om = EXPOSITION.encode() + b"# EOF\n"
    assert _check(gzip.compress(om)[:-9], gzipped=True, openmetrics=True) == "truncated gzip"
    assert _check(om[:-6], gzipped=False, openmetrics=True) == "truncated (no # EOF)"
    assert _check(EXPOSITION.encode()[:-5], gzipped=False, openmetrics=False) == "truncated body"
    assert _check(b"oops\n", gzipped=False, openmetrics=False, status=503) == "status 503"
    text_headers = {"content-type": "text/plain; version=0.0.4"}
    assert (
        check_response(gzipped=False, openmetrics=True, status=200, headers=text_headers, body=om)
        == "wrong content-type"
    ), "OpenMetrics asked for, text served"
    assert (
        check_response(gzipped=True, openmetrics=False, status=200, headers=text_headers, body=om)
        == "wrong content-encoding"
    ), "gzip asked for, identity served"
