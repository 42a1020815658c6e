"""The whole exporter on a Slurm node: the simulated node's 8 GPUs, the one-node Slurm cluster,
``--allocation.source=slurm`` (scontrol) or ``slurm-job-map`` (the directory the shipped prolog
writes). Who holds each GPU, the idle time a job wastes, Xids against the job, and series that
leave with the job."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gpu_exporter.app import Exporter
from gpu_exporter.config import SimulatorConfig
from tests.helpers import Series, make_config, one, parse_exposition, running_exporter, select

from .cluster import NODE, SlurmCluster

SCENARIO = "gpus: [{model: H100-SXM-80GB, count: 8}]\n"
GATED = "while [ -e {gate} ]; do sleep 0.1; done"


@asynccontextmanager
async def exporter_on(
    tmp_path: Path,
    slurm: SlurmCluster,
    source: str,
    monkeypatch: pytest.MonkeyPatch,
    node: str = SCENARIO,
) -> AsyncIterator[Exporter]:
    for name, value in slurm.env.items():  # scontrol finds the cluster's slurm.conf and munge
        monkeypatch.setenv(name, value)
    scenario = tmp_path / "node.yaml"
    scenario.write_text(node)
    config = make_config(
        simulator=SimulatorConfig(scenario),
        fast_interval=0.2,
        slow_interval=0.5,
        kmsg_path=tmp_path / "kmsg",
        state_dir=tmp_path / "state",
        allocation_source=source,
        slurm_node=NODE,
        slurm_form="text",
        slurm_interval=0.2,
        slurm_job_map_dir=slurm.job_map,
    )
    async with running_exporter(config) as exporter:
        yield exporter


async def scrape(exporter: Exporter) -> Series:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{exporter.port}/metrics") as response,
    ):
        return parse_exposition(await response.text())


async def until(exporter: Exporter, condition: str, check: Callable[[Series], bool]) -> Series:
    """Scrape after each render until ``check(series)`` holds (bounded: 100 renders)."""
    for _ in range(100):
        series = await scrape(exporter)
        if check(series):
            return series
        await exporter.sampler.wait_for_news()
    raise AssertionError(f"never saw: {condition}")


def holders(series: Series) -> dict[str, set[str]]:
    """gpu -> job ids of gpu_slurm_job_info."""
    found: dict[str, set[str]] = {}
    for labels in select(series, "gpu_slurm_job_info"):
        names = dict(labels)
        found.setdefault(names["gpu"], set()).add(names["job_id"])
    return found


@pytest.mark.parametrize("source", ["slurm", "slurm-job-map"])
async def test_a_job_holding_two_gpus_is_their_holder_accrues_idle_time_and_leaves(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    job = slurm.submit("--gres=gpu:2", "--account=physics", command=GATED.format(gate=gate))
    slurm.wait_for_state(job, "RUNNING")
    async with exporter_on(tmp_path, slurm, source, monkeypatch) as exporter:
        series = await until(
            exporter,
            "the job's idle seconds",
            lambda s: idle(s, job, "0") > 0 and idle(s, job, "1") > 0,
        )
        assert holders(series) == {"0": {job}, "1": {job}}
        account = "physics" if source == "slurm" else ""  # the directory names no account
        info = one(series, "gpu_slurm_job_info", gpu="0", job_id=job, account=account)
        assert info == 1
        assert one(series, "gpu_exporter_source_up", source="slurm") == 1
        assert one(series, "gpu_allocated", gpu="0") == 1
        assert one(series, "gpu_allocated", gpu="2") == 0
        assert not select(series, "gpu_allocation_info"), "a job is no pod"
        seconds = select(series, "gpu_allocated_seconds_total", job_id=job)
        assert all("namespace" not in dict(k) and "pod" not in dict(k) for k in seconds)

        gate.unlink()
        slurm.wait_for_state(job, "COMPLETED")
        gone = await until(exporter, "the job's series gone", lambda s: not job_series(s, job))
        assert one(gone, "gpu_allocated", gpu="0") == 0


def idle(series: Series, job: str, gpu: str) -> float:
    found = select(series, "gpu_allocated_idle_seconds_total", job_id=job, gpu=gpu)
    return sum(found.values())


def job_series(series: Series, job: str) -> list[str]:
    return [name for name, labels in series if ("job_id", job) in labels]


@pytest.mark.parametrize("source", ["slurm", "slurm-job-map"])
async def test_an_application_xid_counts_against_the_job(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    job = slurm.submit("--gres=gpu:2", "--account=physics")
    slurm.wait_for_state(job, "RUNNING")
    async with exporter_on(tmp_path, slurm, source, monkeypatch) as exporter:
        series = await until(exporter, "the job holds GPU 1", lambda s: "1" in holders(s))
        bus = dict(next(iter(select(series, "gpu_info", gpu="1"))))["pci_bus_id"]
        line = f"NVRM: Xid (PCI:{bus.lower()[4:]}): 13, pid=4242, name=python, Graphics Exception"
        with (tmp_path / "kmsg").open("a") as kmsg:
            kmsg.write(f"3,1,1000,-;{line}\n")
        counted = await until(
            exporter,
            "Xid 13 on GPU 1",
            lambda s: bool(select(s, "gpu_xid_errors_total", gpu="1", xid="13")),
        )
        assert one(counted, "gpu_xid_errors_total", gpu="1", xid="13", job_id=job) == 1
        (labels,) = select(counted, "gpu_xid_errors_total", gpu="1", xid="13")
        assert ("pod", "") in labels, "a job is named in job_id, the pod labels left empty"
        assert ("namespace", "") in labels


async def test_series_per_gpu_stay_bounded_while_100_short_jobs_come_and_go(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cardinality check on the live cluster: 100 array tasks of one GPU each, a fraction
    of a second long, run through the node while the exporter polls Slurm every 0.2 s; no
    scrape shows more series on a GPU than the jobs then holding it explain, and none is left
    on any GPU once they are done."""
    async with exporter_on(tmp_path, slurm, "slurm", monkeypatch) as exporter:
        at_rest = per_gpu(await until(exporter, "the source up", slurm_up))
        array = slurm.submit("--array=0-99", "--gres=gpu:1", command="sleep 0.2")
        most: dict[str, int] = {}
        for _ in range(2000):  # bounded: a scrape after each render until the array is done
            series = await scrape(exporter)
            for gpu, count in per_gpu(series).items():
                most[gpu] = max(most.get(gpu, 0), count - at_rest[gpu])
            if not slurm.run("squeue", "-h", "-j", array, check=False).strip():
                break
            await exporter.sampler.wait_for_news()
        done = await until(exporter, "every task's series gone", lambda s: not job_ids(s))
        assert per_gpu(done) == at_rest, "a finished job left a series behind"
        # A job's info and three accounting series; a finished job's stay for one poll, and a
        # GPU may see a task end and the next start between two reads: a few jobs at once
        # (3 measured), never the dozen each GPU runs (about 48 series if they stayed).
        assert max(most.values()) <= 20, f"series per GPU above rest: {most}"


def slurm_up(series: Series) -> bool:
    return one(series, "gpu_exporter_source_up", source="slurm") == 1


def per_gpu(series: Series) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _name, labels in series:
        gpu = dict(labels).get("gpu")
        if gpu is not None:
            counts[gpu] = counts.get(gpu, 0) + 1
    return counts


def job_ids(series: Series) -> set[str]:
    return {dict(labels)["job_id"] for _name, labels in series if "job_id" in dict(labels)}
