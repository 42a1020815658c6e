"""Generate alerts/dcgm_compat_rules.yml: dcgm-exporter's metric names from gpu-exporter's series.

    python alerts/generate_dcgm_compat.py           # rewrite alerts/dcgm_compat_rules.yml
    python alerts/generate_dcgm_compat.py --check   # exit 1 if it is out of date

An optional rule file for a migration (docs/migration.md): dashboards and alerts written for
NVIDIA dcgm-exporter keep working while both exporters run, and after dcgm-exporter is gone.
Each ``DCGM_FI_*`` series has dcgm-exporter's name, unit and labels (``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``, ``pci_bus_id``, ``DCGM_FI_DRIVER_VERSION``, for MIG
``GPU_I_ID``/``GPU_I_PROFILE``, and ``namespace``/``pod``/``container`` of the holder). Names and
units are dcgm-exporter's default counters (etc/default-counters.csv, NVIDIA/dcgm-exporter @
d5e5f51) and its field table (reference/dcgm.md section 4).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from generate_prometheusrule import _Dumper  # block scalars: the PromQL stays readable

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "dcgm_compat_rules.yml"
XID_CATALOG = HERE.parent / "src" / "gpu_exporter" / "data" / "xid_classes.tsv"
GROUP = "gpu-exporter.dcgm-compat"
KEY = "instance, job, uuid"
GPU_LABELS = "gpu, UUID, modelName, device, pci_bus_id, DCGM_FI_DRIVER_VERSION, Hostname"
MIG_LABELS = "GPU_I_ID, GPU_I_PROFILE"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Compat:
    """One dcgm-exporter series: its name, dcgm-exporter's unit, and our expression for it, which
    must have at most one series per (instance, job, uuid)."""

    name: str
    unit: str
    expr: str


COMPAT: tuple[Compat, ...] = (
    Compat("DCGM_FI_DEV_SM_CLOCK", "MHz", 'gpu_clock_hertz{clock="sm"} / 1e6'),
    Compat("DCGM_FI_DEV_MEM_CLOCK", "MHz", 'gpu_clock_hertz{clock="memory"} / 1e6'),
    Compat("DCGM_FI_DEV_MEMORY_TEMP", "C", 'gpu_temperature_celsius{sensor="memory"}'),
    Compat("DCGM_FI_DEV_GPU_TEMP", "C", 'gpu_temperature_celsius{sensor="gpu"}'),
    # the mean over the minute, from the energy counter (the instant gauge is not served)
    Compat("DCGM_FI_DEV_POWER_USAGE", "W", "rate(gpu_energy_joules_total[1m])"),
    Compat("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ, counter", "gpu_energy_joules_total * 1000"),
    Compat("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "count, counter", "gpu_pcie_replays_total"),
    Compat("DCGM_FI_DEV_GPU_UTIL", "%", "rate(gpu_utilization_seconds_total[1m]) * 100"),
    Compat(
        "DCGM_FI_DEV_ENC_UTIL",
        "%",
        'rate(gpu_engine_utilization_seconds_total{engine="encoder"}[1m]) * 100',
    ),
    Compat(
        "DCGM_FI_DEV_DEC_UTIL",
        "%",
        'rate(gpu_engine_utilization_seconds_total{engine="decoder"}[1m]) * 100',
    ),
    # NVML's free is total - used - reserved (a v1 driver counts reserved as used, none apart).
    Compat(
        "DCGM_FI_DEV_FB_FREE",
        "MiB",
        "(gpu_memory_total_bytes - gpu_memory_used_bytes"
        f" - (gpu_memory_reserved_bytes or gpu_memory_used_bytes * 0)) / {MIB}",
    ),
    Compat("DCGM_FI_DEV_FB_USED", "MiB", f"gpu_memory_used_bytes / {MIB}"),
    Compat("DCGM_FI_DEV_FB_RESERVED", "MiB", f"gpu_memory_reserved_bytes / {MIB}"),
    Compat(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "MB/s, all links",
        "(rate(gpu_nvlink_transmit_bytes_total[1m]) + rate(gpu_nvlink_receive_bytes_total[1m]))"
        " / 1e6",
    ),
    Compat(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "rows, counter",
        'gpu_remapped_rows_total{cause="uncorrectable"}',
    ),
    Compat(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "rows, counter",
        'gpu_remapped_rows_total{cause="correctable"}',
    ),
    Compat("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0/1", "gpu_row_remap_failed"),
    # The activity ratios are rate()s of their exact integrals, over 1m as the traffic rates.
    Compat(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "ratio",
        'rate(gpu_pipe_active_seconds_total{pipe="graphics"}[1m])',
    ),
    Compat("DCGM_FI_PROF_SM_ACTIVE", "ratio", "rate(gpu_sm_active_seconds_total[1m])"),
    Compat("DCGM_FI_PROF_SM_OCCUPANCY", "ratio", "gpu_sm_occupancy_ratio"),
    Compat("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ratio", "rate(gpu_tensor_active_seconds_total[1m])"),
    Compat("DCGM_FI_PROF_DRAM_ACTIVE", "ratio", "rate(gpu_dram_active_seconds_total[1m])"),
    Compat(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "ratio",
        'rate(gpu_pipe_active_seconds_total{pipe="fp64"}[1m])',
    ),
    Compat(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "ratio",
        'rate(gpu_pipe_active_seconds_total{pipe="fp32"}[1m])',
    ),
    Compat(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "ratio",
        'rate(gpu_pipe_active_seconds_total{pipe="fp16"}[1m])',
    ),
    Compat("DCGM_FI_PROF_PCIE_TX_BYTES", "bytes/s", "rate(gpu_pcie_transmit_bytes_total[1m])"),
    Compat("DCGM_FI_PROF_PCIE_RX_BYTES", "bytes/s", "rate(gpu_pcie_receive_bytes_total[1m])"),
    Compat(
        "DCGM_FI_DEV_XID_ERRORS",
        "the last Xid's code (dcgm-exporter's last-value gauge)",
        "device:dcgm_compat_last_xid:code",
    ),
)


def _relabel(expr: str, *pairs: tuple[str, str]) -> str:
    """``label_replace`` each (new, old) pair onto ``expr``; ``device`` gets ``nvidia<gpu>``."""
    for new, old in pairs:
        replacement = "nvidia$1" if new == "device" else "$1"
        expr = f'label_replace({expr}, "{new}", "{replacement}", "{old}", "(.+)")'
    return expr


def identity_rules() -> list[dict[str, str]]:
    gpu = _relabel(
        "gpu_info",
        ("UUID", "uuid"),
        ("modelName", "model"),
        ("device", "gpu"),
        ("DCGM_FI_DRIVER_VERSION", "driver_version"),
        ("Hostname", "node"),
    )
    mig = _relabel(
        "gpu_mig_info", ("GPU_I_ID", "gpu_instance_id"), ("GPU_I_PROFILE", "mig_profile")
    )
    parent = _relabel("device:dcgm_compat_gpu:info", ("parent_uuid", "uuid"))
    parent_labels = GPU_LABELS.replace("gpu, ", "")
    holder = "max by (instance, job, uuid, namespace, pod, container) (gpu_allocation_info)"
    return [
        {
            "record": "device:dcgm_compat_gpu:info",
            "expr": f"max by ({KEY}, {GPU_LABELS}) (\n  {gpu}\n)",
        },
        {
            "record": "device:dcgm_compat_identity:info",
            "expr": (
                "device:dcgm_compat_gpu:info\nor\n"
                f"max by ({KEY}, gpu, {parent_labels}, {MIG_LABELS}) (\n"
                f"  {mig}\n"
                f"  * on (instance, job, parent_uuid) group_left ({parent_labels})\n"
                f"  max by (instance, job, parent_uuid, {parent_labels}) ({parent})\n)"
            ),
        },
        {
            # dcgm-exporter's default: one pod per device, even a time-sliced one.
            "record": "device:dcgm_compat_holder:info",
            "expr": f"topk by ({KEY}) (1, {holder})",
        },
        {
            "record": "device:dcgm_compat_labels:info",
            "expr": (
                "device:dcgm_compat_holder:info\n"
                f"  * on ({KEY}) group_left ({GPU_LABELS}, {MIG_LABELS})\n"
                "  device:dcgm_compat_identity:info\nor\n"
                f"(device:dcgm_compat_identity:info unless on ({KEY}) "
                "device:dcgm_compat_holder:info)"
            ),
        },
    ]


def xid_codes() -> list[int]:
    with XID_CATALOG.open() as catalog:
        rows = csv.reader((line for line in catalog if not line.startswith("#")), delimiter="\t")
        next(rows)  # the header
        return sorted(int(row[0]) for row in rows if row and row[0].isdigit())


def xid_rules() -> list[dict[str, str]]:
    """The last Xid's code as a value, as dcgm-exporter's gauge has it: the newest per device,
    mapped from its ``xid`` label to a number (PromQL cannot read a number from a label), and 0
    where no Xid was counted. A code folded into ``xid="other"`` reads as 0."""
    terms = " or\n  ".join(
        f'device:dcgm_compat_last_xid:timestamp{{xid="{code}"}} * 0 + {code}'
        for code in xid_codes()
    )
    return [
        {
            "record": "device:dcgm_compat_last_xid:timestamp",
            "expr": f"max by ({KEY}, xid) (topk by ({KEY}) (1, gpu_xid_last_timestamp_seconds))",
        },
        {
            "record": "device:dcgm_compat_last_xid:code",
            "expr": f"max by ({KEY}) (\n  {terms}\n)\nor\nmax by ({KEY}) (gpu_info) * 0",
        },
    ]


def compat_rule(compat: Compat) -> dict[str, str]:
    return {
        "record": compat.name,
        "expr": (
            "max without (uuid) (\n  device:dcgm_compat_labels:info\n"
            f"  * on ({KEY}) group_left ()\n  ({compat.expr})\n)"
        ),
    }


def rules_document() -> dict[str, object]:
    rules = identity_rules() + xid_rules() + [compat_rule(c) for c in COMPAT]
    return {"groups": [{"name": GROUP, "rules": rules}]}


HEADER = """\
# dcgm-exporter compatibility: NVIDIA dcgm-exporter's default metric names, units and labels,
# recorded from gpu-exporter's series (docs/migration.md). Optional: load it next to
# recording_rules.yml and alerting_rules.yml, or apply the kustomize component
# deploy/components/dcgm-compat.
#
# GENERATED by alerts/generate_dcgm_compat.py: do not edit; change the script and rerun it.
#
# series                                   dcgm-exporter unit
"""


def render() -> str:
    table = "".join(f"#   {c.name:<40} {c.unit}\n" for c in COMPAT)
    body = yaml.dump(rules_document(), Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + table + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the file is current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
