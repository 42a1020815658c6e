"""What a request passes before it reaches an endpoint: the concurrency limit, the rate limit, the
client certificate's SANs and basic auth, as configured by ``--web.*`` flags and the web config.

The health endpoints (``/healthz``, ``/readyz``) are never limited, so a flood of scrapes cannot
fail kubelet probes and restart the exporter, and they skip authentication unless
``--web.auth-health``. Every rejection is counted in ``gpu_exporter_http_requests_rejected_total``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from enum import Enum
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..exposition import Family, Sample, counter, label_string
from ..logs import RateLimitedLog, get_logger
from ..websecurity import RateLimit, WebConfig

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
REALM = 'Basic realm="gpu-exporter", charset="UTF-8"'
REJECTED = counter(
    "gpu_exporter_http_requests_rejected_total",
    "HTTP requests answered without reaching their endpoint, by reason.",
)
# max_requests: over --web.max-requests (503); rate_limit: over the web config's rate_limit (429);
# auth_busy: too many password checks already queued (503); unauthorized: no or wrong credentials
# (401); client_cert: the client certificate has none of client_allowed_sans (403); bad_request:
# refused by the HTTP parser, before any handler (400: not HTTP, a line or header over the limits,
# no or two Host headers), or a Host that is not host[:port] (400, the guard).
REASONS = ("max_requests", "rate_limit", "auth_busy", "unauthorized", "client_cert", "bad_request")
# The status each refusal by the guard is answered with (bad_request is aiohttp's own 400).
REFUSAL_STATUS: Mapping[str, HTTPStatus] = {
    "max_requests": HTTPStatus.SERVICE_UNAVAILABLE,
    "rate_limit": HTTPStatus.TOO_MANY_REQUESTS,
    "auth_busy": HTTPStatus.SERVICE_UNAVAILABLE,
    "unauthorized": HTTPStatus.UNAUTHORIZED,
    "client_cert": HTTPStatus.FORBIDDEN,
}
DROPPED = counter(
    "gpu_exporter_http_connections_dropped_total",
    "HTTP connections closed by the exporter or the client before a response was delivered, by "
    "reason: write_timeout (the client did not take its response within --web.write-timeout), "
    "body_timeout (a request body slower than --web.read-timeout), reset (the client reset or "
    "closed the connection while its response was written).",
)
DROP_REASONS = ("write_timeout", "body_timeout", "reset")
# RFC 9112 3.2: a Host that is not ``host [":" port]`` (RFC 3986 3.2.2: an IP literal, or a
# reg-name of unreserved, percent-encoded and sub-delim characters) is answered 400. aiohttp's
# parser already refuses a missing (HTTP/1.1) or repeated Host; it passes any value through.
_HOST = re.compile(
    r"(?:\[([0-9A-Fa-f:.]+)\]|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)(?::[0-9]*)?"
)
# bcrypt is slow on purpose (~70 ms at cost 10): one check at a time, and only this many waiting;
# beyond that a guessing client is turned away without costing CPU.
MAX_PENDING_PASSWORD_CHECKS = 4

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_server_log = get_logger("http")


class Verdict(Enum):
    ALLOWED = "allowed"
    DENIED = "denied"
    BUSY = "busy"


class PasswordCheck:
    """Basic-auth credentials against bcrypt hashes, off the event loop.

    A successful (user, password) is remembered as an HMAC under a key that lives only in this
    process, so Prometheus scraping every 15 s costs one bcrypt in total, not one per scrape,
    and memory never holds the password or a plain hash of it. Failures are not remembered:
    every guess costs the guesser a full bcrypt. bcrypt runs on ``executor`` (the web side's own
    threads; None: the loop's default executor, for a check used alone).
    """

    def __init__(
        self,
        users: Iterable[tuple[str, bytes]],
        verify: Callable[[bytes, bytes], bool] | None = None,
        executor: Executor | None = None,
    ) -> None:
        if verify is None:
            import bcrypt  # only with basic_auth_users: an exporter without them never loads it

            verify = bcrypt.checkpw
        self._users = dict(users)
        self._verify = verify
        self._executor = executor
        self._key = os.urandom(32)
        self._verified: dict[str, bytes] = {}  # user -> HMAC of the last password that passed
        self._one_at_a_time = asyncio.Lock()
        self._pending = 0

    async def check(self, authorization: str | None) -> Verdict:
        credentials = _decode_basic(authorization)
        if credentials is None or not self._users:
            return Verdict.DENIED
        user, password = credentials
        if self._passed_before(user, password):
            return Verdict.ALLOWED
        if self._pending >= MAX_PENDING_PASSWORD_CHECKS:
            return Verdict.BUSY
        if not await self._bcrypt(user, password):
            return Verdict.DENIED
        self._verified[user] = self._token(user, password)
        return Verdict.ALLOWED

    def _passed_before(self, user: str, password: str) -> bool:
        remembered = self._verified.get(user)
        return remembered is not None and hmac.compare_digest(
            remembered, self._token(user, password)
        )

    async def _bcrypt(self, user: str, password: str) -> bool:
        known = user in self._users
        # An unknown user is checked against a real hash all the same, so that response times
        # do not tell which user names exist.
        hashed = self._users[user] if known else next(iter(self._users.values()))
        self._pending += 1
        try:
            async with self._one_at_a_time:
                matches = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._safe_verify, password.encode(), hashed
                )
        finally:
            self._pending -= 1
        return known and matches

    def _safe_verify(self, password: bytes, hashed: bytes) -> bool:
        try:
            return self._verify(password, hashed)
        except ValueError:  # bcrypt refuses passwords over 72 bytes: no such password matches
            return False

    def _token(self, user: str, password: str) -> bytes:
        message = user.encode() + b"\0" + password.encode()
        return hmac.new(self._key, message, hashlib.sha256).digest()


def basic_auth_user(authorization: str | None) -> str | None:
    """The user an ``Authorization: Basic`` header names (verified only where the guard checks
    credentials), or None."""
    credentials = _decode_basic(authorization)
    return credentials[0] if credentials is not None else None


def _decode_basic(authorization: str | None) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic`` header, or None when it is not one."""
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except ValueError:  # bad base64 or not UTF-8 (binascii.Error is a ValueError)
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


class TokenBucket:
    """exporter-toolkit's ``rate_limit``: one request per interval, bursts up to ``burst``."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = limit.interval
        self._burst = float(limit.burst)
        self._tokens = float(limit.burst)
        self._clock = clock
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class RequestGuard:
    """The middleware and response headers for the web app, and the rejection counters (a
    sample source of the sampler)."""

    families: Sequence[Family] = (REJECTED, DROPPED)

    def __init__(
        self,
        web_config: WebConfig | None,
        *,
        max_requests: int,
        auth_health: bool = False,
        read_timeout: float = 30.0,
        write_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        executor: Executor | None = None,
    ) -> None:
        self._max_requests = max_requests
        self._executor = executor  # bcrypt's threads (see PasswordCheck)
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._drop_labels = {reason: label_string({"reason": reason}) for reason in DROP_REASONS}
        self._rlog = RateLimitedLog(_server_log, period=60.0, clock=clock)
        self._auth_health = auth_health
        self._clock = clock
        self._in_flight = 0
        self._rejected = dict.fromkeys(REASONS, 0)
        self._labels = {reason: label_string({"reason": reason}) for reason in REASONS}
        self._web_config: WebConfig | None = None
        self._passwords: PasswordCheck | None = None
        self._bucket: TokenBucket | None = None
        self._allowed_sans: frozenset[str] = frozenset()
        self._headers: Mapping[str, str] = {}
        self.apply(web_config)

    def apply(self, web_config: WebConfig | None) -> None:
        """Take a (reloaded) web config's users, rate limit, allowed SANs and headers; what did
        not change keeps its state (verified passwords, the token bucket's tokens)."""
        old = self._web_config
        self._web_config = web_config
        users = web_config.users if web_config else ()
        if old is None or users != old.users:
            self._passwords = PasswordCheck(users, executor=self._executor) if users else None
        limit = web_config.rate_limit if web_config else None
        if old is None or limit != old.rate_limit:
            self._bucket = TokenBucket(limit, self._clock) if limit else None
        tls = web_config.tls if web_config else None
        self._allowed_sans = _normalised_sans(tls.client_allowed_sans) if tls else frozenset()
        self._headers = dict(web_config.headers) if web_config else {}

    @property
    def rejected(self) -> Mapping[str, int]:
        return dict(self._rejected)

    @property
    def dropped(self) -> Mapping[str, int]:
        return dict(self._dropped)

    def samples(self) -> Iterator[Sample]:
        for reason, count in self._rejected.items():
            yield Sample(REJECTED, self._labels[reason], count)
        for reason, count in self._dropped.items():
            yield Sample(DROPPED, self._drop_labels[reason], count)

    def note_dropped(self, reason: str, client: str | None = None) -> None:
        """A connection dropped (counted; one warning line a minute per reason)."""
        self._dropped[reason] += 1
        self._rlog.warning(("dropped", reason), "connection dropped", reason=reason, client=client)

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self._middleware)
        app.on_response_prepare.append(self._add_headers)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not valid_host(request.headers.get("Host", "")):
            return self._bad_host(request)
        authorization = request.headers.get("Authorization")
        if request.path in HEALTH_PATHS:
            if self._auth_health:
                refused = await self.authorize(request.transport, authorization)
                if refused is not None:
                    return refusal(refused)
            return await handler(request)
        if request.can_read_body and not await self._read_body(request):
            return self._closing(request, HTTPStatus.REQUEST_TIMEOUT)
        refused = self.over_limit()
        if refused is not None:
            return refusal(refused)
        with self.slot():
            refused = await self.authorize(request.transport, authorization)
            response = refusal(refused) if refused is not None else await handler(request)
        await self._deliver(request, response)
        return response

    def over_limit(self) -> str | None:
        """The limit a request to a guarded endpoint is over now (``max_requests``,
        ``rate_limit``: counted), or None when it may go on."""
        if self._in_flight >= self._max_requests:
            return self._count("max_requests")
        if self._bucket is not None and not self._bucket.allow():
            return self._count("rate_limit")
        return None

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One of --web.max-requests' slots, held while a request is worked on.

        The slot bounds work, not delivery: a client that never reads its response must not
        keep others from /metrics (40 such clients held every slot for as long as they liked).
        Delivery is bounded by --web.write-timeout instead."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    @contextmanager
    def slot_given_back(self) -> Iterator[None]:
        """Inside a request's slot: give the slot back while the request waits for work built
        once for every request waiting on it (a render's gzip body), which is no work of its
        own. 64 gzip scrapers after a render were turned away 503 for the millisecond it took."""
        self._in_flight -= 1
        try:
            yield
        finally:
            self._in_flight += 1

    async def authorize(
        self, transport: asyncio.BaseTransport | None, authorization: str | None
    ) -> str | None:
        """None when the request may proceed, else why not (``client_cert``, ``auth_busy``,
        ``unauthorized``: counted)."""
        if self._allowed_sans and not self._has_allowed_san(transport):
            return self._count("client_cert")
        if self._passwords is None:
            return None
        verdict = await self._passwords.check(authorization)
        if verdict is Verdict.ALLOWED:
            return None
        return self._count("auth_busy" if verdict is Verdict.BUSY else "unauthorized")

    async def _read_body(self, request: web.Request) -> bool:
        """Read the body before taking a slot (aiohttp keeps it for the handler), within
        --web.read-timeout; False when it did not arrive in time."""
        try:
            async with asyncio.timeout(self._read_timeout):
                await request.read()  # at most client_max_size: 413 beyond it
        except TimeoutError:
            self.note_dropped("body_timeout", request.remote)
            return False
        return True

    async def _deliver(self, request: web.Request, response: web.StreamResponse) -> None:
        try:
            async with asyncio.timeout(self._write_timeout):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            self.note_dropped("write_timeout", request.remote)
            _abort(request)
        except ConnectionError:  # reset by the client: its own doing, not a server error
            self.note_dropped("reset", request.remote)
            _abort(request)

    def _closing(self, request: web.Request, status: HTTPStatus) -> web.Response:
        _abort(request)
        return web.Response(status=status, text=f"{status.phrase}\n")

    def _has_allowed_san(self, transport: asyncio.BaseTransport | None) -> bool:
        peer = transport.get_extra_info("peercert") if transport is not None else None
        names = peer.get("subjectAltName", ()) if isinstance(peer, dict) else ()
        return any(_normalised_san(kind, value) in self._allowed_sans for kind, value in names)

    def _bad_host(self, request: web.Request) -> web.Response:
        """400 and the connection closed, counted and logged as the parser's refusals are."""
        self.note_bad_request()
        self._rlog.warning(
            "bad_host",
            "malformed request refused",
            client=request.remote,
            error=f"invalid Host header {request.headers['Host'][:80]!r}",
        )
        response = web.Response(status=HTTPStatus.BAD_REQUEST, text="invalid Host header\n")
        response.force_close()
        return response

    def note_bad_request(self) -> None:
        """The HTTP parser refused a request (see :class:`ServerLog`)."""
        self._rejected["bad_request"] += 1

    def _count(self, reason: str) -> str:
        self._rejected[reason] += 1
        return reason

    async def _add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if self._headers:
            response.headers.update(self._headers)


def refusal(reason: str) -> web.Response:
    """The answer to a request the guard refused for ``reason``."""
    status = REFUSAL_STATUS[reason]
    response = web.Response(status=status, text=f"{status.phrase}\n")
    if status is HTTPStatus.UNAUTHORIZED:
        response.headers["WWW-Authenticate"] = REALM
    return response


def valid_host(value: str) -> bool:
    """Whether a Host header value is ``host [":" port]`` (empty is valid: RFC 9112 3.2)."""
    match = _HOST.fullmatch(value)
    if match is None:
        return False
    literal = match.group(1)
    if literal is None:
        return True
    try:
        ipaddress.IPv6Address(literal)
    except ValueError:
        return False
    return True


def _normalised_sans(sans: Iterable[str]) -> frozenset[str]:
    return frozenset(_normalised_san("IP Address", san) for san in sans)


def _normalised_san(kind: str, value: str) -> str:
    """IP addresses in Go's form (as in client_allowed_sans); other names as they are."""
    if kind == "IP Address":
        try:
            return str(ipaddress.ip_address(value.strip()))
        except ValueError:
            return value
    return value


def _abort(request: web.BaseRequest) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


class ServerLog:
    """Stands in for aiohttp's ``aiohttp.server`` logger, which would print a traceback to stderr,
    outside the structured log, for every malformed request any client cares to send.

    A request the HTTP parser refuses (not HTTP, a line or a header over the limits) is the
    client's doing: it is counted (``reason="bad_request"``) and logged as one rate-limited
    warning line. Anything else aiohttp reports (a handler that raised: a 500) is an error in the
    structured log, traceback included.
    """

    def __init__(self, guard: RequestGuard) -> None:
        self._guard = guard
        self._rlog = RateLimitedLog(_server_log, period=60.0)

    def exception(self, message: str, *args: object, exc_info: object = None, **_: object) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._bad_request(exc_info, args)
            return
        if isinstance(exc_info, ConnectionError):  # a client reset its connection mid-answer
            self._guard.note_dropped("reset")
            return
        text = message % args if args else message
        _server_log.error(text, exc_info=exc_info if exc_info is not None else True)

    def debug(self, message: str, *args: object, exc_info: object = None, **_: object) -> None:
        if isinstance(exc_info, HttpProcessingError):  # aiohttp's quiet path for non-HTTP bytes
            self._bad_request(exc_info, args)

    def warning(self, message: str, *args: object, **_: object) -> None:
        _server_log.warning(message % args if args else message)

    def _bad_request(self, exc: HttpProcessingError, args: tuple[object, ...]) -> None:
        self._guard.note_bad_request()
        self._rlog.warning(
            "bad_request",
            "malformed request refused",
            client=str(args[0]) if args else None,
            error=str(exc.message)[:200],
        )
