"""Shared fixtures: binaries the tests need, which may skip locally but must exist under CI."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


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
