"""A host-``/proc``-like tree and a pod log directory for the simulated node's processes.

``<root>/proc/<pid>/cgroup`` holds what the kernel would show for each workload's process, and
``<root>/pods/<namespace>_<pod>_<uid>/<container>/`` mirrors the kubelet's ``/var/log/pods``.
The cgroup layouts rotate over every form a real node can produce (cgroup v1/v2, systemd and
cgroupfs drivers, containerd/CRI-O/docker, QoS classes, a cgroup-namespace ``/../`` prefix), so a
simulated run exercises the exporter's parser on all of them.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SimProcess:
    """A workload's process: ``pod`` "" is a host process (a user session's cgroup); a
    ``deleted`` pod's process keeps its pod cgroup while the pod's log directory is gone."""

    pid: int
    namespace: str
    pod: str
    container: str
    command: str = "python"
    deleted: bool = False


HOST_CGROUP = "0::/user.slice/user-1000.slice/session-4.scope\n"


def pod_uid(namespace: str, pod: str) -> str:
    """A stable pod UID for a scenario's pod (Kubernetes UIDs are UUIDs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"k8s://{namespace}/{pod}"))


def container_id(namespace: str, pod: str, container: str) -> str:
    return hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()


def _systemd_v2(uid: str, cid: str, qos: str, runtime: str) -> str:
    slug = uid.replace("-", "_")
    if qos == "guaranteed":
        pod_slice = f"kubepods.slice/kubepods-pod{slug}.slice"
    else:
        pod_slice = f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice"
    return f"0::/{pod_slice}/{runtime}-{cid}.scope\n"


def _cgroupfs_v1(uid: str, cid: str, qos: str) -> str:
    base = f"/kubepods/pod{uid}/{cid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}/{cid}"
    controllers = ("cpuset", "cpu,cpuacct", "memory", "devices", "pids")
    lines = [f"{12 - n}:{name}:{base}" for n, name in enumerate(controllers)]
    return "\n".join([*lines, f"1:name=systemd:{base}", "0::/"]) + "\n"


def cgroup_text(uid: str, cid: str, variant: int) -> str:
    """The ``/proc/<pid>/cgroup`` content of one of six real layouts."""
    layouts = (
        lambda: _systemd_v2(uid, cid, "burstable", "cri-containerd"),
        lambda: _cgroupfs_v1(uid, cid, "besteffort"),
        lambda: _systemd_v2(uid, cid, "guaranteed", "crio"),
        lambda: f"0::/kubepods/burstable/pod{uid}/{cid}\n",
        lambda: _systemd_v2(uid, cid, "besteffort", "docker"),
        # Seen from inside a cgroup namespace: the path climbs out first.
        lambda: (
            f"0::/../../kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{cid}.scope\n"
        ),
    )
    return layouts[variant % len(layouts)]()


class ProcTree:
    """Writes and prunes the tree; blocking file I/O, so call :meth:`sync` off the event loop."""

    def __init__(self, root: Path) -> None:
        self.proc_path = root / "proc"
        self.pod_logs_path = root / "pods"
        self._shown: tuple[frozenset[SimProcess], frozenset[tuple[str, str, str]]] | None = None

    def sync(self, processes: Iterable[SimProcess], pods: Iterable[tuple[str, str, str]]) -> None:
        """Make the tree show exactly ``processes`` and the pods ``(namespace, pod, container)``.

        Nothing is read or written while both are what the tree shows already and it is still
        there: walking a 56-device node's tree cost 2-3 ms of Python, twice a second, on the
        exporter's GIL (a real node's /proc costs the exporter nothing until it reads it)."""
        processes = list(processes)
        wanted = (frozenset(processes), frozenset(pods))
        if wanted == self._shown and self.proc_path.is_dir() and self.pod_logs_path.is_dir():
            return
        self._shown = None  # a sync that fails half-way is redone in full next time
        wanted_pids = {p.pid: p for p in processes}
        self._sync_procs(wanted_pids)
        containers = {
            (p.namespace, p.pod, p.container)
            for p in wanted_pids.values()
            if p.pod and not p.deleted
        }
        self._sync_pods(containers | wanted[1])
        self._shown = wanted

    def _sync_procs(self, wanted: dict[int, SimProcess]) -> None:
        self.proc_path.mkdir(parents=True, exist_ok=True)
        for entry in self.proc_path.iterdir():
            if not entry.name.isdigit() or int(entry.name) not in wanted:
                shutil.rmtree(entry, ignore_errors=True)
        for pid, process in wanted.items():
            path = self.proc_path / str(pid) / "cgroup"
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "comm").write_text(process.command[:15] + "\n", encoding="utf-8")
            if not process.pod:
                path.write_text(HOST_CGROUP, encoding="utf-8")
                continue
            uid = pod_uid(process.namespace, process.pod)
            cid = container_id(process.namespace, process.pod, process.container)
            variant = zlib.crc32(f"{process.namespace}/{process.pod}".encode())
            path.write_text(cgroup_text(uid, cid, variant), encoding="utf-8")

    def _sync_pods(self, containers: set[tuple[str, str, str]]) -> None:
        self.pod_logs_path.mkdir(parents=True, exist_ok=True)
        wanted: dict[str, set[str]] = {}
        for namespace, pod, container in containers:
            name = f"{namespace}_{pod}_{pod_uid(namespace, pod)}"
            wanted.setdefault(name, set()).add(container)
        for entry in self.pod_logs_path.iterdir():
            if entry.name not in wanted:
                shutil.rmtree(entry, ignore_errors=True)
        for name, names in wanted.items():
            for container in names:
                log = self.pod_logs_path / name / container / "0.log"
                if not log.exists():
                    log.parent.mkdir(parents=True, exist_ok=True)
                    log.touch()
