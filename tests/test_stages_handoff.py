"""Each batch's hand-off from a worker to the training process (issue #66 item 2): the worker's wall time from its
collate's end to its next stage (pipelines.stages), less its wait for the next indices (the loader time table's),
counted beside the stages in the capacity and in the check against the workers' busy time. Without it a worker's
busy time holds work no stage does, and a CI run read its truth case 60-72% covered with every stage right.

The clock against perf_counter readings taken around the same calls, and through a real DataLoader worker; the
analysis against injected counters."""

from __future__ import annotations

import io
import math
import os
import time

import pytest
import torch
from rich.console import Console
from torch.utils.data import DataLoader, Dataset, default_collate

from pipelines import stages
from profiler.analysis.stages import COVERED, loader_stages, per_item, stage_series
from profiler.core.sources.stages import SharedDoubles
from profiler.render.loader import stages_table


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh shared array in this process (restored after), no collate pending."""
    monkeypatch.setattr(stages, "_clock", SharedDoubles(stages.ROWS * len(stages.COUNTED) * 2))
    monkeypatch.setattr(stages, "_collated", None)


def _as_worker(monkeypatch: pytest.MonkeyPatch, row: int) -> None:
    monkeypatch.setitem(stages._rows, os.getpid(), row)


def test_a_workers_gap_from_its_collate_to_its_next_stage_is_the_hand_off(
    clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_worker(monkeypatch, 1)
    collate = stages.TimedCollate(lambda items: items)
    outer0 = time.perf_counter()
    collate([1, 2, 3, 4])
    inner0 = time.perf_counter()
    time.sleep(0.02)  # the queue put and the wait for the next indices, as torch's worker loop does them
    inner1 = time.perf_counter()
    with stages.timed("fetch"):
        outer1 = time.perf_counter()
    seconds, items = stages.totals()["handoff"]
    assert items == 4  # the batch's items: the hand-off per item reads like the collate's
    assert inner1 - inner0 <= seconds <= outer1 - outer0, (seconds, inner1 - inner0, outer1 - outer0)
    # one gap per collate: the next stages of the same batch add nothing
    with stages.timed("decode"):
        pass
    assert stages.totals()["handoff"] == (seconds, 4)


def test_no_hand_off_in_the_training_process_nor_where_the_next_thing_timed_is_a_collate(
    clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0 workers: the gap from the collate to the next fetch is the training step, not the loader's
    _as_worker(monkeypatch, 0)
    collate = stages.TimedCollate(lambda items: items)
    collate([1, 2])
    with stages.timed("fetch"):
        pass
    assert "handoff" not in stages.totals()
    # a worker whose data set times no stage: the gap to the next collate holds the items' own (untimed) work
    _as_worker(monkeypatch, 1)
    collate([1, 2])
    time.sleep(0.005)
    collate([3, 4])
    assert "handoff" not in stages.totals() and stages.totals()["collate"][1] == 2 + 4


class _Slow(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        with stages.timed("fetch"):
            time.sleep(0.002)
        return torch.full((2,), float(i))


def test_a_real_workers_hand_off_is_counted_once_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stages, "_clock", None)
    monkeypatch.setattr(stages, "_collated", None)
    stages.install()
    loader = DataLoader(_Slow(), batch_size=4, num_workers=1, collate_fn=stages.TimedCollate(default_collate))
    assert sum(len(b) for b in loader) == 24
    got = stages.totals()
    assert got["fetch"][1] == 24 and got["collate"][1] == 24
    # 6 batches: a gap after each of the first 5 (the last one's ends with the worker)
    assert got["handoff"][1] == 20 and got["handoff"][0] > 0, got


def _readings(per: dict[str, float], items: list[float]) -> list[tuple[float, str, str, float | None]]:
    out: list[tuple[float, str, str, float | None]] = []
    for t, n in enumerate(items):
        for stage, s in per.items():
            out += [(float(t), "stages", f"stage.{stage}.s", s * n), (float(t), "stages", f"stage.{stage}.n", n)]
    return out


# the CI case in figures: 7 ms of stages an item in 2 workers whose busy time is 10 ms an item (0.5 ms of it a wait for
# a CPU, in the stages' and the gaps' clocks too); their gaps hold 3 ms an item, 0.5 of it their wait for the next
# indices: a 2.5 ms hand-off
CI = _readings({"fetch": 0.001, "augment": 0.0055, "collate": 0.0005, "handoff": 0.003}, [100, 200, 300])
KW = {"batch_size": 4, "step_ms": 10.0, "data_wait_ms": 5.0, "loader_ms_per_item": 10.0, "loader_runq_ms_per_item": 0.5}


def test_the_hand_off_counts_in_the_capacity_and_the_check() -> None:
    st = loader_stages(CI, None, workers=2, loader_queue_ms_per_item=0.5, **KW)  # type: ignore[arg-type]
    assert st is not None and st.handoff_ms_per_item == pytest.approx(2.5)
    assert st.coverage == pytest.approx(9.5 / 10.0) and not st.uncovered
    # 2 workers / (7 ms of stages + 2.5 ms of hand-off) an item; without the hand-off it read 2 / 7 ms, too high
    assert st.capacity_samples_per_s == pytest.approx(2e3 / 9.5)
    assert [s.name for s in st.stages] == ["fetch", "augment", "collate"]  # the hand-off is no stage
    assert sum(s.share for s in st.stages) == pytest.approx(1.0) and st.bottleneck == "augment"
    assert st.coverage_line is not None and "the stages and the batches' hand-off hold 95%" in st.coverage_line
    assert "hand-off to the training process" in st.capacity_basis
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(stages_table(st))
    assert "hand-off (batch to training) │      2.50" in buf.getvalue()
    assert st.to_dict()["handoff_ms_per_item"] == pytest.approx(2.5)


def test_without_the_hand_off_the_same_loader_gives_no_capacity() -> None:
    # the loader time not split (no queue figure): the gaps' wait for work cannot be taken out, so no hand-off is
    # counted, and 7 of 10 ms is under the line at 2 workers as at 0
    st = loader_stages(CI, None, workers=2, loader_queue_ms_per_item=None, **KW)  # type: ignore[arg-type]
    assert st is not None and st.handoff_ms_per_item is None and st.coverage == pytest.approx(0.7)
    assert COVERED > 0.7 and st.uncovered and math.isnan(st.capacity_samples_per_s) and st.bottleneck is None
    assert "in 2 worker processes were timed for 70%" in st.headline and "no capacity is given" in st.headline
    # a wait for work longer than the gaps (sampled) leaves no negative hand-off
    idle = loader_stages(CI, None, workers=2, loader_queue_ms_per_item=4.0, **KW)  # type: ignore[arg-type]
    assert idle is not None and idle.handoff_ms_per_item == 0.0


def test_the_training_process_hands_nothing_over_and_the_live_row_and_timeline_show_stages_only() -> None:
    st = loader_stages(CI, None, workers=0, loader_queue_ms_per_item=0.5, **KW)  # type: ignore[arg-type]
    assert st is not None and st.handoff_ms_per_item is None and st.capacity_basis.startswith("derived from the")
    assert set(per_item(CI, None)) == {"fetch", "augment", "collate"}
    assert {name for _t, name, _ms in stage_series(CI)} == {"fetch", "augment", "collate"}


def test_the_workers_time_is_put_per_item_they_loaded() -> None:
    # the figures came per sample trained at 80 samples/s; the stages counted 100 items a second over the window
    # (the prefetched batches filling): per item loaded, the busy time and its parts are 0.8 of them
    st = loader_stages(CI, None, workers=2, loader_queue_ms_per_item=0.5, loader_samples_per_s=80.0, **KW)  # type: ignore[arg-type]
    assert st is not None and st.loader_ms_per_item == pytest.approx(8.0)
    assert st.loader_runq_ms_per_item == pytest.approx(0.4) and st.handoff_ms_per_item == pytest.approx(3.0 - 0.4)
    assert st.coverage == pytest.approx((7.0 + 2.6) / 8.0)
    # at 0 workers the data wait per item is the training's own: nothing is rescaled
    alone = loader_stages(CI, None, workers=0, loader_samples_per_s=80.0, **KW)  # type: ignore[arg-type]
    assert alone is not None and alone.loader_ms_per_item == pytest.approx(10.0)
