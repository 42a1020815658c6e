"""A one-node Slurm cluster on loopback: munged, slurmctld and slurmd in the foreground, every
file under one temporary directory (docs/slurm.md, "The test cluster").

The node has 8 GPUs as GRES, backed by character-device nodes made under the directory (slurmd
accepts only character or block devices in gres.conf's ``File=``, and without ``File=`` it sets
no ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES``). Processes are tracked by ``proctrack/linuxproc``
and ``task/none``: no cgroup needs to be delegated. Accounting is off (no slurmdbd); ``--account``
is still recorded on the job and shown by ``scontrol``.

Tests run as root, so SlurmUser and SlurmdUser are root.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

NODE = "gpunode1"
GPUS = 8
DEVICE_MAJOR = 195  # NVIDIA's character-device major, for realism; nothing opens them
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sbatch", "sinfo", "scancel")
START_TIMEOUT = 30.0
POLL = 0.1


class ClusterError(Exception):
    pass


@dataclass(frozen=True)
class GresLayout:
    """What the node's GPUs are to Slurm: slurm.conf's ``GresTypes`` and the node's ``Gres=``,
    and gres.conf's lines (``{dev}``: the directory of the device nodes)."""

    types: str
    node: str
    conf: str


WHOLE_GPUS = GresLayout("gpu", f"gpu:{GPUS}", f"Name=gpu File={{dev}}/nvidia[0-{GPUS - 1}]\n")
# GPU 6 in MIG mode as two 3g.40gb instances (gres.conf's MultipleFiles: the GPU's device and
# its instance's nvidia-caps devices, as the gres.conf(5) of 22.05 describes; Debian's build
# has no AutoDetect=nvml), GPU 7 shared as 4 shards (a shard's File must be a gpu's too). The
# lines follow the devices; Slurm still numbers h100 first (IDX 0-6, GPU 7 is IDX 6), then the
# instances (IDX 7-8).
MIG_AND_SHARDS = GresLayout(
    "gpu,shard",
    "gpu:h100:7,gpu:3g.40gb:2,shard:4",
    "Name=gpu Type=h100 File={dev}/nvidia[0-5]\n"
    "Name=gpu Type=3g.40gb MultipleFiles={dev}/nvidia6,{dev}/nvidia-caps/nvidia-cap[1-2]\n"
    "Name=gpu Type=3g.40gb MultipleFiles={dev}/nvidia6,{dev}/nvidia-caps/nvidia-cap[3-4]\n"
    "Name=gpu Type=h100 File={dev}/nvidia7\n"
    "Name=shard Count=4 File={dev}/nvidia7\n",
)
CAPS_MAJOR = 240  # nvidia-caps' dynamic major on a typical node; nothing opens them


@dataclass
class SlurmCluster:
    root: Path
    env: Mapping[str, str]
    processes: dict[str, subprocess.Popen[bytes]]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def job_map(self) -> Path:
        return self.root / "job-map"

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            list(argv), env=dict(self.env), capture_output=True, text=True, timeout=30, check=False
        )
        if check and done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: {done.stderr.strip()}\n{self.logs()}")
        return done.stdout

    def submit(self, *options: str, command: str = "sleep 600") -> str:
        """sbatch a job; its raw job id."""
        out = self.run("sbatch", "--parsable", "--output=/dev/null", *options, "--wrap", command)
        return out.strip().split(";", 1)[0]

    def state(self, job_id: str) -> str:
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        for token in out.split():
            if token.startswith("JobState="):
                return token.removeprefix("JobState=")
        return "GONE"

    def wait_for_state(self, job_id: str, *states: str) -> str:
        return wait_until(
            lambda: (s := self.state(job_id)) in states and s,
            f"job {job_id} to reach {'/'.join(states)}",
            self,
        )

    def cancel(self, job_id: str) -> None:
        self.run("scancel", job_id)

    def cancel_all(self) -> None:
        """Cancel every job and wait until none holds anything (the next test starts empty)."""
        self.run("scancel", "--full", "--user=root", check=False)
        wait_until(self._no_live_jobs, "every job to end", self)

    def _no_live_jobs(self) -> bool:
        out = self.run("squeue", "-h", "-o", "%i %T", check=False)
        return not out.strip()

    def logs(self) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                parts.append(
                    f"--- {name} (tail)\n" + "\n".join(path.read_text().splitlines()[-15:])
                )
        return "\n".join(parts)


def wait_until(
    predicate: Callable[[], object], what: str, cluster: SlurmCluster | None = None
) -> object:
    """Poll ``predicate`` until it is truthy: Slurm has no event to await for a state change."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out waiting for {what}\n{cluster.logs() if cluster else ''}")
        time.sleep(POLL)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _memory_mb() -> int:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int, gres: GresLayout = WHOLE_GPUS) -> str:
    cpus = os.cpu_count() or 1
    # Below the machine's memory: slurmd drains a node that has less than it is said to have.
    memory = max(256, _memory_mb() // 2)
    return f"""\
ClusterName=gpuexporter
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes={gres.types}
MpiDefault=none
ReturnToService=2
MinJobAge=300
PlugStackConfig=/dev/null
Prolog={root}/prolog.sh
Epilog={root}/epilog.sh
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} CPUs={cpus} \
  RealMemory={memory} Gres={gres.node} State=UNKNOWN
PartitionName=batch Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
PartitionName=debug Nodes={NODE} MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
"""


def _wrapper(script: Path, job_map: Path) -> str:
    """The shipped prolog/epilog, pointed at the cluster's mapping directory."""
    return f"#!/bin/sh\nGPU_JOB_MAP_DIR={job_map} exec /bin/sh {script}\n"


@contextmanager
def slurm_cluster(scripts: Path, gres: GresLayout = WHOLE_GPUS) -> Iterator[SlurmCluster]:
    """Start the cluster; stop everything it started, whatever happens."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise FileNotFoundError(", ".join(missing))
    root = Path(tempfile.mkdtemp(prefix="slurm-"))
    for sub in ("munge", "state", "spool", "log", "dev", "job-map"):
        (root / sub).mkdir()
    os.chmod(root, 0o755)
    os.chmod(root / "munge", 0o755)  # munged wants its socket's directory reachable by all
    for index in range(GPUS):
        os.mknod(
            root / "dev" / f"nvidia{index}", 0o600 | stat.S_IFCHR, os.makedev(DEVICE_MAJOR, index)
        )
    (root / "dev" / "nvidia-caps").mkdir()
    for index in range(1, 5):
        cap = root / "dev" / "nvidia-caps" / f"nvidia-cap{index}"
        os.mknod(cap, 0o600 | stat.S_IFCHR, os.makedev(CAPS_MAJOR, index))
    (root / "gres.conf").write_text(gres.conf.format(dev=root / "dev"))
    ctld_port, slurmd_port = free_ports(2)
    (root / "slurm.conf").write_text(slurm_conf(root, ctld_port, slurmd_port, gres))
    for name in ("prolog", "epilog"):
        wrapper = root / f"{name}.sh"
        wrapper.write_text(_wrapper(scripts / f"{name}-gpu-job-map.sh", root / "job-map"))
        wrapper.chmod(0o755)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    env.pop("SLURM_JOB_ID", None)
    cluster = SlurmCluster(root, env, {})
    try:
        key = root / "munge" / "munge.key"
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True
        )
        socket_path = root / "munge" / "munge.socket"
        cluster.processes["munged"] = _start(
            cluster,
            "munged",
            "--foreground",
            "--force",
            f"--socket={socket_path}",
            f"--key-file={key}",
            f"--pid-file={root}/munge/munged.pid",
            f"--log-file={root}/log/munged.log",
            f"--seed-file={root}/munge/munged.seed",
        )
        wait_until(socket_path.exists, "munged's socket", cluster)
        cluster.processes["slurmctld"] = _start(cluster, "slurmctld", "-D")
        cluster.processes["slurmd"] = _start(cluster, "slurmd", "-D", "-N", NODE)
        wait_until(lambda: _node_state(cluster) == "idle", f"node {NODE} to be idle", cluster)
        yield cluster
    finally:
        _stop(cluster)
        shutil.rmtree(root, ignore_errors=True)


def _start(cluster: SlurmCluster, *argv: str) -> subprocess.Popen[bytes]:
    log = open(cluster.root / "log" / f"{argv[0]}.out", "wb")  # noqa: SIM115 (the child owns it)
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(cluster.env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        log.close()


def _node_state(cluster: SlurmCluster) -> str:
    for name, process in cluster.processes.items():
        if process.poll() is not None:
            raise ClusterError(f"{name} exited with {process.returncode}\n{cluster.logs()}")
    out = cluster.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False)
    return out.strip()


def _stop(cluster: SlurmCluster) -> None:
    """Cancel the jobs (their processes are slurmstepd's children, not ours), then stop the
    daemons, newest first."""
    if "slurmd" in cluster.processes and cluster.processes["slurmd"].poll() is None:
        with suppress(ClusterError, subprocess.TimeoutExpired):
            cluster.cancel_all()
    for name in ("slurmd", "slurmctld", "munged"):
        process = cluster.processes.get(name)
        if process is None or process.poll() is not None:
            continue
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
