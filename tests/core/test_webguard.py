"""Password checks and the rate limit, without a server."""

from __future__ import annotations

import base64

from gpu_exporter.http.webguard import PasswordCheck, TokenBucket, Verdict
from gpu_exporter.websecurity import RateLimit
from tests.helpers import ManualClock
from tests.web_helpers import bcrypt_hash


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class CountingBcrypt:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt

        self.calls += 1
        return bcrypt.checkpw(password, hashed)


async def test_a_verified_password_costs_one_bcrypt_however_often_it_scrapes() -> None:
    verify = CountingBcrypt()
    check = PasswordCheck([("prom", bcrypt_hash("pw").encode())], verify=verify)
    for _ in range(5):
        assert await check.check(basic("prom", "pw")) is Verdict.ALLOWED
    assert verify.calls == 1, "successful credentials must be remembered"


async def test_wrong_passwords_are_never_remembered_and_unknown_users_cost_a_bcrypt() -> None:
    verify = CountingBcrypt()
    check = PasswordCheck([("prom", bcrypt_hash("pw").encode())], verify=verify)
    assert await check.check(basic("prom", "pw")) is Verdict.ALLOWED
    assert await check.check(basic("prom", "guess")) is Verdict.DENIED
    assert await check.check(basic("prom", "guess")) is Verdict.DENIED
    assert await check.check(basic("eve", "pw")) is Verdict.DENIED
    assert verify.calls == 4, "every failure costs a full bcrypt, unknown users included"
    assert await check.check(basic("prom", "pw")) is Verdict.ALLOWED
    assert verify.calls == 4, "a failure must not evict the remembered password"


async def test_malformed_authorization_headers_are_denied_without_bcrypt() -> None:
    verify = CountingBcrypt()
    check = PasswordCheck([("prom", bcrypt_hash("pw").encode())], verify=verify)
    for header in (
        None,
        "",
        "Bearer abc",
        "Basic !!!",
        "Basic " + base64.b64encode(b"nocolon").decode(),
    ):
        assert await check.check(header) is Verdict.DENIED, header
    assert verify.calls == 0


async def test_a_password_bcrypt_refuses_is_denied() -> None:
    check = PasswordCheck([("prom", bcrypt_hash("pw").encode())])
    assert await check.check(basic("prom", "x" * 100)) is Verdict.DENIED


def test_rate_limit_allows_a_burst_then_one_per_interval() -> None:
    clock = ManualClock()
    bucket = TokenBucket(RateLimit(interval=1.0, burst=2), clock)
    assert [bucket.allow() for _ in range(3)] == [True, True, False]
    clock.advance(1.0)
    assert [bucket.allow(), bucket.allow()] == [True, False]
