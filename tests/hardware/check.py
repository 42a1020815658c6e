"""Hardware check: run the exporter on a real NVIDIA GPU, idle and under load, and report.

Prints, for every metric family the exporter can serve, what it read on each GPU (or that the
family was cleanly absent because the device does not support it), first with the GPU idle, then
while a PyTorch matmul loop keeps it busy. Before that it asks NVML itself what only a real driver
settles (``nvml_facts``: field ids and value types, clock-event masks idle and under load, GPM's
answers to badly spaced samples, memory v2's sum, the MIG paths with and without privileges;
``topology_probes``: NUMA nodes, CPU and memory affinity against sysfs, P2P and common ancestors).
Writes the same as JSON to ``$OUT/hardware-check.json``
(or ``--json PATH``). Installs nothing: needs the package importable (``PYTHONPATH=src``) with its
runtime dependencies, and PyTorch with CUDA for the load phase.

    PYTHONPATH=src python tests/hardware/check.py [--load-seconds 20] [--dcgm.address HOST:PORT]

With ``--dcgm.address`` (a node running a DCGM host engine, e.g. the GPU Operator's nvidia-dcgm
on port 5555) the exporter is started with it, and the report adds the DCGM source's state:
``activity_source`` per GPU, ``gpu_exporter_source_up{source="dcgm"}``, the unwatched devices and
DCGM errors, idle and under load (whether SM activity rises on the GPUs DCGM serves).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pynvml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dra_probes
import nvml_facts
import probes
import topology_probes

REPO = Path(__file__).resolve().parents[2]
LOAD = r"""
import sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + seconds
n = 0
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print(f"load: {n} bf16 8192^3 matmuls in {seconds:.0f}s", flush=True)
"""


def all_families() -> list[str]:
    sys.path.insert(0, str(REPO / "src"))
    from gpu_exporter import identity, pci, sampler, xid
    from gpu_exporter.allocation import metrics as allocation
    from gpu_exporter.collectors import ALL_COLLECTORS
    from gpu_exporter.dcgm import service as dcgm

    names = [f.name for f in identity.FAMILIES]
    for collector in ALL_COLLECTORS:
        names += [f.name for f in collector.families]
    names += [f.name for f in (*xid.FAMILIES, *allocation.FAMILIES, *sampler.SELF_FAMILIES)]
    names += [f.name for f in pci.ExpectedGpus.families]
    names += [f.name for f in dcgm.FAMILIES]
    unserved = {f.name for f in families_that_are_not_served()}
    return [name for name in dict.fromkeys(names) if name not in unserved]


def families_that_are_not_served() -> list[Any]:
    """The status page's own readings: never on /metrics, so not checked there."""
    from gpu_exporter.allocation import metrics as allocation
    from gpu_exporter.collectors import ALL_COLLECTORS

    families = [f for c in ALL_COLLECTORS for f in c.families] + list(allocation.FAMILIES)
    return [f for f in families if not f.served]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def wait_ready(base: str, process: subprocess.Popen[bytes], limit: float = 60.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if process.poll() is not None:
            raise SystemExit(f"exporter exited with status {process.returncode} before ready")
        if get(base + "/readyz")[0] == 200:
            return time.monotonic() - started
        time.sleep(0.1)
    raise SystemExit("exporter not ready within 60 s")


def scrape(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, text = get(base + "/metrics")
    if status != 200:
        raise SystemExit(f"/metrics answered {status}")
    found: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name].append((dict(sample.labels), sample.value))
    return found


def describe(name: str, series: list[tuple[dict[str, str], float]]) -> str:
    if not series:
        return "absent (unsupported on this device/driver, or not applicable)"
    parts = []
    for labels, value in series[:12]:
        keys = {k: v for k, v in labels.items() if k not in ("uuid", "driver_version")}
        parts.append(f"{keys}={value:g}")
    more = f" (+{len(series) - 12} more)" if len(series) > 12 else ""
    return "; ".join(parts) + more


def report(phase: str, families: list[str], data: dict[str, Any]) -> dict[str, str]:
    print(f"\n=== {phase} ===")
    result = {}
    for name in families:
        line = describe(name, data.get(name, []))
        result[name] = line
        print(f"{name:45s} {line}")
    return result


def open_nvml(simulate: bool) -> int:
    """NVML in this process too, for the facts the exporter's series do not show; under
    --simulate the built-in node, with a thermal slowdown on GPU 0 to show the reason nesting."""
    sys.path.insert(0, str(REPO / "src"))
    from gpu_exporter.logs import configure_logging

    configure_logging("console", "warning")  # this process's own NVML boundary: findings only
    if simulate:
        from gpu_exporter.simulator import SimulatedNode, install, load_scenario

        node = SimulatedNode(load_scenario(None))
        node.inject({"type": "throttle", "gpu": 0, "reason": "hw_thermal_slowdown"})
        install(node)
    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetCount())


def masks_during(gpus: int, seconds: float) -> dict[str, list[str]]:
    """Every distinct clock-event mask each GPU showed, sampled every 0.5 s."""
    seen: dict[str, list[str]] = defaultdict(list)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for gpu, mask in nvml_facts.current_reasons(gpus).items():
            if mask not in seen[gpu]:
                seen[gpu].append(mask)
        time.sleep(0.5)
    return dict(seen)


def nvml_probes(gpus: int) -> dict[str, Any]:
    """Raw NVML answers for the interconnect signals (tests/hardware/probes.py), printed."""
    answers = probes.interconnect_probes(gpus)
    print("\n=== raw NVML: NVLink, PCIe, fabric, engines, thresholds ===")
    for gpu, probe in answers.items():
        for key, value in probe.items():
            print(f"gpu {gpu} {key:28s} {json.dumps(value)[:400]}")
    return answers


def dcgm_state(data: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any]:
    """What the DCGM source did: which GPUs it serves, whether it is up, what it left out."""
    state = {
        "activity_source": {
            labels.get("gpu", "?"): labels.get("activity_source", "?")
            for labels, _ in data.get("gpu_info", [])
        },
        "source_up": [
            v for labels, v in data.get("gpu_exporter_source_up", []) if labels["source"] == "dcgm"
        ],
        "unwatched": {
            labels.get("reason", "?"): v
            for labels, v in data.get("gpu_exporter_dcgm_unwatched_devices", [])
        },
        "errors": {
            f"{labels.get('function')}/{labels.get('error')}": v
            for labels, v in data.get("gpu_exporter_dcgm_errors_total", [])
        },
    }
    print(f"dcgm: {json.dumps(state)}")
    return state


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--simulate",
        nargs="?",
        const="",
        default=None,
        metavar="SCENARIO.yaml",
        help="dry run on the simulator (checks this script itself; no load phase)",
    )
    parser.add_argument(
        "--dcgm.address",
        dest="dcgm_address",
        default=None,
        help="a DCGM host engine (host:port or unix:///path) for SM activity without GPM",
    )
    parser.add_argument("--settle-seconds", type=float, default=6.0)
    args = parser.parse_args()
    simulate = args.simulate is not None
    out = args.json or Path(os.environ.get("OUT", ".")) / "hardware-check.json"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    command = [
        sys.executable,
        "-m",
        "gpu_exporter",
        f"--listen=127.0.0.1:{port}",
        "--slow-interval=5s",
        "--log-format=json",
        "--state-dir=/tmp/gpu-exporter-state",
        # Every family the exporter can serve is checked: the ones behind detail flags too.
        "--collector.thresholds",
        "--collector.activity.detail",
        "--collector.pipes.detail",
        "--collector.clock-events.detail",
        "--collector.pcie.errors",
        "--collector.ecc.aggregate",
        "--collector.remap.banks",
    ]
    if simulate:
        command.append(f"--simulate={args.simulate}" if args.simulate else "--simulate")
    if args.dcgm_address:
        command.append(f"--dcgm.address={args.dcgm_address}")
    exporter = subprocess.Popen(command, env=env)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        results["ready_seconds"] = wait_ready(base, exporter)
        gpus = open_nvml(simulate)
        results["nvml"] = nvml_facts.facts(gpus)
        nvml_facts.show("\n=== NVML facts (asked directly) ===", results["nvml"])
        time.sleep(args.settle_seconds)  # a slow round and a few GPM intervals
        families = all_families()
        idle = scrape(base)
        results["idle"] = report("idle", families, idle)
        if args.dcgm_address:
            results["dcgm_idle"] = dcgm_state(idle)
        results["reasons_idle"] = nvml_facts.current_reasons(gpus)
        results["interconnect_probes"] = nvml_probes(gpus)
        results["dra"] = dra_probes.dra_probes(gpus)
        nvml_facts.show("\n=== DRA: device minors and mig-minors ===", results["dra"])
        results["topology"] = topology_probes.topology_probes(gpus)
        nvml_facts.show("\n=== placement: NUMA, affinity, P2P, paths ===", results["topology"])
        if simulate:
            print("\nload phase skipped: --simulate")
        else:
            load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load_seconds)])
            results["reasons_under_load"] = masks_during(gpus, args.load_seconds * 0.75)
            loaded = scrape(base)
            results["load"] = report("under load (bf16 matmuls)", families, loaded)
            if args.dcgm_address:
                results["dcgm_load"] = dcgm_state(loaded)
            load.wait(timeout=args.load_seconds + 60)
        nvml_facts.show("\nclock-event masks idle", results["reasons_idle"])
        nvml_facts.show("clock-event masks under load", results.get("reasons_under_load", {}))
        exporter.send_signal(signal.SIGTERM)
        started = time.monotonic()
        results["exit_status"] = exporter.wait(timeout=10)
        results["exit_seconds"] = time.monotonic() - started
        print(
            f"\nready in {results['ready_seconds']:.2f}s; SIGTERM exit "
            f"{results['exit_status']} in {results['exit_seconds']:.2f}s"
        )
    finally:
        if exporter.poll() is None:
            exporter.kill()
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
