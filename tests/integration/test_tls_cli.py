"""TLS as the command line configures it: HTTPS with a web config file that names a certificate,
plain HTTP without one. These run the exporter as a user does, ``python -m gpu_exporter``."""

from __future__ import annotations

import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpu_exporter.cli import parse_config
from tests.integration.test_process import start
from tests.web_helpers import Pki, write_web_config


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


def test_without_a_web_config_metrics_are_served_over_plain_http(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path)
    with exporter() as (process, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read().decode()
        assert 'gpu_info{gpu="0"' in body
        process.send_signal(signal.SIGHUP)  # a reload request without a file: ignored
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert response.status == 200, "still serving after SIGHUP"
        https = f"https://127.0.0.1:{port}/metrics"
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(https, timeout=10, context=pki.client_context())


def test_with_a_tls_web_config_the_cli_serves_https(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path)
    web_config = write_web_config(
        tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    )
    with exporter(f"--web.config.file={web_config}") as (_process, port):
        url = f"https://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10, context=pki.client_context()) as response:
            assert 'gpu_info{gpu="0"' in response.read().decode()
        with urllib.request.urlopen(url, timeout=10, context=pki.client_context()) as response:
            assert response.status == 200, "a second HTTPS scrape"
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)


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
def test_every_way_of_naming_a_web_config_is_read(argv: list[str], environ: dict[str, str]) -> None:
    assert parse_config(argv, environ).web_config_file == Path("/etc/web.yml"), f"{argv} {environ}"


@pytest.mark.parametrize(
    "argv", [[], ["--simulate", "--web.enable-admin-api", "--web.max-requests=8"]]
)
def test_flags_without_a_web_config_serve_plain_http(argv: list[str]) -> None:
    config = parse_config(argv, {})
    assert config.web_config_file is None, f"{argv} names no web config"
    assert config.web is None, f"{argv}: no TLS, no basic auth"
