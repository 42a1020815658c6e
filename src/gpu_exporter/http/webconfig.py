"""Endpoint security from a Prometheus exporter-toolkit web config file (``--web.config.file``).

The format is exporter-toolkit's, so a node_exporter web config works here unchanged where Python's
ssl module can honour it: ``tls_server_config`` (server certificate, client certificates, TLS
versions, TLS 1.2 cipher suites), ``basic_auth_users`` (bcrypt hashes), ``http_server_config``
(response headers; ``http2`` is accepted and ignored: aiohttp serves HTTP/1.1) and ``rate_limit``.
What Python cannot honour (``curve_preferences``, client certificates accepted without
verification) is rejected by name rather than silently weakened.

Like exporter-toolkit, unknown keys are errors and relative paths are resolved against the
config file's directory, and symlinks are followed (a Secret volume's files are links into its
``..data`` directory; exporter-toolkit reads them with ``os.ReadFile``). Unlike a plain read, each
file must be a regular one of at most :data:`MAX_FILE_BYTES`: a FIFO, a device or a directory put
in its place is refused before a byte is read (``O_NONBLOCK``, ``fstat``), and no more than the
limit and one byte is ever read. Like exporter-toolkit, a change applies while running:
``webreload.py`` checks the file (and the files it names) every 10 s and swaps in a config that
loads, keeping the previous one when the new one is refused.
Every problem is a :class:`WebConfigError` whose message is one line: file, key path, reason.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from .. import safeyaml
from ..safeyaml import quote
from ..websecurity import RateLimit, TlsSettings, WebConfig

# A web config has a few dozen values; aliases may not expand it beyond this (billion laughs).
MAX_YAML_NODES = 10_000
# The config, a certificate chain, a key, a client CA bundle: a few KiB each (the whole Mozilla CA
# bundle is about 220 KiB). Anything larger is not one of them.
MAX_FILE_BYTES = 2**20
_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
)
CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
# Python's ssl verifies every client certificate it asks for: it cannot accept one unverified.
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
_VERIFY_MODES = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# exporter-toolkit allows only these headers, and these values where the header is an enumeration.
ALLOWED_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
# Any of these turns TLS on (exporter-toolkit's TLSConfig.IsEnabled).
_TLS_ENABLING_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type")
_BCRYPT_HASH = re.compile(r"\$2[aby]?\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}")
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class WebConfigError(ValueError):
    """A bad web config: ``web config <file>: <key.path>: <reason>``, on one line."""

    def __init__(self, source: Path, path: str, reason: str) -> None:
        self.source = source
        self.path = path
        self.reason = " ".join(reason.split())  # one line, whatever a library said
        where = f"{path}: " if path else ""
        super().__init__(f"web config {source}: {where}{self.reason}")


class _Invalid(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


def load_web_config(path: Path) -> WebConfig:
    """Read, validate and build everything in ``path`` (certificates included)."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(path, "", f"cannot read the file: {_reason(exc)}") from exc
    return parse_web_config(text, path)


def read_regular_file(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path`` (symlinks followed), which must be a regular file of at most
    ``limit`` bytes (:class:`FileRefused` otherwise). Opened with ``O_NONBLOCK`` so that a FIFO
    cannot hold the thread waiting for a writer, and checked with ``fstat`` before any read;
    at most ``limit + 1`` bytes are read, whatever the file claims or grows to."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), None)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"not a regular file ({kind or 'of an unknown kind'})")
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise FileRefused(f"larger than {limit} bytes")
    return b"".join(chunks)


class FileRefused(OSError):
    """A web config, certificate or key file that is not a small regular file."""


def parse_web_config(text: str, source: Path) -> WebConfig:
    """Validate web config ``text``; relative paths in it are resolved against ``source``'s
    directory."""
    try:
        # PyYAML can raise more than YAMLError on hostile input (ValueError for an impossible
        # date, RecursionError for deep nesting): all of it means "not a valid file".
        document = safeyaml.load(text, max_nodes=MAX_YAML_NODES)
    except Exception as exc:
        raise WebConfigError(source, "", f"not valid YAML: {_reason(exc)}") from exc
    try:
        return _parse(document, source)
    except _Invalid as exc:
        raise WebConfigError(source, exc.path, exc.reason) from None


def _parse(document: Any, source: Path) -> WebConfig:
    root = _mapping({} if document is None else document, "", _TOP_KEYS)
    http = _mapping(
        root.get("http_server_config") or {}, "http_server_config", ("http2", "headers")
    )
    _optional_bool(http, "http2", "http_server_config")  # accepted; aiohttp speaks HTTP/1.1 only
    tls = _tls(root.get("tls_server_config") or {}, source.parent)
    return WebConfig(
        source=source,
        tls=tls,
        users=_users(root.get("basic_auth_users") or {}),
        headers=_headers(http.get("headers") or {}),
        rate_limit=_rate_limit(root.get("rate_limit") or {}),
        files=(source, *_tls_files(root.get("tls_server_config"), source.parent)),
    )


def _tls_files(section: Any, base: Path) -> list[Path]:
    """The certificate, key and client CA files a valid TLS section names."""
    if not isinstance(section, Mapping):
        return []
    names = (section.get(key) for key in ("cert_file", "key_file", "client_ca_file"))
    return [base / name for name in names if isinstance(name, str) and name]


# -- TLS ---------------------------------------------------------------------------------------


def _tls(section: Any, base: Path) -> TlsSettings | None:
    tls = _mapping(section, "tls_server_config", _TLS_KEYS)
    strings = {
        key: _optional_str(tls, key, "tls_server_config")
        for key in (*_TLS_ENABLING_KEYS, "client_ca_file", "min_version", "max_version")
    }
    if not any(strings[key] for key in (*_TLS_ENABLING_KEYS, "client_ca_file")):
        if any(tls.get(key) not in (None, "", []) for key in _TLS_KEYS):
            _fail("tls_server_config", "TLS settings without a certificate: set cert_file")
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _set_versions(context, strings["min_version"] or "TLS12", strings["max_version"] or "TLS13")
    cert = _pem(strings, "cert", base)
    key = _pem(strings, "key", base)
    _load_key_pair(context, cert, key)
    client_auth = _client_auth(context, strings, base)
    sans = _string_list(tls, "client_allowed_sans")
    if sans and client_auth != "RequireAndVerifyClientCert":
        _fail(
            "tls_server_config.client_allowed_sans",
            "needs client_auth_type: RequireAndVerifyClientCert",
        )
    _set_ciphers(context, _string_list(tls, "cipher_suites"))
    _set_server_preference(context, tls.get("prefer_server_cipher_suites", True))
    if _string_list(tls, "curve_preferences"):
        _fail(
            "tls_server_config.curve_preferences",
            "not supported: Python's ssl module cannot set a curve preference list; "
            "remove it to use OpenSSL's defaults",
        )
    fixed = (
        strings["min_version"],
        strings["max_version"],
        client_auth,
        tuple(_string_list(tls, "cipher_suites")),
        tls.get("prefer_server_cipher_suites", True),
    )
    return TlsSettings(context, client_auth or "NoClientCert", frozenset(sans), fixed)


def _set_versions(context: ssl.SSLContext, minimum: str, maximum: str) -> None:
    for key, name in (("min_version", minimum), ("max_version", maximum)):
        if name not in TLS_VERSIONS:
            _fail(
                f"tls_server_config.{key}",
                f"unknown TLS version {quote(name)} ({_one_of(TLS_VERSIONS)})",
            )
    if TLS_VERSIONS[minimum] > TLS_VERSIONS[maximum]:
        _fail("tls_server_config.min_version", f"{minimum} is above max_version {maximum}")
    context.minimum_version = TLS_VERSIONS[minimum]
    context.maximum_version = TLS_VERSIONS[maximum]


def _pem(strings: Mapping[str, str], name: str, base: Path) -> tuple[str, bytes]:
    """(the key that gave it, its PEM bytes) from ``name`` inline or ``name_file``."""
    inline, path = strings[name], strings[f"{name}_file"]
    key = f"tls_server_config.{name}"
    if inline and path:
        _fail(key, f"set {name} or {name}_file, not both")
    if inline:
        return key, inline.encode()
    if not path:
        _fail(f"{key}_file", "missing (the server needs both cert_file and key_file)")
    return f"{key}_file", _read(f"{key}_file", base / path)


def _read(key: str, path: Path) -> bytes:
    try:
        return read_regular_file(path)
    except OSError as exc:
        _fail(key, f"cannot read {path}: {_reason(exc)}")


def _load_key_pair(
    context: ssl.SSLContext, cert: tuple[str, bytes], key: tuple[str, bytes]
) -> None:
    """ssl loads certificates only from files: inline PEM goes through a private temporary
    directory, removed at once."""

    def no_passphrase() -> NoReturn:
        _fail(key[0], "the private key is encrypted; give it unencrypted (keep it in a Secret)")

    with tempfile.TemporaryDirectory(prefix="gpu-exporter-tls-") as scratch:
        cert_path, key_path = Path(scratch, "cert.pem"), Path(scratch, "key.pem")
        cert_path.write_bytes(cert[1])
        key_path.write_bytes(key[1])
        try:
            context.load_cert_chain(cert_path, key_path, password=no_passphrase)
        except ssl.SSLError as exc:
            _fail(
                f"{cert[0]} / {key[0]}",
                f"not a PEM certificate and matching private key ({_reason(exc)})",
            )


def _client_auth(context: ssl.SSLContext, strings: Mapping[str, str], base: Path) -> str:
    where = "tls_server_config.client_auth_type"
    client_auth = strings["client_auth_type"]
    if client_auth in _UNVERIFIED_CLIENT_AUTH:
        _fail(
            where,
            f"{client_auth} is not supported: Python's ssl module verifies every client "
            "certificate it asks for; use VerifyClientCertIfGiven or RequireAndVerifyClientCert",
        )
    if client_auth not in _VERIFY_MODES:
        _fail(where, f"unknown value {quote(client_auth)} ({_one_of(CLIENT_AUTH_TYPES)})")
    has_ca = bool(strings["client_ca"] or strings["client_ca_file"])
    if _VERIFY_MODES[client_auth] == ssl.CERT_NONE:
        if has_ca:
            _fail("tls_server_config.client_ca_file", "client CAs given without client_auth_type")
        return client_auth
    if not has_ca:
        _fail("tls_server_config.client_ca_file", f"{client_auth} needs client_ca_file")
    ca_key, ca = _pem(strings, "client_ca", base)
    try:
        context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError) as exc:
        _fail(ca_key, f"no PEM CA certificate in it ({_reason(exc)})")
    context.verify_mode = _VERIFY_MODES[client_auth]
    return client_auth


def _set_ciphers(context: ssl.SSLContext, names: list[str]) -> None:
    known = _cipher_names()
    for index, name in enumerate(names):
        if name not in known:
            _fail(
                f"tls_server_config.cipher_suites[{index}]",
                f"unknown cipher suite {quote(name)} (use Go's names, e.g. "
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)",
            )
    openssl = [known[name] for name in names if known[name] != "-"]
    if not openssl:
        return  # TLS 1.3 suites only, or none: the TLS library's defaults
    try:
        context.set_ciphers(":".join(openssl))
    except ssl.SSLError:
        _fail("tls_server_config.cipher_suites", "none of them is available in this OpenSSL")


def _cipher_names() -> dict[str, str]:
    """Go cipher-suite name -> OpenSSL name (``-``: TLS 1.3, not configurable)."""
    text = resources.files("gpu_exporter").joinpath("data/tls_cipher_suites.tsv").read_text()
    rows = (line.split("\t") for line in text.splitlines() if line and not line.startswith("#"))
    return {go: openssl for go, openssl in rows}


def _set_server_preference(context: ssl.SSLContext, prefer: Any) -> None:
    if not isinstance(prefer, bool):
        _fail("tls_server_config.prefer_server_cipher_suites", "must be true or false")
    if prefer:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE


# -- users, headers, rate limit ----------------------------------------------------------------


def _users(section: Any) -> tuple[tuple[str, bytes], ...]:
    users = _mapping(section, "basic_auth_users", None)
    out = []
    for user, hashed in users.items():
        where = _join("basic_auth_users", user)
        if not user or ":" in user:
            _fail(where, "a user name must be non-empty and without ':' (basic auth splits on it)")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            # Never echo the value: it may be a password pasted by mistake.
            _fail(where, "not a bcrypt hash (make one with: htpasswd -nBC 10 '' | tr -d ':\\n')")
        out.append((user, hashed.encode()))
    return tuple(out)


def _headers(section: Any) -> tuple[tuple[str, str], ...]:
    headers = _mapping(section, "http_server_config.headers", None)
    out = []
    for name, value in headers.items():
        where = _join("http_server_config.headers", name)
        if name not in ALLOWED_HEADERS:
            _fail(where, f"this header cannot be set ({_one_of(ALLOWED_HEADERS)})")
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            _fail(where, "must be a one-line string")
        allowed = ALLOWED_HEADERS[name]
        if allowed and value not in allowed:
            _fail(where, f"invalid value {quote(value)} ({_one_of(allowed)})")
        if value:  # blank means unset, as in exporter-toolkit
            out.append((name, value))
    return tuple(out)


def _rate_limit(section: Any) -> RateLimit | None:
    limit = _mapping(section, "rate_limit", ("interval", "burst"))
    interval = _go_duration(limit.get("interval", "0s"), "rate_limit.interval")
    if interval == 0:
        return None
    burst = limit.get("burst", 0)
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
        _fail("rate_limit.burst", "must be a whole number of at least 1 when interval is set")
    return RateLimit(interval, burst)


def _go_duration(value: Any, where: str) -> float:
    """Go's duration syntax (``1m30s``, ``500ms``; ``0`` alone), in seconds."""
    if value == 0 and not isinstance(value, bool):
        return 0.0
    text = value if isinstance(value, str) else ""
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        _fail(where, f"invalid duration {quote(value)} (use e.g. 100ms, 1s, 1m30s)")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


# -- shapes ------------------------------------------------------------------------------------


def _mapping(value: Any, where: str, keys: tuple[str, ...] | None) -> dict[str, Any]:
    """``value`` as a mapping with string keys, each one of ``keys`` (any, if None)."""
    if not isinstance(value, dict):
        _fail(where, f"must be a mapping, not {_kind(value)}")
    for key in value:
        if not isinstance(key, str):
            _fail(_join(where, repr(key)), "keys must be strings (quote them)")
        if keys is not None and key not in keys:
            _fail(_join(where, key), f"unknown key ({_one_of(keys)})")
    return value


def _optional_str(section: Mapping[str, Any], key: str, where: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        _fail(_join(where, key), f"must be a string, not {_kind(value)}")
    return value


def _optional_bool(section: Mapping[str, Any], key: str, where: str) -> None:
    if key in section and not isinstance(section[key], bool):
        _fail(_join(where, key), "must be true or false")


def _string_list(section: Mapping[str, Any], key: str) -> list[str]:
    value = section.get(key)
    where = f"tls_server_config.{key}"
    if value is None:
        return []
    if not isinstance(value, list):
        _fail(where, f"must be a list, not {_kind(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            _fail(f"{where}[{index}]", "must be a non-empty string")
    return value


def _fail(path: str, reason: str) -> NoReturn:
    raise _Invalid(path, reason)


def _join(where: str, key: str) -> str:
    shown = key if key and key.isprintable() and key.strip() == key else repr(key)
    return f"{where}.{shown}" if where else shown


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names: dict[type, str] = {list: "a list", dict: "a mapping", str: "a string", bool: "a boolean"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else "a date")


def _one_of(choices: Mapping[str, Any] | tuple[str, ...]) -> str:
    return "use one of " + ", ".join(choices)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
