"""OpenSSL is loaded only by an exporter that can serve TLS: one started with a web config file.

Without one, nothing in the process can use TLS (a reload re-reads the file given at start and
cannot add one), so the CLI marks ``ssl`` and ``_hashlib`` (OpenSSL's hashes; Python's built-in
ones serve hashlib then) unavailable before anything imports them (docs/performance.md, Peak
RSS). These run the exporter as a user does, ``python -m gpu_exporter``, and look at what the
process has mapped.
"""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpu_exporter.cli import may_use_tls, parse_config
from tests.integration.test_process import start
from tests.web_helpers import Pki, write_web_config

OPENSSL = ("libssl", "libcrypto", "/_ssl.", "/_hashlib.")


def openssl_mapped(pid: int) -> list[str]:
    """OpenSSL's libraries and Python's bindings to them, as mapped into process ``pid``."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if any(name in line for name in OPENSSL)})


@contextmanager
def exporter(*args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    process, port = start("--simulate", *args)
    try:
        yield process, port
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0, "the exporter did not stop cleanly on SIGTERM"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_without_a_web_config_openssl_is_never_loaded_and_metrics_are_served() -> None:
    with exporter() as (process, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read().decode()
        assert 'gpu_info{gpu="0"' in body
        process.send_signal(signal.SIGHUP)  # a reload request without a file: ignored, still no TLS
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert response.status == 200
        assert openssl_mapped(process.pid) == [], "OpenSSL was loaded without a web config"


def test_with_a_tls_web_config_the_cli_serves_https(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path)
    web_config = write_web_config(
        tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    )
    with exporter(f"--web.config.file={web_config}") as (process, port):
        url = f"https://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10, context=pki.client_context()) as response:
            assert 'gpu_info{gpu="0"' in response.read().decode()
        assert openssl_mapped(process.pid), "serving TLS without OpenSSL mapped?"
        with urllib.request.urlopen(url, timeout=10, context=pki.client_context()) as response:
            assert response.status == 200, "a second HTTPS scrape"


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--web.config.file=/etc/web.yml"], {}),
        (["--web.config.file", "/etc/web.yml"], {}),
        (["--web.config=/etc/web.yml"], {}),  # argparse takes an unambiguous prefix
        (["--simulate", "--web.config.f", "/etc/web.yml", "--log-level=debug"], {}),
        ([], {"GPU_EXPORTER_WEB_CONFIG_FILE": "/etc/web.yml"}),
    ],
)
def test_every_way_of_naming_a_web_config_keeps_tls_possible(
    argv: list[str], environ: dict[str, str]
) -> None:
    assert parse_config(argv, environ).web_config_file is not None, "the parser's reading"
    assert may_use_tls(argv, environ), f"{argv} {environ} names a web config: TLS must stay"


@pytest.mark.parametrize(
    "argv",
    [[], ["--simulate", "--web.enable-admin-api", "--web.max-requests=8"], ["--", "--web.c"]],
)
def test_flags_without_a_web_config_rule_tls_out(argv: list[str]) -> None:
    assert may_use_tls(argv, {}) is False, f"{argv} names no web config"
