"""Slurm's answer about jobs and GPUs, parsed: recorded output of the test cluster (tests/slurm/
data/README.md says how it was made), and the cases a real cluster shows that one node cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_exporter.allocation.jobgpus import (
    GpuOrder,
    JobGpus,
    SlurmError,
    SlurmJob,
    gres_order,
    job_gpus,
    resolve,
)
from gpu_exporter.allocation.slurm import (
    AMBIGUOUS,
    BAD_GRES,
    BAD_RECORD,
    NODES_MISMATCH,
    hostlist_contains,
    parse_gpu_gres,
    parse_index_list,
    parse_jobs_json,
    parse_scontrol_text,
)
from gpu_exporter.devices import DeviceId

DATA = Path(__file__).resolve().parent / "data"
NODE = "gpunode1"
TEXT = (DATA / "scontrol-show-job-d.txt").read_text()
JSON = (DATA / "squeue-json.json").read_text()

# The holders in the recording (job ids from tests/slurm/record.py's run).
RECORDED = job_gpus(
    [
        SlurmJob("1", (1,), user="root", account="bio", partition="batch", array="1_1"),
        SlurmJob("2", (2, 3), user="root", account="physics", partition="batch"),
        SlurmJob("5", (0,), user="root", account="bio", partition="batch", array="1_0"),
    ],
    GpuOrder.GRES,
)


def test_the_text_form_names_each_running_job_with_its_gpus_account_and_partition() -> None:
    assert parse_scontrol_text(TEXT, NODE) == RECORDED


def test_the_json_form_gives_the_same_answer_as_the_text_form() -> None:
    assert parse_jobs_json(JSON, NODE) == RECORDED


@pytest.mark.parametrize(
    "found", [parse_scontrol_text(TEXT, NODE), parse_jobs_json(JSON, NODE)], ids=["text", "json"]
)
def test_finished_pending_and_gpu_less_jobs_hold_nothing(found: JobGpus) -> None:
    ids = {job.job_id for job in found.jobs}
    assert ids.isdisjoint({"3", "4", "6", "7"})  # completed, CPU-only, pending het components
    assert found.skipped == ()


def test_another_nodes_jobs_are_not_this_nodes_holders() -> None:
    assert parse_scontrol_text(TEXT, "gpunode2").jobs == ()
    assert parse_jobs_json(JSON, "gpunode2").jobs == ()


def test_gpu_numbers_are_positions_in_gres_conf_not_device_minors() -> None:
    # gres.conf named minors 3, 5 and 6; the job holding minors 5 and 6 is IDX 1-2.
    text = (DATA / "scontrol-show-job-d-sparse-minors.txt").read_text()
    (job,) = parse_scontrol_text(text, "node1").jobs
    assert job.gpus == (1, 2)
    gpus = [_gpu(0, minor=3), _gpu(1, minor=5), _gpu(2, minor=6)]
    resolved = resolve(parse_scontrol_text(text, "node1"), gpus)
    assert [h.device.uuid for h in resolved.holdings] == ["GPU-1", "GPU-2"]


def test_a_multi_node_record_holds_only_the_gpus_of_this_nodes_line() -> None:
    record = _record(
        "RUNNING",
        "     Nodes=gpu[01-02] CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:0-1)\n"
        "     Nodes=gpu03 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:5)\n",
    )
    assert parse_scontrol_text(record, "gpu02").jobs[0].gpus == (0, 1)
    assert parse_scontrol_text(record, "gpu03").jobs[0].gpus == (5,)
    assert parse_scontrol_text(record, "gpu04").jobs == ()


@pytest.mark.parametrize("state", ["RUNNING", "SUSPENDED", "COMPLETING"])
def test_running_suspended_and_completing_jobs_hold_their_gpus(state: str) -> None:
    record = _record(state, "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n")
    assert parse_scontrol_text(record, "n1").jobs[0].gpus == (3,)


def test_a_gpu_entry_without_indices_is_counted_not_guessed() -> None:
    record = _record("RUNNING", "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:2\n")
    found = parse_scontrol_text(record, "n1")
    assert found.jobs == ()
    assert found.skips() == {BAD_GRES: 1}


def test_a_record_without_a_numeric_job_id_is_counted() -> None:
    found = parse_scontrol_text("JobId=abc JobName=x\n   JobState=RUNNING\n", "n1")
    assert found.skips() == {BAD_RECORD: 1}


def test_no_jobs_at_all_is_an_empty_answer() -> None:
    assert parse_scontrol_text("No jobs in the system\n", "n1") == JobGpus()


def test_a_job_name_and_comment_forging_record_lines_make_the_record_ambiguous() -> None:
    # Recorded: scontrol prints the newlines of a job's name and comment as they are, so the
    # job below claims account "finance" and all 8 GPUs in lines of its own making.
    forged = (DATA / "scontrol-show-job-d-forged.txt").read_text()
    found = parse_scontrol_text(forged, NODE)
    assert (found.jobs, found.skips()) == ((), {AMBIGUOUS: 1})


def test_the_json_form_is_not_fooled_by_forged_names() -> None:
    found = parse_jobs_json((DATA / "squeue-json-forged.json").read_text(), NODE)
    assert found.jobs == (SlurmJob("8", (0,), "root", "real", "batch"),)


def test_a_forged_node_line_after_the_allocation_makes_the_record_ambiguous() -> None:
    record = _record("RUNNING", "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n")
    forged = record + "   Comment=c\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)\n"
    assert parse_scontrol_text(forged, "n1").skips() == {AMBIGUOUS: 1}


def test_a_job_name_naming_fields_on_its_own_line_changes_nothing() -> None:
    record = _record("RUNNING", "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n")
    named = record.replace("JobName=train", "JobName=x Account=finance ArrayJobId=9 ArrayTaskId=1")
    assert parse_scontrol_text(named, "n1") == parse_scontrol_text(record, "n1")


def test_heterogeneous_components_are_separate_jobs_named_by_leader_and_offset() -> None:
    text = TEXT.replace("JobState=PENDING", "JobState=RUNNING").replace(
        "JobName=het\n", "JobName=het\n     Nodes=gpunode1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:7)\n"
    )
    jobs = {job.job_id: job for job in parse_scontrol_text(text, NODE).jobs}
    assert (jobs["6"].het, jobs["7"].het) == ("6+0", "6+1")


def test_the_data_parser_json_of_newer_slurm_is_read_too() -> None:
    # Slurm 23.02+ (data_parser): numbers as {"set", "number"}, states as lists, nodes under
    # job_resources.nodes.allocation. Hand-written in that shape from the recorded job 2.
    job = {
        "job_id": 2,
        "job_state": ["RUNNING"],
        "account": "physics",
        "partition": "batch",
        "user_name": "root",
        "array_job_id": {"set": True, "infinite": False, "number": 0},
        "array_task_id": {"set": False, "infinite": False, "number": 0},
        "het_job_id": {"set": True, "infinite": False, "number": 0},
        "het_job_offset": {"set": False, "infinite": False, "number": 0},
        "gres_detail": ["gpu:2(IDX:2-3)"],
        "job_resources": {"nodes": {"allocation": [{"index": 0, "name": NODE}]}},
    }
    found = parse_jobs_json(json.dumps({"jobs": [job], "errors": []}), NODE)
    assert found.jobs == (SlurmJob("2", (2, 3), "root", "physics", "batch"),)


def test_json_whose_gres_does_not_line_up_with_its_nodes_is_counted() -> None:
    job = json.loads(JSON)["jobs"][0]
    job["gres_detail"] = [*job["gres_detail"], "gpu:1(IDX:4)"]
    found = parse_jobs_json(json.dumps({"jobs": [job]}), NODE)
    assert (found.jobs, found.skips()) == ((), {NODES_MISMATCH: 1})


@pytest.mark.parametrize("text", ["", "{", '{"errors": [{"error": "no controller"}]}', "[1]"])
def test_json_without_a_job_list_is_an_error_saying_so(text: str) -> None:
    with pytest.raises(SlurmError, match="JSON"):
        parse_jobs_json(text, NODE)


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:a100:3(IDX:0,2,5)", (0, 2, 5)),
        ("gpu:a100:1(IDX:0),gpu:h100:1(IDX:4)", (0, 4)),
        ("gpu:1(IDX:6),nic:1(IDX:0)", (6,)),
        ("nic:1(IDX:0)", ()),
        ("", ()),
        ("(null)", ()),
        ("gpu:2(IDX:0)", None),  # the count disagrees with the indices
        ("gpu:2(IDX:0-x)", None),
        ("gpu:2", None),
    ],
)
def test_gres_strings(gres: str, expected: tuple[int, ...] | None) -> None:
    assert parse_gpu_gres(gres) == expected


def test_index_lists_are_bounded_and_ascending() -> None:
    assert parse_index_list("0-2,7") == (0, 1, 2, 7)
    assert parse_index_list("3-1") is None
    assert parse_index_list("0-100000") is None


@pytest.mark.parametrize(
    ("expression", "name", "expected"),
    [
        ("gpunode1", "gpunode1", True),
        ("gpu[01-04,07]", "gpu03", True),
        ("gpu[01-04,07]", "gpu07", True),
        ("gpu[01-04,07]", "gpu05", False),
        ("gpu[01-04]", "gpu3", False),  # zero-padded ranges name padded hosts only
        ("gpu[1-10]", "gpu10", True),
        ("login1,gpu[1-2]", "gpu2", True),
        ("rack[1-2]-n[1-4]", "rack2-n3", True),
        ("gpu[1-2]", "gpu", False),
    ],
)
def test_hostlists(expression: str, name: str, expected: bool) -> None:
    assert hostlist_contains(expression, name) is expected


def test_gres_order_follows_device_minors_and_falls_back_to_nvml_indices() -> None:
    gpus = [_gpu(0, minor=2), _gpu(1, minor=0), _gpu(2, minor=1)]
    assert [g.index for g in gres_order(gpus)] == [1, 2, 0]
    assert [g.index for g in gres_order([_gpu(1), _gpu(0, minor=1)])] == [0, 1]


def test_gpu_numbers_matching_no_gpu_are_unresolved() -> None:
    found = job_gpus([SlurmJob("9", (0, 8))], GpuOrder.GRES)
    resolved = resolve(found, [_gpu(0, minor=0)])
    assert [h.device.uuid for h in resolved.holdings] == ["GPU-0"]
    assert resolved.unresolved == (("9", 8),)


def test_nvml_numbers_resolve_by_nvml_index() -> None:
    found = job_gpus([SlurmJob("9", (1,))], GpuOrder.NVML)
    resolved = resolve(found, [_gpu(0, minor=1), _gpu(1, minor=0)])
    assert [h.device.index for h in resolved.holdings] == [1]


def _gpu(index: int, minor: int | None = None) -> DeviceId:
    return DeviceId(index=index, uuid=f"GPU-{index}", minor=minor)


def _record(state: str, node_lines: str) -> str:
    return (
        "JobId=42 JobName=train\n"
        "   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A\n"
        "   Priority=1 Nice=0 Account=ml QOS=normal\n"
        f"   JobState={state} Reason=None Dependency=(null)\n"
        "   Partition=gpu AllocNode:Sid=login1:1\n"
        "   JOB_GRES=gpu:2\n" + node_lines + "   MinCPUsNode=1\n"
    )
