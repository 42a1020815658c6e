"""The one-node Slurm cluster (:mod:`.cluster`), started once for the Slurm tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_binary

from .cluster import BINARIES, MIG_AND_SHARDS, SlurmCluster, slurm_cluster

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def _require_cluster() -> None:
    for binary in BINARIES:
        require_binary(binary)  # skip locally, fail under CI=true
    if os.geteuid() != 0:  # SlurmUser, SlurmdUser and the GRES device nodes need root
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("the Slurm test cluster runs as root, and CI must run it")
        pytest.skip("the Slurm test cluster runs as root")


@pytest.fixture(scope="session")
def slurm_session() -> Iterator[SlurmCluster]:
    _require_cluster()
    with slurm_cluster(SCRIPTS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def slurm_mig() -> Iterator[SlurmCluster]:
    """A cluster whose node has MIG instances and shards as GRES (cluster.MIG_AND_SHARDS), for
    the one module that needs it (started and stopped around it: about a second)."""
    _require_cluster()
    with slurm_cluster(SCRIPTS, MIG_AND_SHARDS) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_session: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with no job in it when the test starts and after it ends."""
    slurm_session.cancel_all()
    yield slurm_session
    slurm_session.cancel_all()
