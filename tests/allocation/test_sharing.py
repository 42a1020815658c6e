"""gpu_sharing_info's mode, from what the allocation, the process scan and NVML say."""

from __future__ import annotations

import pytest

from gpu_exporter.allocation.sharing import sharing_mode, sharing_modes

from .helpers import GPU_A, GPU_B, GPU_C, GPU_D, MIG_B1

A, B = ("ml", "a"), ("web", "b")


@pytest.mark.parametrize(
    ("holders", "replicated", "mps_clients", "compute_mode", "mode"),
    [
        ((), False, False, 0, "unallocated"),
        ((A,), False, False, 0, "exclusive"),
        ((A,), True, False, 0, "time_slicing"),  # one replica of a time-sliced GPU held so far
        ((A, B), False, False, 0, "time_slicing"),  # several holders (e.g. one DRA claim)
        ((A, B), True, True, 0, "mps"),  # MPS clients seen on the device
        ((A,), True, True, 3, "mps"),
        ((A, B), True, False, 3, "mps"),  # exclusive-process mode with several holders: MPS
        ((A,), False, False, 3, "exclusive"),  # exclusive-process, one holder: not shared
    ],
)
def test_mode_of_a_whole_gpu(
    holders: tuple[tuple[str, str], ...],
    replicated: bool,
    mps_clients: bool,
    compute_mode: int,
    mode: str,
) -> None:
    found = sharing_mode(
        GPU_A,
        holders,
        replicated=replicated,
        mps_clients=mps_clients,
        compute_mode=compute_mode,
    )
    assert found == mode


def test_mig_gpus_say_mig_and_their_instances_have_no_row() -> None:
    modes = sharing_modes(
        [GPU_A, GPU_B, MIG_B1, GPU_C, GPU_D],
        {GPU_A.uuid: {A}, MIG_B1.uuid: {A, B}, GPU_C.uuid: {A, B}},
        replicated={GPU_C.uuid},
        mps_devices=set(),
        compute_modes={},
    )
    assert {d.uuid: m for d, m in modes.items()} == {
        GPU_A.uuid: "exclusive",
        GPU_B.uuid: "mig",
        GPU_C.uuid: "time_slicing",
        GPU_D.uuid: "unallocated",
    }
