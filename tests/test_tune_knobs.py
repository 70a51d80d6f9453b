"""The loader's own knobs in a tune (#47): ``prefetch_factor`` and ``pin_memory`` tried at the climb's pick where
they can matter, in scenarios and in ``tune -- CMD`` trials alike, each with the record of what it changed; and
``stallscope run --prefetch-factor / --pin-memory``, which trains a pick as the tune ran it.

The search is tested on modelled throughputs with a fake clock (deterministic); the knobs' way into a real
DataLoader, a script's loader and the simulated device's copy on real runs."""

from __future__ import annotations

import io
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, stallscope
from rich.console import Console
from test_cli import assert_one_line_error
from test_tune import FakeTrials, run

from profiler.sweep.analysis import Config, SweepRow, config_from_dict
from profiler.sweep.climb import KNOB_NOTABLE, LoaderKnobs
from profiler.sweep.command import PIPELINE, CommandSpec, CommandTrials
from profiler.sweep.render import render_tune
from profiler.sweep.run import scenario_knobs
from profiler.sweep.tuner import tune_from_dict

ON_CPU = {"naive": LoaderKnobs(2, pin_memory=False, copies=False)}
ON_ACCELERATOR = {"naive": LoaderKnobs(2, pin_memory=False, copies=True)}


def queue_model(gain: dict[int, float]) -> FakeTrials:
    """A loader that waits, its throughput rising with the workers up to 8 (the cores' ceiling is not reached: the
    workers wait); ``gain`` the factor a prefetch_factor gives (2: the DataLoader's own, 1.0). The loop waits for
    data a third of the step, so a deeper queue is tried."""

    def model(cfg: Config) -> float:
        return 50.0 * min(cfg.workers, 8) * gain.get(cfg.prefetch_factor or 2, 1.0) + 10.0

    return FakeTrials(model, cpu=lambda c: 0.05, parts=lambda c: (10.0, 30.0))


def test_a_deeper_queue_is_kept_only_where_it_gains_past_the_threshold() -> None:
    result = run(queue_model({4: 1.10, 8: 1.12}), pipelines=["naive"], max_batch=8, max_workers=8, knobs=ON_CPU)
    rec = result.recommended
    assert rec is not None and rec.workers == 8 and rec.prefetch_factor == 4  # 8 was within 3% of 4: not taken
    why = result.stopped["naive"]["prefetch_factor"]
    assert why == "stopped at 4: prefetch_factor 8 was 1.8% faster than 4 (458.0 vs 450.0 samples/s: within 3%)"
    tried = [c.prefetch_factor for c, _, role in result_calls(result) if role == "trial"]
    assert tried.count(4) == 1 and tried.count(8) == 1
    assert (
        rec.name == "naive-b8-w8-pf4"
        and rec.flags() == "--pipeline naive --batch-size 8 --workers 8 --prefetch-factor 4"
    )
    # the final comparison ran the pick with its knob, and the record says what it changed
    assert {r.prefetch_factor for r in result.final if r.role == "recommended"} == {4}
    assert result.stopped["naive"]["pin_memory"].startswith("not searched: the batches are not copied")


def result_calls(result: object) -> list[tuple[Config, str, str]]:
    return [(r.config, r.name, r.role or "") for r in result.trials]  # type: ignore[attr-defined]


def test_a_queue_that_does_not_help_leaves_the_loaders_own() -> None:
    result = run(queue_model({4: 0.99, 8: 0.98}), pipelines=["naive"], max_batch=8, max_workers=8, knobs=ON_CPU)
    rec = result.recommended
    assert rec is not None and rec.prefetch_factor is None and rec.workers == 8
    assert result.stopped["naive"]["prefetch_factor"].startswith("stopped at 2: prefetch_factor 4 was 1.0% slower")
    assert [r.prefetch_factor for r in result.trials].count(8) == 0  # one loss ends the direction


def test_the_knobs_are_not_tried_where_they_cannot_matter() -> None:
    # no workers at the pick: nothing is loaded ahead
    cheap = FakeTrials(lambda c: 100.0 - c.workers, parts=lambda c: (20.0, 40.0))
    result = run(cheap, pipelines=["naive"], max_batch=8, max_workers=2, knobs=ON_ACCELERATOR)
    assert result.recommended is not None and result.recommended.workers == 0
    assert result.stopped["naive"]["prefetch_factor"].startswith("not searched: no worker processes at the pick")
    # the copy is not in the breakdown: pin_memory's share unknown, not tried
    assert result.stopped["naive"]["pin_memory"] == "not searched: the pick's copy to the device was not measured"
    # a loop that barely waits: a deeper queue has nothing to hide (the figure said)
    fed = FakeTrials(lambda c: 100.0 + 50 * min(c.workers, 2), cpu=lambda c: 0.5, parts=lambda c: (0.6, 30.0))
    result = run(fed, pipelines=["naive"], max_batch=8, max_workers=2, knobs=ON_CPU)
    assert result.stopped["naive"]["prefetch_factor"] == (
        f"not searched: the loop waited for data 2% of the step at the pick (under {KNOB_NOTABLE:.0%}): a deeper "
        "queue has nothing to hide"
    )
    assert all(r.prefetch_factor is None and r.pin_memory is None for r in result.trials)
    # a pipeline without the knobs (DALI's loader) and one that pins already
    result = run(fed, pipelines=["naive"], max_batch=8, max_workers=2, knobs={})
    assert (
        result.stopped["naive"]["prefetch_factor"] == "not searched: the naive pipeline's loader has no prefetch_factor"
    )
    result = run(fed, pipelines=["naive"], max_batch=8, max_workers=2, knobs={"naive": LoaderKnobs(2, True, True)})
    assert result.stopped["naive"]["pin_memory"] == "not searched: the loader pins its batches already"


class CopyTrials(FakeTrials):
    """Batches copied to an accelerator: the copy a quarter of the step (10 of 40 ms), the loop fed (0.5 ms of data
    wait); pinning speeds the step by ``gain``."""

    def __init__(self, gain: float) -> None:
        def model(c: Config) -> float:
            return (100.0 + 50 * min(c.workers, 2)) * (gain if c.pin_memory else 1.0)

        super().__init__(model, cpu=lambda c: 0.5, parts=lambda c: (0.5, 40.0))

    def __call__(self, cfg: Config, label: str, role: str) -> SweepRow:
        row = super().__call__(cfg, label, role)
        return replace(row, breakdown_ms_per_step={**row.breakdown_ms_per_step, "h2d": 10.0}) if row.ok else row


@pytest.mark.parametrize(("gain", "kept"), [(1.2, True), (1.01, False)])
def test_pin_memory_is_tried_where_the_batches_are_copied_and_kept_where_it_gains(gain: float, kept: bool) -> None:
    trials = CopyTrials(gain)
    result = run(trials, pipelines=["naive"], max_batch=8, max_workers=2, knobs=ON_ACCELERATOR)
    rec = result.recommended
    assert rec is not None and (rec.pin_memory is True) is kept
    why = result.stopped["naive"]["pin_memory"]
    assert why.startswith("stopped at on: pin_memory on was 20.0% faster than off" if kept else "stopped at off:")
    # on the CPU the same loader is not tried pinned
    result = run(CopyTrials(gain), pipelines=["naive"], max_batch=8, max_workers=2, knobs=ON_CPU)
    assert all(r.pin_memory is None for r in result.trials)


def test_knobbed_configurations_round_trip_and_render() -> None:
    cfg = Config("naive", 64, 4, prefetch_factor=8, pin_memory=True)
    assert cfg.name == "naive-b64-w4-pf8-pin" and Config("naive", 64, 4, pin_memory=False).name == "naive-b64-w4-nopin"
    assert config_from_dict(cfg.to_dict()) == cfg and Config("naive", 8, 0).to_dict() == {
        "pipeline": "naive", "batch_size": 8, "workers": 0,
    }  # fmt: skip
    result = run(queue_model({4: 1.10, 8: 1.12}), pipelines=["naive"], max_batch=8, max_workers=8, knobs=ON_CPU)
    back = tune_from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.recommended == result.recommended and back.trials == result.trials
    console = Console(file=io.StringIO(), width=220, color_system=None)
    render_tune(back, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "Recommended: --pipeline naive --batch-size 8 --workers 8 --prefetch-factor 4" in text
    assert f"naive prefetch_factor {result.stopped['naive']['prefetch_factor']}" in text
    assert any(ln.split()[:4] == ["trial", "naive", "pf4", "8"] for ln in text.splitlines())


def test_a_scenarios_pipelines_knobs_follow_the_device() -> None:
    assert scenario_knobs(False) == {
        "naive": LoaderKnobs(2, pin_memory=False, copies=False), "prefetch": LoaderKnobs(2, False, False),
    }  # fmt: skip
    on = scenario_knobs(True)
    assert on["naive"] == LoaderKnobs(2, False, True) and on["prefetch"] == LoaderKnobs(2, True, True)


# -- the knobs reach the loaders -------------------------------------------------------------------------------------


def test_the_spec_sets_the_dataloaders_knobs_and_says_what_it_set() -> None:
    from pipelines import LoaderSpec
    from pipelines.naive import NaivePipeline, watched_loader
    from scenarios import get

    dataset = get("mlp-mnist").build_dataset(None)
    built = NaivePipeline().build(dataset, LoaderSpec(batch_size=4, workers=2, prefetch_factor=6, pin_memory=True))
    loader = watched_loader(built.batches)
    assert loader.prefetch_factor == 6 and built.config["prefetch_factor"] == 6
    # on the host there is no page-locked memory to use: the DataLoader is not asked to pin (torch would warn and not
    # pin); the knob stays as set, and a simulated device's copy is modelled from it
    assert loader.pin_memory is False and built.config["pin_memory"] is True
    plain = NaivePipeline().build(dataset, LoaderSpec(batch_size=4, workers=0, prefetch_factor=6))
    assert watched_loader(plain.batches).prefetch_factor is None and plain.config["pin_memory"] is False
    with pytest.raises(ValueError, match="prefetch_factor must be >= 1, got 0"):
        LoaderSpec(batch_size=4, workers=2, prefetch_factor=0)


SCRIPT = str(ROOT / "tests" / "data" / "tune_script.py")


def test_a_command_trial_sets_the_knobs_on_the_scripts_loader_and_the_change_names_them(tmp_path: Path) -> None:
    from profiler.sweep.command import change

    cmd = [sys.executable, SCRIPT, "--items", "wait", "--item-ms", "5", "--step-ms", "1"]
    trials = CommandTrials(CommandSpec(cmd, seconds=0.5), tmp_path)
    own = trials.first()
    assert own.ok and trials.knobs == LoaderKnobs(2, pin_memory=False, copies=False)  # the CPU: nothing copied
    assert trials.overrides(Config(PIPELINE, 4, 2)) == {"num_workers": 2, "persistent_workers": True}
    cfg = Config(PIPELINE, 4, 2, prefetch_factor=4, pin_memory=False)
    assert trials.overrides(cfg) == {
        "num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "pin_memory": False,
    }  # fmt: skip
    row = trials(cfg, "pf4", "trial")
    assert row.ok and row.config == cfg, row.error
    built = trials.loaders[cfg]
    assert built["args"]["prefetch_factor"] == 4 and built["args"]["num_workers"] == 2
    # what the recommendation changes at the script's line: the knobs set that differ from its own (pin_memory False
    # is the script's own)
    assert change(trials.loaders[own.config], built) == {
        "num_workers": 2,
        "persistent_workers": True,
        "prefetch_factor": 4,
    }


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--prefetch-factor", "4"], ["--prefetch-factor 4", "--workers 1 or more, not 0"]),
        (["--prefetch-factor", "0", "--workers", "2"], ["--prefetch-factor", "0"]),
        (["--pipeline", "dali", "--pin-memory", "on"], ["--pin-memory", "naive or prefetch, not dali"]),
        (["--pin-memory", "maybe"], ["--pin-memory", "maybe", "on", "off"]),
        (["--pin-memory", "on", "--", "python", "-c", "pass"], ["--pin-memory", "not allowed with a command"]),
    ],
)
def test_run_loader_knob_bad_input_is_one_line_and_exit_2(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(stallscope("run", "--no-live", *args), *needles)


def test_a_pinned_copy_to_a_simulated_device_takes_the_pinned_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlp-mnist's batches (784 floats an item) copied to a simulated V100 with nothing else on the device
    (--loader-only): with --pin-memory on every copy is a pinned one (the datasheet's 12 GB/s), without it a
    pageable one (half that), and each step's measured copy phase holds at least the simulated copy (a loaded
    host wakes the sleep late: beside a stress run a 0.6 ms copy's phase read up to 16 ms, so only the bound is
    checked on the host's clock)."""
    from profiler.core.kernel_windows.windows import tail_plan
    from profiler.core.steps.device_timers import resolve_device
    from profiler.core.store import load_run
    from profiler.drivers.runner import RunConfig, run_scenario
    from profiler.sim.device import SimDevice
    from scenarios import get

    copies: list[tuple[int, bool, bool]] = []
    h2d = SimDevice.h2d

    def recorded(self: SimDevice, nbytes: int, *, pinned: bool = False, side_stream: bool = False) -> None:
        copies.append((nbytes, pinned, side_stream))
        h2d(self, nbytes, pinned=pinned, side_stream=side_stream)

    monkeypatch.setattr(SimDevice, "h2d", recorded)
    device = resolve_device("sim:v100")
    spec = device.sim.spec
    for pin in (False, True):
        copies.clear()
        cfg = RunConfig(
            out=tmp_path / str(pin), device=device, batch_size=2048, workers=0, pin_memory=pin, steps=6, warmup=1,
            attribution=False, loader_only=True, sample_hz=5.0,
        )  # fmt: skip
        s = run_scenario(get("mlp-mnist"), cfg).summary()
        assert s is not None and s.status == "complete"
        meta = load_run(tmp_path / str(pin)).meta
        assert meta["sim_copy"] == ("pinned" if pin else "pageable") and meta["loader"]["pin_memory"] is pin
        nbytes = meta["batch_bytes"]
        # every step's copy, blocking, pinned where asked: the 7 steps, then the kernel window's after them
        assert copies == [(nbytes, pin, False)] * (7 + tail_plan(6).steps)
        rate = spec.h2d_pinned_gbps if pin else spec.h2d_pageable_gbps
        simulated_ms = nbytes / (rate * 1e9) * 1e3
        assert SimDevice(device.sim).h2d_s(nbytes, pinned=pin) * 1e3 == pytest.approx(simulated_ms)
        assert s.breakdown_ms_per_step.h2d >= simulated_ms, (pin, s.breakdown_ms_per_step)


# -- what a trial on an accelerator predicts ----------------------------------------------------------------------


def test_on_a_simulated_gpu_the_workers_needed_come_from_the_devices_own_step(tmp_path: Path) -> None:
    """io-wait's items sleep 20 ms (160 ms a batch of 8 in the loop); its model runs on a simulated device whose step
    takes 40 ms. With 0 workers the loop launches a step and goes back to loading while the device runs it: the step
    less its data wait is the launch time (7.3 ms by the calibrated host cost, and the copy), and dividing the
    loader's time by it would ask for several times the workers. The device's own busy time a step (the simulated
    device's events) is the rate that says how many feed it: 160 x 1.25 / 40, 5 workers."""
    import scenarios
    from profiler.core.steps.device_timers import DeviceInfo
    from profiler.drivers.runner import RunConfig, run_scenario
    from profiler.sim.cost import measure_step
    from profiler.sim.device import SimDevice
    from profiler.sim.specs import AcceleratorSpec, SimConfig
    from profiler.sweep.analysis import row_from_summary
    from profiler.sweep.climb import fed_step_ms, workers_to_feed

    scenario = scenarios.get(str(ROOT / "tests" / "data" / "scenarios" / "io_wait.py"))
    cost = measure_step(scenario.model, scenario.dataset()[0], 8, loss=scenario.loss)
    spec = AcceleratorSpec("twin", "a 40 ms twin", {"fp32": cost.flops / 0.040 / 1e12}, 16.0, 10.0, 5.0, 300.0, 50.0)
    config = SimConfig(spec, "fp32", 1.0)
    truth = SimDevice(config)
    truth.load(cost)
    device_ms = truth.step_s() * 1e3
    assert device_ms == pytest.approx(40.0, rel=0.02)  # the twin's step: the injected truth
    cfg = RunConfig(
        out=tmp_path / "run", device=DeviceInfo("sim", "cpu", "40 ms twin (simulated)", sim=config), pipeline="naive",
        batch_size=8, workers=0, steps=12, warmup=2, attribution=False, sample_hz=5.0,
    )  # fmt: skip
    session = run_scenario(scenario, cfg)
    s = session.summary()
    assert s is not None and s.status == "complete"
    row = row_from_summary(
        s, pipeline="naive", batch_size=8, workers=0, run_dir=None, step_s=session.step_times(), stop_reason="steps",
        wall_s=1.0,
    )  # fmt: skip
    step, wait = row.step_time_ms["mean"], row.breakdown_ms_per_step["data_wait"]
    assert step - wait < 0.5 * device_ms, row  # what the host saw of the step: the launches and the copy
    # the fed step: the device's busy time a step (its copy included), not the host's part
    assert fed_step_ms(row) == pytest.approx(device_ms, rel=0.1), (row.device_busy_fraction, step)
    expected = math.ceil(wait * 1.25 / fed_step_ms(row))
    assert workers_to_feed(row) == expected and 4 <= expected <= 6, (wait, fed_step_ms(row))


def test_a_knob_the_final_rounds_undo_is_said_in_its_stop_reason() -> None:
    # prefetch_factor 4 was 6% ahead of the loader's own 2 on trials known to +-12% each: taken as a step left within
    # the uncertainty, and its rival re-run beside it in the final rounds, where the loader's own wins
    trial_thr = {(0, None): 40.0, (1, None): 60.0, (2, None): 100.0, (2, 4): 106.0, (2, 8): 100.0}
    final_thr = {(0, None): 40.0, (2, None): 104.0, (2, 4): 95.0}

    class Noisy(FakeTrials):
        def __call__(self, cfg: Config, label: str, role: str) -> SweepRow:
            row = super().__call__(cfg, label, role)
            thr = (trial_thr if role == "trial" else final_thr)[(cfg.workers, cfg.prefetch_factor)]
            return replace(row, throughput_samples_per_s=thr, step_time_rel_ci=0.12)

    trials = Noisy(lambda c: 1.0, cpu=lambda c: 0.05, parts=lambda c: (10.0, 30.0))
    result = run(trials, pipelines=["naive"], cores=2, max_workers=2, batches=[], knobs=ON_CPU)
    assert result.recommended == Config("naive", 8, 2)
    why = result.stopped["naive"]["prefetch_factor"]
    assert why.startswith("stopped at 2: re-run beside 4 in the final rounds, its median 104.0 against 95.0 samples/s")
    assert "(the climb had stopped at 4: prefetch_factor 8 was 5.7% slower than 4" in why, why
    assert result.stopped["naive"]["workers"].startswith("stopped at 2")  # the workers did not change
