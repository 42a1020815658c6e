"""From a host PID to its pod: ``/proc/<pid>/cgroup`` and the kubelet's pod log directories.

Every cgroup layout kubelet produces is handled (``reference/kubernetes.md``): cgroup v2 and v1,
the systemd and cgroupfs drivers, containerd, CRI-O and cri-dockerd scopes, and paths seen from
inside a cgroup namespace (``/../`` prefixes) by matching the path's suffix.

Pod UIDs become namespace/name through the layout of ``/var/log/pods`` on the host,
``<namespace>_<pod>_<uid>/<container>/``: only directory *names* are read, never log content,
and it needs no Kubernetes API credentials or RBAC (a read-only hostPath mount is enough).
Everything here does blocking file I/O and runs on worker threads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# "pod<uid>" as its own path element (cgroupfs) or as the end of a systemd slice name.
_POD = re.compile(rf"(?:^|[/\-:])pod(?P<uid>{_UID})(?:\.slice)?(?=/|:|$)", re.IGNORECASE)
# The container scope right after the pod: "<id>", "cri-containerd-<id>.scope", "crio-<id>.scope",
# "docker-<id>.scope", or systemd-style "...slice:cri-containerd:<id>".
_CONTAINER = re.compile(
    r"^[/:](?:(?:cri-containerd|crio|docker|containerd)[-:])?(?P<id>[0-9a-f]{64})(?:\.scope)?(?:/|$)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class CgroupOwner:
    """The pod (and, when the path shows it, the container) a process belongs to."""

    pod_uid: str  # with dashes, as Kubernetes writes it
    container_id: str | None = None


@dataclass(frozen=True)
class PodName:
    namespace: str
    pod: str
    containers: tuple[str, ...] = ()


def parse_cgroup(text: str) -> CgroupOwner | None:
    """The pod owning a process, from the content of its ``/proc/<pid>/cgroup``; None if none.

    Lines are ``hierarchy-id:controllers:path``; cgroup v2 has the single line ``0::path``.
    The first line naming a pod wins (v1 hierarchies all agree for a container's process).
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        owner = parse_cgroup_path(parts[2])
        if owner is not None:
            return owner
    return None


def parse_cgroup_path(path: str) -> CgroupOwner | None:
    """The pod in one cgroup path (any prefix, e.g. ``/../``, is ignored)."""
    # The innermost pod element wins (nested kubelets are not expected, but be exact).
    match = next(reversed(list(_POD.finditer(path))), None)
    if match is None:
        return None
    uid = match["uid"].replace("_", "-").lower()
    rest = path[match.end() :]
    container = _CONTAINER.match(rest)
    if container is not None and "conmon" not in rest:
        return CgroupOwner(uid, container["id"].lower())
    return CgroupOwner(uid)


def read_process_owner(proc_path: Path, pid: int) -> CgroupOwner | None:
    """Read ``<proc>/<pid>/cgroup``; None when the process is gone or not in a pod."""
    try:
        text = (proc_path / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse_cgroup(text)


def read_command(proc_path: Path, pid: int) -> str:
    """``<proc>/<pid>/comm`` (the kernel's 15-byte command name); "" when it cannot be read."""
    try:
        raw = (proc_path / str(pid) / "comm").read_bytes()[:64]
    except OSError:
        return ""
    return raw.decode("utf-8", errors="replace").strip()


def parse_pod_log_dir(name: str) -> tuple[str, str, str] | None:
    """``<namespace>_<pod>_<uid>`` -> (namespace, pod, uid). Names cannot hold underscores."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    namespace, pod, uid = parts
    return namespace, pod, uid.lower()


def read_pod_names(pod_logs_path: Path) -> dict[str, PodName]:
    """Pod UID -> namespace, name and container names, from the kubelet's log directories."""
    pods: dict[str, PodName] = {}
    try:
        entries = list(os.scandir(pod_logs_path))
    except OSError:
        return pods
    for entry in entries:
        parsed = parse_pod_log_dir(entry.name)
        if parsed is None or not entry.is_dir():
            continue
        namespace, pod, uid = parsed
        pods[uid] = PodName(namespace, pod, _containers(Path(entry.path)))
    return pods


def _containers(pod_dir: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(e.name for e in os.scandir(pod_dir) if e.is_dir()))
    except OSError:
        return ()
