"""The simulator as kubelet: a real pod-resources gRPC server and a proc-like tree.

The server answers from the node's allocations at each call, so allocations and releases on the
timeline show up as they happen. Device ids are the NVIDIA device plugin's: ``GPU-<uuid>``,
``MIG-<uuid>``, and ``<uuid>::<n>`` replicas on a time-sliced GPU. GetAllocatableResources lists
every schedulable device: each MIG instance (``nvidia.com/mig-<profile>``, or whatever resource
the scenario's allocations name for it), each whole GPU not in MIG mode, and, for a GPU the
scenario shares by replicas, its replicas (at least ``MIN_REPLICAS``).

Allocations with a ``claim`` are served as DRA claims of ``gpu.nvidia.com`` in
``dynamic_resources`` instead (not in GetAllocatableResources, as on a real kubelet), with the
driver's CDI specs and the host's ``mig-minors`` under the root (see :mod:`.dra`).

A refresh task keeps ``<root>/proc/<pid>/cgroup`` and ``<root>/pods/...`` (see
:mod:`.procfs`), and the CDI specs, in step with the node's workloads and allocations; point the
exporter's ``--proc-path``, ``--pod-logs-path``, ``--cdi-spec-dir`` and ``--nvidia-caps-path``
at :attr:`proc_path`, :attr:`pod_logs_path`, :attr:`cdi_spec_dir` and :attr:`nvidia_caps_path`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_exporter.allocation.podresources import ContainerCpus, ContainerDevices
from gpu_exporter.simulator.dra import CdiFiles, claim_devices
from gpu_exporter.simulator.podresources_server import KubeletState, PodResourcesServer
from gpu_exporter.simulator.procfs import ProcTree, SimProcess

if TYPE_CHECKING:
    from gpu_exporter.simulator.node import SimulatedNode
    from gpu_exporter.simulator.scenario import AllocationSpec

MIN_REPLICAS = 4
GPU_RESOURCE = "nvidia.com/gpu"


class SimulatedKubelet:
    def __init__(
        self,
        node: SimulatedNode,
        socket_path: Path | None = None,
        *,
        files_root: Path | None = None,
        refresh_interval: float = 0.5,
    ) -> None:
        """Without ``files_root``, a temporary directory (removed by :meth:`close`) holds the
        tree and, without ``socket_path``, the socket (kept short: unix paths max ~107 bytes)."""
        self._node = node
        self._own_root = files_root is None
        root = files_root or Path(tempfile.mkdtemp(prefix="gpu-sim-"))
        self._server = PodResourcesServer(socket_path or root / "kubelet.sock", self.state)
        self._root = root
        self._tree = ProcTree(root)
        self._cdi = CdiFiles(root)
        self._interval = refresh_interval
        self._specs = list(self._scenario_allocations())  # the scenario is immutable
        self._task: asyncio.Task[None] | None = None
        self._state: tuple[int, KubeletState] | None = None  # (node's events applied, state)

    @property
    def socket_path(self) -> Path:
        return self._server.socket_path

    @property
    def proc_path(self) -> Path:
        return self._tree.proc_path

    @property
    def pod_logs_path(self) -> Path:
        return self._tree.pod_logs_path

    @property
    def cdi_spec_dir(self) -> Path:
        return self._cdi.spec_dir

    @property
    def nvidia_caps_path(self) -> Path:
        return self._cdi.nvidia_caps_path

    async def start(self) -> None:
        await self.refresh()
        await self._server.start()
        self._task = asyncio.create_task(self._refresh_loop())

    async def stop(self) -> None:
        """Stop serving; the socket file goes away, as when the kubelet stops."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._server.stop()

    async def close(self) -> None:
        """Stop, and remove the files tree when this object created it."""
        await self.stop()
        if self._own_root:
            await asyncio.to_thread(shutil.rmtree, self._root, True)

    async def refresh(self) -> None:
        """Bring the proc-like tree and the CDI files up to date with the node, in one hop to a
        worker thread (a hop costs the event loop more than the reading itself)."""
        await asyncio.to_thread(self.sync_files)

    def sync_files(self) -> None:
        """The refresh's work (on a worker thread: file I/O; the node is read under its lock)."""
        processes, pods = self._processes()
        self._tree.sync(processes, pods)
        self._cdi.sync(self._node.allocations, self._node.gpus)

    def state(self) -> KubeletState:
        """What the kubelet would answer now (called on the event loop by the server). Events
        are applied, counters not integrated: integrating every GPU here stalled the loop for
        tens of milliseconds on a 56-device node, a cost no real kubelet puts on the exporter.
        Kept until the node applies another event: only events change what a kubelet lists,
        and rebuilding it took 1-2 ms of the loop per call on ``mig56``."""
        self._node.advance(integrate=False)
        applied = self._node.events_applied  # read first: an event meanwhile makes a rebuild
        if self._state is None or self._state[0] != applied:
            self._state = (applied, self._build_state())
        return self._state[1]

    def _build_state(self) -> KubeletState:
        allocations = self._node.allocations
        containers = [
            ContainerDevices(
                a.spec.namespace, a.spec.pod, a.spec.container, a.spec.resource, (a.device_id,)
            )
            for a in allocations
            if a.spec.claim is None
        ]
        claims = claim_devices(allocations, self._node.gpus, self._node.scenario.node.name)
        running = sorted(
            {
                (w.spec.namespace, w.spec.pod, w.spec.container)
                for gpu in self._node.gpus
                for w, _ in gpu.all_workloads()
                if w.spec.pod and not w.spec.deleted
            }
        )
        cpus = container_cpus(a.spec for a in allocations)
        return KubeletState(
            containers, list(self._allocatable()), claims, running=running, cpus=cpus
        )

    # -- internals ---------------------------------------------------------------------------

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except OSError:  # a vanished tmp dir must not kill the simulated kubelet
                continue

    def _processes(self) -> tuple[list[SimProcess], list[tuple[str, str, str]]]:
        node = self._node
        with node.lock:
            node.advance(integrate=False)
            processes = [
                SimProcess(
                    w.pid,
                    w.spec.namespace,
                    w.spec.pod,
                    w.spec.container,
                    w.spec.process_name,
                    w.spec.deleted,
                )
                for gpu in node.gpus
                for w, _ in gpu.all_workloads()
            ]
            pods = [(a.spec.namespace, a.spec.pod, a.spec.container) for a in node.allocations]
        return processes, pods

    def _allocatable(self) -> Iterator[tuple[str, str]]:
        """The device plugin's devices: those the scenario never hands out through a claim."""
        specs = [s for s in self._specs if s.claim is None]
        dra = {(s.gpu, s.mig) for s in self._specs if s.claim is not None}
        for gpu in self._node.gpus:
            if (gpu.index, None) in dra:
                continue
            if gpu.mig_enabled:
                for mig in gpu.migs:
                    if (gpu.index, mig.spec.index) in dra:
                        continue
                    resource = _resource(specs, gpu.index, mig.spec.index)
                    yield resource or f"nvidia.com/mig-{mig.spec.profile.name}", mig.uuid
                continue
            mine = [s for s in specs if s.gpu == gpu.index and s.mig is None]
            replicas = [s.replica for s in mine if s.replica is not None]
            resource = _resource(specs, gpu.index, None) or GPU_RESOURCE
            if not replicas:
                yield resource, gpu.uuid
                continue
            for n in range(max(MIN_REPLICAS, max(replicas) + 1)):
                yield resource, f"{gpu.uuid}::{n}"

    def _scenario_allocations(self) -> Iterable[AllocationSpec]:
        scenario = self._node.scenario
        yield from scenario.allocations
        for event in scenario.timeline:
            if event.type == "allocate":
                yield event.params["allocation"]


def container_cpus(specs: Iterable[AllocationSpec]) -> list[ContainerCpus]:
    """Each container's CPU ids and memory NUMA nodes, as the kubelet lists them once per
    container (a scenario may repeat or split them over the container's allocations)."""
    cpus: dict[tuple[str, str, str], tuple[set[int], set[int]]] = {}
    for spec in specs:
        ids, nodes = cpus.setdefault((spec.namespace, spec.pod, spec.container), (set(), set()))
        ids.update(spec.cpu_ids)
        nodes.update(spec.memory_numa_nodes)
    return [
        ContainerCpus(*key, tuple(sorted(ids)), tuple(sorted(nodes)))
        for key, (ids, nodes) in cpus.items()
        if ids or nodes
    ]


def _resource(specs: list[AllocationSpec], gpu: int, mig: int | None) -> str | None:
    return next((s.resource for s in specs if s.gpu == gpu and s.mig == mig), None)
