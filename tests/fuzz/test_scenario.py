"""Properties of the scenario loader: any text, and any mutation of a real scenario, gives a valid
scenario or a one-line ScenarioError that names the file and a key path that exists in the input."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.simulator.errors import ScenarioError
from gpu_exporter.simulator.loader import loads_scenario, parse_scenario
from gpu_exporter.simulator.scenario import Scenario

SOURCE = "fuzzed.yaml"
REPO = Path(__file__).resolve().parents[2]


def real_scenarios() -> list[Any]:
    builtin = resources.files("gpu_exporter.simulator").joinpath("data/builtin.yaml")
    texts = [builtin.read_text("utf-8")]
    texts += [p.read_text("utf-8") for p in sorted((REPO / "demo/scenarios").glob("*.yaml"))]
    return [yaml.safe_load(text) for text in texts]


SCENARIOS = real_scenarios()


def load(call: Any, *args: Any) -> Scenario | ScenarioError:
    try:
        scenario = call(*args, SOURCE)
    except ScenarioError as exc:
        error = exc
    else:
        assert isinstance(scenario, Scenario)
        assert scenario.gpus, "a valid scenario has GPUs"
        return scenario
    assert "\n" not in str(error), f"not one line: {error}"
    str(error).encode("utf-8")  # it is written to a log or an HTTP answer: must be text
    assert str(error).startswith(f"{SOURCE}: {error.path}: "), f"file and key path first: {error}"
    return error


# ---------------------------------------------------------------------------------------- text

_FRAGMENTS = [
    "gpus:", "node:", "workloads:", "timeline:", "allocations:", " model: ", "H100-SXM-80GB",
    "\n", "\n  ", "\n- ", "- ", "{", "}", "[", "]", ", ", ": ", "count: ", "mig: ", "1g.10gb",
    "at: ", "90s", "type: ", "xid", "0", "-1", "1e400", ".nan", "~", "&a ", "*a", "<<: ", "!!set ",
    "!!python/object:x ", "? ", "'", '"', "#", "1" * 5000, "2024-01-01", "---\n", "\t",
]  # fmt: skip
yaml_like = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), max_size=30).map(
    "".join
)


@given(yaml_like)
@example("gpus: " + "1" * 5000)  # PyYAML's int() refuses 4300+ digits: ValueError
@example("[" * 1000)  # PyYAML composes recursively: RecursionError
@example("gpus: [H100-SXM-80GB]\nnode: {uptime: " + "9" * 5000 + "}")
@example("gpus: [{model: H100-SXM-80GB, mig: [[]]}]")  # a list as a MIG profile: TypeError
def test_any_text_is_a_scenario_or_a_located_error(text: str) -> None:
    load(loads_scenario, text)


# ------------------------------------------------------------------------------- mutations


def paths(data: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every key path in a parsed document, the root included."""
    found = [prefix]
    if isinstance(data, Mapping):
        for key, value in data.items():
            found += paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += paths(value, (*prefix, index))
    return found


def replace(data: Any, path: tuple[str | int, ...], value: Any) -> Any:
    if not path:
        return value
    data[path[0]] = replace(data[path[0]], path[1:], value)
    return data


_SCALARS = ["90s", "every 30s", "50%", "120%", "idle", "bursty", "H100-SXM-80GB", "1g.10gb",
            "nvidia.com/gpu", "xid", "ecc", "71GiB", "-5s", "", " ", "GPU-x",
            "lone \ud800 surrogate"]  # fmt: skip
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(_SCALARS),
    # Odd keys too: an error's key path quotes them (["1g.10gb"]), so they cannot read as two.
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["gpu", "mig", "type", "at", "pod", "model", "x", "1g.10gb", "a b"]),
            inner,
        )
    ),
    max_leaves=6,
)


def segments(key_path: str) -> list[str | int]:
    """``timeline[3].params["a.b"]`` -> ``["timeline", 3, "params", "a.b"]``."""
    found: list[str | int] = []
    for name, index, quoted in re.findall(
        r'([^.\[\]"]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]', key_path
    ):
        found.append(int(index) if index else json.loads(quoted) if quoted else name)
    return found


def assert_path_exists(data: Any, key_path: str) -> None:
    """All but the last segment walk the input (the last may be the missing required key)."""
    if key_path == "(root)":
        return
    node = data
    for part in segments(key_path)[:-1]:
        in_mapping = isinstance(node, Mapping) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_mapping or in_list:
            node = node[part]
        else:
            raise AssertionError(f"error names {key_path!r}, which is not in the input")


@given(st.data(), st.sampled_from(range(len(SCENARIOS))), values)
def test_a_mutated_scenario_is_valid_or_names_the_broken_key(
    data: st.DataObject, which: int, value: Any
) -> None:
    document = copy.deepcopy(SCENARIOS[which])
    target = data.draw(st.sampled_from(paths(document)), label="replaced")
    mutated = replace(document, target, value)
    outcome = load(parse_scenario, mutated)
    if isinstance(outcome, ScenarioError):
        assert_path_exists(mutated, outcome.path)


def test_the_real_scenarios_load() -> None:
    for document in SCENARIOS:
        assert isinstance(load(parse_scenario, document), Scenario)
