"""--dcgm.address and --dcgm.embedded: parsed once, bad values a one-line usage error."""

from __future__ import annotations

import pytest

from gpu_exporter.cli import UsageError, parse_config
from gpu_exporter.dcgm.target import Target


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("nvidia-dcgm.gpu-operator.svc:5555", Target("nvidia-dcgm.gpu-operator.svc:5555")),
        ("10.0.0.7", Target("10.0.0.7")),
        ("unix:///run/nvidia-dcgm/socket", Target("/run/nvidia-dcgm/socket", unix_socket=True)),
    ],
)
def test_an_address_is_host_port_or_a_unix_socket(text: str, target: Target) -> None:
    config = parse_config([f"--dcgm.address={text}"], environ={})
    assert config.dcgm_target == target


def test_off_by_default_and_embedded_on_request() -> None:
    assert parse_config([], environ={}).dcgm_target is None
    embedded = parse_config(["--dcgm.embedded"], environ={}).dcgm_target
    assert embedded is not None
    assert embedded.embedded
    from_env = parse_config([], environ={"GPU_EXPORTER_DCGM_ADDRESS": "h:5555"}).dcgm_target
    assert from_env == Target("h:5555")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tcp://h:5555", "use host:port or unix:///path"),
        ("unix://relative", "unix:///absolute/path"),
        ("h:99999", "port 1-65535"),
        (":5555", "expected host:port"),
    ],
)
def test_a_bad_address_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_config([f"--dcgm.address={text}"], environ={})


def test_an_address_and_an_embedded_engine_together_are_refused() -> None:
    with pytest.raises(UsageError, match="not both"):
        parse_config(["--dcgm.address=h:5555", "--dcgm.embedded"], environ={})
