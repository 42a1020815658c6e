"""The HTTP control surface injects events into a running simulated exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_exporter.simulator import SimulatedNode, loads_scenario
from gpu_exporter.simulator.control import make_routes

SCENARIO = """
gpus:
  - {model: H100-SXM-80GB, count: 2}
workloads:
  - {gpu: 0, pod: web, namespace: prod, sm: 0.5}
"""


@pytest.fixture
def node() -> SimulatedNode:
    return SimulatedNode(loads_scenario(SCENARIO, "control.yaml"), clock=lambda: 0.0)


@pytest.fixture
async def client(node: SimulatedNode) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    app.add_routes(make_routes(node))
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client
    node.close()


async def test_post_one_json_event(
    client: TestClient[web.Request, web.Application], node: SimulatedNode
) -> None:
    response = await client.post("/-/simulator/events", json={"type": "xid", "gpu": 1, "code": 48})
    assert response.status == 200
    assert await response.json() == {"applied": [{"t": 0.0, "type": "xid", "gpu": 1, "code": 48}]}
    assert ": 48, " in node.kmsg_lines[-1]


async def test_post_an_sxid(
    client: TestClient[web.Request, web.Application], node: SimulatedNode
) -> None:
    event = {"type": "sxid", "switch": 11, "code": 12028, "link": 7, "message": "PRIV error"}
    response = await client.post("/-/simulator/events", json=event)
    assert response.status == 200
    assert await response.json() == {"applied": [{"t": 0.0, **event}]}
    assert node.kmsg_lines[0].endswith(
        ";nvidia-nvswitch11: SXid (PCI:0000:10:00.0): 12028, Non-fatal, Link 07 PRIV error"
    )
    response = await client.post("/-/simulator/events", json=[{"type": "sxid", "code": 1}])
    assert response.status == 400
    assert await response.text() == "<request>: [0].switch: required key is missing\n"


async def test_post_a_yaml_list(
    client: TestClient[web.Request, web.Application], node: SimulatedNode
) -> None:
    body = """
    - {type: throttle, gpu: all, reason: hw_slowdown}
    - {type: gpu_lost, gpu: 1}
    """
    response = await client.post(
        "/-/simulator/events", data=body, headers={"Content-Type": "application/yaml"}
    )
    assert response.status == 200
    assert [e["type"] for e in (await response.json())["applied"]] == ["throttle", "gpu_lost"]
    assert node.gpus[1].lost
    assert node.gpus[0].throttles == {"hw_slowdown"}


async def test_bad_event_is_a_400_with_the_reason(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.post("/-/simulator/events", json=[{"type": "xid", "gpu": 9, "code": 1}])
    assert response.status == 400
    assert await response.text() == (
        "<request>: [0].gpu: gpu index 9 out of range (the node has 2 GPUs)\n"
    )
    response = await client.post("/-/simulator/events", data="")
    assert response.status == 400


async def test_get_scenario_summarises_the_state(
    client: TestClient[web.Request, web.Application],
) -> None:
    await client.post("/-/simulator/events", json={"type": "ecc", "gpu": 0, "corrected": 2})
    response = await client.get("/-/simulator/scenario")
    assert response.status == 200
    summary = await response.json()
    assert summary["source"] == "control.yaml"
    gpu0 = summary["gpus"][0]
    assert gpu0["ecc"]["aggregate"]["corrected"] == 2
    assert gpu0["workloads"][0]["pod"] == "web"
    assert summary["recent_events"][-1]["type"] == "ecc"


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (  # JSON can spell a lone UTF-16 surrogate; no kernel text can hold one
            '{"type": "xid", "gpu": 0, "code": 13, "message": "bad \\ud800 text"}',
            "<request>: message: 'bad \\ud800 text' is not valid Unicode text (a lone surrogate)\n",
        ),
        (
            '{"type": "xid", "gpu": 0, "code": 13, "\\ud800": 1}',
            '<request>: ["\\ud800"]: unknown key (allowed: code, delivery, gpu, message, mig, '
            "pid, process_name, type)\n",
        ),
        (  # a dotted key is quoted, so the path cannot be read as two keys
            '{"type": "xid", "gpu": 0, "code": 13, "pid.x": 1}',
            '<request>: ["pid.x"]: unknown key (allowed: code, delivery, gpu, message, mig, '
            "pid, process_name, type)\n",
        ),
    ],
    ids=["surrogate-value", "surrogate-key", "dotted-key"],
)
async def test_odd_text_is_a_located_400_not_a_crash(
    client: TestClient[web.Request, web.Application], body: str, answer: str
) -> None:
    response = await client.post(
        "/-/simulator/events", data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    assert await response.text() == answer
