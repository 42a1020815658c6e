"""Command line: flags (each also read from ``GPU_EXPORTER_<FLAG>``) into one frozen Config.

The only module that exits the process. Every user error is one line on stderr naming what and
where, with a non-zero status; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__
from .settings import GROUPS, CollectorOptions, Flag, declared_flags, env_name, parse_duration

if TYPE_CHECKING:
    from .config import Config
    from .host import Host

__all__ = [
    "UsageError",
    "build_parser",
    "env_name",
    "host_for",
    "parse_config",
    "parse_duration",
    "run",
]

EXIT_USAGE = 2
EXIT_FAILURE = 1
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class UsageError(Exception):
    """A bad flag, environment variable or file: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports its ValueError message instead of a generic one."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__
    return convert


def all_flags() -> list[Flag]:
    """Every flag: the settings declared on Config, the options the collectors declare (each
    named by its parser destination, unique across classes), then each collector's switch."""
    from .collectors import ALL_COLLECTORS, option_classes
    from .config import Config

    flags = list(declared_flags(Config))
    for kind in option_classes(ALL_COLLECTORS):
        flags += [replace(f, name=_option_dest(kind, f.name)) for f in declared_flags(kind)]
    for collector in ALL_COLLECTORS:
        state = "enabled" if collector.enabled_by_default else "disabled"
        flags.append(
            Flag(
                f"--collector.{collector.name}",
                f"{collector.help} ({state} by default)",
                "collectors",
                name=f"collector_{collector.name}",
                default=collector.enabled_by_default,
            )
        )
    return flags


def _option_dest(kind: type, field: str) -> str:
    return f"{kind.__module__}.{kind.__qualname__}.{field}"


def _parsed(flag: Flag, value: Any) -> Any:
    if flag.repeat:  # None until given: then the default tuple
        return flag.default if value is None else tuple(value)
    return value


def _collector_options(namespace: argparse.Namespace) -> CollectorOptions:
    """Each options class the collectors declare, built from its flags; only those that differ
    from their defaults are kept (``CollectorOptions.of`` gives the defaults of the rest)."""
    from .collectors import ALL_COLLECTORS, option_classes

    given = []
    for kind in option_classes(ALL_COLLECTORS):
        values = {
            f.name: _parsed(f, getattr(namespace, _option_dest(kind, f.name)))
            for f in declared_flags(kind)
        }
        if (options := kind(**values)) != kind():
            given.append(options)
    return CollectorOptions(tuple(given))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpu-exporter",
        description="Prometheus exporter for NVIDIA GPUs. Every flag also reads "
        "GPU_EXPORTER_<FLAG> (e.g. GPU_EXPORTER_LISTEN, GPU_EXPORTER_COLLECTOR_ECC=false).",
    )
    parser.add_argument("--version", action="version", version=f"gpu-exporter {__version__}")
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    for flag in all_flags():
        _add_flag(groups[flag.group], flag)
    return parser


def _add_flag(group: argparse._ArgumentGroup, flag: Flag) -> None:
    if flag.switch:
        help_text = flag.help if flag.group == "collectors" else _with_default(flag)
        group.add_argument(
            flag.option,
            dest=flag.name,
            action=argparse.BooleanOptionalAction,
            default=flag.default,
            help=help_text,
        )
        return
    assert flag.type is not None
    extra: dict[str, Any] = {}
    if flag.const is not None:
        extra = {"nargs": "?", "const": flag.const}
    if flag.repeat:  # None until given; parse_config puts the default tuple in then
        extra = {"action": "append"}
    group.add_argument(
        flag.option,
        dest=flag.name,
        type=_checked(flag.type.parse),
        default=None if flag.repeat else flag.default,
        choices=flag.type.choices,
        metavar=flag.metavar or flag.type.metavar,
        help=_with_default(flag),
        **extra,
    )


def _with_default(flag: Flag) -> str:
    shown = f"default {flag.shown_default()}".replace("%", "%%")
    return f"{flag.help} ({shown})" if flag.help else shown


def _env_args(flags: list[Flag], environ: Mapping[str, str], argv: Sequence[str] = ()) -> list[str]:
    """Turn GPU_EXPORTER_* variables into flags placed before the real ones (which win)."""
    args: list[str] = []
    for flag in flags:
        if flag.env not in environ:
            continue
        if flag.repeat and any(a == flag.option or a.startswith(f"{flag.option}=") for a in argv):
            continue  # a repeated flag would add to the variable's list instead of replacing it
        value, option = environ[flag.env], flag.option
        if flag.switch:
            args.append(option if _env_bool(flag.env, value) else option.replace("--", "--no-", 1))
        elif flag.repeat:
            args += [f"{option}={item.strip()}" for item in value.split(",") if item.strip()]
        elif flag.const is not None:
            if value.strip().lower() in _TRUE:
                args.append(option)
            elif value.strip().lower() not in _FALSE:
                args.append(f"{option}={value}")
        else:
            args.append(f"{option}={value}")
    return args


def _env_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise UsageError(f"environment variable {name}: invalid boolean {value!r} (use true or false)")


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    from .collectors import ALL_COLLECTORS
    from .config import Config

    parser = build_parser()
    environ = os.environ if environ is None else environ
    flags = all_flags()
    namespace = parser.parse_args([*_env_args(flags, environ, argv), *argv])
    values: dict[str, Any] = {}
    for flag in declared_flags(Config):
        values.update(flag.to_config(_parsed(flag, getattr(namespace, flag.name))))
    values["collectors"] = frozenset(
        c.name for c in ALL_COLLECTORS if getattr(namespace, f"collector_{c.name}")
    )
    values["collector_options"] = _collector_options(namespace)
    config = Config(**values)
    if config.dcgm_embedded and config.dcgm_address is not None:
        raise UsageError("--dcgm.address and --dcgm.embedded: use one DCGM host engine, not both")
    return config


def load_files(config: Config) -> Config:
    """Read the files the flags name, once, at start: a bad file is a usage error (exit 2)."""
    if config.xid_classes is not None:
        _check_xid_classes(config.xid_classes)
    if config.web_config_file is None:
        return config
    from .http.webconfig import WebConfigError, load_web_config

    try:
        return replace(config, web=load_web_config(config.web_config_file))
    except WebConfigError as exc:
        raise UsageError(str(exc)) from exc


def _check_xid_classes(path: Path) -> None:
    """Validate the override file up front, so a mistake is one line and exit status 2."""
    from .xid import XidClassesError, load_classifier

    try:
        load_classifier(path)
    except XidClassesError as exc:
        raise UsageError(str(exc)) from exc


def host_for(config: Config) -> Host:
    """This machine, or under --simulate the simulated node: the one place that reaches into
    the simulator for the exporter (``simulator/host.py`` builds its host). A bad scenario is a
    :class:`UsageError`."""
    if config.simulator is None:
        from .host import real_host

        return real_host(config)
    from .simulator import ScenarioError
    from .simulator.host import simulated_host

    try:
        return simulated_host(config).host
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None


def run(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    import asyncio

    from .app import build_exporter, run_until_signalled
    from .http.listener import ListenError
    from .logs import configure_logging
    from .nvml import NvmlUnavailable

    try:
        config = load_files(parse_config(sys.argv[1:] if argv is None else argv, environ))
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    configure_logging(config.log_format, config.log_level)
    try:
        exporter = build_exporter(config, host_for(config))
        asyncio.run(run_until_signalled(exporter))
    except NvmlUnavailable as exc:
        return _fail(
            f"NVML is not available ({exc}); on a machine without an NVIDIA GPU and driver, "
            "run with --simulate to use the built-in simulated node",
            EXIT_FAILURE,
        )
    except ListenError as exc:
        return _fail(
            f"cannot listen on {config.listen_host}:{config.listen_port}: {exc.reason}",
            EXIT_FAILURE,
        )
    except OSError as exc:  # a file or directory the flags name (e.g. --state-dir), not the port
        return _fail(str(exc), EXIT_FAILURE)
    except UsageError as exc:  # a bad --simulate scenario
        return _fail(str(exc), EXIT_USAGE)
    return 0


def _fail(message: str, status: int) -> int:
    print(f"gpu-exporter: error: {message}", file=sys.stderr)
    return status


def main() -> NoReturn:
    sys.exit(run())
