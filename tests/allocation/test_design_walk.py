"""docs/design.md's walk "A kubelet answer to a pod's idle seconds" is the code's: each step
names a module that exists and, in its parentheses, a function or method that module has."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "gpu_exporter"
DESIGN = (ROOT / "docs" / "design.md").read_text()
WALK = DESIGN.split("### A kubelet answer to a pod's idle seconds", 1)[-1].split("\n#", 1)[0]
STEPS = re.findall(r"^\d+\. (.*?)(?=^\d+\. |\Z)", WALK, re.M | re.S)


def test_the_walk_has_its_steps() -> None:
    assert len(STEPS) >= 6, "docs/design.md lost the walk from a kubelet answer to idle seconds"


def test_every_step_names_a_module_and_what_runs_there() -> None:
    problems = []
    for step in STEPS:
        found = re.match(r"`([a-z_/]+)\.py` \(`([A-Za-z_.]+)`", step)
        if found is None:
            problems.append(f"a step that does not start with `module.py` (`name`: {step[:60]!r}")
            continue
        path, name = found.groups()
        module = importlib.import_module("gpu_exporter." + path.replace("/", "."))
        target: object = module
        for part in name.split("."):
            target = getattr(target, part, None)
        if target is None:
            problems.append(f"{path}.py has no {name}")
    assert not problems, "; ".join(problems)


def test_every_module_the_walk_names_exists() -> None:
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*(?:\.py|/))`", WALK))
    assert named, "the walk names no module"
    missing = sorted(p for p in named if not (PACKAGE / p).exists())
    assert not missing, f"modules the walk names that do not exist: {missing}"
