"""The web config loader: exporter-toolkit's format, strict, with one-line errors."""

from __future__ import annotations

import os
import ssl
import textwrap
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.http.webconfig import (
    MAX_FILE_BYTES,
    WebConfigError,
    load_web_config,
    parse_web_config,
)
from tests.web_helpers import Pki, bcrypt_hash, write_web_config


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path)


def load(directory: Path, text: str) -> object:
    return load_web_config(write_web_config(directory, textwrap.dedent(text)))


def error_of(directory: Path, text: str) -> str:
    with pytest.raises(WebConfigError) as caught:
        load(directory, text)
    message = str(caught.value)
    assert "\n" not in message, f"an error must be one line: {message!r}"
    assert message.startswith(f"web config {directory / 'web.yml'}: "), message
    return message


def test_a_node_exporter_config_loads_with_paths_relative_to_the_file(pki: Pki) -> None:
    hashed = bcrypt_hash("pw")
    config = load_web_config(
        write_web_config(
            pki.directory,
            f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [scraper.example]
  min_version: TLS12
  max_version: TLS13
  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
http_server_config:
  http2: true
  headers:
    X-Frame-Options: deny
    Strict-Transport-Security: max-age=31536000
    X-XSS-Protection: ""
basic_auth_users:
  prometheus: {hashed}
rate_limit:
  interval: 100ms
  burst: 5
""",
        )
    )
    assert config.tls is not None
    assert config.tls.context.verify_mode == ssl.CERT_REQUIRED
    assert config.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert config.tls.client_allowed_sans == {"scraper.example"}
    assert config.users == (("prometheus", hashed.encode()),)
    assert dict(config.headers) == {
        "X-Frame-Options": "deny",
        "Strict-Transport-Security": "max-age=31536000",
    }, "a blank header means unset"
    assert config.rate_limit is not None
    assert (config.rate_limit.interval, config.rate_limit.burst) == (0.1, 5)


def test_an_empty_file_means_no_tls_and_no_auth(tmp_path: Path) -> None:
    config = load_web_config(write_web_config(tmp_path, ""))
    assert config.tls is None
    assert not config.auth_required


def test_inline_pem_is_accepted(pki: Pki) -> None:
    cert = (pki.directory / "server.crt").read_text()
    key = (pki.directory / "server.key").read_text()
    indent = "\n".join("    " + line for line in cert.splitlines())
    key_indent = "\n".join("    " + line for line in key.splitlines())
    config = load(
        pki.directory, f"tls_server_config:\n  cert: |\n{indent}\n  key: |\n{key_indent}\n"
    )
    assert config.tls is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tls_server_config: [1]", "tls_server_config: must be a mapping, not a list"),
        ("tls_sever_config: {}", "tls_sever_config: unknown key (use one of tls_server_config,"),
        ("tls_server_config: {cert_file: server.crt, keyfile: x}", "tls_server_config.keyfile:"),
        ("tls_server_config: {cert_file: server.crt}", "tls_server_config.key_file: missing"),
        (
            "tls_server_config: {cert_file: nope.crt, key_file: server.key}",
            "tls_server_config.cert_file: cannot read ",
        ),
        (
            "tls_server_config: {cert_file: ca.crt, key_file: server.key}",
            "tls_server_config.cert_file / tls_server_config.key_file: not a PEM certificate "
            "and matching private key",
        ),
        (
            "tls_server_config: {min_version: TLS13}",
            "tls_server_config: TLS settings without a certificate",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: TLS14}",
            "tls_server_config.min_version: unknown TLS version 'TLS14'",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "min_version: TLS13, max_version: TLS12}",
            "tls_server_config.min_version: TLS13 is above max_version TLS12",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "client_auth_type: RequireAnyClientCert}",
            "RequireAnyClientCert is not supported",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "client_auth_type: Sometimes}",
            "tls_server_config.client_auth_type: unknown value 'Sometimes'",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "client_auth_type: RequireAndVerifyClientCert}",
            "tls_server_config.client_ca_file: RequireAndVerifyClientCert needs client_ca_file",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "client_ca_file: ca.crt}",
            "client CAs given without client_auth_type",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "client_auth_type: RequireAndVerifyClientCert, client_ca_file: server.key}",
            "tls_server_config.client_ca_file: no PEM CA certificate",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "client_allowed_sans: [a]}",
            "client_allowed_sans: needs client_auth_type: RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]}",
            "tls_server_config.cipher_suites[0]: unknown cipher suite",
        ),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key, "
            "curve_preferences: [X25519]}",
            "tls_server_config.curve_preferences: not supported",
        ),
        ("basic_auth_users: {alice: hunter2}", "basic_auth_users.alice: not a bcrypt hash"),
        ("basic_auth_users: {123: x}", "basic_auth_users.123: keys must be strings"),
        ("http_server_config: {headers: {Server: x}}", "headers.Server: this header cannot be set"),
        (
            "http_server_config: {headers: {X-Frame-Options: allow}}",
            "X-Frame-Options: invalid value 'allow'",
        ),
        ("http_server_config: {http2: maybe}", "http_server_config.http2: must be true or false"),
        ("rate_limit: {interval: fast, burst: 1}", "rate_limit.interval: invalid duration"),
        ("rate_limit: {interval: 1s}", "rate_limit.burst: must be a whole number"),
        ("tls_server_config: {cert_file: [", "not valid YAML"),
    ],
)
def test_bad_configs_name_the_key_and_the_problem(pki: Pki, text: str, expected: str) -> None:
    assert expected in error_of(pki.directory, text)


def test_a_password_pasted_instead_of_a_hash_is_not_echoed(tmp_path: Path) -> None:
    message = error_of(tmp_path, "basic_auth_users: {alice: hunter2}")
    assert "hunter2" not in message


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"web config .*missing\.yml: cannot read the file"):
        load_web_config(tmp_path / "missing.yml")


def refused_without_blocking(path: Path) -> str:
    """The error loading ``path`` gives, from a thread that would hang on a FIFO opened for
    reading without O_NONBLOCK: if it does, a writer is opened to release it and the test fails
    instead of hanging."""
    outcome: list[str] = []

    def attempt() -> None:
        try:
            load_web_config(path)
            outcome.append("loaded")
        except WebConfigError as exc:
            outcome.append(str(exc))

    worker = threading.Thread(target=attempt)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():
        os.close(os.open(path, os.O_WRONLY))  # the opener's writer: lets the blocked read end
        worker.join()
        pytest.fail(f"reading {path} blocked the thread")
    return outcome[0]


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda path: os.mkfifo(path), "a FIFO"),
        (lambda path: path.symlink_to("/dev/zero"), "a character device"),
        (lambda path: path.mkdir(), "a directory"),
    ],
    ids=["fifo", "symlink-to-dev-zero", "directory"],
)
def test_a_web_config_that_is_not_a_regular_file_is_refused_before_a_read(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    path = tmp_path / "web.yml"
    make(path)
    assert refused_without_blocking(path) == (
        f"web config {path}: cannot read the file: not a regular file ({kind})"
    )


def test_an_oversized_web_config_is_refused_having_read_no_more_than_the_limit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "web.yml"
    with path.open("wb") as sparse:  # claims 1 GiB and costs no disk
        sparse.truncate(2**30)
    tracemalloc.start()
    try:
        with pytest.raises(WebConfigError, match=f"larger than {MAX_FILE_BYTES} bytes"):
            load_web_config(path)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_FILE_BYTES, f"{peak / 2**20:.1f} MiB held to refuse a 1 GiB file"


def test_a_web_config_through_a_symlink_is_read_as_a_secret_volume_has_it(tmp_path: Path) -> None:
    """The kubelet mounts a Secret's keys as links into its ``..data`` directory:
    exporter-toolkit follows them, and so does the exporter."""
    data = tmp_path / "..data"
    data.mkdir()
    (data / "web.yml").write_text(f"basic_auth_users: {{alice: {bcrypt_hash('pw')}}}\n")
    (tmp_path / "web.yml").symlink_to(Path("..data/web.yml"))
    assert load_web_config(tmp_path / "web.yml").auth_required


@pytest.mark.parametrize("name", ["cert_file", "key_file", "client_ca_file"])
def test_an_oversized_certificate_key_or_ca_file_is_refused(pki: Pki, name: str) -> None:
    huge = pki.directory / "huge.pem"
    with huge.open("wb") as sparse:
        sparse.truncate(MAX_FILE_BYTES + 1)
    files = {"cert_file": "server.crt", "key_file": "server.key", "client_ca_file": "ca.crt"}
    files[name] = "huge.pem"
    message = error_of(
        pki.directory,
        f"""
        tls_server_config:
          cert_file: {files["cert_file"]}
          key_file: {files["key_file"]}
          client_ca_file: {files["client_ca_file"]}
          client_auth_type: RequireAndVerifyClientCert
        """,
    )
    assert message.endswith(
        f"tls_server_config.{name}: cannot read {huge}: larger than {MAX_FILE_BYTES} bytes"
    ), message


def test_a_certificate_that_is_a_fifo_is_refused(pki: Pki) -> None:
    os.mkfifo(pki.directory / "fifo.crt")
    write_web_config(
        pki.directory, "tls_server_config: {cert_file: fifo.crt, key_file: server.key}"
    )
    message = refused_without_blocking(pki.directory / "web.yml")
    assert message.endswith(
        f"tls_server_config.cert_file: cannot read {pki.directory / 'fifo.crt'}: "
        "not a regular file (a FIFO)"
    ), message


YAMLISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.sampled_from(["TLS12", "server.crt", "RequireAndVerifyClientCert", "1s", "$2y$04$x"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "tls_server_config",
                    "cert_file",
                    "key_file",
                    "client_auth_type",
                    "client_ca_file",
                    "basic_auth_users",
                    "http_server_config",
                    "headers",
                    "rate_limit",
                    "interval",
                    "burst",
                    "min_version",
                    "cipher_suites",
                    "X-Frame-Options",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=YAMLISH)
def test_any_yaml_document_is_loaded_or_rejected_with_a_web_config_error(document: object) -> None:
    import yaml

    _only_web_config_errors(yaml.safe_dump(document), Path("/nonexistent/web.yml"))


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list(":-[]{}\n #&*!|>'\"%@`,?aZ09.$")), max_size=60))
def test_any_text_is_loaded_or_rejected_with_a_web_config_error(text: str) -> None:
    _only_web_config_errors(text, Path("/nonexistent/web.yml"))


def _only_web_config_errors(text: str, source: Path) -> None:
    """Loads, or raises WebConfigError with a one-line message: anything else fails the test."""
    message = ""
    try:
        parse_web_config(text, source)
    except WebConfigError as exc:
        message = str(exc)
    assert "\n" not in message, f"multi-line error for {text!r}: {message}"
