"""Which GPUs each Slurm job on this node holds, from Slurm's own answer (docs/slurm.md).

Two forms of the same answer are parsed:

- the text of ``scontrol show job -d``, which every Slurm version prints: one record per job,
  and in it one ``Nodes=<hostlist> CPU_IDs=... Mem=... GRES=gpu:2(IDX:0-1)`` line per group of
  nodes with the same allocation;
- the JSON job list of ``scontrol show job -d --json`` (Slurm 23.02 and later) or ``squeue
  --json`` (21.08 and later; 22.05 has no ``scontrol --json``), where ``gres_detail[i]`` is the
  ``gpu:2(IDX:0-1)`` string of the job's i-th allocated node.

Slurm's ``IDX`` (and ``SLURM_JOB_GPUS``) is a position in the node's GRES device list (gres.conf
order, by device file), not a device minor nor an NVML index: with gres.conf naming
``/dev/nvidia[3,5,6]``, the GPU behind ``nvidia5`` is ``IDX:1``. :func:`.jobgpus.resolve` turns
it into devices. A job holds GPUs while it runs, is suspended (an idle allocation) or completes (its
epilog still runs); a finished job stays in the list for ``MinJobAge`` with an empty ``GRES=``,
and is not a holder.

Each array task and each heterogeneous-job component is its own job record with its own raw
job id (``JobId=``): that id is what ``SLURM_JOB_ID``, the ``job_<id>`` cgroup and
prolog-written mapping files name, so it is the holder's id; ``array`` (``5_1``) and ``het``
(``9+1``) keep the names users see.

Running ``scontrol`` blocks: :class:`SlurmReader` runs it with a timeout and a bound on its
output, on a worker thread.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from enum import Enum
from itertools import pairwise
from typing import Any, NamedTuple

from .jobgpus import GpuOrder, JobGpus, SlurmError, SlurmJob, job_gpus

# Job states in which a job holds its GPUs (squeue(1), JOB STATE CODES).
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})
MAX_OUTPUT_BYTES = 32 * 1024 * 1024  # a whole cluster's job list, every poll: bounded

# Skip reasons (JobGpus.skipped): jobs on this node whose GPUs could not be read.
BAD_GRES = "bad_gres"  # a GRES string naming GPUs without readable indices
BAD_RECORD = "bad_record"  # a record without a job id, or a JSON job that is not an object
NODES_MISMATCH = "nodes_mismatch"  # JSON: gres_detail does not line up with the job's nodes
AMBIGUOUS = "ambiguous"  # text: a free-text value (a job name, a comment) forged record lines

# One GPU entry of a GRES string: gpu[:type]:count(IDX:list), e.g. gpu:a100:2(IDX:0-1) or a
# MIG type, gpu:3g.40gb:1(IDX:7); a shard entry, shard[:type]:count(IDX:list), whose count is
# the shards and whose IDX names the GPUs they are on: shard:2(IDX:6) (verified on 22.05).
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:(),]+))?:(?P<count>\d+)\((?P<idx>[^)]*)\)")
_SHARD_GRES = re.compile(r"(?:^|,)shard(?::[^:(),]+)?:(?P<count>\d+)\((?P<idx>[^)]*)\)")
# A node's gpu GRES (scontrol show node's Gres=): gpu[:type]:count[(S:sockets)].
_NODE_GPU_GRES = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:(),]+))?:(?P<count>\d+)(?:\([^)]*\))?")
_NODE_GRES_LINE = re.compile(r"^[ \t]+Gres=(\S*)", re.M)
_IDX = re.compile(r"IDX:(?P<list>[0-9,\-]*)")
_RANGE = re.compile(r"(?P<lo>\d+)(?:-(?P<hi>\d+))?")


# -- the text form --------------------------------------------------------------------------


def parse_scontrol_text(text: str, node: str) -> JobGpus:
    """``scontrol show job -d`` output -> the jobs holding GPUs on ``node``."""
    jobs: list[SlurmJob] = []
    skipped: Counter[str] = Counter()
    for record in _RECORD_START.split(text):
        if record.startswith("JobId="):
            found = _text_job(record, node, skipped)
            if found is not None:
                jobs.append(found)
    return job_gpus(jobs, GpuOrder.GRES, skipped)


# A record starts at an unindented "JobId=" line. Free-text values (JobName, Comment, WorkDir,
# ...) may hold newlines, and scontrol prints them as they are (verified: a job named
# "x\n   Priority=1 Account=finance" prints that line): a record is read only when each line
# it is read from is there once, and its node lines form one block; any other record is
# skipped as ambiguous. The JSON form has no such problem.
_RECORD_START = re.compile(r"\n(?=JobId=)")
_HEAD_KEYS = ("JobId", "ArrayJobId", "ArrayTaskId", "HetJobId", "HetJobOffset")
_HEAD = {key: re.compile(rf"(?:^|\s){key}=(\S*)") for key in _HEAD_KEYS}
_STATE_LINE = re.compile(r"^[ \t]+JobState=(\S*)", re.M)
# (the key starting the line, the field read from it)
_LINE_FIELDS = (("UserId", "UserId"), ("Priority", "Account"), ("Partition", "Partition"))
_FIELD_LINES = {key: re.compile(rf"^[ \t]+{start}=.*$", re.M) for start, key in _LINE_FIELDS}
_FIELD = {key: re.compile(rf"(?:^|\s){key}=(\S*)") for _, key in _LINE_FIELDS}
_NODE_LINE = re.compile(r"^[ \t]+Nodes=(?P<nodes>\S+) .*\bCPU_IDs=.*?\bGRES=(?P<gres>\S*)", re.M)


def _text_job(record: str, node: str, skipped: Counter[str]) -> SlurmJob | None:
    head = record.split("\n", 1)[0].split(" JobName=", 1)[0]
    job_id = _search(_HEAD["JobId"], head)
    if not job_id or not job_id.isdigit():
        skipped[BAD_RECORD] += 1
        return None
    states = _STATE_LINE.findall(record)
    if len(states) != 1:
        skipped[AMBIGUOUS] += 1
        return None
    if states[0] not in HOLDING_STATES:
        return None
    allocation = list(_NODE_LINE.finditer(record))
    here = [line for line in allocation if hostlist_contains(line["nodes"], node)]
    if not here:
        return None  # elsewhere (checked for forgery only where it names this node)
    fields = _line_fields(record)
    if fields is None or not _one_block(record, allocation):
        skipped[AMBIGUOUS] += 1
        return None
    held = _held(line["gres"] for line in here)
    if held is None:
        skipped[BAD_GRES] += 1
        return None
    if not held.gpus and not held.shards:
        return None  # no GPUs here
    array_id, task = _search(_HEAD["ArrayJobId"], head), _search(_HEAD["ArrayTaskId"], head)
    het_id, offset = _search(_HEAD["HetJobId"], head), _search(_HEAD["HetJobOffset"], head)
    return SlurmJob(
        job_id=job_id,
        gpus=held.gpus,
        shards=held.shards,
        gpu_types=held.types,
        user=_name(fields["UserId"]),
        account=_name(fields["Account"]),
        partition=_name(fields["Partition"]),
        array=f"{array_id}_{task}" if array_id and task else "",
        het=f"{het_id}+{offset}" if het_id and offset else "",
    )


def _line_fields(record: str) -> dict[str, str | None] | None:
    """The fields read from their own lines; None when such a line is missing or repeated."""
    fields: dict[str, str | None] = {}
    for key, pattern in _FIELD_LINES.items():
        found = pattern.findall(record)
        if len(found) != 1:
            return None
        fields[key] = _search(_FIELD[key], found[0])
    return fields


def _one_block(record: str, allocation: Sequence[re.Match[str]]) -> bool:
    """Whether the node lines follow each other (a forged one sits elsewhere)."""
    return all(record.count("\n", a.end(), b.start()) == 1 for a, b in pairwise(allocation))


def _search(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return match.group(1) if match is not None else None


def _name(value: str | None) -> str:
    """``root(0)`` -> ``root``; Slurm's ``(null)`` -> empty."""
    if not value or value == "(null)":
        return ""
    return value.split("(", 1)[0]


# -- the JSON form --------------------------------------------------------------------------


def parse_jobs_json(text: str, node: str) -> JobGpus:
    """The JSON job list (``scontrol show job -d --json`` or ``squeue --json``) -> the jobs
    holding GPUs on ``node``. Both the 0.0.38 plugin's plain values (22.05) and data_parser's
    ``{"set": ..., "number": ...}`` numbers and state lists (23.02 and later) are read."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"Slurm's JSON is not JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
        errors = document.get("errors") if isinstance(document, dict) else None
        raise SlurmError(f"Slurm's JSON has no job list (errors: {errors!r:.200})")
    jobs: list[SlurmJob] = []
    skipped: Counter[str] = Counter()
    for entry in document["jobs"]:
        if not isinstance(entry, dict):
            skipped[BAD_RECORD] += 1
            continue
        found = _json_job(entry, node, skipped)
        if found is not None:
            jobs.append(found)
    return job_gpus(jobs, GpuOrder.GRES, skipped)


def _json_job(entry: dict[str, Any], node: str, skipped: Counter[str]) -> SlurmJob | None:
    job_id = _number(entry.get("job_id"))
    if job_id is None:
        skipped[BAD_RECORD] += 1
        return None
    state = entry.get("job_state")
    states = set(state) if isinstance(state, list) else {state}
    if not states & HOLDING_STATES:
        return None
    details = entry.get("gres_detail") or []
    names = _allocated_nodes(entry)
    if not isinstance(details, list) or len(details) != len(names):
        if details:
            skipped[NODES_MISMATCH] += 1
        return None
    mine = [detail for name, detail in zip(names, details, strict=True) if name == node]
    held = _held(mine) if all(isinstance(d, str) for d in mine) else None
    if held is None:
        skipped[BAD_GRES] += 1
        return None
    if not held.gpus and not held.shards:
        return None
    array_id, task = _number(entry.get("array_job_id")), _number(entry.get("array_task_id"))
    het_id, offset = _number(entry.get("het_job_id")), _number(entry.get("het_job_offset"))
    return SlurmJob(
        job_id=str(job_id),
        gpus=held.gpus,
        shards=held.shards,
        gpu_types=held.types,
        user=_text(entry.get("user_name")),
        account=_text(entry.get("account")),
        partition=_text(entry.get("partition")),
        array=f"{array_id}_{task}" if array_id and task is not None else "",
        het=f"{het_id}+{offset}" if het_id and offset is not None else "",
    )


def _allocated_nodes(entry: dict[str, Any]) -> list[str]:
    """The job's nodes in allocation order: 0.0.38's ``allocated_nodes[].nodename``, or
    data_parser's ``nodes.allocation[].name``."""
    resources = entry.get("job_resources")
    if not isinstance(resources, dict):
        return []
    listed = resources.get("allocated_nodes")
    key = "nodename"
    if not isinstance(listed, list):
        nodes = resources.get("nodes")
        listed = nodes.get("allocation") if isinstance(nodes, dict) else None
        key = "name"
    if not isinstance(listed, list):
        return []
    return [_text(n.get(key)) if isinstance(n, dict) else "" for n in listed]


def _number(value: object) -> int | None:
    """A plain int, or data_parser's ``{"set": true, "number": n}``; None when unset."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


# -- shared pieces --------------------------------------------------------------------------


class Held(NamedTuple):
    """What one job's GRES strings on this node hold."""

    gpus: tuple[int, ...]  # gpu GRES positions, sorted
    shards: tuple[int, ...]  # the GPUs (gpu GRES positions) its shards are on
    types: tuple[str, ...]  # the types its gpu entries name, sorted


def _held(strings: Iterable[str]) -> Held | None:
    gpus: set[int] = set()
    shards: set[int] = set()
    types: set[str] = set()
    for gres in strings:
        read = parse_gres(gres)
        if read is None:
            return None
        gpus.update(read.gpus)
        shards.update(read.shards)
        types.update(read.types)
    return Held(tuple(sorted(gpus)), tuple(sorted(shards)), tuple(sorted(types)))


def parse_gres(gres: str) -> Held | None:
    """One node's GRES string (``gpu:2(IDX:0-1)``, ``gpu:3g.40gb:1(IDX:7)``,
    ``shard:2(IDX:6)``, several joined by commas, other GRES ignored); None when a GPU or
    shard entry has no readable index list, or a GPU entry's count disagrees with it."""
    if gres in ("", "(null)"):
        return Held((), (), ())
    gpus: list[int] = []
    types: set[str] = set()
    for entry in _GPU_GRES.finditer(gres):
        indices = _indices(entry["idx"])
        if indices is None or len(indices) != int(entry["count"]):
            return None
        gpus.extend(indices)
        if entry["type"]:
            types.add(entry["type"])
    shards: list[int] = []
    for entry in _SHARD_GRES.finditer(gres):
        indices = _indices(entry["idx"])
        if not indices:  # a shard count says nothing of how many GPUs: only none is wrong
            return None
        shards.extend(indices)
    if not gpus and re.search(r"(?:^|,)gpu[:(]", gres):
        return None  # a GPU entry this cannot read: say so rather than report no GPUs
    if not shards and re.search(r"(?:^|,)shard[:(]", gres):
        return None
    return Held(tuple(sorted(set(gpus))), tuple(sorted(set(shards))), tuple(sorted(types)))


def _indices(text: str) -> tuple[int, ...] | None:
    idx = _IDX.search(text)
    return parse_index_list(idx["list"]) if idx is not None else None


def parse_gpu_gres(gres: str) -> tuple[int, ...] | None:
    """The GPU indices of one node's GRES string (:func:`parse_gres`'s ``gpus``)."""
    read = parse_gres(gres)
    return None if read is None else read.gpus


def parse_node_layout(text: str) -> tuple[tuple[str, int], ...]:
    """``scontrol show node -d <node>`` -> its gpu GRES as (type, count) in Slurm's IDX order
    (``Gres=gpu:h100:7,gpu:3g.40gb:2(S:0),shard:h100:4`` -> (("h100", 7), ("3g.40gb", 2))).
    :class:`SlurmError` unless exactly one ``Gres=`` line is there (one node's record)."""
    lines = _NODE_GRES_LINE.findall(text)
    if len(lines) != 1:
        raise SlurmError(f"scontrol show node printed {len(lines)} Gres= lines, not one")
    return tuple(
        (entry["type"] or "", int(entry["count"])) for entry in _NODE_GPU_GRES.finditer(lines[0])
    )


def parse_index_list(text: str, limit: int = 4096) -> tuple[int, ...] | None:
    """``0-1,4`` -> (0, 1, 4); None when malformed, descending or over ``limit`` indices."""
    indices: list[int] = []
    for part in text.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            return None
        lo = int(match["lo"])
        hi = int(match["hi"]) if match["hi"] is not None else lo
        if hi < lo or len(indices) + hi - lo + 1 > limit:
            return None
        indices.extend(range(lo, hi + 1))
    return tuple(indices)


def hostlist_contains(expression: str, name: str) -> bool:
    """Whether Slurm's hostlist ``expression`` (``gpu[01-04,07],login1``) names ``name``."""
    return any(_piece_contains(piece, name) for piece in _split_hostlist(expression))


def _split_hostlist(expression: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, char in enumerate(expression):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            yield expression[start:i]
            start = i + 1
    yield expression[start:]


def _piece_contains(piece: str, name: str) -> bool:
    if "[" not in piece:
        return piece == name
    pattern, ranges = "", []
    for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", piece):
        pattern += re.escape(literal)
        if group:
            pattern += r"(\d+)"
            ranges.append(group)
    match = re.fullmatch(pattern, name)
    if match is None:
        return False
    return all(_in_ranges(d, g) for d, g in zip(match.groups(), ranges, strict=True))


def _in_ranges(digits: str, group: str) -> bool:
    """``07`` against ``01-04,07``: the number in a range, zero-padded as the range is."""
    for part in group.split(","):
        lo, _, hi = part.partition("-")
        hi = hi or lo
        if not (lo.isdigit() and hi.isdigit()):
            continue
        padded = lo.startswith("0") and len(lo) > 1
        if padded and len(digits) != len(lo):
            continue
        if not padded and digits != str(int(digits)):
            continue
        if int(lo) <= int(digits) <= int(hi):
            return True
    return False


def local_node_name() -> str:
    """The short host name: slurmd's NodeName unless it was started with ``-N``."""
    return socket.gethostname().split(".", 1)[0]


# -- running Slurm's commands ---------------------------------------------------------------


class SlurmForm(Enum):
    TEXT = "text"  # scontrol show job -d
    JSON = "json"  # the JSON command (scontrol show job -d --json, or squeue --json)
    AUTO = "auto"  # JSON, and the text form for good once the JSON command is refused


TEXT_COMMAND = ("scontrol", "show", "job", "-d")
JSON_COMMAND = ("scontrol", "show", "job", "-d", "--json")
NODE_COMMAND = ("scontrol", "show", "node", "-d")  # and the node's name


class SlurmReader:
    """Asks Slurm which jobs hold GPUs on ``node`` (blocking: call :meth:`read` on a worker
    thread). ``node`` is this node's Slurm NodeName (slurmd's ``-N``, else the short host
    name). Every call is bounded by ``timeout`` seconds and :data:`MAX_OUTPUT_BYTES`."""

    def __init__(
        self,
        node: str,
        *,
        form: SlurmForm = SlurmForm.AUTO,
        timeout: float = 10.0,
        text_command: Sequence[str] = TEXT_COMMAND,
        json_command: Sequence[str] = JSON_COMMAND,
        node_command: Sequence[str] = NODE_COMMAND,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._node = node
        self._form = form
        self._timeout = timeout
        self._text_command = tuple(text_command)
        self._json_command = tuple(json_command)
        self._node_command = (*node_command, node)
        self._env = dict(env) if env is not None else None

    @property
    def form(self) -> SlurmForm:
        """The form used now (AUTO becomes TEXT once the JSON command is refused)."""
        return self._form

    def read(self) -> JobGpus:
        found = self._read_jobs()
        if not any(job.gpu_types for job in found.jobs):
            return found
        # A job names a GRES type (a GPU model, or a MIG profile): which positions are MIG
        # instances is the node's layout's to say. Asked only then: one node's record.
        layout = parse_node_layout(self._run(self._node_command))
        return replace(found, layout=layout)

    def _read_jobs(self) -> JobGpus:
        if self._form is SlurmForm.TEXT:
            return parse_scontrol_text(self._run(self._text_command), self._node)
        try:
            return parse_jobs_json(self._run(self._json_command), self._node)
        except _Refused:
            if self._form is not SlurmForm.AUTO:
                raise SlurmError(f"{' '.join(self._json_command)} is not supported") from None
            self._form = SlurmForm.TEXT
            return parse_scontrol_text(self._run(self._text_command), self._node)

    def _run(self, argv: Sequence[str]) -> str:
        """Run ``argv``; its output goes to an unlinked temporary file, so what is read into
        memory is bounded whatever the command prints."""
        command = " ".join(argv)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                done = subprocess.run(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    timeout=self._timeout,
                    env=self._env,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise SlurmError(f"{command} timed out after {self._timeout:g}s") from None
            except OSError as exc:
                raise SlurmError(f"{command} could not run: {exc.strerror or exc}") from None
            err.seek(0)
            stderr = err.read(4096).decode("utf-8", "replace").strip()
            if done.returncode != 0:
                if "unrecognized option" in stderr or "invalid option" in stderr:
                    raise _Refused(stderr)
                first = stderr.splitlines()[-1] if stderr else f"exit status {done.returncode}"
                raise SlurmError(f"{command} failed: {first[:300]}")
            if os.fstat(out.fileno()).st_size > MAX_OUTPUT_BYTES:
                raise SlurmError(f"{command} printed over {MAX_OUTPUT_BYTES} bytes")
            out.seek(0)
            return out.read().decode("utf-8", "replace")


class _Refused(SlurmError):
    """The command does not know an option (``--json`` before Slurm 23.02)."""
