"""The exporter as a user runs it: a separate process, signals, exit codes and error lines."""

from __future__ import annotations

import ctypes.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import promtool_check_metrics

STARTUP_LIMIT = 30.0


def exporter_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_exporter", "--log-format=json", *args]


def start(*args: str) -> tuple[subprocess.Popen[str], int]:
    """Start the exporter on an ephemeral port and return it once it says where it listens."""
    process = subprocess.Popen(
        exporter_command("--listen=127.0.0.1:0", *args),
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    for line in process.stderr:  # each log line is an event; no polling needed
        event = json.loads(line)
        if event.get("event") == "listening":
            return process, int(event["address"].rsplit(":", 1)[1])
    raise AssertionError(f"exporter exited with {process.wait()} before listening")


@pytest.fixture
def running_exporter() -> Iterator[tuple[subprocess.Popen[str], int]]:
    process, port = start("--simulate", "--fast-interval=200ms")
    try:
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_simulated_exporter_serves_clean_metrics_and_exits_0_on_sigterm(
    running_exporter: tuple[subprocess.Popen[str], int],
) -> None:
    process, port = running_exporter
    status, body = get(port, "/metrics")
    assert status == 200
    assert 'gpu_info{gpu="0"' in body
    promtool_check_metrics(body)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0


def test_sigint_also_stops_it_cleanly(running_exporter: tuple[subprocess.Popen[str], int]) -> None:
    process, _ = running_exporter
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=10) == 0


def test_sighup_does_not_stop_it(running_exporter: tuple[subprocess.Popen[str], int]) -> None:
    """exporter-toolkit users send SIGHUP to reload; without a web config it is ignored (it was
    the default action: the process died)."""
    process, port = running_exporter
    process.send_signal(signal.SIGHUP)
    assert get(port, "/healthz")[0] == 200
    assert process.poll() is None, "SIGHUP stopped the exporter"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0


def test_a_bad_scenario_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text("gpus:\n  - model: H900\n")
    result = subprocess.run(
        exporter_command("--simulate", str(scenario)), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(scenario) in lines[0]
    assert "gpus[0].model" in lines[0]
    assert "H900" in lines[0]


def test_a_bad_xid_classes_file_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    overrides = tmp_path / "classes.yaml"
    overrides.write_text("13: {class: hardware}\n999999999999: {class: nonsense}\n")
    result = subprocess.run(
        exporter_command("--simulate", "--xid-classes", str(overrides)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{result.stderr}"
    assert str(overrides) in lines[0]


def test_a_missing_scenario_file_is_one_line() -> None:
    result = subprocess.run(
        exporter_command("--simulate", "/nonexistent/node.yaml"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "/nonexistent/node.yaml" in result.stderr


def test_bad_flags_are_one_line_without_traceback() -> None:
    result = subprocess.run(
        exporter_command("--fast-interval=often"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr == (
        "gpu-exporter: error: argument --fast-interval: invalid duration 'often' "
        "(use e.g. 500ms, 1s, 2m)\n"
    )


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_without_nvml_it_exits_non_zero_with_one_line_naming_simulate() -> None:
    result = subprocess.run(exporter_command(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--simulate" in lines[0]


def test_the_console_script_and_python_m_are_the_same_program() -> None:
    result = subprocess.run(exporter_command("--version"), capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.startswith("gpu-exporter ")


def xid_count(port: int) -> float:
    _, body = get(port, "/metrics")
    total = 0.0
    for line in body.splitlines():
        if line.startswith("gpu_xid_errors_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for_count(port: int, wanted: float, limit: float = 30.0) -> list[float]:
    """Poll /metrics (a process boundary: no event to await) until the count reaches ``wanted``;
    returns every value seen, so the caller can check it never overshot."""
    seen = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        seen.append(xid_count(port))
        if seen[-1] >= wanted:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"Xid count stuck at {seen[-1]}, wanted {wanted}")


def test_kill_9_mid_stream_loses_no_xid_and_counts_none_twice(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text("gpus: [{model: H100-SXM-80GB}]\n")
    kmsg, state = tmp_path / "kmsg", tmp_path / "state"
    kmsg.touch()
    args = ("--simulate", str(scenario), f"--kmsg-path={kmsg}", f"--state-dir={state}")
    line = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics Exception"
    seq = 0

    def write(count: int) -> None:
        nonlocal seq
        with kmsg.open("a") as log:
            for _ in range(count):
                seq += 1
                log.write(f"3,{seq},{seq * 1000},-;{line}\n")
                log.flush()

    first, port = start(*args)
    try:
        write(10)
        wait_for_count(port, 10)
        writer = threading.Thread(target=write, args=(40,))
        writer.start()
        first.send_signal(signal.SIGKILL)  # mid-stream: records keep arriving while it dies
        writer.join()
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    write(10)  # while nothing runs
    second, port = start(*args)
    try:
        seen = wait_for_count(port, 60)
        seen += [xid_count(port) for _ in range(5)]
        assert max(seen) == 60, f"counted twice after the restart: {max(seen)}"
    finally:
        second.kill()
        second.wait()
