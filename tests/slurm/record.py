"""Record what Slurm prints about jobs holding GPUs, for the parser's tests (tests/slurm/data).

    python -m tests.slurm.record [mig]

starts the test cluster (:mod:`.cluster`), submits the jobs below, and writes
``scontrol show job -d`` and ``squeue --json`` as they stand once every job is where it should
be. Review the diff: job ids, times and paths change from run to run, the shapes must not.
``mig`` records only the cluster of ``cluster.MIG_AND_SHARDS`` (MIG GRES and shards), with
``scontrol show node -d``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cluster import MIG_AND_SHARDS, NODE, SlurmCluster, slurm_cluster, wait_until

DATA = Path(__file__).resolve().parent / "data"
SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def submit_all(cluster: SlurmCluster) -> dict[str, str]:
    """The jobs of the recording, by role."""
    jobs = {
        "array": cluster.submit("-J", "arr", "--array=0-1", "--gres=gpu:1", "--account=bio"),
        "two_gpus": cluster.submit("-J", "two", "--gres=gpu:2", "--account=physics"),
        "finished": cluster.submit(
            "-J", "short", "--gres=gpu:1", "--account=chem", "-p", "debug", command="true"
        ),
        "cpu_only": cluster.submit("-J", "cpu", "--account=cpu"),
    }
    cluster.wait_for_state(jobs["two_gpus"], "RUNNING")
    cluster.wait_for_state(jobs["finished"], "COMPLETED")
    cluster.wait_for_state(jobs["cpu_only"], "RUNNING")
    # Components of one heterogeneous job may not share a node: on one node it stays pending.
    jobs["het"] = cluster.submit(
        "-J", "het", "--account=phys", "--gres=gpu:1", ":", "-p", "debug", "--gres=gpu:1"
    )
    wait_until(lambda: "HetJobOffset=1" in cluster.run("scontrol", "show", "job"), "het job")
    return jobs


# A job whose name and comment forge record lines: scontrol prints newlines in them as they are.
FORGED_NAME = (
    "evil Account=finance\n   Priority=1 Nice=0 Account=finance\n"
    "     Nodes=gpunode1 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)"
)
FORGED_COMMENT = "c\n     Nodes=gpunode1 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)"


def main() -> None:
    with slurm_cluster(SCRIPTS) as cluster:
        jobs = submit_all(cluster)
        (DATA / "scontrol-show-job-d.txt").write_text(cluster.run("scontrol", "show", "job", "-d"))
        (DATA / "squeue-json.json").write_text(cluster.run("squeue", "--json"))
        cluster.cancel_all()
        forged = cluster.submit(
            "-J", FORGED_NAME, "--comment", FORGED_COMMENT, "--gres=gpu:1", "--account=real"
        )
        cluster.wait_for_state(forged, "RUNNING")
        text = cluster.run("scontrol", "show", "job", "-d", forged)
        (DATA / "scontrol-show-job-d-forged.txt").write_text(text)
        (DATA / "squeue-json-forged.json").write_text(cluster.run("squeue", "--json"))
        print("recorded jobs:", {**jobs, "forged": forged})


def record_mig() -> None:
    with slurm_cluster(SCRIPTS, MIG_AND_SHARDS) as cluster:
        jobs = {
            "mig": cluster.submit("-J", "mig", "--gres=gpu:3g.40gb:1", "--account=physics"),
            "shard_2": cluster.submit("-J", "sh2", "--gres=shard:2", "--account=chem"),
            "shard_1": cluster.submit("-J", "sh1", "--gres=shard:1", "--account=bio"),
            "whole": cluster.submit("-J", "whole", "--gres=gpu:h100:1"),
        }
        for job in jobs.values():
            cluster.wait_for_state(job, "RUNNING")
        text = cluster.run("scontrol", "show", "job", "-d")
        (DATA / "scontrol-show-job-d-mig-shard.txt").write_text(text)
        (DATA / "squeue-json-mig-shard.json").write_text(cluster.run("squeue", "--json"))
        node = cluster.run("scontrol", "show", "node", "-d", NODE)
        (DATA / "scontrol-show-node-d-mig-shard.txt").write_text(node)
        print("recorded jobs:", jobs)


if __name__ == "__main__":
    record_mig() if sys.argv[1:] == ["mig"] else main()
