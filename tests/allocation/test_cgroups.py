"""Every cgroup layout kubelet produces, and the pod log directory layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter.allocation.cgroups import (
    CgroupOwner,
    PodName,
    parse_cgroup,
    parse_pod_log_dir,
    read_pod_names,
    read_process_owner,
)
from gpu_exporter.simulator.procfs import cgroup_text

UID = "8d2b6e1c-5f0a-4c7e-9b3d-2a1f0e9c8b7a"
SLUG = UID.replace("-", "_")
CID = "4f" * 32

CASES = [
    pytest.param(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLUG}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID),
        id="v2-systemd-containerd-burstable",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLUG}.slice/"
        f"crio-{CID}.scope\n",
        CgroupOwner(UID, CID),
        id="v2-systemd-crio-besteffort",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-pod{SLUG}.slice/docker-{CID}.scope\n",
        CgroupOwner(UID, CID),
        id="v2-systemd-docker-guaranteed",
    ),
    pytest.param(
        f"0::/kubepods/burstable/pod{UID}/{CID}\n", CgroupOwner(UID, CID), id="v2-cgroupfs"
    ),
    pytest.param(f"0::/kubepods/pod{UID}/{CID}\n", CgroupOwner(UID, CID), id="cgroupfs-guaranteed"),
    pytest.param(
        f"12:cpuset:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
        CgroupOwner(UID, CID),
        id="v1-cgroupfs",
    ),
    pytest.param(
        f"11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLUG}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID),
        id="v1-systemd",
    ),
    pytest.param(
        f"4:pids:/system.slice/containerd.service/kubepods-burstable-pod{SLUG}.slice:"
        f"cri-containerd:{CID}\n",
        CgroupOwner(UID, CID),
        id="v1-systemd-colon-form",
    ),
    pytest.param(
        f"0::/../../kubepods-burstable-pod{SLUG}.slice/cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID),
        id="cgroup-namespace-prefix",
    ),
    pytest.param(f"0::/../pod{UID}/{CID}\n", CgroupOwner(UID, CID), id="namespace-cgroupfs"),
    pytest.param(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLUG}.slice\n",
        CgroupOwner(UID),
        id="pod-level-only",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-pod{SLUG}.slice/crio-conmon-{CID}.scope\n",
        CgroupOwner(UID),
        id="crio-conmon-is-not-the-container",
    ),
    pytest.param(
        f"0::/kubepods/burstable/pod{UID.upper()}/{CID}\n", CgroupOwner(UID, CID), id="uc"
    ),
    pytest.param("0::/system.slice/sshd.service\n", None, id="host-process"),
    pytest.param("0::/user.slice/user-1000.slice/session-2.scope\n", None, id="user-session"),
    pytest.param("", None, id="empty"),
    pytest.param("garbage\n", None, id="garbage"),
]


@pytest.mark.parametrize(("text", "owner"), CASES)
def test_parse_cgroup(text: str, owner: CgroupOwner | None) -> None:
    assert parse_cgroup(text) == owner


@pytest.mark.parametrize("variant", range(6))
def test_every_simulated_layout_parses(variant: int) -> None:
    assert parse_cgroup(cgroup_text(UID, CID, variant)) == CgroupOwner(UID, CID)


def test_read_process_owner(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert read_process_owner(tmp_path, 42) == CgroupOwner(UID, CID)
    assert read_process_owner(tmp_path, 43) is None  # gone


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        (f"ml_train-0_{UID}", ("ml", "train-0", UID)),
        (
            f"kube-system_nvidia-device-plugin-x7k2p_{UID}",
            ("kube-system", "nvidia-device-plugin-x7k2p", UID),
        ),
        ("no-underscores", None),
        (f"a_b_c_{UID}", None),
        (f"_pod_{UID}", None),
    ],
)
def test_parse_pod_log_dir(name: str, parsed: tuple[str, str, str] | None) -> None:
    assert parse_pod_log_dir(name) == parsed


def test_read_pod_names(tmp_path: Path) -> None:
    pod = tmp_path / f"research_jupyter_{UID}"
    (pod / "notebook").mkdir(parents=True)
    (pod / "sidecar").mkdir()
    (tmp_path / "stray-file").write_text("")
    assert read_pod_names(tmp_path) == {
        UID: PodName("research", "jupyter", ("notebook", "sidecar"))
    }
    assert read_pod_names(tmp_path / "missing") == {}
