"""Fixtures for the allocation tests (helpers live in :mod:`helpers`)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpu_exporter.nvml import WorkerPool

from .grpc_go import build_go_kubelet
from .helpers import FakeKubelet


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to about 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ga-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(short_dir / "kubelet.sock")
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    workers = WorkerPool(size=2, name="test-allocation")
    yield workers
    workers.shutdown()


@pytest.fixture(scope="session")
def go_kubelet_binary() -> Path:
    """The grpc-go pod-resources server (grpcgo/kubelet.go), built once."""
    return build_go_kubelet()
