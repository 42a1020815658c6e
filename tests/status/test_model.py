"""The status page's rows, built from an exposition written by hand: what each series becomes."""
# ruff: noqa: E501  (exposition lines are kept whole, as the exporter writes them)

from __future__ import annotations

import textwrap

from gpu_exporter.exposition import Exposition
from gpu_exporter.http.status import NodeStatus, UnheldProcess, build_status
from gpu_exporter.http.status.cache import StatusPage
from gpu_exporter.http.status.page import render_html
from gpu_exporter.http.status.reader import read_exposition

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"

EXPOSITION = textwrap.dedent(
    f"""\
    # HELP gpu_info Identity.
    # TYPE gpu_info gauge
    gpu_info{{gpu="0",uuid="{GPU0}",model="NVIDIA H100 80GB HBM3"}} 1
    gpu_info{{gpu="1",uuid="{GPU1}",model="NVIDIA H100 80GB HBM3"}} 1
    gpu_up{{gpu="0",uuid="{GPU0}"}} 1
    gpu_up{{gpu="1",uuid="{GPU1}"}} 1
    gpu_up{{gpu="2",uuid=""}} 0
    gpu_sm_active_ratio{{gpu="0",uuid="{GPU0}"}} 0.08
    gpu_utilization_ratio{{gpu="0",uuid="{GPU0}"}} 0.95
    gpu_clocks_event_active{{gpu="0",uuid="{GPU0}",reason="gpu_idle"}} 1
    gpu_clocks_event_active{{gpu="0",uuid="{GPU0}",reason="sw_power_cap"}} 1
    gpu_clocks_event_active{{gpu="0",uuid="{GPU0}",reason="hw_slowdown"}} 0
    gpu_allocation_info{{gpu="0",uuid="{GPU0}",namespace="a",pod="busy",container="c",resource="nvidia.com/gpu"}} 1
    gpu_allocation_info{{gpu="0",uuid="{GPU0}",namespace="b",pod="<script>alert(1)</script>",container="c",resource="nvidia.com/gpu"}} 1
    gpu_container_sm_active_ratio{{gpu="0",uuid="{GPU0}",namespace="a",pod="busy",container="c"}} 0.07
    gpu_allocation_idle_streak_seconds{{gpu="0",uuid="{GPU0}",namespace="a",pod="busy"}} 0
    gpu_allocation_idle_streak_seconds{{gpu="0",uuid="{GPU0}",namespace="b",pod="<script>alert(1)</script>"}} 125
    gpu_drain_recommended{{gpu="1",uuid="{GPU1}",reason="xid_48"}} 1
    gpu_drain_recommended{{gpu="2",uuid="",reason="device_lost"}} 1
    gpu_row_remap_pending{{gpu="1",uuid="{GPU1}"}} 1
    gpu_nvlink_links{{gpu="1",uuid="{GPU1}",state="active"}} 1
    gpu_nvlink_link_active{{gpu="1",uuid="{GPU1}",link="1"}} 0
    gpu_xid_errors_total{{gpu="1",uuid="{GPU1}",xid="48",class="hardware",action="gpu_reset",namespace="a",pod="busy"}} 1
    gpu_xid_errors_total{{gpu="1",uuid="{GPU1}",xid="48",class="hardware",action="gpu_reset",namespace="",pod=""}} 2
    gpu_xid_last_timestamp_seconds{{gpu="1",uuid="{GPU1}",xid="48",class="hardware"}} 2000
    gpu_xid_last_timestamp_seconds{{gpu="0",uuid="{GPU0}",xid="13",class="application"}} 1000
    gpu_exporter_source_up{{source="kmsg"}} 0
    gpu_exporter_build_info{{version="0.1.0",driver_version="580.95.05",nvml_version="13"}} 1
    """
)


def status() -> NodeStatus:
    return build_status(
        read_exposition(EXPOSITION), version="0.1.0", ready=True, healthy=True, problems=()
    )


def test_each_gpu_and_a_gpu_lost_before_it_was_identified_get_a_row() -> None:
    rows = status().devices
    assert [(row.gpu, row.uuid) for row in rows] == [("0", GPU0), ("1", GPU1), ("2", "")]
    assert not rows[2].health.up, "a GPU that only has gpu_up 0 is shown as lost"
    assert rows[2].health.drain_reasons == ("device_lost",)


def test_a_shared_gpu_lists_each_holder_with_its_own_activity_and_idle_time() -> None:
    gpu0 = status().devices[0]
    assert [(h.namespace, h.pod) for h in gpu0.holders] == [
        ("a", "busy"),
        ("b", "<script>alert(1)</script>"),
    ]
    assert gpu0.holders[0].sm_active == 0.07
    assert gpu0.holders[1].sm_active is None, "no per-process series: nothing invented"
    assert gpu0.holders[1].idle_seconds == 125
    assert not gpu0.idle_allocated, "one holder is busy, so the GPU is not idle-allocated"


def test_clock_reasons_by_design_are_not_listed_as_throttling() -> None:
    assert status().devices[0].throttle_reasons == ("sw_power_cap",)


def test_health_gathers_drains_remaps_and_links() -> None:
    gpu1 = status().devices[1]
    assert gpu1.health.drain_reasons == ("xid_48",)
    assert gpu1.health.row_remap_pending
    assert not gpu1.health.ok
    assert (gpu1.interconnect.nvlink_active, gpu1.interconnect.nvlink_links) == (1, 2)
    assert status().devices[0].interconnect.nvlink_links is None, "no NVLink series, no cell"


def test_xids_are_newest_first_with_their_count_action_and_pods() -> None:
    xids = status().xids
    assert [(x.gpu, x.xid) for x in xids] == [("1", "48"), ("0", "13")]
    assert xids[0].count == 3
    assert xids[0].action == "gpu_reset"
    assert xids[0].pods == ("a/busy",)


def test_sources_and_driver_come_from_the_self_metrics() -> None:
    node = status()
    assert node.sources == {"kmsg": False}
    assert node.driver_version == "580.95.05"


def test_markup_in_a_pod_name_is_rendered_as_text() -> None:
    page = render_html(status())
    assert "<script>" not in page, "a pod name must never become markup"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_process_that_holds_nothing_is_listed_under_its_gpu_with_its_command_as_text() -> None:
    processes = {
        GPU1: (
            UnheldProcess(4242, "no_pod", "<img src=x>", memory_used_bytes=2**30),
            UnheldProcess(4343, "gone", "python3", "ml", "old-job", 20 * 2**30),
        )
    }
    built = build_status(
        read_exposition(EXPOSITION),
        version="0.1.0",
        ready=True,
        healthy=True,
        problems=(),
        processes=processes,
    )
    (gpu1,) = [d for d in built.devices if d.uuid == GPU1]
    assert [p.process_class for p in gpu1.processes] == ["no_pod", "gone"]
    assert not next(d for d in built.devices if d.uuid == GPU0).processes, "nothing on GPU 0"
    page = render_html(built)
    assert "<img" not in page, "a process names itself: never markup"
    assert '<span class="warn">no_pod</span> <code>&lt;img src=x&gt;</code>' in page
    assert "ml/old-job, pid 4343, 20.0 GiB" in page


def test_escaped_label_values_are_read_back_as_written() -> None:
    series = read_exposition('m{a="x\\"y\\\\z\\nw",b=""} 2\nbroken{a="x} 1\n')
    assert series.of("m") == [({"a": 'x"y\\z\nw', "b": ""}, 2.0)]
    assert series.of("broken") == [], "a line that does not parse is skipped, not guessed"


PLACED = textwrap.dedent(
    f"""\
    gpu_info{{gpu="0",uuid="{GPU0}",model="NVIDIA L40S"}} 1
    gpu_info{{gpu="1",uuid="{GPU1}",model="NVIDIA L40S"}} 1
    gpu_allocation_info{{gpu="0",uuid="{GPU0}",namespace="ml",pod="tp-split",container="trainer",resource="nvidia.com/gpu"}} 1
    gpu_allocation_info{{gpu="1",uuid="{GPU1}",namespace="ml",pod="tp-split",container="trainer",resource="nvidia.com/gpu"}} 1
    gpu_allocation_path_info{{namespace="ml",pod="tp-split",path="system",best_path="pcie_switch"}} 1
    gpu_allocation_numa_aligned_ratio{{gpu="1",uuid="{GPU1}",namespace="ml",pod="tp-split",container="trainer"}} 0
    gpu_allocation_sm_activity_band_seconds_total{{gpu="0",uuid="{GPU0}",namespace="ml",pod="tp-split",band="low"}} 30
    gpu_allocation_sm_activity_band_seconds_total{{gpu="0",uuid="{GPU0}",namespace="ml",pod="tp-split",band="mid"}} 0
    gpu_allocation_sm_activity_band_seconds_total{{gpu="0",uuid="{GPU0}",namespace="ml",pod="tp-split",band="high"}} 10
    """
)


def test_a_holder_shows_its_pods_path_its_numa_alignment_and_its_activity_shape() -> None:
    rows = build_status(
        read_exposition(PLACED), version="0.1.0", ready=True, healthy=True, problems=()
    ).devices
    (first,), (second,) = rows[0].holders, rows[1].holders
    assert (first.path, first.best_path) == ("system", "pcie_switch"), "the pod's, on each GPU"
    assert first.numa_aligned is None, "no CPU ids listed for this GPU: absent, not zero"
    assert second.numa_aligned == 0.0
    assert first.sm_bands is not None
    assert (first.sm_bands.low, first.sm_bands.mid, first.sm_bands.high) == (0.75, 0.0, 0.25)
    assert second.sm_bands is None, "no band signal on that GPU"
    html = render_html(
        build_status(read_exposition(PLACED), version="", ready=True, healthy=True, problems=())
    )
    assert "path system (best pcie_switch)" in html
    assert "NUMA 0%" in html
    assert "SM low/mid/high 75/0/25%" in html


def test_a_slurm_jobs_xid_names_the_job_among_the_holders() -> None:
    exposition = textwrap.dedent(
        """\
        gpu_xid_errors_total{gpu="0",uuid="GPU-0",xid="13",class="application",action="restart_app",namespace="",pod="",job_id="4242"} 1
        gpu_xid_last_timestamp_seconds{gpu="0",uuid="GPU-0",xid="13",class="application"} 1000
        """
    )
    node = build_status(
        read_exposition(exposition), version="0.1.0", ready=True, healthy=True, problems=()
    )
    assert node.xids[0].pods == ("job 4242",)


class _StillView:
    """A sampler whose last render does not change (the next round's is still on its thread)."""

    def __init__(self) -> None:
        self.exposition = Exposition(text=EXPOSITION.encode(), openmetrics=b"")
        self.ready = True

    def healthy(self) -> bool:
        return True

    def problems(self) -> list[str]:
        return []


def test_a_process_scan_between_renders_reaches_the_page_without_a_new_render() -> None:
    scans: list[dict[str, tuple[UnheldProcess, ...]]] = [{}]
    page = StatusPage(_StillView(), "0.1.0", lambda: scans[-1])
    (gpu1,) = [d for d in page.status().devices if d.uuid == GPU1]
    assert gpu1.processes == ()
    scans.append({GPU1: (UnheldProcess(4343, "gone", "python3", "ml", "old-job", 2**30),)})
    (gpu1,) = [d for d in page.status().devices if d.uuid == GPU1]
    assert [p.pid for p in gpu1.processes] == [4343], "the page kept the scan before the last"
    assert b"old-job" in page.json(), "the JSON was built from the page before the scan"
