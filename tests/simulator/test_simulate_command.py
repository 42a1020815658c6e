"""``gpu-exporter-simulate -- COMMAND``: unmodified pynvml programs on the simulated node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SIMULATE = BIN / "gpu-exporter-simulate"
TIMEOUT = 120


def simulate(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SIMULATE), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_nvitop_one_shot_prints_the_eight_simulated_gpus() -> None:
    result = simulate("--", str(BIN / "nvitop"), "-1")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    assert "Driver Version: 580.95.05" in output
    gpu_rows = [line for line in output.splitlines() if "H100 80GB HBM3" in line]
    assert len(gpu_rows) == 8, output
    assert "3g.40gb" in output, "the MIG GPU's instances are listed"


def test_a_scenario_file_and_process_ids_no_host_process_has(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "gpus: [{model: A100-SXM-80GB, count: 2}]\n"
        "workloads: [{gpu: 1, pod: p, pid: 1, memory: 1GiB, sm: 0.5}]\n"
    )
    script = """
        import os, pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        pid = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)[0].pid
        pid_max = int(open("/proc/sys/kernel/pid_max").read())
        print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(handle))
        print(pid > pid_max, os.path.exists(f"/proc/{pid}"))
    """
    result = simulate(str(scenario), "--", *python(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["2 NVIDIA A100-SXM4-80GB", "True False"]


def test_the_exit_status_is_the_commands() -> None:
    assert simulate("--", *python("raise SystemExit(7)")).returncode == 7


def test_signals_reach_the_program() -> None:
    script = """
        import signal, sys
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
        print("ready", flush=True)
        signal.pause()
    """
    with subprocess.Popen(
        [str(SIMULATE), "--", *python(script)], stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT) == 42


def test_python_children_share_the_node_and_its_timeline() -> None:
    child = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    script = f"""
        import subprocess, sys
        print(subprocess.run([sys.executable, "-c", {child!r}], capture_output=True,
                             text=True, check=True).stdout.strip())
    """
    result = simulate("--", *python(script))
    assert result.stdout.strip() == "8", result.stderr


def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path) -> None:
    """A distribution's own sitecustomize further down PYTHONPATH runs after the hook."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_RAN = True\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import builtins, pynvml; pynvml.nvmlInit()\n"
    code += "print(getattr(builtins, 'SITE_RAN', False), pynvml.nvmlDeviceGetCount())"
    result = simulate("--", *python(code), env=env)
    assert result.stdout.split() == ["True", "8"], result.stdout + result.stderr


def test_a_program_without_pynvml_pays_nothing() -> None:
    result = simulate("--", *python("import sys; print('pynvml' in sys.modules)"))
    assert result.stdout.strip() == "False", "the hook imports pynvml only when the program does"


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["nvitop"], 2, "missing '--' before the command"),
        (["--"], 2, "no command after '--'"),
        (["a.yaml", "b.yaml", "--", "true"], 2, "one scenario file at most"),
        (["--", "no-such-command-here"], 127, "no-such-command-here: No such file or directory"),
        (["missing.yaml", "--", "true"], 2, "missing.yaml: (file): No such file or directory"),
    ],
)
def test_usage_errors_say_what_is_wrong(args: list[str], status: int, message: str) -> None:
    result = simulate(*args)
    assert result.returncode == status
    assert message in result.stderr


def test_a_bad_scenario_is_refused_with_its_location(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("gpus: [{model: H100-SXM-80GB, compute_mode: shared}]\n")
    result = simulate("bad.yaml", "--", "true", cwd=tmp_path)
    assert result.returncode == 2
    assert "bad.yaml: gpus[0].compute_mode: expected one of" in result.stderr
