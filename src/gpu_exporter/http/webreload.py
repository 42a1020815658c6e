"""Keeps the web config current while the exporter runs.

node_exporter's exporter-toolkit reads its web config file again for every TLS handshake and
request, so a rotated certificate (cert-manager rewriting a Secret, which the kubelet swaps into
the pod's volume) or a changed password takes effect without a restart; users who reuse that
file expect the same here. The files the config was built from (itself, the certificate, key and
client CAs) are checked every ``interval`` seconds with ``stat`` alone, and read again only when
one of them changed. A config that fails to load, or that changes what a running listener cannot
(TLS on or off, protocol versions, cipher suites, the client certificate requirement), is
refused: the previous one stays in force, the refusal is logged and counted.

At most one reload runs at a time: a SIGHUP (or a timed check) that arrives while one runs asks
for one more afterwards, and any number of them make that one. Reloads run on the web side's own
threads (``executor``, from ``app.build_exporter``), never on the default executor that the rest
of the exporter needs (the gzip bodies among them).

New TLS connections get the newest certificate through the listening context's SNI callback,
which OpenSSL calls on every ClientHello (with or without a server name) and which may hand the
connection a different context: its certificate, key and client CA store then apply.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path

from ..exposition import Family, Sample, counter, gauge, label_string
from ..logs import RateLimitedLog, get_logger
from ..websecurity import WebConfig
from .webconfig import WebConfigError, load_web_config

RELOADS = counter(
    "gpu_exporter_web_config_reloads_total",
    "Web config reloads after one of its files changed, by result (success, failure: the "
    "previous config stays in force).",
)
LAST_RELOAD_OK = gauge(
    "gpu_exporter_web_config_last_reload_successful",
    "1 when the web config in force is the one on disk; 0 after a failed reload.",
)
RESULTS = ("success", "failure")
DEFAULT_INTERVAL = 10.0
# What a file looks like to stat: a Secret update replaces it (new inode), an edit rewrites it.
Fingerprint = tuple[tuple[int, int, int] | None, ...]

_log = get_logger("web")


class WebConfigReloader:
    """The web config in force (``current``), re-read when its files change.

    ``apply`` is told of each accepted config (the request guard's users, limits and headers).
    ``check`` does blocking I/O (stat, and a read when something changed): run it off the loop,
    on ``executor`` (None: the loop's default executor, for a reloader used alone).
    """

    families: Sequence[Family] = (RELOADS, LAST_RELOAD_OK)

    def __init__(
        self,
        initial: WebConfig,
        apply: Callable[[WebConfig], None],
        *,
        interval: float = DEFAULT_INTERVAL,
        load: Callable[[Path], WebConfig] = load_web_config,
        executor: Executor | None = None,
    ) -> None:
        self.current = initial
        self._apply = apply
        self._interval = interval
        self._load = load
        self._executor = executor
        self._fingerprint = _fingerprint(initial.files)
        self._results = dict.fromkeys(RESULTS, 0)
        self._last_ok = True
        self._rlog = RateLimitedLog(_log, period=300.0)
        self._task: asyncio.Task[None] | None = None
        self._reloading: asyncio.Task[None] | None = None  # the one reload in flight
        self._follow_up: bool | None = None  # asked for meanwhile: forced (SIGHUP) or not
        if initial.tls is not None:
            initial.tls.context.sni_callback = self._choose_context

    def samples(self) -> Iterator[Sample]:
        for result in RESULTS:
            yield Sample(RELOADS, label_string({"result": result}), self._results[result])
        yield Sample(LAST_RELOAD_OK, "", 1.0 if self._last_ok else 0.0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="web-config-reload")

    async def stop(self) -> None:
        """Stop checking; a reload in flight is abandoned (its thread finishes on its own: a
        read is bounded, and nothing it finds is applied)."""
        tasks = [task for task in (self._task, self._reloading) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = self._reloading = None
        self._follow_up = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await asyncio.shield(self.reload(force=False))

    def reload_on_signal(self) -> None:
        """SIGHUP (on the loop): read the files again now, changed or not, as exporter-toolkit
        users expect of a reload signal."""
        _log.info("SIGHUP: reading the web config again", file=str(self.current.source))
        self.reload(force=True)

    def reload(self, force: bool) -> asyncio.Task[None]:
        """Start a reload (``force``: read even if nothing changed), or, while one runs, ask for
        one more after it; the task that will have done it."""
        if self._reloading is not None:
            self._follow_up = force or bool(self._follow_up)
            return self._reloading
        self._reloading = asyncio.get_running_loop().create_task(
            self._reloads(force), name="web-config-reload-once"
        )
        return self._reloading

    async def _reloads(self, force: bool) -> None:
        try:
            while True:
                await self._check_once(force)
                if self._follow_up is None:
                    return
                force, self._follow_up = self._follow_up, None
        finally:
            self._reloading = None

    async def _check_once(self, force: bool = False) -> None:
        loop = asyncio.get_running_loop()
        try:
            candidate = await loop.run_in_executor(self._executor, self.check, force)
        except Exception as exc:  # a bug here must not end the checks, nor the exporter
            self._refuse(f"unexpected error: {exc!r}")
            return
        if candidate is not None:
            self._accept(candidate)

    def check(self, force: bool = False) -> WebConfig | None:
        """A newer, valid config when a file changed since the last check (or ``force``), else
        None."""
        fingerprint = _fingerprint(self.current.files)
        if fingerprint == self._fingerprint and not force:
            return None
        self._fingerprint = fingerprint
        try:
            candidate = self._load(self.current.source)
            _check_restart_free(self.current, candidate)
        except WebConfigError as exc:
            self._refuse(str(exc))
            return None
        # The new files may differ from the old (a renamed certificate): watch those from now.
        self._fingerprint = _fingerprint(candidate.files)
        return candidate

    def reload_now(self) -> bool:
        """Check and, when there is a newer valid config, put it in force, all in the caller's
        thread (tests; the running exporter checks off the loop and applies on it). True when
        a new config was accepted."""
        candidate = self.check()
        if candidate is None:
            return False
        self._accept(candidate)
        return True

    def _accept(self, candidate: WebConfig) -> None:
        self.current = candidate
        self._apply(candidate)
        self._results["success"] += 1
        self._last_ok = True
        _log.info("web config reloaded", file=str(candidate.source))

    def _refuse(self, reason: str) -> None:
        self._results["failure"] += 1
        self._last_ok = False
        self._rlog.error(
            "refused",
            "web config not reloaded; the previous one stays in force",
            reason=reason,
        )

    def _choose_context(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        """OpenSSL's ClientHello callback: hand the connection the newest context."""
        tls = self.current.tls
        if tls is not None and connection.context is not tls.context:
            connection.context = tls.context


def _check_restart_free(current: WebConfig, candidate: WebConfig) -> None:
    """Refuse what the running listener cannot take (see the module's docstring), and what would
    silently open the endpoints: dropping every basic_auth_users entry (a truncated or half-written
    file must not turn authentication off)."""
    if current.users and not candidate.users:
        raise WebConfigError(
            candidate.source,
            "basic_auth_users",
            "removing every user would open /metrics and the admin API: that needs a restart",
        )
    if (current.tls is None) != (candidate.tls is None):
        raise WebConfigError(
            candidate.source, "tls_server_config", "turning TLS on or off needs a restart"
        )
    if (
        current.tls is not None
        and candidate.tls is not None
        and current.tls.fixed != candidate.tls.fixed
    ):
        raise WebConfigError(
            candidate.source,
            "tls_server_config",
            "versions, cipher suites and client_auth_type change only with a restart",
        )


def _fingerprint(files: Sequence[Path]) -> Fingerprint:
    return tuple(_stat(path) for path in files)


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)  # follows the Secret volume's ..data symlink
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)
