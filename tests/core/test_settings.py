"""Settings are declared once, on Config's fields or on a collector's options class; the parser,
the environment and the README flags table follow that one declaration."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from gpu_exporter.app import sampler_settings
from gpu_exporter.cli import UsageError, _env_args, all_flags, build_parser, parse_config
from gpu_exporter.collectors import ALL_COLLECTORS, option_classes
from gpu_exporter.config import Config
from gpu_exporter.sampler import SamplerSettings
from gpu_exporter.settings import Flag, declared_flags, format_duration, parse_duration

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
ROWS = dict(re.findall(r"^\| `(--[a-z][^`]*)`(?: / `--no-[^`]*`)? \| ([^|]*) \|", README, re.M))


def readme_row(option: str) -> tuple[str, str]:
    """The README row of ``option``: (first cell without backticks, default cell)."""
    for head, default in ROWS.items():
        if head == option or head.startswith(option + " "):
            return head, default.strip()
    raise AssertionError(f"{option} has no row in README's flags table")


DECLARED = [
    *declared_flags(Config),
    *(flag for kind in option_classes(ALL_COLLECTORS) for flag in declared_flags(kind)),
]


@pytest.mark.parametrize("flag", DECLARED, ids=lambda f: f.option)
def test_readme_flags_table_shows_each_declared_flag_with_its_default(flag: Flag) -> None:
    head, default = readme_row(flag.option)
    shown = flag.shown_default()
    expected = shown if shown in ("on", "off", "none") else f"`{shown}`"
    assert default == expected, f"README says {flag.option} defaults to {default}, code {expected}"
    metavar = flag.shown_metavar
    if metavar is not None and flag.const is None:
        assert head == f"{flag.option} {metavar.replace('|', chr(92) + '|')}", (
            f"README's row for {flag.option} should read `{flag.option} {metavar}`"
        )


def test_every_config_field_default_is_the_parsers_default() -> None:
    assert parse_config([], environ={}) == Config(
        collectors=parse_config([], environ={}).collectors
    ), "a flag's parser default differs from its Config field's default"


def test_every_switch_reads_its_environment_variable() -> None:
    parser = build_parser()
    for flag in all_flags():
        if not flag.switch:
            continue
        flipped = "false" if flag.default else "true"
        namespace = parser.parse_args(_env_args(all_flags(), {flag.env: flipped}))
        assert getattr(namespace, flag.name) is not flag.default, f"{flag.env} is not read"


@pytest.mark.parametrize("seconds", [0.25, 0.5, 1.0, 30.0, 90.0, 120.0, 3600.0, 604800.0])
def test_a_duration_default_is_written_as_the_parser_reads_it(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_a_repeatable_flag_collects_every_value_and_replaces_its_default() -> None:
    assert parse_config([], environ={}).cdi_spec_dirs == (Path("/var/run/cdi"), Path("/etc/cdi"))
    given = parse_config(["--cdi-spec-dir=/a", "--cdi-spec-dir", "/b"], environ={})
    assert given.cdi_spec_dirs == (Path("/a"), Path("/b"))


def test_a_repeatable_flags_variable_is_a_comma_separated_list_the_flags_replace() -> None:
    environ = {"GPU_EXPORTER_CDI_SPEC_DIR": "/x, /y,"}
    assert parse_config([], environ=environ).cdi_spec_dirs == (Path("/x"), Path("/y"))
    assert parse_config(["--cdi-spec-dir=/z"], environ=environ).cdi_spec_dirs == (Path("/z"),)


def test_the_self_pod_is_namespace_slash_name() -> None:
    assert parse_config(["--self-pod=monitoring/gpu-exporter-x"], environ={}).self_pod == (
        "monitoring",
        "gpu-exporter-x",
    )
    for bad in ("gpu-exporter-x", "/x", "a/", "a/b/c"):
        with pytest.raises(UsageError, match="NAMESPACE/NAME"):
            parse_config([f"--self-pod={bad}"], environ={})


def test_the_pod_resources_socket_is_unset_unless_given() -> None:
    """Unset, the default socket (or the simulator's kubelet); given, that one in any case."""
    assert parse_config([], environ={}).pod_resources_socket is None
    given = parse_config(["--simulate", "--pod-resources-socket=k.sock"], environ={})
    assert given.pod_resources_socket == Path("k.sock")


def test_the_sampler_settings_are_the_config_fields_of_their_names() -> None:
    """``app.sampler_settings`` is the one place they are built: none left out or crossed."""
    flags = ["--fast-interval=2s", "--slow-interval=45s", "--nvml-timeout=3s"]
    flags += ["--collector-durations", "--no-collector.power", "--collector.ecc.aggregate"]
    config = replace(parse_config(flags, environ={}), init_timeout=7.0)
    settings = sampler_settings(config)
    for field in fields(SamplerSettings):
        expected = getattr(config, field.name)
        assert expected != getattr(Config(), field.name), f"{field.name}: give it a non-default"
        assert getattr(settings, field.name) == expected, f"SamplerSettings.{field.name}"
