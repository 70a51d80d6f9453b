"""`stallscope tune` on a budget that holds few trials (issue #66, item 1): the plan comes from the first trial's
measured length; a budget that holds more trials but no final round spends them, compared as they ran; one too small
for a second trial says so and by how much; nothing compared is never called "the best", and the first trial's own
advice (what `stallscope run` says of it) is named instead.

The search runs on a fake clock (tests/test_tune.py's FakeTrials: every trial takes its ``wall_s``), as a command's
tune does it (the script's own setting measured first); one CLI-driven check runs a small script of a known trial
length for real with a budget too small for a second trial.
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path

import pytest
from conftest import stallscope
from rich.console import Console
from test_tune import FakeTrials, run

from profiler.sweep.analysis import Config
from profiler.sweep.render import render_tune
from profiler.sweep.tuner import ONE_TRIAL_EACH, TuneResult

TRIAL_S = 20.0  # the case: `tune --budget-s 60 -- python main.py --epochs 1`, one trial of 20 s
OWN = Config("script", 64, 0)
# throughput by workers: 2 workers 23% faster than the script's 0 (the sweep measured 606.5 -> 741.8)
SPEED = {0: 606.5, 1: 650.0, 2: 741.8, 4: 700.0}
ADVICE = "main.py:124: ... Set num_workers=2 (this machine has 2 cores) so batches are prepared in parallel."


def command_tune(budget_s: float, speed: dict[int, float] = SPEED) -> tuple[TuneResult, FakeTrials]:
    """A command's tune on the fake clock: the script's own setting (batch 64, 0 workers) first, as
    sweep.command runs it, then the search on 2 cores; its rendering given a change site and run's advice."""
    trials = FakeTrials(lambda c: speed[c.workers], wall_s=TRIAL_S)
    first = dataclasses.replace(trials(OWN, "t01-script", "trial"), role="trial")
    result = run(
        trials, pipelines=["script"], default=OWN, first=first, default_batch=64, max_batch=64, batches=[],
        max_workers=4, cores=2, budget_s=budget_s,
    )  # fmt: skip
    rec = result.recommended
    args = {"num_workers": rec.workers, "persistent_workers": True} if rec is not None and rec != OWN else {}
    result.change = {"site": "main.py:124", "kind": "DataLoader", "args": args}
    if not result.compared:
        result.advice = [ADVICE]
    return result, trials


def text(result: TuneResult) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_tune(result, console)
    out = console.file.getvalue()
    assert isinstance(out, str)
    return " ".join(out.split())


def test_a_60_s_budget_with_20_s_trials_spends_the_40_s_left_on_two_more_trials() -> None:
    result, trials = command_tune(60.0)
    # before: 1 trial + 0 final runs, 20 s of the 60 s, "the best configuration found" with nothing compared
    assert [r.workers for r in result.trials] == [0, 1, 2], result.notes
    assert not result.final and result.elapsed_s == pytest.approx(3 * TRIAL_S) and trials.now <= 60.0
    assert result.recommended == Config("script", 64, 2) and result.basis == ONE_TRIAL_EACH
    assert result.speedup == pytest.approx(SPEED[2] / SPEED[0])  # the trials' own figures, one each
    plan = result.notes[0]
    assert "the first trial took 20 s: the 40 s left of the 60 s budget hold 2 more trials" in plan, plan
    assert "--budget-s 80 or more also re-runs the pick beside the default" in plan
    shown = text(result)
    assert "Tune: 3 trials + 0 final runs, 60 s of a 60 s budget" in shown
    assert "best configuration" not in shown
    assert "Recommended change (measured in one trial each; not re-run side by side" in shown
    assert "main.py:124 DataLoader(..., num_workers=2, persistent_workers=True) x1.22 measured" in shown
    assert json.loads(json.dumps(result.to_dict()))["speedup_basis"] == ONE_TRIAL_EACH


def test_one_trial_each_recommends_nothing_within_the_two_trials_uncertainty() -> None:
    # the alternatives measured no faster, or faster only within the trials' +-3%: the script's setting is kept,
    # named for what it is (the best alternative's ratio, one trial each), never "the best configuration found"
    result, _ = command_tune(60.0, {0: 606.5, 1: 600.0, 2: 620.0, 4: 500.0})
    assert result.recommended == OWN and result.unconfirmed == Config("script", 64, 2)
    assert result.unconfirmed_speedup == pytest.approx(620.0 / 606.5)
    shown = text(result)
    assert "best configuration" not in shown
    assert "Keep the script's setting at main.py:124: the best alternative found (script-b64-w2) made x1.02" in shown
    assert "one trial each, not re-run side by side: the budget held no final round" in shown


def test_a_budget_too_small_for_a_second_trial_says_by_how_much_and_names_runs_advice() -> None:
    result, _ = command_tune(30.0)
    assert len(result.trials) == 1 and not result.final
    assert result.speedup is None and not result.compared  # nothing was compared: no figure for a speedup
    shown = text(result)
    assert "best configuration" not in shown
    assert (
        "Nothing was compared with the script's setting at main.py:124, so there is no verdict on it: the budget of "
        "30 s is too small for a second trial: the first took 20 s, and a second needs 10 s more than the budget "
        "(--budget-s 40 or more tries a second configuration; --budget-s 80 or more also re-runs the pick beside "
        "the default)"
    ) in shown
    assert f"Not measured by this tune, `stallscope run` on its first trial advises: {ADVICE}" in shown
    assert shown.count("too small for a second trial") == 1  # said once: in the verdict, not again as a note


def test_a_budget_for_a_second_trial_and_a_round_keeps_the_final_comparison() -> None:
    # 80 s = 20 s spent + a second trial + one round of the pick beside the default: the usual search
    result, _ = command_tune(80.0)
    assert [r.role for r in result.final] == ["default", "recommended"] and result.basis != ONE_TRIAL_EACH
    assert not any("budget" in n and "hold" in n for n in result.notes)


# a script of a known trial length: its DataLoader's items sleep, so each batch takes ITEM_MS x BATCH however busy
# the host; 0 workers, so the loop waits for every batch and `run` advises workers
SCRIPT = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.zeros(4)

for step, batch in enumerate(DataLoader(Items(), batch_size=4, num_workers=0)):
    if step >= 400:
        break
"""


def test_tune_of_a_command_on_a_budget_too_small_for_a_second_trial(tmp_path: Path) -> None:
    # each trial: the script's start (importing torch) + 21 batches of 20 ms + 0.5 s measured: over 1 s, so a 1 s
    # budget is spent by the first trial whatever the host
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "tune"
    res = stallscope(
        "tune", "--budget-s", "1", "--seconds", "0.5", "--out", str(out), "--", sys.executable, str(script)
    )
    assert res.returncode == 0, res.stderr[-3000:]
    shown = " ".join(res.stdout.split())
    assert "best configuration" not in shown, shown
    assert "Tune: 1 trial + 0 final runs" in shown
    assert "Nothing was compared with the script's setting at train.py:13, so there is no verdict on it" in shown
    assert "the budget of 1 s is too small for a second trial: the first took" in shown
    assert "s more than the budget (--budget-s" in shown
    assert "`stallscope run` on its first trial advises: train.py:13: " in shown and "Set num_workers=" in shown
    saved = json.loads((out / "tune.json").read_text())
    assert saved["speedup"] is None and saved["advice"] and len(saved["trials"]) == 1
