"""Hostile YAML and request bodies: alias bombs, endless values quoted in errors, bytes that are
not UTF-8, JSON nested beyond any use, events from off the node. Each is refused fast, in one
line, with what and where."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from gpu_exporter.http.webconfig import WebConfigError, parse_web_config
from gpu_exporter.safeyaml import MAX_NODES, YamlBudgetError, load, quote
from gpu_exporter.simulator import ScenarioError, SimulatedNode, load_scenario, loads_scenario
from gpu_exporter.simulator.control import EVENTS_PATH, _loopback, make_routes

# "Billion laughs" in under 1 KiB: nine levels of nine aliases, 9**9 values once expanded.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)
SCENARIO = "gpus:\n  - {model: H100-SXM-80GB, count: 1}\n"
Client = TestClient[web.Request, web.Application]


def test_the_bomb_is_small() -> None:
    assert len(BOMB) < 1024
    assert BOMB.count("*") == 72


def refused_cheaply(call: object) -> str:
    """Run ``call``; it must raise, and allocate little while doing so. Returns the message."""
    tracemalloc.start()
    try:
        try:
            call()  # type: ignore[operator]
        except (ScenarioError, WebConfigError, YamlBudgetError) as exc:
            message = str(exc)
        else:
            raise AssertionError("accepted")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB to refuse it"
    return message


def test_an_alias_bomb_in_a_scenario_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(SCENARIO + BOMB)
    message = refused_cheaply(lambda: load_scenario(path))
    assert message.startswith(f"{path}: (yaml): more than {MAX_NODES} values once aliases")
    assert "\n" not in message


def test_aliases_a_scenario_needs_still_work() -> None:
    scenario = loads_scenario(
        SCENARIO + "workloads:\n  - &w {gpu: 0, pod: a, namespace: n, sm: 0.5}\n"
        "  - {<<: *w, pod: b}\n",
        "merge.yaml",
    )
    assert [w.pod for w in scenario.workloads] == ["a", "b"]


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(YamlBudgetError, match="recursive alias"):
        load("a: &a [1, *a]\n")


def test_an_alias_bomb_in_a_web_config_is_refused(tmp_path: Path) -> None:
    # The same function reads the file at start and on every reload.
    message = refused_cheaply(lambda: parse_web_config(BOMB, tmp_path / "web.yml"))
    assert "values once aliases are expanded" in message


def test_values_quoted_in_errors_are_cut() -> None:
    huge = "x" * 1_000_000
    with pytest.raises(ScenarioError) as caught:
        loads_scenario(f"node: {{uptime: '{huge}'}}\n" + SCENARIO, "long.yaml")
    assert len(str(caught.value)) < 300, "the whole value was quoted"
    with pytest.raises(ScenarioError) as caught:
        loads_scenario(f"node: {{'{huge}.': 1}}\n" + SCENARIO, "key.yaml")
    assert len(str(caught.value)) < 300, "the whole key was quoted"
    assert len(quote(list(range(10**6)))) < 100


def test_a_scenario_that_is_not_utf8_is_one_line_and_status_2(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SCENARIO.encode() + b"# caf\xe9\n")
    with pytest.raises(ScenarioError, match=r"latin1.yaml: \(file\): not UTF-8 text"):
        load_scenario(path)
    done = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", f"--simulate={path}", "--listen=127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "not UTF-8 text (invalid byte at offset" in done.stderr


@pytest.mark.parametrize(
    ("timeline", "says"),
    [
        ("node: {uptime: .inf}\n", "node.uptime: duration must be at most 100 years"),
        ("node: {uptime: .nan}\n", "node.uptime: duration must be at most 100 years"),
        (
            "timeline: [{at: 1m, repeat: every 0.000001s, type: ecc, gpu: 0, corrected: 1}]\n",
            "timeline[0].repeat: repeat period must be at least 100ms",
        ),
    ],
)
def test_durations_that_would_spin_or_throw_are_refused(timeline: str, says: str) -> None:
    with pytest.raises(ScenarioError, match=says.replace("[", r"\[").replace(".", r"\.")):
        loads_scenario(SCENARIO + timeline, "t.yaml")


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = SimulatedNode(loads_scenario(SCENARIO, "control.yaml"), clock=lambda: 0.0)
    app = web.Application(client_max_size=64 * 1024)
    app.add_routes(make_routes(node))
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client
    node.close()


async def post(client: Client, body: bytes, content_type: str) -> tuple[int, str]:
    async with client.post(EVENTS_PATH, data=body, headers={"Content-Type": content_type}) as r:
        return r.status, await r.text()


async def test_an_alias_bomb_posted_to_the_simulator_is_refused(client: Client) -> None:
    status, text = await post(client, BOMB.encode(), "application/yaml")
    assert status == 400
    assert "aliases (*name) are not allowed here" in text


@pytest.mark.parametrize(
    ("body", "content_type", "says"),
    [
        (b'{"type": "xid"}', "application/json; charset=bogus-42", "unsupported charset"),
        (b'{"type": "\xff"}', "application/json", "not UTF-8 text"),
        (b"[" * 30_000 + b"]" * 30_000, "application/json", "nested too deeply"),
        (b"type: \xff", "application/yaml", "not UTF-8 text"),
    ],
)
async def test_unreadable_bodies_are_400_not_500(
    client: Client, body: bytes, content_type: str, says: str
) -> None:
    status, text = await post(client, body, content_type)
    assert (status, text.count("\n")) == (400, 1), text
    assert says in text


class _Transport:
    """A connection from ``peer``: only a mocked request can come from off loopback here."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def get_extra_info(self, name: str, default: object = None) -> object:
        return (self._peer, 40000) if name == "peername" else default


async def test_events_from_off_the_node_are_refused_unless_asked() -> None:
    node = SimulatedNode(loads_scenario(SCENARIO, "control.yaml"), clock=lambda: 0.0)
    try:
        (route,) = [r for r in make_routes(node) if r.path == EVENTS_PATH]  # type: ignore[attr-defined]
        for peer in ("10.1.2.3", "fd00::1", "::ffff:10.1.2.3"):
            request = make_mocked_request("POST", EVENTS_PATH, transport=_Transport(peer))
            response = await route.handler(request)  # type: ignore[attr-defined]
            assert response.status == 403, peer
            assert "--simulate.remote-events" in response.text
        assert node.kmsg_lines == []
    finally:
        node.close()


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
def test_loopback_peers_are_loopback(peer: str) -> None:
    assert _loopback(peer)


def test_a_kmsg_path_in_a_missing_directory_names_the_real_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "k"
    argv = ["--simulate", "--listen=127.0.0.1:0", f"--kmsg-path={missing}"]
    done = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "cannot listen" not in done.stderr
    why = "cannot create the simulator's kernel log: No such file or directory"
    assert done.stderr.strip().endswith(f"--kmsg-path {missing}: {why}")
