"""The README documents every metric and flag the code has, so the two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from gpu_exporter import identity, pci, sampler, xid
from gpu_exporter.allocation import metrics as allocation_metrics
from gpu_exporter.cli import build_parser
from gpu_exporter.collectors import ALL_COLLECTORS
from gpu_exporter.dcgm import service as dcgm_service
from gpu_exporter.exposition import Family

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def code_families() -> list[Family]:
    families = [*identity.FAMILIES, *sampler.SELF_FAMILIES, *xid.FAMILIES]
    families += allocation_metrics.FAMILIES
    families += pci.ExpectedGpus.families
    families += dcgm_service.FAMILIES
    for collector in ALL_COLLECTORS:
        families += collector.families
    return families


def readme_metric_rows() -> dict[str, str]:
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (gauge|counter) \|", README, flags=re.MULTILINE)
    return dict(rows)


def test_every_metric_is_in_the_readme_table_with_its_type() -> None:
    documented = readme_metric_rows()
    for family in code_families():
        if not family.served:  # the status page's own reading: not a metric anyone scrapes
            assert family.name not in documented, f"{family.name} is not served: not a metric"
            continue
        assert family.name in documented, f"{family.name} is missing from README's metrics table"
        assert documented[family.name] == family.type.value, f"{family.name}: wrong type in README"


def test_every_flag_is_in_the_readme_flags_table() -> None:
    for action in build_parser()._actions:
        for option in action.option_strings:
            if option in ("-h", "--help") or option.startswith(("--collector.", "--no-collector.")):
                continue
            assert f"`{option}" in README, f"flag {option} is missing from README's flags table"


def test_every_collector_is_named_in_the_readme() -> None:
    for collector in ALL_COLLECTORS:
        assert f"`{collector.name}`" in README, f"collector {collector.name} not in README"
