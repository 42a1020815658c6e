"""Shared fixtures: binaries the tests need, which may skip locally but must exist under CI; the
hypothesis settings profiles (docs/fuzzing.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Property tests take their budget from one profile, chosen by HYPOTHESIS_PROFILE:
# - "dev" (default locally): random inputs, a new draw every run, so local runs keep exploring;
# - "ci" (default under CI=true): fewer examples and derandomized, so a red build is reproducible
#   with the same command and is caused by the change under test, not by a lucky draw;
# - "fuzz": a long on-demand search (make fuzz runs the coverage-guided harness instead).
# No deadline anywhere: on a loaded 2-core runner timing noise, not slowness, trips it; the
# example counts bound the run time instead.
HYPOTHESIS_PROFILES = {
    "dev": settings(max_examples=100, deadline=None),
    "ci": settings(
        max_examples=50,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    ),
    "fuzz": settings(max_examples=20_000, deadline=None),
}


def pytest_configure(config: pytest.Config) -> None:
    for name, profile in HYPOTHESIS_PROFILES.items():
        settings.register_profile(name, profile)
    default = "ci" if os.environ.get("CI", "").lower() == "true" else "dev"
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", default))


def require_binary(name: str) -> str:
    """Path of ``name``; skip when missing locally, fail under CI (CI=true) where it must exist."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{name} is not installed, and CI must run this test (see .ci/run)")
        pytest.skip(f"{name} is not installed")
    return path


def promtool_check_metrics(body: str) -> None:
    """Fail with promtool's complaints unless it accepts ``body`` as an exposition."""
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"promtool check metrics: {result.stdout}{result.stderr}"


@pytest.fixture(autouse=True)
def collectors_never_raise(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    """A collector that raises something other than an NVML error is a bug: the exporter logs
    its traceback and carries on, and the test that met it fails (unless marked collector_bug)."""
    from gpu_exporter.sampler.outcomes import Outcomes

    if request.node.get_closest_marker("collector_bug"):
        yield
        return

    raised: list[str] = []
    original = Outcomes._collector_raised

    def record(self: Outcomes, job: Any, exc: BaseException) -> None:
        raised.append(f"{job.name} on {job.calls.uuid}: {exc!r}")
        original(self, job, exc)

    monkeypatch.setattr(Outcomes, "_collector_raised", record)
    yield
    assert not raised, "a collector raised (a programming error, not an NVML error): " + "; ".join(
        raised
    )
