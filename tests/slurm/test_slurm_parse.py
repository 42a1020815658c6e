"""Slurm's answer about jobs and GPUs, parsed: recorded output of the test cluster (tests/slurm/
data/README.md says how it was made), and the cases a real cluster shows that one node cannot."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_exporter.allocation.jobgpus import (
    GpuOrder,
    JobGpus,
    SlurmError,
    SlurmJob,
    gres_order,
    job_gpus,
    mig_profile_of,
    resolve,
)
from gpu_exporter.allocation.slurm import (
    AMBIGUOUS,
    BAD_GRES,
    BAD_RECORD,
    NODES_MISMATCH,
    SlurmForm,
    SlurmReader,
    hostlist_contains,
    parse_gpu_gres,
    parse_index_list,
    parse_jobs_json,
    parse_node_layout,
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


# -- MIG GRES and shards (recorded on cluster.MIG_AND_SHARDS: tests/slurm/data/README.md) -----

MIG_TEXT = (DATA / "scontrol-show-job-d-mig-shard.txt").read_text()
MIG_JSON = (DATA / "squeue-json-mig-shard.json").read_text()
MIG_NODE = (DATA / "scontrol-show-node-d-mig-shard.txt").read_text()
MIG_RECORDED = job_gpus(
    [
        SlurmJob("1", (7,), "root", "physics", "batch", gpu_types=("3g.40gb",)),
        SlurmJob("2", (), "root", "chem", "batch", shards=(6,)),
        SlurmJob("3", (), "root", "bio", "batch", shards=(6,)),
        SlurmJob("4", (0,), "root", "", "batch", gpu_types=("h100",)),
    ],
    GpuOrder.GRES,
)


@pytest.mark.parametrize("parse", [parse_scontrol_text, parse_jobs_json], ids=["text", "json"])
def test_a_mig_gres_names_its_type_and_a_shard_the_gpu_it_is_on(parse: object) -> None:
    text = MIG_TEXT if parse is parse_scontrol_text else MIG_JSON
    assert parse(text, NODE) == MIG_RECORDED  # type: ignore[operator]


def test_the_nodes_layout_numbers_gpu_types_in_the_order_slurm_lists_them() -> None:
    assert parse_node_layout(MIG_NODE) == (("h100", 7), ("3g.40gb", 2))
    assert parse_node_layout("   Gres=gpu:a100:4(S:0-1),nic:1\n") == (("a100", 4),)
    with pytest.raises(SlurmError, match="Gres= lines"):
        parse_node_layout("   Gres=gpu:1\n   Gres=gpu:8\n")


def test_mig_positions_are_the_instances_of_their_profile_and_shards_share_their_gpu() -> None:
    """The recorded node: GPUs 0-5 and 7 whole (h100, IDX 0-6), GPU 6 as two 3g.40gb instances
    (IDX 7-8); job 1 holds IDX 7, jobs 2 and 3 shards of IDX 6 (GPU 7)."""
    whole = [_gpu(i, minor=i) for i in (0, 1, 2, 3, 4, 5, 7)]
    parent = DeviceId(index=6, uuid="GPU-6", minor=6, mig_mode="enabled")
    instances = [_mig(parent, gi) for gi in (2, 1)]  # in no particular order
    found = replace(MIG_RECORDED, layout=parse_node_layout(MIG_NODE))
    resolved = resolve(found, [*whole, parent, *instances])
    held = {(h.job.job_id, h.device.uuid) for h in resolved.holdings}
    assert held == {("1", "MIG-6-1"), ("2", "GPU-7"), ("3", "GPU-7"), ("4", "GPU-0")}
    assert resolved.shared == {"GPU-7"}, "shards are a shared GPU, as time-slicing"
    assert {d.uuid for d in resolved.schedulable} == {
        *(g.uuid for g in whole),
        "MIG-6-1",
        "MIG-6-2",
    }, "Slurm hands out the instances, not their GPU"
    assert resolved.unresolved == ()


def test_without_the_layout_a_mig_position_is_not_taken_for_a_whole_gpu_beyond_the_node() -> None:
    found = job_gpus([SlurmJob("1", (8,), gpu_types=("3g.40gb",))], GpuOrder.GRES)
    resolved = resolve(found, [_gpu(i, minor=i) for i in range(8)])
    assert resolved.unresolved == (("1", 8),)


def test_mig_types_are_read_as_profiles() -> None:
    assert mig_profile_of("3g.40gb") == "3g.40gb"
    assert mig_profile_of("a100_1g.10gb+me") == "1g.10gb+me"
    assert mig_profile_of("nvidia_a100_3G.20GB") == "3g.20gb"
    assert mig_profile_of("h100") is None


def test_the_reader_asks_for_the_nodes_layout_only_when_a_job_names_a_type(
    tmp_path: Path,
) -> None:
    asked = tmp_path / "asked"
    node = (
        "sh",
        "-c",
        f'echo "$1" >> {asked}; cat "$0"',
        str(DATA / "scontrol-show-node-d-mig-shard.txt"),
    )
    mig = SlurmReader(
        NODE,
        form=SlurmForm.TEXT,
        text_command=("cat", str(DATA / "scontrol-show-job-d-mig-shard.txt")),
        node_command=node,
    )
    assert mig.read().layout == (("h100", 7), ("3g.40gb", 2))
    assert asked.read_text() == f"{NODE}\n", "one node's record, by name"
    plain = SlurmReader(
        NODE,
        form=SlurmForm.TEXT,
        text_command=("cat", str(DATA / "scontrol-show-job-d.txt")),
        node_command=node,
    )
    assert plain.read().layout == ()
    assert asked.read_text() == f"{NODE}\n", "untyped GPUs need no layout"


def _mig(parent: DeviceId, gpu_instance: int) -> DeviceId:
    return DeviceId(
        index=parent.index,
        uuid=f"MIG-{parent.index}-{gpu_instance}",
        mig_mode="enabled",
        parent_uuid=parent.uuid,
        gpu_instance_id=gpu_instance,
        compute_instance_id=0,
        mig_profile="3g.40gb",
        minor=parent.minor,
    )
