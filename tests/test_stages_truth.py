"""The loader's stages against the data set's own timing: items whose fetch, decode and augment sleep for known
times (tests/data/scenarios/stage_costs.py, timed through pipelines.stages as the built-in data sets time theirs
and, around the same sleeps, by the data set itself into a truth file), 2 workers, a 4 ms model: the loader cannot
keep up. Each stage's time per item against the data set's own mean, the slowest stage named the bottleneck (fetch
in one case, augment in the other), and the capacity derived from the stage times against the throughput the
loader-bound run really had.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import ROOT, stallscope

SCENARIO = str(ROOT / "tests" / "data" / "scenarios" / "stage_costs.py")


@pytest.mark.parametrize("case", ["fetch", "augment"])
def test_stage_times_bottleneck_and_capacity_match_the_data_sets_own_timing(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth_file = tmp_path / "truth.txt"
    monkeypatch.setenv("STAGE_CASE", case)
    monkeypatch.setenv("STAGE_TRUTH", str(truth_file))
    res = stallscope(
        "run", SCENARIO, "--workers", "2", "--no-attribution", "--out", str(tmp_path / "run"), "--no-live", "--json"
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    st = summary["stages"]
    spent: dict[str, list[float]] = defaultdict(list)
    for line in truth_file.read_text().splitlines():
        stage, seconds = line.split()
        spent[stage].append(float(seconds))
    got = {s["name"]: s for s in st["stages"]}
    assert set(got) == {"fetch", "decode", "augment", "collate"}
    for stage, times in spent.items():
        # the run's measured window against every item the data set timed (warm-up included): the same sleeps
        assert got[stage]["ms_per_item"] == pytest.approx(1e3 * statistics.mean(times), rel=0.10, abs=0.3), stage
    assert st["bottleneck"] == case, st
    assert "LOADER_STAGE" in [r["code"] for r in summary["recommendations"]]
    # the capacity is derived (2 workers / the stages' time per item): the run is loader-bound, so the throughput
    # it measured is the capacity less what the training process adds per batch (receiving it, the 4 ms step
    # overlapping): measured 134 against 144 samples/s (-7%) on a quiet host
    assert summary["throughput_samples_per_s"] == pytest.approx(st["capacity_samples_per_s"], rel=0.15), st
    assert st["demand_samples_per_s"] > 2 * st["capacity_samples_per_s"]  # a 4 ms model would take far more
    assert os.path.exists(tmp_path / "run" / "run.sqlite")
