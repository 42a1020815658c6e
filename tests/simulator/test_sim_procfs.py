"""The simulated host's /proc and pod-log trees: what the allocation code reads under --simulate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpu_exporter.simulator.procfs import ProcTree, SimProcess

TRAINER = SimProcess(4242, "ml", "trainer", "main")
SERVER = SimProcess(5151, "prod", "web", "server")


def shown_pids(tree: ProcTree) -> set[int]:
    return {int(entry.name) for entry in tree.proc_path.iterdir()}


def test_the_tree_shows_exactly_the_processes_and_pods_asked_for(tmp_path: Path) -> None:
    tree = ProcTree(tmp_path)
    tree.sync([TRAINER, SERVER], [])
    assert shown_pids(tree) == {4242, 5151}
    assert "kubepods" in (tree.proc_path / "4242" / "cgroup").read_text()

    tree.sync([SERVER], [("ml", "idle", "main")])
    assert shown_pids(tree) == {5151}, "a process that ended still has a /proc entry"
    logs = {entry.name.split("_")[1] for entry in tree.pod_logs_path.iterdir()}
    assert logs == {"web", "idle"}, "pod log directories do not follow the pods"


def test_an_unchanged_node_costs_no_walk_of_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = ProcTree(tmp_path)
    tree.sync([TRAINER], [])
    walks: list[int] = []
    monkeypatch.setattr(tree, "_sync_procs", lambda wanted: walks.append(len(wanted)))
    tree.sync([TRAINER], [])
    assert walks == [], "the same processes walked the whole tree again"
    tree.sync([TRAINER, SERVER], [])
    assert walks == [2], "a new process was not written"


def test_a_tree_removed_from_under_it_is_written_again(tmp_path: Path) -> None:
    tree = ProcTree(tmp_path)
    tree.sync([TRAINER], [])
    shutil.rmtree(tree.proc_path)
    tree.sync([TRAINER], [])
    assert shown_pids(tree) == {4242}
