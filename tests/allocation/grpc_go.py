"""A real grpc-go pod-resources server (grpcgo/kubelet.go), built once per test session.

The kubelet is grpc-go; this is the same library (Debian's ``golang-google-grpc-dev``, built
offline in GOPATH mode), answering bytes the test writes with Python's protobuf. The binary is
kept in the temporary directory under the source's hash, so a later session reuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from google.protobuf.message import Message
from grpclib.const import Status

from tests.conftest import require_binary

SOURCE = Path(__file__).parent / "grpcgo" / "kubelet.go"
GOPATH = Path("/usr/share/gocode")  # golang-google-grpc-dev's sources


def build_go_kubelet() -> Path:
    """The server's binary, built unless this source's build is already there."""
    go = require_binary("go")
    if not (GOPATH / "src" / "google.golang.org" / "grpc").is_dir():
        missing = f"grpc-go's sources are not in {GOPATH} (apt-get install golang-google-grpc-dev)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing}, and CI must run this test (see .ci/run)")
        pytest.skip(missing)
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    home = Path(tempfile.gettempdir()) / f"gpu-exporter-go-kubelet-{digest}"
    binary = home / "kubelet"
    if binary.exists():
        return binary
    home.mkdir(exist_ok=True)
    partial = home / f"kubelet.{os.getpid()}"
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{GOPATH}:{home / 'gopath'}",
        "GOCACHE": str(home / "cache"),
        "GOPROXY": "off",
        "GOFLAGS": "",
    }
    subprocess.run([go, "build", "-o", str(partial), str(SOURCE)], env=env, check=True)
    partial.replace(binary)  # whole or not at all, for a session running beside this one
    return binary


class GoKubelet:
    """One grpc-go server process on ``socket``, answering what :meth:`answer` wrote."""

    def __init__(self, binary: Path, socket: Path, *args: str) -> None:
        self.binary = binary
        self.socket = socket
        self.answers = socket.parent / f"{socket.stem}-answers"
        self.answers.mkdir(exist_ok=True)
        self._args = args
        self.answered: Counter[str] = Counter()  # answers sent, by method
        self.connections = 0  # connections accepted, by every process started so far
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    def answer(self, method: str, message: Message) -> None:
        """``method`` answers ``message`` from its next call on."""
        with contextlib.suppress(FileNotFoundError):
            (self.answers / f"{method}.status").unlink()
        self._write(f"{method}.bin", message.SerializeToString())

    def refuse(self, method: str, status: Status, message: str) -> None:
        self._write(f"{method}.status", f"{status.value} {message}".encode())

    def _write(self, name: str, data: bytes) -> None:
        partial = self.answers / f".{name}"
        partial.write_bytes(data)
        partial.replace(self.answers / name)  # a call reads the old answer or the new one

    async def start(self) -> None:
        process = await asyncio.create_subprocess_exec(
            str(self.binary),
            f"-socket={self.socket}",
            f"-answers={self.answers}",
            *self._args,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line == b"ready\n", f"the grpc-go kubelet did not start: {line!r}"
        self._process = process
        self._reader = asyncio.create_task(self._read(process.stdout))

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            kind, _, rest = line.decode().partition(" ")
            if kind == "answered":
                self.answered[rest.split()[0]] += 1
            elif kind == "connection":
                self.connections += 1

    async def stop(self, *, graceful: bool = True) -> None:
        """SIGTERM (grpc-go's GracefulStop) or SIGKILL, and wait for the process to end."""
        process, self._process = self._process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        await asyncio.wait_for(process.wait(), 30)
        if self._reader is not None:
            await self._reader  # every line it printed is counted
