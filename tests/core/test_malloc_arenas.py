"""The exporter caps glibc's malloc arenas at start: its threads cannot grow RSS an arena each."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from gpu_exporter.cli import MALLOC_ARENAS, cap_malloc_arenas

# Eight threads allocate at once, then glibc's malloc_info(3) lists the arenas (one <heap> each).
COUNT_ARENAS = textwrap.dedent(
    """
    import ctypes, sys, tempfile, threading
    from gpu_exporter.cli import cap_malloc_arenas
    if sys.argv[1] == "capped":
        assert cap_malloc_arenas({}), "mallopt refused the cap"
    started = threading.Barrier(8)
    def allocate():
        started.wait()
        kept = [bytearray(100_000) for _ in range(10)]
    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.fclose.argtypes = (ctypes.c_void_p,)
    with tempfile.NamedTemporaryFile("r") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        print(out.read().count("<heap nr="))
    """
)


def arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_threads_share_the_capped_arenas() -> None:
    uncapped, capped = arenas("uncapped"), arenas("capped")
    assert uncapped > MALLOC_ARENAS, f"without the cap the threads made only {uncapped} arenas"
    assert capped <= MALLOC_ARENAS, f"with the cap the threads made {capped} arenas"


def test_an_operators_malloc_arena_max_is_left_alone() -> None:
    assert cap_malloc_arenas({"MALLOC_ARENA_MAX": "4"}) is False
