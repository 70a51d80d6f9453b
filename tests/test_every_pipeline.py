"""Every built-in scenario trains on CPU through every pipeline that applies to it (issue #4's "done when").

naive and prefetch apply to every scenario; dali to the file-backed ones (imagenet, ssd), and any other gets a
one-line PipelineError. Two measured steps each, small batches, tiny generated data sets.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import scenarios
from pipelines import PipelineError
from profiler.core.steps.device_timers import resolve_device
from profiler.drivers.runner import RunConfig, TrainingError, run_scenario
from scenarios.datagen import make

FILE_BACKED = {"imagenet": ("imagenet-like", 3), "ssd": ("voc-like", 20)}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    out = {}
    for name, (kind, classes) in FILE_BACKED.items():
        out[name] = root / kind
        make(kind, out[name], 12, classes=classes)
    return out


CASES = [
    (name, pipeline)
    for name in scenarios.names()
    for pipeline in ("naive", "prefetch", "dali")
    if pipeline != "dali" or name in FILE_BACKED
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "pipeline"), CASES)
def test_trains_through_the_pipeline(name: str, pipeline: str, data: dict[str, Path], tmp_path: Path) -> None:
    cfg = RunConfig(
        out=tmp_path / "run",
        device=resolve_device("cpu"),
        pipeline=pipeline,
        batch_size=4,
        steps=2,
        warmup=1,
        attribution=False,
        data=data.get(name),
    )
    session = run_scenario(scenarios.get(name), cfg)
    assert session.status == "complete"
    assert session.meta["pipeline"] == pipeline and math.isfinite(session.meta["final_loss"])


@pytest.mark.parametrize("name", [n for n in scenarios.names() if n not in FILE_BACKED][:2])
def test_dali_refuses_in_memory_scenarios_in_one_line(name: str, tmp_path: Path) -> None:
    cfg = RunConfig(out=tmp_path / "run", device=resolve_device("cpu"), pipeline="dali", steps=1, warmup=0)
    with pytest.raises(TrainingError) as info:
        run_scenario(scenarios.get(name), cfg)
    assert isinstance(info.value.__cause__, PipelineError)
    assert info.value.bad_input and "needs an image-folder dataset" in info.value.bad_input
    assert "\n" not in info.value.bad_input
