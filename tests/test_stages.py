"""The loader's stages, piece by piece: the stage clock across forked DataLoader workers, the source's metrics,
and the analysis on readings made by hand (time per item, capacity against demand, the bottleneck, the words).
The figures against a data set's own timing are in tests/test_stages_truth.py."""

from __future__ import annotations

import io
import math

import pytest
import torch
from rich.console import Console

from pipelines import stages
from profiler.analysis.stages import loader_stages, prefix_stages, stage_advice
from profiler.core.sources.stages import StageSource
from profiler.render.loader import stages_table


class Timed(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> int:
        stages.record("fetch", 0.002)
        stages.record("decode", 0.001)
        return i


def test_the_clock_sums_every_loader_process_and_the_collate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stages, "_clock", None)
    stages.record("fetch", 1.0)  # not installed: nothing is timed
    assert stages.totals() == {} and not stages.installed()
    stages.install()
    loader = torch.utils.data.DataLoader(
        Timed(), batch_size=4, num_workers=2, collate_fn=stages.TimedCollate(torch.utils.data.default_collate)
    )
    assert sum(len(b) for b in loader) == 24
    got = stages.totals()
    # 24 items in 2 forked workers, each row written by its own process; 6 batches of 4 collated
    assert got["fetch"] == pytest.approx((24 * 0.002, 24)) and got["decode"] == pytest.approx((24 * 0.001, 24))
    assert got["collate"][1] == 24 and got["collate"][0] > 0
    assert StageSource(stages.totals).read()["stage.fetch.n"] == 24


def _readings(per_item: dict[str, float], items: list[float]) -> list[tuple[float, str, str, float | None]]:
    out: list[tuple[float, str, str, float | None]] = []
    for t, n in enumerate(items):
        for stage, s in per_item.items():
            out += [(float(t), "stages", f"stage.{stage}.s", s * n), (float(t), "stages", f"stage.{stage}.n", n)]
    return out


def test_capacity_demand_and_the_bottleneck() -> None:
    samples = _readings({"fetch": 0.010, "decode": 0.004, "augment": 0.005, "collate": 0.001}, [100, 300, 500])
    # 2 workers at 20 ms an item: 100 samples/s; a 4-sample batch every 10 ms of compute would take 400
    st = loader_stages(samples, (1.0, 2.0), workers=2, batch_size=4, step_ms=40.0, data_wait_ms=30.0)
    assert st is not None and [s.name for s in st.stages] == ["fetch", "decode", "augment", "collate"]
    assert st.stages[0].ms_per_item == pytest.approx(10.0) and st.stages[0].share == pytest.approx(0.5)
    assert st.capacity_samples_per_s == pytest.approx(100.0) and st.demand_samples_per_s == pytest.approx(400.0)
    assert st.headroom == pytest.approx(0.25) and st.bottleneck == "fetch"
    assert st.headline.startswith("Input-bound at the fetch stage") and "cache the data set" in st.headline
    console = Console(record=True, width=140)
    console.print(stages_table(st))
    text = console.export_text()
    assert "fetch  <- bottleneck" in text and "capacity 100 samples/s in 2 worker processes" in text
    assert "an upper bound" in text
    # the same stages beside a slow model: the loader keeps up, nothing is named
    slow = loader_stages(samples, None, workers=2, batch_size=4, step_ms=100.0, data_wait_ms=0.0)
    assert slow is not None and slow.bottleneck is None and slow.headline.startswith("The loader keeps up")
    # 0 workers: the training process runs the stages, one at a time
    alone = loader_stages(samples, None, workers=0, batch_size=4, step_ms=40.0, data_wait_ms=30.0)
    assert alone is not None and alone.processes == 1 and alone.capacity_samples_per_s == pytest.approx(50.0)
    assert "samples/s in the training process (num_workers=0)" in alone.headline
    # the advice leads with the change and never repeats the headline (a report shows both: an HTML page said the
    # sentence twice in a fresh-clone CI)
    advice = stage_advice(st)
    assert advice is not None and st.headline not in advice and advice.startswith("Speed up the fetch stage")
    assert "holds the loader to 100 samples/s in 2 worker processes, under the training's 400" in advice
    assert "The bytes come slowly: cache the data set" in advice and stage_advice(slow) is None


def test_no_stage_readings_no_figures() -> None:
    assert (
        loader_stages([(0.0, "host", "sys.cpu_pct", 5.0)], None, workers=2, batch_size=4, step_ms=1, data_wait_ms=0)
        is None
    )
    one = _readings({"fetch": 0.01}, [100])  # a single reading: no difference to take
    assert loader_stages(one, None, workers=2, batch_size=4, step_ms=1.0, data_wait_ms=0.0) is None
    nan_demand = loader_stages(
        _readings({"fetch": 0.01}, [1, 2]), None, workers=1, batch_size=math.nan, step_ms=1.0, data_wait_ms=0.0
    )
    assert nan_demand is not None and math.isnan(nan_demand.headroom) and nan_demand.bottleneck is None


def test_dali_stages_are_the_differences_of_its_prefixes() -> None:
    # with 2 threads, the reader 1 ms a sample, + the decoder 5 ms, the whole graph 8 ms (wall): in a thread, fetch
    # 2 ms an item, decode 8, augment 6; the whole graph's rate (125 samples/s) is the capacity, measured; the
    # training would take 8 / (20 - 2 ms) = 444 samples/s
    prefixes = {
        "prefix_s_per_sample": {"fetch": 0.001, "decode": 0.005, "augment": 0.008},
        "rounds": 7,
        "batches": 2,
        "batch_size": 8,
        "threads": 2,
    }
    st = prefix_stages(prefixes, batch_size=8, step_ms=20.0, data_wait_ms=2.0)
    assert st is not None
    got = {s.name: s.ms_per_item for s in st.stages}
    assert got == pytest.approx({"fetch": 2.0, "decode": 8.0, "augment": 6.0})
    assert {s.name: s.capacity_samples_per_s for s in st.stages} == pytest.approx(
        {"fetch": 1000.0, "decode": 250.0, "augment": 1000 / 3}
    )
    assert st.capacity_samples_per_s == pytest.approx(125.0) and st.processes == 2
    assert st.demand_samples_per_s == pytest.approx(8 / 0.018)
    assert st.bottleneck == "decode" and "DALI's 2 threads" in st.headline
    assert "no per-operator times" in st.method and "7 rounds of 2 batches of 8 each" in st.method
    assert st.capacity_basis.startswith("measured: the whole graph")
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(stages_table(st))
    text = " ".join(buf.getvalue().split())  # the caption wraps at the table's width
    assert "on DALI's 2 threads, measured: the whole graph run alone" in text and "decode <- bottleneck" in text
    # a prefix that ran faster than the one before it (noise) costs nothing rather than a negative time
    noisy = {**prefixes, "prefix_s_per_sample": {"fetch": 0.002, "decode": 0.0019, "augment": 0.004}}
    st2 = prefix_stages(noisy, batch_size=8, step_ms=20.0, data_wait_ms=2.0)
    assert st2 is not None and {s.name: s.ms_per_item for s in st2.stages}["decode"] == 0.0
    assert prefix_stages({"not_timed": "x"}, batch_size=8, step_ms=20.0, data_wait_ms=2.0) is None
