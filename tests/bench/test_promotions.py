"""The promotion counter of bench/promotions.py: what a generation-1 collection moved into the
old generation, counted by type, only once counting started."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from promotions import PromotionCounter


class RoundState:
    """Stands for what a round keeps alive."""


def test_a_generation_1_collection_counts_the_young_objects_still_alive(tmp_path: Path) -> None:
    counter = PromotionCounter(tmp_path / "promotions.json", sites=False)
    gc.callbacks.append(counter.on_collection)
    try:
        alive = [RoundState() for _ in range(5)]
        gc.collect(1)  # before counting starts: not counted
        counter.start()
        alive.extend(RoundState() for _ in range(40))
        gone = [RoundState() for _ in range(30)]
        del gone
        gc.collect(1)
    finally:
        gc.callbacks.remove(counter.on_collection)
    counter.dump()
    report = json.loads((tmp_path / "promotions.json").read_text())
    assert dict(report["types"]).get("RoundState") == 40, (
        "only the 40 objects alive at the counted collection are promotions"
        f" (counted: {report['types']})"
    )
    assert report["generation_1_collections"] >= 1
