"""Flags and GPU_EXPORTER_* variables become one frozen Config; bad input is one clear line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpu_exporter.cli import UsageError, env_name, parse_config, parse_duration, run
from gpu_exporter.collectors import collector_names
from gpu_exporter.config import DEFAULT_PORT


def test_defaults_listen_on_the_exporter_port_with_every_default_collector() -> None:
    config = parse_config([], environ={})
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", DEFAULT_PORT)
    assert DEFAULT_PORT not in (9400, 9835), (
        "must not clash with dcgm-exporter or nvidia_gpu_exporter"
    )
    assert config.collectors == frozenset(collector_names()) - {"thresholds"}, (
        "every collector but the board's temperature thresholds (constants no rule reads)"
    )
    assert config.simulator is None
    assert (config.fast_interval, config.slow_interval) == (1.0, 30.0)


def test_config_is_frozen() -> None:
    config = parse_config([], environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.listen_port = 1  # type: ignore[misc]


def test_flags_set_every_field() -> None:
    config = parse_config(
        [
            "--listen=127.0.0.1:9999",
            "--simulate",
            "--fast-interval=500ms",
            "--slow-interval=2m",
            "--nvml-timeout=250ms",
            "--no-collector.ecc",
            "--idle-threshold=0.1",
            "--state-dir=/tmp/state",
            "--xid-pod-retention=36h",
            "--log-format=json",
            "--log-level=debug",
        ],
        environ={},
    )
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9999)
    assert config.simulator is not None
    assert config.simulator.scenario is None
    assert (config.fast_interval, config.slow_interval, config.nvml_timeout) == (0.5, 120.0, 0.25)
    assert "ecc" not in config.collectors
    assert "memory" in config.collectors
    assert config.idle_threshold == 0.1
    assert config.state_dir == Path("/tmp/state")
    assert config.xid_pod_retention == 36 * 3600.0
    assert (config.log_format, config.log_level) == ("json", "debug")


def test_simulate_takes_an_optional_scenario_file() -> None:
    config = parse_config(["--simulate", "node.yaml"], environ={})
    assert config.simulator is not None
    assert config.simulator.scenario == Path("node.yaml")


def test_environment_variables_are_read_and_flags_win() -> None:
    environ = {
        "GPU_EXPORTER_LISTEN": "127.0.0.1:1234",
        "GPU_EXPORTER_FAST_INTERVAL": "2s",
        "GPU_EXPORTER_COLLECTOR_ECC": "false",
        "GPU_EXPORTER_SIMULATE": "true",
    }
    config = parse_config(["--fast-interval=3s"], environ=environ)
    assert config.listen_port == 1234
    assert config.fast_interval == 3.0
    assert "ecc" not in config.collectors
    assert config.simulate


def test_env_names_follow_the_flag_names() -> None:
    assert env_name("--pod-resources-socket") == "GPU_EXPORTER_POD_RESOURCES_SOCKET"
    assert env_name("--collector.clock_events") == "GPU_EXPORTER_COLLECTOR_CLOCK_EVENTS"


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--listen=nowhere"], {}, "invalid listen address 'nowhere'"),
        (["--fast-interval=soon"], {}, "invalid duration 'soon'"),
        (["--idle-threshold=2"], {}, "invalid ratio '2'"),
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        (
            [],
            {"GPU_EXPORTER_COLLECTOR_ECC": "maybe"},
            "GPU_EXPORTER_COLLECTOR_ECC: invalid boolean",
        ),
        # Empty was read as the working directory: the journal landed wherever the process ran.
        ([], {"GPU_EXPORTER_STATE_DIR": ""}, "--state-dir: empty path"),
        (["--kmsg-path="], {}, "--kmsg-path: empty path"),
    ],
)
def test_bad_input_names_what_and_where(
    argv: list[str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_config(argv, environ=environ)


def test_run_reports_a_usage_error_as_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["--listen=nowhere"], environ={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("gpu-exporter: error: argument --listen: invalid listen address")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1", 1.0), ("1.5s", 1.5), ("250ms", 0.25), ("1h", 3600.0), ("7d", 604800.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "-1s", "1w", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)
