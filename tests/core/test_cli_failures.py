"""How the process fails at start: one line naming what went wrong, the right exit status.
(Run as a real process: the CLI configures logging for the whole process.)"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path


def exporter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "--log-format=json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    # Searched, not matched per line: a worker thread's log line may still be half written when
    # the CLI prints its error, so the error need not start a line.
    lines = re.findall(r"gpu-exporter: error: [^\n]*", result.stderr)
    assert len(lines) == 1, f"one error line expected, stderr was:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_port_in_use_says_it_cannot_listen() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = exporter("--simulate", f"--listen=127.0.0.1:{port}", "--no-allocation")
    assert result.returncode == 1
    assert error_line(result).startswith(f"gpu-exporter: error: cannot listen on 127.0.0.1:{port}")


def test_a_file_that_cannot_be_made_is_not_reported_as_a_listen_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "kmsg"
    result = exporter(
        "--simulate", "--listen=127.0.0.1:0", "--no-allocation", f"--kmsg-path={missing}"
    )
    assert result.returncode == 1
    line = error_line(result)
    assert "cannot listen" not in line, line
    assert str(missing) in line, f"the error names the path: {line}"


def test_a_bad_scenario_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text("gpus: [{model: NoSuchGPU}]\n")
    result = exporter(f"--simulate={scenario}", "--listen=127.0.0.1:0")
    assert result.returncode == 2
    assert error_line(result).startswith(f"gpu-exporter: error: {scenario}"), result.stderr
