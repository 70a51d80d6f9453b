"""`stallscope tune`'s pipeline set: by default the installed pipelines that can train the scenario, each one
left out named with why; an explicit pipeline that cannot is bad input before any trial. In-process
(``profiler.cli.main``): torch is imported once for the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

import pipelines
from profiler.cli import main

SCENARIOS = ROOT / "tests" / "data" / "scenarios"
QUICK = ["--steps", "2", "--warmup", "1", "--max-batch-size", "8", "--max-workers", "0", "--no-live", "--json"]


def test_applicable_follows_the_declared_data_and_what_is_installed() -> None:
    usable, left_out = pipelines.applicable(None)
    assert usable == ["naive", "prefetch"]
    assert set(left_out) == {"dali"} and "makes its data in memory" in left_out["dali"]
    usable, left_out = pipelines.applicable("imagenet-like")
    assert {"naive", "prefetch"} <= set(usable)
    # dali applies to a file-backed scenario where DALI imports; elsewhere it is left out as not installed
    assert ("dali" in usable) != ("dali" in left_out)
    assert all("not installed" in why for why in left_out.values())
    assert pipelines.why_not("naive", None) is None
    with pytest.raises(pipelines.PipelineError, match="unknown pipeline 'turbo'"):
        pipelines.why_not("turbo", None)


def test_tune_defaults_leave_dali_out_of_an_in_memory_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["tune", str(SCENARIOS / "tune.py"), "--budget-s", "1", *QUICK, "--out", str(tmp_path / "t")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    d = json.loads(captured.out)
    assert set(d["left_out"]) == {"dali"} and "in memory" in d["left_out"]["dali"]
    assert {r["pipeline"] for r in d["trials"]} <= {"naive", "prefetch"} and d["recommended"] is not None
    if len(d["trials"]) == 1:
        # the 1 s budget held the first trial alone: nothing was compared with it, so no speedup (issue #66: x1
        # against nothing was "the best configuration found"), and the note says by how much the budget is short
        assert d["speedup"] is None, d["notes"]
        assert any("too small for a second trial" in n and "more than the budget" in n for n in d["notes"]), d["notes"]
    else:  # a host fast enough for a second trial in 1 s: they were compared
        assert d["speedup"] is not None, d["notes"]
    header = next(ln for ln in captured.err.splitlines() if "tuning tune" in ln)
    assert "(naive, prefetch; dali left out: needs an image-folder or detection dataset" in header


def test_tune_explicit_dali_on_an_in_memory_scenario_is_one_line_before_any_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t"
    rc = main(["tune", str(SCENARIOS / "tune.py"), "--pipelines", "naive,dali", *QUICK, "--out", str(out)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, lines
    for needle in (
        "--pipelines",
        "dali cannot train scenario 'tune'",
        "in memory",
        "pipelines that can: naive, prefetch",
    ):
        assert needle in lines[0], lines[0]
    assert not out.exists()  # no trial ran, no directory was made


def test_tune_defaults_go_on_when_dali_finds_no_image_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    scenario = str(SCENARIOS / "files_not_folder.py")
    # the batch held at the scenario's 8: the pipelines are what this is about (a batch climb of 2-step trials,
    # each known to +-100% or worse, measured everything again: 28 runs, where 3 trials and the final rounds do)
    rc = main(["tune", scenario, "--data", str(data), "--budget-s", "60", "--batch-sizes", "8", *QUICK,
               "--out", str(tmp_path / "t")])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    d = json.loads(captured.out)
    if "dali" in d["left_out"]:  # DALI not installed here: left out before any trial
        assert "not installed" in d["left_out"]["dali"]
    else:  # declared file-backed, so tried; its loader found no image folder: a failed trial, noted, skipped
        dali = [r for r in d["trials"] if r["pipeline"] == "dali"]
        assert len(dali) == 1 and dali[0]["status"] == "failed" and "image-folder" in dali[0]["error"]
        assert any(n.startswith("pipeline dali failed at dali-b8-w0") for n in d["notes"])
        assert d["stopped"]["dali"]["workers"] == "not searched: dali-b8-w0 failed"
    assert d["recommended"]["pipeline"] in {"naive", "prefetch"}
    # an explicit dali on it stays bad input (here found when the loader is built)
    rc = main(["tune", scenario, "--data", str(data), "--pipelines", "dali", *QUICK, "--out", str(tmp_path / "u")])
    assert rc == 2
