"""gpu-exporter soak: ``make soak`` (``python bench/soak.py [--duration 600] [--seed 1] [...]``).

Starts the real exporter process on the simulated node ``bench/scenarios/soak.yaml`` and, for
``--duration`` seconds, keeps 64 keep-alive scrapers on ``/metrics`` (each request alternating
plain/gzip and text/OpenMetrics) while it injects, through ``POST /-/simulator/events``:

- Xids of several codes and classes on random GPUs every few seconds, delivered through NVML, the
  kernel log or both (which the exporter must count once), sometimes as a storm of identical ones,
  and now and then an NVSwitch SXid (kernel log only) instead;
- pods allocated on free GPUs and released;
- a GPU lost and, several seconds later, recovered, about every minute.

With ``--tls`` the exporter serves HTTPS with basic auth from a web config (a throwaway CA), the
scrapers and the injector connect over TLS with credentials, and every ``--rotate-every`` seconds
the server certificate is replaced on disk: a fourth verdict checks that each new certificate
reached new connections (the exporter follows its web config while running).

Every ``--sample-every`` seconds it records the exporter's RSS, the scrapes, their latency and
errors, and Xids injected versus counted. At the end it lets the exporter settle and checks three
verdicts: every injected Xid counted exactly once per (gpu, xid), every SXid per (switch, sxid);
no scrape error (non-200,
connection error, truncated or malformed body); RSS flat (median of the last 20% of the samples
after the warm-up within tolerance of the median of the first 20%). It prints a table, writes
``bench/results/soak.json`` and exits 1 when a verdict fails: a soak is a test, not a benchmark.

Two choices, on purpose:
- No Xid is injected on a GPU from the moment it is lost until the exporter shows it back
  (``gpu_up 1``). A lost GPU delivers no NVML events; its kernel-log lines would still count, but
  which Xids a real lost GPU can still report is not what this soak is about.
- One NVML-only and one kernel-log-only report of the same Xid on one GPU within the 5 s matching
  window are, by design, one event (docs/xid.md, "One Xid, counted once"): the injector never
  sends those two within ``GUARD_S`` of each other (it sends "both" instead), so the expected
  count stays exact.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import json
import math
import os
import random
import re
import signal
import ssl
import statistics
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import BENCH, ROOT, Proc, proc_status_kib, start_gpu_exporter, wait_ready
from loadgen import percentile

SCENARIO = BENCH / "scenarios" / "soak.yaml"
GPUS = 8
FREE_GPUS = (3, 4, 5, 6, 7)  # soak.yaml keeps 0-2 allocated; pods come and go on these
# (code, delivery the simulator gives it by default): application 13, 31, 94; informational 43,
# 45, 92; hardware 48, 64, 74, 95, 109; 79/119/120 only ever reach the kernel log on real drivers.
XID_CODES = (13, 31, 43, 45, 48, 64, 74, 79, 92, 94, 95, 109, 119, 120)
KMSG_ONLY_CODES = frozenset({79, 119, 120})
DELIVERIES = (("both", 0.5), ("kmsg", 0.3), ("nvml", 0.2))
GUARD_S = 8.0  # > the exporter's 5 s both-sources matching window, with margin for lag
PROBE_AFTER_S = 0.3  # the loss-window probe: this long after a GPU is lost
LOSS_WINDOW_S = 2.5  # with --no-loss-window-probe, no NVML-only Xid this long after a loss
STORM_P = 0.1  # chance that an Xid comes as a storm of identical ones (delivered both ways)
SXID_P = 0.1  # chance that an NVSwitch SXid comes instead of an Xid
SWITCHES = 4  # an HGX H100 baseboard's NVSwitches
SXID_CODES = (11004, 12028, 20034, 24007)
VARIANTS = (  # (gzip, openmetrics), taken in turn by every scraper
    (False, False),
    (True, False),
    (False, True),
    (True, True),
)
OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"
EVENTS_PATH = "/-/simulator/events"
TAG = "soak"
MARKDOWN_ROWS = 20


def log(message: str) -> None:
    harness.log(message, TAG)


@dataclass(frozen=True)
class Params:
    duration: float = 600.0
    scrapers: int = 64
    seed: int = 1
    sample_every: float = 10.0
    warmup: float = 60.0
    rss_tolerance_pct: float = 5.0
    xid_every: float = 3.0  # mean seconds between Xid injections
    alloc_every: float = 8.0  # mean seconds between allocation changes
    loss_every: float = 60.0  # mean seconds between GPU losses
    loss_hold: tuple[float, float] = (5.0, 10.0)  # a lost GPU stays lost this long (min, max)
    loss_window_probe: bool = True  # an NVML-only Xid on a healthy GPU just after each loss
    settle_limit: float = 30.0  # at most this long for the counts to stop moving at the end
    tls: bool = False  # HTTPS with basic auth, and certificate rotations
    rotate_every: float = 60.0  # with tls: seconds between certificate rotations


# --------------------------------------------------------------------------- pure pieces

_XID_LINE = re.compile(r"^gpu_xid_errors_total\{([^}]*)\} (\S+)", re.M)
_SXID_LINE = re.compile(r"^gpu_nvswitch_sxid_errors_total\{([^}]*)\} (\S+)", re.M)
_GPU_UP = re.compile(r'^gpu_up\{gpu="(\d+)"[^}]*\} (\S+)', re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def xid_counts(exposition: str) -> dict[tuple[str, str], float]:
    """``gpu_xid_errors_total`` summed over every other label, by ``(gpu, xid)``; and
    ``gpu_nvswitch_sxid_errors_total`` by ``("nvswitch<switch>", sxid)``."""
    sums: dict[tuple[str, str], float] = {}
    for labels, value in _XID_LINE.findall(exposition):
        named = dict(_LABEL.findall(labels))
        key = (named.get("gpu", ""), named.get("xid", ""))
        sums[key] = sums.get(key, 0.0) + float(value)
    for labels, value in _SXID_LINE.findall(exposition):
        named = dict(_LABEL.findall(labels))
        key = (sxid_key(named.get("switch", "")), named.get("sxid", ""))
        sums[key] = sums.get(key, 0.0) + float(value)
    return sums


def sxid_key(switch: int | str) -> str:
    """Where an NVSwitch's SXids sit in the (gpu, xid) tally."""
    return f"nvswitch{switch}"


def gpus_up(exposition: str) -> dict[int, bool]:
    return {int(gpu): float(value) == 1 for gpu, value in _GPU_UP.findall(exposition)}


def check_response(
    *, gzipped: bool, openmetrics: bool, status: int, headers: Mapping[str, str], body: bytes
) -> str | None:
    """What is wrong with one /metrics answer (a short error kind), or None when it is whole."""
    if status != 200:
        return f"status {status}"
    if (headers.get("content-encoding") == "gzip") != gzipped:
        return "wrong content-encoding"
    kind = headers.get("content-type", "")
    if kind.startswith("application/openmetrics-text") != openmetrics:
        return "wrong content-type"
    if gzipped:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error):
            return "truncated gzip"
    if openmetrics and not body.endswith(b"# EOF\n"):
        return "truncated (no # EOF)"
    if not body.endswith(b"\n") or b"gpu_info{" not in body:
        return "truncated body"
    return None


def xid_verdict(
    injected: Mapping[tuple[str, str], int], counted: Mapping[tuple[str, str], float]
) -> dict[str, Any]:
    """Exact: every (gpu, xid) counted as often as injected, nothing counted that was not."""
    keys = sorted(set(injected) | set(counted), key=_tally_order)
    wrong = [
        {"gpu": gpu, "xid": xid, "injected": injected.get((gpu, xid), 0), "counted": got}
        for gpu, xid in keys
        if (got := counted.get((gpu, xid), 0.0)) != injected.get((gpu, xid), 0)
    ]
    return {
        "ok": not wrong,
        "injected": sum(injected.values()),
        "counted": sum(counted.values()),
        "pairs": len(keys),
        "mismatches": wrong,
    }


def _tally_order(key: tuple[str, str]) -> tuple[int, int | str, int]:
    """GPUs by index (unmatched "" first), then the NVSwitches; codes numerically."""
    where, code = key
    if where.isdigit() or not where:
        return (0, int(where or -1), int(code))
    return (1, where, int(code))


def rss_verdict(
    samples: Sequence[tuple[float, float]], *, warmup: float, tolerance_pct: float
) -> dict[str, Any]:
    """``samples`` are (seconds, MiB). After ``warmup`` s, the median of the last 20% of the
    samples may exceed the median of the first 20% by at most ``tolerance_pct`` percent."""
    steady = [mib for t, mib in samples if t >= warmup]
    if len(steady) < 5:
        return {"ok": False, "reason": f"only {len(steady)} samples after the warm-up (need 5)"}
    fifth = max(1, len(steady) // 5)
    first, last = statistics.median(steady[:fifth]), statistics.median(steady[-fifth:])
    growth = 100 * (last - first) / first
    return {
        "ok": growth <= tolerance_pct,
        "first_mib": round(first, 2),
        "last_mib": round(last, 2),
        "growth_pct": round(growth, 2),
        "tolerance_pct": tolerance_pct,
        "samples": len(steady),
        "per_fifth": fifth,
    }


def error_verdict(errors: Mapping[str, int], scrapes: int) -> dict[str, Any]:
    return {"ok": not any(errors.values()) and scrapes > 0, "scrapes": scrapes, "errors": errors}


# --------------------------------------------------------------------------- HTTP on asyncio


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Endpoint:
    """Where the exporter listens: plain HTTP, or TLS (``tls``) with basic auth."""

    port: int
    tls: ssl.SSLContext | None = None
    authorization: str | None = None  # the Authorization header, with credentials

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.tls is None:
            return await asyncio.open_connection("127.0.0.1", self.port)
        return await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=self.tls, server_hostname="127.0.0.1"
        )


class Connection:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams (Content-Length bodies only)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(
        self, method: str, path: str, headers: Mapping[str, str] = {}, body: bytes = b""
    ) -> Answer:
        if self._streams is None:
            self._streams = await self.endpoint.connect()
        reader, writer = self._streams
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.endpoint.port}"]
        if self.endpoint.authorization is not None:
            lines.append(f"Authorization: {self.endpoint.authorization}")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            answer_headers = {}
            for line in header_lines:
                if ":" in line:
                    name, value = line.split(":", 1)
                    answer_headers[name.strip().lower()] = value.strip()
            if "content-length" not in answer_headers:
                raise ConnectionError("answer without Content-Length")
            payload = await reader.readexactly(int(answer_headers["content-length"]))
        except BaseException:
            self.close()
            raise
        return Answer(int(status_line.split()[1]), answer_headers, payload)

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


# --------------------------------------------------------------------------- load


@dataclass
class Window:
    """Scrapes since the last sample."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class Load:
    window: Window = field(default_factory=Window)
    scrapes: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: list[str] = field(default_factory=list)

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window

    def failed(self, kind: str, detail: str) -> None:
        self.window.errors[kind] += 1
        self.errors[kind] += 1
        if len(self.error_examples) < 10:
            self.error_examples.append(f"{time.strftime('%H:%M:%S')} {kind}: {detail}")


async def scraper(number: int, endpoint: Endpoint, load: Load, stop: asyncio.Event) -> None:
    connection = Connection(endpoint)
    turn = number
    try:
        while not stop.is_set():
            gzipped, openmetrics = VARIANTS[turn % len(VARIANTS)]
            turn += 1
            headers = {"Accept-Encoding": "gzip"} if gzipped else {}
            if openmetrics:
                headers["Accept"] = OPENMETRICS_ACCEPT
            started = time.perf_counter()
            try:
                answer = await connection.request("GET", "/metrics", headers)
            except (
                OSError,
                ssl.SSLError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
            ) as exc:
                load.failed("connection", repr(exc))
                await asyncio.sleep(0.1)
                continue
            load.window.latencies_ms.append((time.perf_counter() - started) * 1000)
            load.scrapes += 1
            problem = check_response(
                gzipped=gzipped,
                openmetrics=openmetrics,
                status=answer.status,
                headers=answer.headers,
                body=answer.body,
            )
            if problem is not None:
                load.failed(problem, f"scraper {number}, {len(answer.body)} bytes")
    finally:
        connection.close()


# --------------------------------------------------------------------------- injection


@dataclass
class Injected:
    """What the injector did, for the verdicts and the report."""

    xids: Counter[tuple[str, str]] = field(default_factory=Counter)
    by_delivery: Counter[str] = field(default_factory=Counter)
    storms: int = 0
    sxids: int = 0
    allocations: int = 0
    releases: int = 0
    losses: list[dict[str, float]] = field(default_factory=list)
    skipped_lost: int = 0
    guarded: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)


class Injector:
    """Seeded random events, posted in order on one control connection."""

    def __init__(self, endpoint: Endpoint, params: Params) -> None:
        self.params = params
        self.rng = random.Random(params.seed)
        self.control = Connection(endpoint)
        self.lock = asyncio.Lock()
        self.done = Injected()
        self.unavailable: set[int] = set()  # lost, or recovered but not yet seen back
        self.pods: dict[int, str] = {}  # GPU -> soak pod on it
        self.next_pod = 0
        self.single: dict[tuple[int, int], tuple[str, float]] = {}  # last one-source Xid
        self.last_loss = -1e9

    async def post(self, events: list[dict[str, Any]]) -> None:
        body = json.dumps(events).encode()
        async with self.lock:
            answer = await self.control.request(
                "POST", EVENTS_PATH, {"Content-Type": "application/json"}, body
            )
        if answer.status != 200:
            raise RuntimeError(f"simulator refused {events}: {answer.body.decode()[:300]}")

    async def scrape(self) -> str:
        async with self.lock:
            answer = await self.control.request("GET", "/metrics")
        return answer.body.decode()

    def pause(self, mean: float) -> float:
        return self.rng.uniform(0.5 * mean, 1.5 * mean)

    # -- Xids

    async def xids(self, stop: asyncio.Event) -> None:
        while not await _sleep_or_stop(stop, self.pause(self.params.xid_every)):
            if self.rng.random() < SXID_P:
                await self.send_sxid()
                continue
            gpu = self.rng.randrange(GPUS)
            code = self.rng.choice(XID_CODES)
            if gpu in self.unavailable:
                self.done.skipped_lost += 1
                continue
            delivery = self._delivery(gpu, code)
            copies = 1
            if self.rng.random() < STORM_P and code not in KMSG_ONLY_CODES:
                copies, delivery = self.rng.randint(3, 6), "both"
                self.done.storms += 1
            event: dict[str, Any] = {"type": "xid", "gpu": gpu, "code": code}
            if delivery is not None:
                event["delivery"] = delivery
            await self.send_xid(event, copies)

    async def send_xid(self, event: dict[str, Any], copies: int = 1) -> None:
        await self.post([event] * copies)
        gpu, code, delivery = event["gpu"], event["code"], event.get("delivery")
        self.done.xids[(str(gpu), str(code))] += copies
        self.done.by_delivery[delivery or "kmsg"] += copies
        if delivery in ("nvml", "kmsg"):
            self.single[(gpu, code)] = (delivery, time.monotonic())

    async def send_sxid(self) -> None:
        switch, code = self.rng.randrange(SWITCHES), self.rng.choice(SXID_CODES)
        severity = self.rng.choice(("fatal", "non_fatal", "correctable"))
        await self.post([{"type": "sxid", "switch": switch, "code": code, "severity": severity}])
        self.done.xids[(sxid_key(switch), str(code))] += 1
        self.done.sxids += 1

    def _delivery(self, gpu: int, code: int) -> str | None:
        if code in KMSG_ONLY_CODES:
            return None  # the simulator's default: kernel log only, like a real driver
        names, weights = zip(*DELIVERIES, strict=True)
        delivery = self.rng.choices(names, weights)[0]
        in_loss_window = time.monotonic() - self.last_loss < LOSS_WINDOW_S
        if self._would_merge(gpu, code, delivery) or (
            delivery == "nvml" and in_loss_window and not self.params.loss_window_probe
        ):
            self.done.guarded += 1
            return "both"
        return delivery

    def _would_merge(self, gpu: int, code: int, delivery: str) -> bool:
        """One-source reports of both kinds within GUARD_S count once (by design): avoid."""
        last = self.single.get((gpu, code))
        return (
            delivery != "both"
            and last is not None
            and last[0] != delivery
            and time.monotonic() - last[1] < GUARD_S
        )

    # -- allocations

    async def allocations(self, stop: asyncio.Event) -> None:
        while not await _sleep_or_stop(stop, self.pause(self.params.alloc_every)):
            free = [g for g in FREE_GPUS if g not in self.pods and g not in self.unavailable]
            if free and (not self.pods or self.rng.random() < 0.5):
                gpu = self.rng.choice(free)
                self.next_pod += 1
                pod = f"soak-{self.next_pod}"
                workload = {
                    "memory": f"{self.rng.randint(4, 60)}GiB",
                    "sm": round(self.rng.uniform(0.05, 0.95), 2),
                }
                event = {"type": "allocate", "gpu": gpu, "pod": pod, "namespace": "soak"}
                await self.post([{**event, "workload": workload}])
                self.pods[gpu] = pod
                self.done.allocations += 1
            elif self.pods:
                gpu = self.rng.choice(sorted(self.pods))
                await self.post(
                    [{"type": "release", "pod": self.pods.pop(gpu), "namespace": "soak"}]
                )
                self.done.releases += 1

    # -- GPU losses

    async def losses(self, stop: asyncio.Event, started: float) -> None:
        while not await _sleep_or_stop(stop, self.pause(self.params.loss_every)):
            gpu = self.rng.randrange(GPUS)
            hold = self.rng.uniform(*self.params.loss_hold)
            await self.lose_and_recover(gpu, hold, started)

    async def lose_and_recover(self, gpu: int, hold: float, started: float) -> None:
        self.unavailable.add(gpu)
        lost_at = self.last_loss = time.monotonic()
        await self.post([{"type": "gpu_lost", "gpu": gpu}])
        if self.params.loss_window_probe:
            await self._probe_loss_window(lost_at, started)
        seen_down = await self._wait_up(gpu, False, limit=hold)
        await asyncio.sleep(max(0.0, hold - (time.monotonic() - lost_at)))
        await self.post([{"type": "gpu_recovered", "gpu": gpu}])
        recovered_at = time.monotonic()
        seen_up = await self._wait_up(gpu, True, limit=120.0)
        self.unavailable.discard(gpu)
        self.done.losses.append(
            {
                "gpu": gpu,
                "at_s": round(lost_at - started, 1),
                "held_s": round(recovered_at - lost_at, 1),
                "seen_down_after_s": round(seen_down - lost_at, 2) if seen_down else -1,
                "seen_up_after_s": round(seen_up - recovered_at, 2) if seen_up else -1,
            }
        )

    async def _probe_loss_window(self, lost_at: float, started: float) -> None:
        """An NVML-only Xid on a healthy GPU while the exporter reacts to the loss."""
        await asyncio.sleep(max(0.0, PROBE_AFTER_S - (time.monotonic() - lost_at)))
        healthy = [g for g in range(GPUS) if g not in self.unavailable]
        codes = [c for c in XID_CODES if c not in KMSG_ONLY_CODES]
        gpu = self.rng.choice(healthy)
        code = next(
            (
                c
                for c in self.rng.sample(codes, len(codes))
                if not self._would_merge(gpu, c, "nvml")
            ),
            None,
        )
        if code is None:
            return
        await self.send_xid({"type": "xid", "gpu": gpu, "code": code, "delivery": "nvml"})
        self.done.probes.append(
            {
                "gpu": gpu,
                "xid": code,
                "after_loss_s": round(time.monotonic() - lost_at, 2),
                "at_s": round(time.monotonic() - started, 1),
            }
        )

    async def _wait_up(self, gpu: int, up: bool, *, limit: float) -> float | None:
        """Poll gpu_up (every 0.25 s) until it reads ``up``; the time it did, or None."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if gpus_up(await self.scrape()).get(gpu) == up:
                return time.monotonic()
            await asyncio.sleep(0.25)
        return None


# --------------------------------------------------------------------------- TLS (--tls)

USER, PASSWORD = "prometheus", "soak-password"
_RELOAD_LINE = re.compile(r'^gpu_exporter_web_config_reloads_total\{result="(\w+)"\} (\S+)', re.M)


class Pki:
    """A throwaway CA, the exporter's web config (TLS and basic auth) and certificate rotations.

    The files are laid out as the kubelet lays out a Secret volume: each name a symlink into
    ``..data``, itself a symlink to a versioned directory that a rotation replaces in one
    ``rename``, so the certificate and key always change together."""

    def __init__(self, directory: Path) -> None:
        import bcrypt  # dev dependencies, needed by --tls only
        import trustme

        self.directory = directory
        self.ca = trustme.CA()
        self.context = ssl.create_default_context()
        self.ca.configure_trust(self.context)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        self._web_yml = (
            "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
            f"basic_auth_users:\n  {USER}: {hashed}\n"
        )
        self.version = 0
        self.served = b""  # the DER of the newest certificate
        self.rotations: list[dict[str, Any]] = []
        directory.mkdir()
        self._publish(self.ca.issue_cert("127.0.0.1"))
        for name in ("web.yml", "server.crt", "server.key"):
            (directory / name).symlink_to(Path("..data") / name)

    @property
    def web_config(self) -> Path:
        return self.directory / "web.yml"

    def endpoint(self, port: int) -> Endpoint:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return Endpoint(port, self.context, f"Basic {token}")

    def _publish(self, certificate: Any) -> None:
        self.version += 1
        version = self.directory / f"..v{self.version}"
        version.mkdir()
        (version / "web.yml").write_text(self._web_yml)
        (version / "server.crt").write_bytes(certificate.cert_chain_pems[0].bytes())
        (version / "server.key").write_bytes(certificate.private_key_pem.bytes())
        staged = self.directory / "..data_tmp"
        staged.symlink_to(version.name)
        os.replace(staged, self.directory / "..data")
        self.served = ssl.PEM_cert_to_DER_cert(certificate.cert_chain_pems[0].bytes().decode())

    async def rotations_task(
        self, endpoint: Endpoint, params: Params, stop: asyncio.Event, started: float
    ) -> None:
        while not await _sleep_or_stop(stop, params.rotate_every):
            self._publish(self.ca.issue_cert("127.0.0.1"))
            at = time.monotonic()
            seen = await self._served_within(endpoint, limit=30.0)
            seen_after = None if seen is None else round(seen, 2)
            self.rotations.append({"at_s": round(at - started, 1), "seen_after_s": seen_after})

    async def _served_within(self, endpoint: Endpoint, limit: float) -> float | None:
        """Seconds until a new connection gets the newest certificate, None if not in ``limit``."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            with contextlib.suppress(OSError, ssl.SSLError):
                _, writer = await endpoint.connect()
                der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
                writer.close()
                if der == self.served:
                    return time.monotonic() - started
            await asyncio.sleep(0.25)
        return None

    def verdict(self, final_exposition: str) -> dict[str, Any]:
        """Every rotation reached new connections, and the exporter took each without a
        refused reload."""
        reloads = {result: float(value) for result, value in _RELOAD_LINE.findall(final_exposition)}
        missed = [r for r in self.rotations if r["seen_after_s"] is None]
        return {
            "ok": bool(self.rotations) and not missed and reloads.get("failure", 0.0) == 0,
            "rotations": len(self.rotations),
            "missed": missed,
            "reloads": reloads,
            "seen_after_s": [r["seen_after_s"] for r in self.rotations],
        }


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``; True when ``stop`` was set meanwhile (or already)."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return stop.is_set()
    return True


# --------------------------------------------------------------------------- the run


@dataclass
class Sample:
    t: float
    rss_mib: float
    scrapes_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    xids_injected: int
    xids_counted: float
    gpus_lost: int


async def sampler(
    proc: Proc, load: Load, injector: Injector, params: Params, started: float, stop: asyncio.Event
) -> list[Sample]:
    samples: list[Sample] = []
    last = next_at = time.monotonic()
    print_header()
    while True:
        next_at += params.sample_every
        if await _sleep_or_stop(stop, max(0.0, next_at - time.monotonic())):
            break
        now = time.monotonic()
        window = load.take_window()
        ordered = sorted(window.latencies_ms)
        counted = xid_counts(await injector.scrape())
        sample = Sample(
            t=round(now - started, 1),
            rss_mib=round(proc_status_kib(proc.pid, "VmRSS") / 1024, 2),
            scrapes_per_s=round(len(ordered) / (now - last), 1),
            p50_ms=round(percentile(ordered, 50), 2) if ordered else float("nan"),
            p99_ms=round(percentile(ordered, 99), 2) if ordered else float("nan"),
            errors=sum(window.errors.values()),
            xids_injected=sum(injector.done.xids.values()),
            xids_counted=sum(counted.values()),
            gpus_lost=len(injector.unavailable),
        )
        last = now
        samples.append(sample)
        print_row(sample)
    return samples


async def settle(injector: Injector, limit: float) -> dict[tuple[str, str], float]:
    """Scrape until the Xid counts equal the injected ones, or stop moving for 5 s."""
    deadline = time.monotonic() + limit
    counted = xid_counts(await injector.scrape())
    steady_since = time.monotonic()
    while time.monotonic() < deadline:
        if xid_verdict(injector.done.xids, counted)["ok"]:
            break
        await asyncio.sleep(0.5)
        now_counted = xid_counts(await injector.scrape())
        if now_counted != counted:
            counted, steady_since = now_counted, time.monotonic()
        elif time.monotonic() - steady_since > 5:
            break
    return counted


async def soak(proc: Proc, params: Params, pki: Pki | None = None) -> dict[str, Any]:
    started = time.monotonic()
    # SIGTERM (kill, a timeout) cancels the run, so main() still stops the exporter child.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    load = Load()
    endpoint = pki.endpoint(proc.port) if pki is not None else Endpoint(proc.port)
    injector = Injector(endpoint, params)
    series_at_start = series_by_metric(await injector.scrape())
    stop_load, stop_events = asyncio.Event(), asyncio.Event()
    scrapers = [
        asyncio.create_task(scraper(n, endpoint, load, stop_load)) for n in range(params.scrapers)
    ]
    events = [
        asyncio.create_task(injector.xids(stop_events)),
        asyncio.create_task(injector.allocations(stop_events)),
        asyncio.create_task(injector.losses(stop_events, started)),
    ]
    if pki is not None:
        events.append(
            asyncio.create_task(pki.rotations_task(endpoint, params, stop_events, started))
        )
    recorder = asyncio.create_task(sampler(proc, load, injector, params, started, stop_load))
    await asyncio.sleep(params.duration)
    stop_events.set()
    await asyncio.gather(*events)  # a loss in progress finishes: its GPU is back
    stop_load.set()
    await asyncio.gather(*scrapers)
    samples = await recorder
    log("load stopped; waiting for the Xid counts to settle")
    counted = await settle(injector, params.settle_limit)
    final = await injector.scrape()
    injector.control.close()
    rss = [(s.t, s.rss_mib) for s in samples]
    xids = xid_verdict(injector.done.xids, counted)
    probed = {(str(p["gpu"]), str(p["xid"])) for p in injector.done.probes}
    for mismatch in xids["mismatches"]:
        mismatch["loss_window_probe"] = (mismatch["gpu"], mismatch["xid"]) in probed
    return {
        "samples": [asdict(s) for s in samples],
        "injected": {
            "xids": sum(injector.done.xids.values()),
            "xids_by_delivery": dict(injector.done.by_delivery),
            "storms": injector.done.storms,
            "sxids": injector.done.sxids,
            "guarded_to_both": injector.done.guarded,
            "skipped_on_lost_gpu": injector.done.skipped_lost,
            "loss_window_probes": injector.done.probes,
            "allocations": injector.done.allocations,
            "releases": injector.done.releases,
            "gpu_losses": injector.done.losses,
        },
        "series": series_growth(series_at_start, series_by_metric(final)),
        "error_examples": load.error_examples,
        "exporter_log": {"levels": dict(proc.levels), "warnings_and_errors": dict(proc.events)},
        "verdicts": {
            "xids": xids,
            "errors": error_verdict(dict(load.errors), load.scrapes),
            "rss": rss_verdict(rss, warmup=params.warmup, tolerance_pct=params.rss_tolerance_pct),
            **({"tls": pki.verdict(final)} if pki is not None else {}),
        },
    }


def series_by_metric(exposition: str) -> Counter[str]:
    """How many series each metric has (the name before ``{`` or the value)."""
    return Counter(
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in exposition.splitlines()
        if line and not line.startswith("#")
    )


def series_growth(start: Counter[str], end: Counter[str]) -> dict[str, Any]:
    changed = {
        name: [start[name], end[name]] for name in sorted(start | end) if start[name] != end[name]
    }
    return {"start": start.total(), "end": end.total(), "changed": changed}


# --------------------------------------------------------------------------- report


COLUMNS = (
    ("t s", 6),
    ("RSS MiB", 8),
    ("scrapes/s", 9),
    ("p50 ms", 8),
    ("p99 ms", 8),
    ("errors", 6),
    ("Xids inj", 8),
    ("counted", 8),
    ("lost", 4),
)


def print_header() -> None:
    print(" ".join(f"{name:>{width}}" for name, width in COLUMNS), flush=True)


def print_row(s: Sample) -> None:
    values = (
        f"{s.t:.0f}",
        f"{s.rss_mib:.1f}",
        f"{s.scrapes_per_s:.0f}",
        f"{s.p50_ms:.1f}",
        f"{s.p99_ms:.1f}",
        str(s.errors),
        str(s.xids_injected),
        f"{s.xids_counted:.0f}",
        str(s.gpus_lost),
    )
    print(" ".join(f"{v:>{w}}" for v, (_, w) in zip(values, COLUMNS, strict=True)), flush=True)


def verdict_lines(verdicts: Mapping[str, Mapping[str, Any]]) -> Iterable[str]:
    x, e, r = verdicts["xids"], verdicts["errors"], verdicts["rss"]
    yield (
        f"Xids:   {'PASS' if x['ok'] else 'FAIL'}  {x['injected']} injected, "
        f"{x['counted']:.0f} counted over {x['pairs']} (gpu, xid) pairs"
        + "".join(
            f"\n        gpu {m['gpu']} xid {m['xid']}: injected {m['injected']}, "
            f"counted {m['counted']:.0f}"
            + (" (includes a loss-window probe)" if m.get("loss_window_probe") else "")
            for m in x["mismatches"]
        )
    )
    yield (
        f"errors: {'PASS' if e['ok'] else 'FAIL'}  {e['scrapes']} scrapes, "
        f"{sum(e['errors'].values())} errors {dict(e['errors']) or ''}"
    )
    if "reason" in r:
        yield f"RSS:    FAIL  {r['reason']}"
    else:
        yield (
            f"RSS:    {'PASS' if r['ok'] else 'FAIL'}  median of first 20% after warm-up "
            f"{r['first_mib']:.1f} MiB, of last 20% {r['last_mib']:.1f} MiB "
            f"({r['growth_pct']:+.1f}%, tolerance {r['tolerance_pct']:.0f}%)"
        )
    if "tls" in verdicts:
        t = verdicts["tls"]
        seen = [s for s in t["seen_after_s"] if s is not None]
        yield (
            f"TLS:    {'PASS' if t['ok'] else 'FAIL'}  {t['rotations']} certificate rotations, "
            f"{len(t['missed'])} not served within 30 s"
            + (f", served after {min(seen):.1f}-{max(seen):.1f} s" if seen else "")
            + f"; exporter reloads {t['reloads']}"
        )


def markdown(report: Mapping[str, Any]) -> str:
    """The table (at most MARKDOWN_ROWS evenly spaced samples) and verdicts as Markdown."""
    out = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    samples = report["samples"]
    step = math.ceil(len(samples) / MARKDOWN_ROWS)  # every sample stays in the JSON
    for s in samples[step - 1 :: step]:
        out.append(
            f"| {s['t']:.0f} | {s['rss_mib']:.1f} | {s['scrapes_per_s']:.0f} | {s['p50_ms']:.1f} "
            f"| {s['p99_ms']:.1f} | {s['errors']} | {s['xids_injected']} "
            f"| {s['xids_counted']:.0f} | {s['gpus_lost']} |"
        )
    out.append("")
    out.extend(f"    {line}" for line in "\n".join(verdict_lines(report["verdicts"])).splitlines())
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> tuple[Params, argparse.Namespace]:
    defaults = Params()
    parser = argparse.ArgumentParser(description="gpu-exporter soak (see bench/README.md)")
    add = parser.add_argument
    add("--duration", type=float, default=defaults.duration, help="seconds of load (default 600)")
    add("--scrapers", type=int, default=defaults.scrapers, help="concurrent scrapers (default 64)")
    add("--seed", type=int, default=defaults.seed, help="seed of the injection schedule")
    add("--sample-every", type=float, help="seconds between samples (default duration/60, >= 1)")
    add("--warmup", type=float, help="seconds before RSS counts (default min(60, duration/5))")
    add("--rss-tolerance", type=float, default=defaults.rss_tolerance_pct, help="percent (5)")
    add("--xid-every", type=float, default=defaults.xid_every, help="mean s between Xids (3)")
    add("--loss-every", type=float, help="mean s between GPU losses (min(60, duration/3))")
    add(
        "--loss-window-probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after each GPU loss, an NVML-only Xid on a healthy GPU (default on); with --no-..., "
        "no NVML-only Xid in the 2.5 s after a loss",
    )
    add(
        "--tls",
        action="store_true",
        help="serve HTTPS with basic auth (a throwaway CA) and rotate the certificate",
    )
    add(
        "--rotate-every",
        type=float,
        default=defaults.rotate_every,
        help="with --tls: seconds between certificate rotations (60)",
    )
    add("--out", type=Path, default=BENCH / "results" / "soak.json")
    add("--markdown", type=Path, metavar="SOAK.json", help="print a result as Markdown and exit")
    args = parser.parse_args(argv)
    params = Params(
        duration=args.duration,
        scrapers=args.scrapers,
        seed=args.seed,
        sample_every=args.sample_every or min(10.0, max(1.0, args.duration / 60)),
        warmup=args.warmup if args.warmup is not None else min(60.0, args.duration / 5),
        rss_tolerance_pct=args.rss_tolerance,
        xid_every=args.xid_every,
        loss_every=args.loss_every or min(defaults.loss_every, args.duration / 3),
        loss_window_probe=args.loss_window_probe,
        tls=args.tls,
        rotate_every=args.rotate_every,
    )
    return params, args


def main(argv: list[str] | None = None) -> int:
    params, args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())), end="")
        return 0
    report: dict[str, Any] = {"machine": harness.machine_info(), "params": asdict(params)}
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        (work / "kmsg").touch()
        pki = Pki(work / "web") if params.tls else None
        extra = [f"--web.config.file={pki.web_config}"] if pki is not None else []
        args_ = harness.exporter_args(SCENARIO, work, extra)
        proc = start_gpu_exporter([sys.executable, "-m", "gpu_exporter", *args_])
        try:
            wait_ready(proc, pki.context if pki is not None else None)
            log(f"exporter pid {proc.pid} on port {proc.port}; {params.duration:.0f} s of soak")
            report.update(asyncio.run(soak(proc, params, pki)))
            report["exporter_peak_rss_mib"] = round(proc_status_kib(proc.pid, "VmHWM") / 1024, 2)
        except asyncio.CancelledError:
            log("stopped by SIGTERM; no verdicts")
            return 128 + signal.SIGTERM
        finally:
            proc.stop()
    report["scenario"] = str(SCENARIO.relative_to(ROOT))
    passed = all(v["ok"] for v in report["verdicts"].values())
    report["passed"] = passed
    harness.write_json(args.out, report)
    print()
    for line in verdict_lines(report["verdicts"]):
        print(line)
    print(f"soak {'PASSED' if passed else 'FAILED'}; wrote {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
