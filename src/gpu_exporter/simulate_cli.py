"""``gpu-exporter-simulate [SCENARIO.yaml] -- COMMAND [ARGS...]``: any Python program on the
simulated node.

The command checks the scenario, puts the start-up hook (``simulate_startup/sitecustomize.py``)
first on ``PYTHONPATH`` and *execs* COMMAND: the program replaces this process, so signals reach it
directly and its exit status is the command's. Every Python interpreter started under it (the
program and its Python children) sees the simulated GPUs under its own ``pynvml``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import gpu_exporter
from gpu_exporter.simulate_hook import EPOCH_ENV, PID_OFFSET_ENV, SCENARIO_ENV
from gpu_exporter.simulator import ScenarioError, load_scenario

USAGE = "usage: gpu-exporter-simulate [SCENARIO.yaml] -- COMMAND [ARGS...]"
HELP = f"""{USAGE}

Run COMMAND with the simulated node (the built-in 8x H100 scenario, or SCENARIO.yaml) under
every Python pynvml it imports. Simulated process ids are moved above the host's pid_max, so no
host process has them. See docs/simulator.md.
"""
PACKAGES_ENV = "GPU_EXPORTER_SIMULATE_PACKAGES"
PID_MAX = Path("/proc/sys/kernel/pid_max")
# Linux's largest pid_max (PID_MAX_LIMIT on 64-bit), for hosts where /proc does not say.
PID_MAX_LIMIT = 4_194_304


class UsageError(Exception):
    pass


def parse(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(scenario path or None, command) from the arguments."""
    if "--" not in argv:
        raise UsageError("missing '--' before the command")
    split = list(argv).index("--")
    before, command = list(argv[:split]), list(argv[split + 1 :])
    if not command:
        raise UsageError("no command after '--'")
    if len(before) > 1:
        raise UsageError(f"one scenario file at most, got {len(before)}: {' '.join(before)}")
    if before and before[0].startswith("-"):
        raise UsageError(f"unknown option {before[0]}")
    return (before[0] if before else None), command


def environment(scenario: str | None, base: dict[str, str]) -> dict[str, str]:
    """The command's environment: the start-up hook first on PYTHONPATH, and the node's keys."""
    startup = str(resources.files("gpu_exporter").joinpath("simulate_startup"))
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (startup, base.get("PYTHONPATH")) if p)
    env[SCENARIO_ENV] = str(Path(scenario).resolve()) if scenario else ""
    env.setdefault(EPOCH_ENV, repr(time.time()))  # nested commands keep the outer timeline
    env.setdefault(PID_OFFSET_ENV, str(pid_max()))
    env[PACKAGES_ENV] = str(Path(gpu_exporter.__file__).resolve().parent.parent)
    return env


def pid_max() -> int:
    """The host's pid_max: no process id reaches it, so simulated pids above it are never real."""
    try:
        return int(PID_MAX.read_text())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(HELP, end="")
        return 0
    try:
        scenario, command = parse(args)
        if scenario is not None:
            load_scenario(
                Path(scenario)
            )  # refuse a bad file here, with its line, not in every child
    except UsageError as error:
        print(f"gpu-exporter-simulate: {error}\n{USAGE}", file=sys.stderr)
        return 2
    except ScenarioError as error:
        print(f"gpu-exporter-simulate: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"gpu-exporter-simulate: {scenario}: {error.strerror}", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, environment(scenario, dict(os.environ)))
    except OSError as error:
        print(f"gpu-exporter-simulate: {command[0]}: {error.strerror}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126
    return 0  # not reached: exec replaced this process
