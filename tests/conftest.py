"""Shared fixtures: binaries the tests need, which may skip locally but must exist under CI."""

from __future__ import annotations

import os
import shutil

import pytest


def require_binary(name: str) -> str:
    """Path of ``name``; skip when missing locally, fail under CI (CI=true) where it must exist."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{name} is not installed, and CI must run this test (see .ci/run)")
        pytest.skip(f"{name} is not installed")
    return path
