"""MIG instances and shared GPUs as Slurm hands them out: on the cluster of
``cluster.MIG_AND_SHARDS`` (GPU 6 in two 3g.40gb instances, GPU 7 in 4 shards) and the
simulated node with the same GPUs, a job holding a MIG GRES is that instance's holder, and jobs
holding shards of one GPU are its holders together, as MIG and time-sliced devices are on a
Kubernetes node (docs/slurm.md, "MIG and shards")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Series, one, select

from .cluster import SlurmCluster
from .test_exporter import GATED, exporter_on, until

NODE_WITH_MIG = (
    "gpus:\n"
    "  - {model: H100-SXM-80GB, count: 6}\n"
    "  - {model: H100-SXM-80GB, mig: [3g.40gb, 3g.40gb]}\n"
    "  - {model: H100-SXM-80GB}\n"
)


def job_devices(series: Series) -> dict[str, set[tuple[str, str]]]:
    """job id -> (gpu, gpu_instance_id or "") of each gpu_slurm_job_info."""
    found: dict[str, set[tuple[str, str]]] = {}
    for labels in select(series, "gpu_slurm_job_info"):
        names = dict(labels)
        device = (names["gpu"], names.get("gpu_instance_id", ""))
        found.setdefault(names["job_id"], set()).add(device)
    return found


async def test_mig_gres_and_shards_map_to_instances_and_shared_gpus(
    slurm_mig: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    command = GATED.format(gate=gate)
    first = slurm_mig.submit("--gres=gpu:3g.40gb:1", "--account=physics", command=command)
    second = slurm_mig.submit("--gres=gpu:3g.40gb:1", "--account=chem", command=command)
    shared = [slurm_mig.submit("--gres=shard:1", "--account=bio", command=command) for _ in "ab"]
    whole = slurm_mig.submit("--gres=gpu:h100:1", command=command)
    for job in (first, second, *shared, whole):
        slurm_mig.wait_for_state(job, "RUNNING")
    try:
        async with exporter_on(tmp_path, slurm_mig, "slurm", monkeypatch, NODE_WITH_MIG) as exp:
            series = await until(exp, "every job's holdings", lambda s: len(job_devices(s)) == 5)
            instances = {device for job in (first, second) for device in job_devices(series)[job]}
            assert {gpu for gpu, _ in instances} == {"6"}, "MIG GRES are GPU 6's instances"
            assert len(instances) == 2, "each job holds its own instance"
            assert job_devices(series)[shared[0]] == {("7", "")}, "shards are on GPU 7"
            assert job_devices(series)[shared[1]] == {("7", "")}, "both shard jobs share it"
            assert job_devices(series)[whole] == {("0", "")}
            assert one(series, "gpu_slurm_job_info", job_id=first, account="physics") == 1
            assert one(series, "gpu_sharing_info", gpu="7", mode="time_slicing") == 1
            mig_allocated = select(series, "gpu_allocated", gpu="6")
            assert sorted(mig_allocated.values()) == [1.0, 1.0], "each instance is handed out"
            idle = await until(
                exp,
                "idle seconds on the instances and the shared GPU",
                lambda s: len(select(s, "gpu_allocated_idle_seconds_total")) == 5,
            )
            held = {dict(k)["gpu"] for k in select(idle, "gpu_allocated_seconds_total")}
            assert held == {"0", "6", "7"}
    finally:
        gate.unlink()
