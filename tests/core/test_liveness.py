"""A GPU's liveness as a state machine: UP -> SUSPECT -> LOST (backoff) -> UP."""

from __future__ import annotations

from gpu_exporter.devices import Gpu
from gpu_exporter.sampler import MAX_PROBE_BACKOFF, GpuState, Liveness


def test_a_suspect_gpu_is_probed_at_once_and_dismissed_back_to_up() -> None:
    state = GpuState(0, None)
    assert state.suspect_loss(), "UP -> SUSPECT is a change the sampler logs"
    assert not state.suspect_loss(), "a second GpuIsLost while suspect changes nothing"
    assert state.up, "a suspect GPU still serves its series"
    assert state.probe_due(now=0.0), "a suspect GPU is probed in the next fast round"
    state.dismiss()
    assert state.liveness is Liveness.UP
    assert not state.probe_due(now=1e9), "an answering GPU is not probed"


def test_a_lost_gpu_is_probed_with_doubling_backoff_up_to_the_cap() -> None:
    state = GpuState(0, None)
    assert state.lose(now=100.0)
    assert not state.lose(now=100.0), "losing a lost GPU again changes nothing"
    assert not state.up
    assert not state.probe_due(100.5), "the first probe is a second after the loss"
    assert state.probe_due(101.0)
    gaps = []
    for _ in range(8):
        gaps.append(state.backoff)
        state.schedule_probe(now=0.0)
    assert gaps[:4] == [2.0, 4.0, 8.0, 16.0]
    assert max(gaps) == MAX_PROBE_BACKOFF


def test_a_lost_gpu_that_answers_is_up_with_the_backoff_reset() -> None:
    state = GpuState(0, None, Liveness.LOST, backoff=32.0)
    gpu = Gpu.__new__(Gpu)  # identity is not what liveness looks at
    state.recover(gpu)
    assert state.liveness is Liveness.UP
    assert state.backoff == 1.0
    assert state.gpu is gpu
