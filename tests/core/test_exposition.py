"""The exposition: both encodings, escaping, family grouping, content negotiation, gzip."""

from __future__ import annotations

import gzip

import pytest

from gpu_exporter.exposition import (
    EMPTY_BLOCK,
    Block,
    BlockWriter,
    Sample,
    counter,
    format_value,
    gauge,
    label_string,
    render,
    render_block,
    render_blocks,
    wants_openmetrics,
)
from tests.conftest import promtool_check_metrics

POWER = gauge("gpu_power_watts", "Power draw, in watts.")
ENERGY = counter("gpu_energy_joules_total", "Energy consumed, in joules.")
UNUSED = gauge("gpu_unused_ratio", "Never sampled.")


def gpu(index: int) -> str:
    return label_string({"gpu": str(index), "uuid": f"GPU-{index}"})


def test_text_format_groups_samples_by_family_in_declared_order() -> None:
    samples = [
        Sample(ENERGY, gpu(0), 10.5),
        Sample(POWER, gpu(0), 300),
        Sample(POWER, gpu(1), 250.25),
    ]
    text = render(samples, [POWER, ENERGY]).text.decode()
    assert text == (
        "# HELP gpu_power_watts Power draw, in watts.\n"
        "# TYPE gpu_power_watts gauge\n"
        'gpu_power_watts{gpu="0",uuid="GPU-0"} 300\n'
        'gpu_power_watts{gpu="1",uuid="GPU-1"} 250.25\n'
        "# HELP gpu_energy_joules_total Energy consumed, in joules.\n"
        "# TYPE gpu_energy_joules_total counter\n"
        'gpu_energy_joules_total{gpu="0",uuid="GPU-0"} 10.5\n'
    )


def test_openmetrics_names_counter_families_without_total_and_ends_with_eof() -> None:
    body = render([Sample(ENERGY, gpu(0), 1)], [ENERGY]).openmetrics.decode()
    assert "# TYPE gpu_energy_joules counter\n" in body
    assert 'gpu_energy_joules_total{gpu="0",uuid="GPU-0"} 1\n' in body
    assert body.endswith("# EOF\n")


def test_blocks_rendered_once_join_into_one_group_per_family_in_block_order() -> None:
    # A slow collector's block is kept between its rounds; a fast one's is new each round.
    slow = render_block([Sample(ENERGY, gpu(0), 10.5), Sample(POWER, gpu(0), 300)])
    fast = BlockWriter(prefix=gpu(1))
    fast.add(POWER, 250.25)
    fast.add(ENERGY, 7, 'source="field"')
    joined = render_blocks([slow, fast.block()], [POWER, ENERGY])
    assert joined.text.decode() == (
        "# HELP gpu_power_watts Power draw, in watts.\n"
        "# TYPE gpu_power_watts gauge\n"
        'gpu_power_watts{gpu="0",uuid="GPU-0"} 300\n'
        'gpu_power_watts{gpu="1",uuid="GPU-1"} 250.25\n'
        "# HELP gpu_energy_joules_total Energy consumed, in joules.\n"
        "# TYPE gpu_energy_joules_total counter\n"
        'gpu_energy_joules_total{gpu="0",uuid="GPU-0"} 10.5\n'
        'gpu_energy_joules_total{gpu="1",uuid="GPU-1",source="field"} 7\n'
    )
    again = render_blocks([slow, fast.block()], [POWER, ENERGY])
    assert again.text == joined.text, "a kept block renders the same bytes every time"


def test_a_part_that_writes_what_it_wrote_last_run_keeps_its_block_and_its_lines() -> None:
    def run(power: float, previous: Block = EMPTY_BLOCK) -> Block:
        writer = BlockWriter(prefix=gpu(0))
        writer.add(POWER, power)
        writer.add(ENERGY, 7)
        return writer.block(previous)

    first = run(300).format()
    assert run(300, first) is first, "the same samples as last run made a new block"
    changed = run(250.25, first)
    assert changed is not first, "a changed value kept the previous block"
    assert changed.families is first.families, "the same families made a new families tuple"
    assert render_blocks([changed], [POWER]).text.decode().splitlines()[2] == (
        'gpu_power_watts{gpu="0",uuid="GPU-0"} 250.25'
    )
    other_device = BlockWriter(prefix=gpu(1))
    other_device.add(POWER, 300)
    other_device.add(ENERGY, 7)
    assert other_device.block(first) is not first, "another device's labels kept the block"


def test_families_without_samples_are_omitted() -> None:
    text = render([Sample(POWER, gpu(0), 1)], [UNUSED, POWER]).text.decode()
    assert "gpu_unused_ratio" not in text


def test_label_values_are_escaped() -> None:
    labels = label_string({"pod": 'we"ird\\name\nx'})
    assert labels == 'pod="we\\"ird\\\\name\\nx"'


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.0, "1"), (0.5, "0.5"), (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (1e20, "1e+20")],
)
def test_values_are_formatted_as_prometheus_expects(value: float, expected: str) -> None:
    assert format_value(value) == expected


@pytest.mark.parametrize(
    "value", [0, 3, -0.0, 1e15, 1e15 - 1, -1e15, 2**63, 0.1, float("nan"), float("-inf")]
)
def test_a_block_writes_each_value_as_format_value_does(value: float) -> None:
    writer = BlockWriter()
    writer.add(POWER, value)
    (body,) = writer.block().lines
    assert body == f"gpu_power_watts {format_value(value)}\n"


def test_nan_is_rendered_as_nan() -> None:
    assert format_value(float("nan")) == "NaN"


def test_counter_and_gauge_names_follow_conventions() -> None:
    with pytest.raises(ValueError, match="must end in _total"):
        counter("gpu_energy_joules", "x")
    with pytest.raises(ValueError, match="must not end in _total"):
        gauge("gpu_things_total", "x")


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        ("", False),
        ("text/plain", False),
        (
            "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            True,
        ),
        ("application/openmetrics-text;q=0.2,text/plain;q=0.9", False),
        ("application/openmetrics-text;q=0", False),
    ],
)
def test_accept_header_negotiation(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


def test_gzip_bodies_are_built_once_and_decompress_to_the_plain_body() -> None:
    exposition = render([Sample(POWER, gpu(0), 1)], [POWER])
    first = exposition.body(openmetrics=False, gzipped=True)
    assert exposition.body(openmetrics=False, gzipped=True) is first
    assert gzip.decompress(first) == exposition.text


def test_promtool_accepts_the_text_format() -> None:
    body = render([Sample(POWER, gpu(0), 1), Sample(ENERGY, gpu(0), 2)], [POWER, ENERGY]).text
    promtool_check_metrics(body.decode())


def test_a_family_declared_twice_yields_one_help_and_type_block() -> None:
    again = gauge("gpu_power_watts", "Declared elsewhere with other words.")
    text = render([Sample(POWER, gpu(0), 1), Sample(again, gpu(1), 2)], [POWER]).text.decode()
    assert text.count("# TYPE gpu_power_watts gauge") == 1
    assert 'gpu_power_watts{gpu="1",uuid="GPU-1"} 2' in text
