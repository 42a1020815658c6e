"""The web config follows its files while the exporter runs, as node_exporter's does: a rotated
certificate reaches new connections and a changed password applies, without a restart; a broken
file, or a change only a restart can make, leaves the config in force alone and says so."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import ssl
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from structlog.testing import capture_logs

from gpu_exporter.app import Exporter
from gpu_exporter.config import SimulatorConfig
from gpu_exporter.http.webconfig import MAX_FILE_BYTES, load_web_config
from gpu_exporter.http.webreload import WebConfigReloader
from tests.helpers import make_config, one, parse_exposition, running_exporter
from tests.integration.test_process import start as start_process
from tests.web_helpers import PASSWORD, USER, Pki, bcrypt_hash

NEW_PASSWORD = "rotated-s3cret"


def write_atomically(path: Path, data: bytes) -> None:
    """As the kubelet updates a Secret volume: a new file swapped in, never a partial one."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(data)
    os.replace(staged, path)


def web_yml(password: str, tls: bool = True) -> bytes:
    section = "tls_server_config: {cert_file: server.crt, key_file: server.key}\n" if tls else ""
    return f"{section}basic_auth_users:\n  {USER}: {bcrypt_hash(password)}\n".encode()


def auth(password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(USER, password)}


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    pki = Pki.create(tmp_path)
    write_atomically(tmp_path / "web.yml", web_yml(PASSWORD))
    return pki


def exporter_config(pki: Pki) -> Any:
    path = pki.directory / "web.yml"
    return make_config(
        simulator=SimulatorConfig(),
        fast_interval=0.2,
        slow_interval=1.0,
        web_config_file=path,
        web=load_web_config(path),
    )


def reloader_of(exporter: Exporter) -> WebConfigReloader:
    assert exporter.web_config is not None, "a web config file must get a reloader"
    return exporter.web_config


async def served_certificate(exporter: Exporter, pki: Pki) -> bytes:
    """The certificate a new TLS connection is given (DER)."""
    _, writer = await asyncio.open_connection(
        "127.0.0.1", exporter.port, ssl=pki.client_context(), server_hostname="127.0.0.1"
    )
    try:
        certificate = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    assert isinstance(certificate, bytes)
    return certificate


async def status(exporter: Exporter, pki: Pki, headers: dict[str, str]) -> int:
    connector = aiohttp.TCPConnector(ssl=pki.client_context())
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(f"https://127.0.0.1:{exporter.port}/metrics", headers=headers) as response,
    ):
        await response.read()
        return response.status


async def reload_metrics(exporter: Exporter, pki: Pki) -> tuple[float, float, float]:
    """(successful reloads, failed reloads, last reload successful) as scraped."""
    # Twice: the first news may be a round rendered from what was read before the reload.
    await exporter.sampler.wait_for_news()
    await exporter.sampler.wait_for_news()
    connector = aiohttp.TCPConnector(ssl=pki.client_context())
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(
            f"https://127.0.0.1:{exporter.port}/metrics", headers=auth(NEW_PASSWORD)
        ) as response,
    ):
        series = parse_exposition(await response.text())
    return (
        one(series, "gpu_exporter_web_config_reloads_total", result="success"),
        one(series, "gpu_exporter_web_config_reloads_total", result="failure"),
        one(series, "gpu_exporter_web_config_last_reload_successful"),
    )


async def test_a_rotated_certificate_reaches_new_connections_without_a_restart(pki: Pki) -> None:
    async with running_exporter(exporter_config(pki)) as exporter:
        before = await served_certificate(exporter, pki)
        rotated = pki.ca.issue_cert("127.0.0.1", "localhost")
        write_atomically(pki.directory / "server.key", rotated.private_key_pem.bytes())
        write_atomically(pki.directory / "server.crt", rotated.cert_chain_pems[0].bytes())

        assert reloader_of(exporter).reload_now(), "a changed certificate must be reloaded"
        after = await served_certificate(exporter, pki)
        assert after != before, "new connections must get the rotated certificate"
        assert after == ssl.PEM_cert_to_DER_cert(rotated.cert_chain_pems[0].bytes().decode())
        assert not reloader_of(exporter).reload_now(), "nothing changed since: nothing to do"


async def test_a_changed_password_applies_and_a_broken_file_changes_nothing(pki: Pki) -> None:
    web = pki.directory / "web.yml"
    async with running_exporter(exporter_config(pki)) as exporter:
        reloader = reloader_of(exporter)
        write_atomically(web, web_yml(NEW_PASSWORD))
        assert reloader.reload_now()
        assert await status(exporter, pki, auth(PASSWORD)) == 401, "the old password is gone"
        assert await status(exporter, pki, auth(NEW_PASSWORD)) == 200

        write_atomically(web, b"basic_auth_users: [not, a, mapping\n")
        assert not reloader.reload_now(), "a broken file must not replace a working config"
        assert await status(exporter, pki, auth(NEW_PASSWORD)) == 200
        assert await reload_metrics(exporter, pki) == (1, 1, 0)

        write_atomically(web, web_yml(NEW_PASSWORD))
        assert reloader.reload_now(), "a fixed file is taken again"
        assert await reload_metrics(exporter, pki) == (2, 1, 1)


async def test_turning_tls_off_waits_for_a_restart(pki: Pki) -> None:
    async with running_exporter(exporter_config(pki)) as exporter:
        write_atomically(pki.directory / "web.yml", web_yml(PASSWORD, tls=False))
        assert not reloader_of(exporter).reload_now(), "the listener cannot drop TLS while open"
        assert await status(exporter, pki, auth(PASSWORD)) == 200, "still TLS, still the config"


async def test_removing_every_user_waits_for_a_restart(pki: Pki) -> None:
    """A reload that drops basic_auth_users (a truncated file, a bad edit) would open /metrics and
    the admin API to anyone: refused like the other restart-only changes."""
    tls = b"tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
    async with running_exporter(exporter_config(pki)) as exporter:
        write_atomically(pki.directory / "web.yml", tls)
        assert not reloader_of(exporter).reload_now(), "authentication turned off by a reload"
        assert await status(exporter, pki, {}) == 401, "open without credentials"
        assert await status(exporter, pki, auth(PASSWORD)) == 200


async def test_sighup_reads_the_web_config_at_once(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    write_atomically(path, web_yml(PASSWORD, tls=False))
    reloader = WebConfigReloader(load_web_config(path), lambda _config: None, interval=3600)
    write_atomically(path, web_yml(NEW_PASSWORD, tls=False))
    before = reloader.current.users
    reloader.reload_on_signal()
    for _ in range(200):
        if reloader.current.users != before:
            break
        await asyncio.sleep(0.01)  # the reload runs on a worker thread
    assert reloader.current.users != before, "SIGHUP did not reload the web config"


async def test_the_reloader_notices_a_change_by_itself(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    write_atomically(path, web_yml(PASSWORD, tls=False))
    initial = load_web_config(path)
    applied = asyncio.Event()
    reloader = WebConfigReloader(initial, lambda _config: applied.set(), interval=0.01)
    reloader.start()
    try:
        write_atomically(path, web_yml(NEW_PASSWORD, tls=False))
        await asyncio.wait_for(applied.wait(), timeout=10)
        assert reloader.current.users != initial.users, "the new password hash is in force"
    finally:
        await reloader.stop()


async def test_rotated_client_cas_decide_who_may_connect(tmp_path: Path) -> None:
    server_ca, old_clients, new_clients = trustme.CA(), trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1")
    write_atomically(tmp_path / "server.crt", server.cert_chain_pems[0].bytes())
    write_atomically(tmp_path / "server.key", server.private_key_pem.bytes())
    write_atomically(tmp_path / "clients.crt", old_clients.cert_pem.bytes())
    write_atomically(
        tmp_path / "web.yml",
        b"tls_server_config: {cert_file: server.crt, key_file: server.key,\n"
        b"  client_ca_file: clients.crt, client_auth_type: RequireAndVerifyClientCert}\n",
    )
    initial = load_web_config(tmp_path / "web.yml")
    reloader = WebConfigReloader(initial, lambda _config: None)
    assert initial.tls is not None

    async def greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server_socket = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=initial.tls.context)
    port = server_socket.sockets[0].getsockname()[1]

    async def admitted(clients: trustme.CA) -> bool:
        context = ssl.create_default_context()
        server_ca.configure_trust(context)
        clients.issue_cert("scraper").configure_cert(context)
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
            )
            greeting = await reader.read(5)
            writer.close()
        except (OSError, ssl.SSLError):
            return False
        return greeting == b"hello"  # TLS 1.3 reports a refused client certificate on read

    async with server_socket:
        assert (await admitted(old_clients), await admitted(new_clients)) == (True, False)
        write_atomically(tmp_path / "clients.crt", new_clients.cert_pem.bytes())
        assert reloader.reload_now()
        assert (await admitted(old_clients), await admitted(new_clients)) == (False, True), (
            "after a reload only certificates of the new client CA may connect"
        )


async def test_an_unexpected_error_while_reloading_is_counted_and_checking_goes_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "web.yml"
    write_atomically(path, web_yml(PASSWORD, tls=False))
    loop = asyncio.get_running_loop()
    attempts: list[int] = []
    failed = asyncio.Event()

    def broken_load(_path: Path) -> Any:
        attempts.append(1)
        loop.call_soon_threadsafe(failed.set)
        raise RuntimeError("a bug while reading")

    reloader = WebConfigReloader(
        load_web_config(path), lambda _config: None, interval=0.01, load=broken_load
    )
    reloader.start()
    try:
        write_atomically(path, web_yml(NEW_PASSWORD, tls=False))
        await asyncio.wait_for(failed.wait(), timeout=10)
        failed.clear()
        write_atomically(path, web_yml(PASSWORD, tls=False))
        await asyncio.wait_for(failed.wait(), timeout=10)
        assert len(attempts) == 2, "the checks go on after an error"
        samples = {(s.family.name, s.labels): s.value for s in reloader.samples()}
        assert samples[("gpu_exporter_web_config_last_reload_successful", "")] == 0
    finally:
        await reloader.stop()


def plain_config(path: Path) -> Any:
    """An exporter with basic auth and no TLS, from the web config at ``path``."""
    return make_config(
        simulator=SimulatorConfig(),
        fast_interval=0.2,
        slow_interval=1.0,
        web_config_file=path,
        web=load_web_config(path),
    )


async def plain_status(exporter: Exporter, path: str, headers: dict[str, str]) -> int:
    """The status of a GET without gzip (whose body is built on the default executor)."""
    headers = {"Accept-Encoding": "identity", **headers}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{exporter.port}{path}", headers=headers) as response,
    ):
        await response.read()
        return response.status


def reload_counts(reloader: WebConfigReloader) -> dict[str, float]:
    return {sample.labels or sample.family.name: sample.value for sample in reloader.samples()}


async def test_a_config_swapped_for_a_link_to_dev_zero_is_refused_and_the_old_one_serves(
    tmp_path: Path,
) -> None:
    web = tmp_path / "web.yml"
    write_atomically(web, web_yml(PASSWORD, tls=False))
    async with running_exporter(plain_config(web)) as exporter:
        web.unlink()
        web.symlink_to("/dev/zero")  # read whole, this took RSS to gigabytes in a second
        with capture_logs() as logs:
            await reloader_of(exporter).reload(force=True)  # what SIGHUP runs
        refusals = [log for log in logs if log["event"].startswith("web config not reloaded")]
        assert [log["reason"] for log in refusals] == [
            f"web config {web}: cannot read the file: not a regular file (a character device)"
        ]
        assert await plain_status(exporter, "/metrics", auth(PASSWORD)) == 200, "old config gone"
        assert await plain_status(exporter, "/metrics", {}) == 401, "authentication turned off"
        assert reload_counts(reloader_of(exporter))['result="failure"'] == 1


async def test_sighups_while_a_reload_runs_make_one_more_reload_not_eight(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    write_atomically(path, web_yml(PASSWORD, tls=False))
    started, release = threading.Event(), threading.Event()
    loads: list[Path] = []

    def slow_load(source: Path) -> Any:
        loads.append(source)
        started.set()
        release.wait(timeout=10)  # a read that takes its time (a slow disk)
        return load_web_config(source)

    with ThreadPoolExecutor(max_workers=1) as workers:
        reloader = WebConfigReloader(
            load_web_config(path), lambda _config: None, load=slow_load, executor=workers
        )
        first = reloader.reload(force=True)
        assert await asyncio.to_thread(started.wait, 10)
        for _ in range(8):
            reloader.reload_on_signal()
        release.set()
        await first
    assert len(loads) == 2, "reloads asked for while one ran must coalesce into one"


async def test_logins_and_reloads_do_not_wait_for_the_default_executor(tmp_path: Path) -> None:
    """The default executor serves the rest of the exporter (gzip bodies, start-up reads): a
    web config that hangs or a login flood must not take its threads, nor wait behind them."""
    web = tmp_path / "web.yml"
    write_atomically(web, web_yml(PASSWORD, tls=False))
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    release = threading.Event()
    async with running_exporter(plain_config(web)) as exporter:
        busy = [loop.run_in_executor(None, release.wait, 30) for _ in range(2)]
        try:
            write_atomically(web, web_yml(NEW_PASSWORD, tls=False))
            async with asyncio.timeout(10):
                await reloader_of(exporter).reload(force=True)
                assert await plain_status(exporter, "/metrics", auth(NEW_PASSWORD)) == 200
        finally:
            release.set()
            await asyncio.gather(*busy)


async def test_an_oversized_certificate_is_refused_and_the_old_one_serves(pki: Pki) -> None:
    async with running_exporter(exporter_config(pki)) as exporter:
        before = await served_certificate(exporter, pki)
        staged = pki.directory / ".server.crt.new"
        with staged.open("wb") as sparse:
            sparse.truncate(MAX_FILE_BYTES + 1)
        os.replace(staged, pki.directory / "server.crt")
        with capture_logs() as logs:
            assert not reloader_of(exporter).reload_now()
        reasons = [log["reason"] for log in logs if "reason" in log]
        assert reasons == [
            f"web config {pki.directory / 'web.yml'}: tls_server_config.cert_file: cannot read "
            f"{pki.directory / 'server.crt'}: larger than {MAX_FILE_BYTES} bytes"
        ]
        assert await served_certificate(exporter, pki) == before


def test_a_fifo_config_and_eight_sighups_leave_the_exporter_serving_and_stoppable(
    tmp_path: Path,
) -> None:
    """The attack as it was run: the web config replaced by a FIFO, then SIGHUP after SIGHUP.
    Each of them used to hold a default executor thread for good, until gzip scrapes, a new
    login and SIGTERM all hung."""
    web = tmp_path / "web.yml"
    write_atomically(web, web_yml(PASSWORD, tls=False))
    process, port = start_process("--simulate", "--fast-interval=200ms", f"--web.config.file={web}")
    watchdog = threading.Timer(60, process.kill)  # a hung exporter ends the log lines read below
    watchdog.start()
    try:
        web.unlink()
        os.mkfifo(web)
        for _ in range(8):
            process.send_signal(signal.SIGHUP)
        assert process.stderr is not None
        refused = next(
            event
            for event in map(json.loads, process.stderr)
            if event["event"].startswith("web config not reloaded")
        )
        assert refused["reason"].endswith("not a regular file (a FIFO)"), refused
        assert http_get(port, "/healthz") == (200, "identity")
        assert http_get(port, "/metrics", auth(PASSWORD)) == (200, "identity"), "a fresh login"
        gzipped = {**auth(PASSWORD), "Accept-Encoding": "gzip"}
        assert http_get(port, "/metrics", gzipped) == (200, "gzip")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()


def http_get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, content encoding) of a GET, whose body is read (and decompressed) whole."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        encoding = response.headers.get("Content-Encoding", "identity")
        if encoding == "gzip":
            assert b"gpu_info" in gzip.decompress(body)
        return response.status, encoding
