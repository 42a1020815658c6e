"""Closed-loop HTTP/1.1 keep-alive load: N scrapers, each sending its next request as soon as the
previous response has been read, for a bounded time. Two interchangeable generators:

- ``wrk`` (C, one thread, ``-c N``; latency percentiles from its histogram via a Lua ``done``
  hook). Used when ``wrk`` is on PATH (``apt-get install wrk``): it costs the machine least.
  wrk 4.1 corrects the histogram for coordinated omission before ``done`` sees it
  (``stats_correct``: a latency of k request periods adds samples at k-1, k-2... periods), so
  its p99 weighs each stall by how long it lasted, as a scraper on a timer would meet it.
- ``python``: an asyncio client on raw sockets (no HTTP library), one connection per scraper,
  per-request latencies timed with ``perf_counter_ns``, uncorrected; a fallback that costs more
  CPU.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WRK_SCRIPT = """
wrk.method = "GET"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,"bytes":%d}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max, summary.bytes))
end
"""


@dataclass
class LoadResult:
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    rps: float
    body_bytes: float  # mean bytes per response (headers included for wrk)
    generator: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def pick_generator(preference: str) -> str:
    if preference == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    if preference == "wrk" and not shutil.which("wrk"):
        raise SystemExit("--client wrk: wrk is not on PATH (apt-get install -y wrk)")
    return preference


def run_load(
    generator: str,
    port: int,
    *,
    concurrency: int,
    gzip: bool,
    seconds: float,
    path: str = "/metrics",
) -> LoadResult:
    if generator == "wrk":
        return _run_wrk(port, concurrency=concurrency, gzip=gzip, seconds=seconds, path=path)
    return asyncio.run(
        _run_python(port, concurrency=concurrency, gzip=gzip, seconds=seconds, path=path)
    )


# --------------------------------------------------------------------------- wrk


def _run_wrk(port: int, *, concurrency: int, gzip: bool, seconds: float, path: str) -> LoadResult:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    try:
        command = [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "30s",
            "-s",
            script.name,
        ]
        if gzip:
            command += ["-H", "Accept-Encoding: gzip"]
        command.append(f"http://127.0.0.1:{port}{path}")
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 60, check=False
        )
    finally:
        Path(script.name).unlink(missing_ok=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith('{"requests"')), None)
    if line is None:
        raise RuntimeError(
            f"wrk failed ({out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}"
        )
    data = json.loads(line)
    requests = int(data["requests"])
    return LoadResult(
        requests=requests,
        errors=int(data["errors"]),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        max_ms=data["max_us"] / 1000,
        rps=requests / (data["duration_us"] / 1e6),
        body_bytes=data["bytes"] / max(1, requests),
        generator="wrk",
    )


# --------------------------------------------------------------------------- python


async def _run_python(
    port: int, *, concurrency: int, gzip: bool, seconds: float, path: str
) -> LoadResult:
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    if gzip:
        request += "Accept-Encoding: gzip\r\n"
    payload = (request + "\r\n").encode()
    latencies: list[int] = []
    sizes: list[int] = []
    errors = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def scraper() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter_ns()
                writer.write(payload)
                head = await reader.readuntil(b"\r\n\r\n")
                status = head[9:12]
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                        break
                else:
                    raise RuntimeError("response without Content-Length")
                await reader.readexactly(length)
                latencies.append(time.perf_counter_ns() - t0)
                sizes.append(length)
                if status != b"200":
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(scraper() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return summarize_ns(latencies, errors=errors, elapsed=elapsed, sizes=sizes, generator="python")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize_ns(
    latencies_ns: list[int], *, errors: int, elapsed: float, sizes: list[int], generator: str
) -> LoadResult:
    ms = sorted(v / 1e6 for v in latencies_ns)
    return LoadResult(
        requests=len(ms),
        errors=errors,
        p50_ms=percentile(ms, 50),
        p99_ms=percentile(ms, 99),
        max_ms=ms[-1] if ms else math.nan,
        rps=len(ms) / elapsed if elapsed > 0 else math.nan,
        body_bytes=sum(sizes) / max(1, len(sizes)),
        generator=generator,
    )


def median_cell(cells: list[LoadResult]) -> dict[str, Any]:
    """The cell with the median p99 of repeated cells (the upper one of an even count), whole, so
    that its p50, p99 and rate come from one measurement; every cell's p99 is kept beside it, in
    the order measured, under ``p99_ms_cells``."""
    if not cells:
        raise ValueError("median_cell needs at least one cell")
    ranked = sorted(cells, key=lambda cell: cell.p99_ms)
    kept: dict[str, Any] = ranked[len(ranked) // 2].as_dict()
    if len(cells) > 1:
        kept["p99_ms_cells"] = [round(cell.p99_ms, 4) for cell in cells]
    return kept
