"""`stallscope sweep` over tests/data/scenarios/knee.py (a sleep-timed model, so a busy CPU does not move it): the
knee, the explained compute slowdown and the failed-configuration row, from one sweep run once for the module.

Apart from tests/test_sweep.py so that this module's one work unit (its tests share the module's sweep,
tests/scheduling.py) holds only tests that mostly wait: the sweep sleeps, and its unit is light.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from rich.console import Console

from profiler.core.steps.device_timers import resolve_device
from profiler.core.store import load_run
from profiler.drivers.runner import RunConfig
from profiler.sweep.analysis import MIN_STEPS, Config, is_stable, relative_ci
from profiler.sweep.render import render_sweep
from profiler.sweep.run import Harness, Limits, run_sweep

SCENARIOS = ROOT / "tests" / "data" / "scenarios"
# light (tests/scheduling.py): the module's sweep sleeps (knee.py); 2.7-2.9 CPU-seconds over its 23 s here (0.12 of
# a core; 22.3 s in a fresh-clone CI run, 0.13), the other two tests read its result
LIGHT = pytest.mark.light(seconds=22)


def sweep_of(
    tmp: Path, scenario: str, batches: list[int], workers: list[int], limits: Limits | None = None
) -> tuple[Any, Path]:
    import scenarios

    out = tmp / "sweep"
    base = RunConfig(out, resolve_device("cpu"))
    h = Harness(scenario=scenarios.get(str(SCENARIOS / scenario)), base=base, limits=limits or Limits())
    out.mkdir()
    result, stopped = run_sweep(h, [Config("naive", b, w) for w in workers for b in batches], out)
    assert stopped is None
    return result, out


@pytest.fixture(scope="module")
def knee_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return sweep_of(tmp_path_factory.mktemp("knee"), "knee.py", [8, 16, 32, 64, 128], [0])


@LIGHT
def test_sweep_finds_the_injected_knee(knee_sweep: tuple[Any, Path]) -> None:
    result, _ = knee_sweep
    thr = {r.batch_size: r.throughput_samples_per_s for r in result.rows if r.ok}
    # injected: 40, 80, 77.7, 38.8 samples/s (sleeps; the loop's own cost only lowers them a little)
    assert thr[16] == pytest.approx(80, rel=0.2) and thr[8] == pytest.approx(thr[16] / 2, rel=0.15)
    assert result.knee is not None and result.knee.batch_size == 16, result.knee
    for r in result.rows:
        if r.ok:
            assert r.stop_reason == _rule_on_its_own_steps(r), r
            # the row's interval is the one of its own recorded steps, all of them: the rule judged the steps
            # before the last (a step is recorded when the next one starts), so one late last step on a busy
            # machine widens the row's interval past the rule's (a stress pass: 30% on a row that stopped stable),
            # and the row says so rather than the rule's narrower figure
            d = [s.t_end - s.t_start for s in load_run(Path(r.run_dir)).steps if not s.warmup]
            assert r.step_time_rel_ci == pytest.approx(relative_ci(d), rel=1e-9), r
    # sleep-timed steps are steady: on a quiet host every configuration stops early, long before the cap of 30.
    # Beside two busy processes one row in a stress pass ran to the cap: its steps had not settled, and the check
    # above holds the rule to what the row's own steps say.
    assert any(r.stop_reason == "stable" and r.steps < 30 for r in result.rows if r.ok), result.rows


def _rule_on_its_own_steps(row: Any) -> str:
    """Why the early-stop rule ends a row, recomputed from the row's own recorded steps: "stable" where a window of
    its measured steps before the last (a step is recorded when the next starts, give or take one) meets
    ``is_stable``, else "steps" (the cap)."""
    d = [s.t_end - s.t_start for s in load_run(Path(row.run_dir)).steps if not s.warmup]
    stable = [p for p in range(MIN_STEPS, len(d)) if is_stable(d[:p])]
    if not stable:
        return "steps"
    # the rule fires at its first stable window: the row ends there (the step it judged after, and the last)
    return "stable" if stable[0] >= len(d) - 2 else f"stable only at {stable[0]} of {len(d)} steps"


@pytest.mark.light(seconds=0)
def test_sweep_explains_the_injected_compute_slowdown(knee_sweep: tuple[Any, Path]) -> None:
    result, _ = knee_sweep
    assert [(s.batch_size, s.smaller_batch_size, s.cause) for s in result.slowdowns] == [(64, 32, "compute")]
    assert result.slowdowns[0].drop == pytest.approx(0.5, abs=0.12)
    assert "compute per sample grew" in result.slowdowns[0].text


@pytest.mark.light(seconds=0)
def test_a_failed_configuration_is_a_row_and_every_run_is_kept(knee_sweep: tuple[Any, Path]) -> None:
    result, out = knee_sweep
    oom = result.rows[-1]
    assert (oom.batch_size, oom.status) == (128, "failed") and "OutOfMemoryError" in (oom.error or "")
    for r in result.rows:
        assert (out / r.name / "run.sqlite").exists()
    assert load_run(out / "naive-b16-w0").meta["batch_size"] == 16
    on_disk = json.loads((out / "sweep.json").read_text())
    assert on_disk == json.loads(json.dumps(result.to_dict()))

    buf = io.StringIO()
    render_sweep(result, Console(file=buf, width=200, color_system=None), out)
    text = buf.getvalue()
    assert "Knee: knee (naive, 0 workers): batch 16" in text and "Slowdown [compute] batch 64" in text
    assert "naive-b128-w0 failed: OutOfMemoryError" in text
