"""Sweep and tune orchestration: run configurations of one scenario into one directory, each stopped early
(docs/sweep-and-tune.md: the directories, the stop rule, failures and signals).

Invariants: every configuration runs through ``run_scenario``, the loop ``stallscope run`` uses (attribution off),
and one of N > 1 ranks through ``run_job`` for exactly ``Limits.steps`` steps (the stop rule cannot reach other
processes); a configuration that fails is a row, never the end of the sweep, unless every next one would fail
alike (bad user data, a run store that cannot be written); ``sweep.json`` / ``tune.json`` are rewritten atomically
after every configuration; nothing here renders (progress goes to ``on_start`` / ``on_finish`` and ``monitor``).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipelines import PipelineError, applicable, require, usable_cores
from profiler.analysis.apart import measured_steps
from profiler.core.session import Interrupted
from profiler.core.store import StepRow, StoreWriteError
from profiler.drivers.runner import RunConfig, RunStopped, TrainingError, run_scenario
from profiler.live.feeds import Monitor
from profiler.runs.session import Session
from profiler.sweep.analysis import (
    MIN_STEPS,
    REL_CI,
    Config,
    SweepResult,
    SweepRow,
    analyse_sweep,
    row_from_job,
    row_from_summary,
    t95,
    with_knobs,
)
from profiler.sweep.climb import LoaderKnobs
from profiler.sweep.defaults import DEFAULT_STEPS, SECONDS_ONLY_STEPS
from profiler.sweep.tuner import TuneResult, tune
from scenarios import Scenario

# A tune trial's least measured time (within its caps): the host source finds new loader workers at its first
# reading after the loader's iter(), and its first reading of each is a baseline, so the workers' CPU share is
# a mean of few readings in a shorter window
TRIAL_MIN_S = 1.0
# Without --seconds, a tune trial's measured time is capped at its budget / TRIAL_SHARE (at least TRIAL_MIN_S),
# so that a budget holds a few trials and the final comparison (4 runs) even where a step takes seconds
# and the early-stop rule would wait for a precision a loaded machine does not give: 120 s -> 10 s a trial
TRIAL_SHARE = 12

OnStart = Callable[[int, int | None, Config, Path], None]  # (index from 1, planned or None, config, run dir)
OnFinish = Callable[[SweepRow], None]


@dataclass(frozen=True, slots=True)
class Limits:
    """How long each configuration trains (its warm-up: ``Harness.base.warmup``, None for the scenario's)."""

    steps: int = DEFAULT_STEPS
    seconds: float | None = None
    min_seconds: float = 0.0  # neither the early-stop rule nor the steps cap ends a configuration sooner


@dataclass(frozen=True, slots=True)
class Harness:
    """What every configuration of a sweep or tune shares. Each configuration runs ``base`` (built from the
    shared flags, as ``stallscope run`` builds its own) with its pipeline, batch size, workers, run store and
    ``limits`` put in."""

    scenario: Scenario
    base: RunConfig
    limits: Limits = Limits()
    monitor: Monitor | None = None
    on_start: OnStart | None = None
    on_finish: OnFinish | None = None
    # the signal the CLI received, if any: a signal handler's exception can be swallowed by a broad
    # ``except Exception`` on the main thread (a source probe, say), so the sweep also polls this
    stop_requested: Callable[[], str | None] | None = None


class ConfigStopped(Interrupted):
    """A signal stopped a configuration mid-run; ``row`` is what it measured (status "interrupted")."""

    def __init__(self, signame: str, row: SweepRow) -> None:
        super().__init__(signame)
        self.row = row


class StopRule:
    """The ``RunConfig.stop_when`` of one configuration; ``reason`` says why it fired ("stable", "seconds").

    O(1) per step: it keeps running sums over the measured step times in ``session.recent``, taking each row
    once (by step index) and dropping the rows ``recent`` has let go, so :meth:`relative_ci` equals (to rounding)
    ``analysis.sweep.relative_ci`` of those step times without re-reading them.
    """

    def __init__(
        self,
        limits: Limits,
        clock: Callable[[], float] = time.perf_counter,
        stop_requested: Callable[[], str | None] | None = None,
    ) -> None:
        self._limits = limits
        self._clock = clock
        self._stop_requested = stop_requested
        self._t_first: float | None = None
        self.reason: str | None = None
        self._calls = 0  # measured steps done: the runner calls the rule after each one
        self._seen = -1  # the highest step index taken from ``session.recent``
        self._window: deque[tuple[int, float]] = deque()  # (step, duration) of the measured rows taken
        # sums of (duration - shift), shift being the first duration taken: no cancellation against the mean
        self._shift: float | None = None
        self._sum = 0.0
        self._sum_sq = 0.0

    def __call__(self, session: Session) -> bool:
        if self._stop_requested is not None and self._stop_requested():
            self.reason = "signal"
            return True
        now = self._clock()
        self._calls += 1
        if self._t_first is None:
            self._t_first = now  # the end of the first measured step: the seconds cap counts from here
        # the step that just finished is recorded when the loop asks for the next batch: ``recent`` holds
        # the ones before it, which is what the rule can judge
        self._take(session.recent)
        long_enough = now - self._t_first >= self._limits.min_seconds
        if long_enough and len(self._window) >= MIN_STEPS and self.relative_ci() < REL_CI:  # ``is_stable``
            self.reason = "stable"
            return True
        if self._limits.seconds is not None and now - self._t_first >= self._limits.seconds:
            self.reason = "seconds"
            return True
        if long_enough and self._calls >= self._limits.steps:  # the runner's cap is lifted while min_seconds holds
            self.reason = "steps"
            return True
        return False

    def _take(self, recent: deque[tuple[StepRow, Any]]) -> None:
        new: list[StepRow] = []
        for row, _ in reversed(recent):
            if row.step <= self._seen:
                break
            new.append(row)
        for row in reversed(new):
            self._seen = row.step
            if not row.warmup:
                d = row.t_end - row.t_start
                if self._shift is None:
                    self._shift = d
                self._window.append((row.step, d))
                self._add(d - self._shift, 1.0)
        first = recent[0][0].step if recent else self._seen + 1
        while self._window and self._window[0][0] < first:  # fell out of ``recent``
            assert self._shift is not None
            self._add(self._window.popleft()[1] - self._shift, -1.0)

    def _add(self, x: float, sign: float) -> None:
        self._sum += sign * x
        self._sum_sq += sign * x * x

    def relative_ci(self) -> float:
        """``analysis.sweep.relative_ci`` of the measured step times taken so far."""
        n = len(self._window)
        if n < 2 or self._shift is None:
            return math.inf
        m = self._shift + self._sum / n
        if not m > 0:
            return math.inf
        var = max(0.0, (self._sum_sq - self._sum * self._sum / n) / (n - 1))
        return t95(n - 1) * math.sqrt(var / n) / m


def run_config(h: Harness, cfg: Config, out: Path, role: str | None = None) -> SweepRow:
    """Train one configuration into run store ``out`` (a job directory when ``cfg.nproc`` > 1); its row. Raises
    ConfigStopped on a signal and TrainingError for bad user data; any other failure is a row with status
    "failed"."""
    if cfg.nproc > 1:
        return run_job_config(h, cfg, out)
    t0 = time.perf_counter()
    rule = StopRule(h.limits, stop_requested=h.stop_requested)
    run_cfg = replace(
        h.base,
        out=out,
        pipeline=cfg.pipeline,
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        prefetch_factor=cfg.prefetch_factor,
        pin_memory=cfg.pin_memory,
        steps=h.limits.steps if h.limits.min_seconds <= 0 else SECONDS_ONLY_STEPS,
        attribution=False,
        stop_when=rule,
        extra_meta={**h.base.extra_meta, "sweep_config": cfg.name, **({"tune_role": role} if role else {})},
    )
    session: Session | None = None
    status: str | None = None
    error: str | None = None
    stopped: str | None = None
    try:
        session = run_scenario(h.scenario, run_cfg, h.monitor)
    except TrainingError as exc:
        if exc.bad_input or store_failure(exc) is not None:
            raise
        session, status, error = exc.session, "failed", exc.where
    except RunStopped as exc:
        session, stopped = exc.session, exc.signame
        status, error = "interrupted", f"stopped by {stopped}"
    except (Interrupted, KeyboardInterrupt) as exc:
        stopped = getattr(exc, "signame", "SIGINT")
        status, error = "interrupted", f"stopped by {stopped}"
    except Exception as exc:  # noqa: BLE001 - set-up failed before the run store existed: a failed row
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    signame = _requested(h)
    if stopped is None and signame is not None:  # the signal's exception was swallowed on its way
        stopped, status, error = signame, "interrupted", f"stopped by {signame}"
    row = _row(cfg, out, rule, session, status=status, error=error, wall_s=time.perf_counter() - t0, role=role)
    row = with_knobs(row, cfg)
    if stopped is not None:
        raise ConfigStopped(stopped, row)
    return row


def store_failure(exc: BaseException) -> StoreWriteError | None:
    """The run store write failure that ended a configuration's training (``exc.__cause__``), else None."""
    cause = exc.__cause__
    return cause if isinstance(cause, StoreWriteError) else None


def _requested(h: Harness) -> str | None:
    return h.stop_requested() if h.stop_requested is not None else None


def run_job_config(h: Harness, cfg: Config, out: Path) -> SweepRow:
    """Train a configuration of ``cfg.nproc`` ranks as a job (:func:`profiler.jobs.launch.run_job`) into job directory
    ``out``; its row from the job summary. Each rank runs ``h.limits.steps`` measured steps: the early-stop rule
    and the seconds cap cannot stop ranks in other processes. A job that fails is a failed row; a signal (the
    elastic agent's handlers take SIGINT/SIGTERM while its ranks run and stop them) raises ConfigStopped with the
    row of what the ranks recorded."""

    from profiler.jobs.launch import JobSpec, job_id_for, run_job

    t0 = time.perf_counter()
    source = str(h.base.extra_meta.get("scenario_source") or h.scenario.name)
    spec = JobSpec(
        scenario=source,
        run=replace(
            h.base,
            out=out,
            pipeline=cfg.pipeline,
            batch_size=cfg.batch_size,
            workers=cfg.workers,
            steps=h.limits.steps,
            attribution=False,
            stop_when=None,
            extra_meta={**h.base.extra_meta, "sweep_config": cfg.name},
        ),
        nproc=cfg.nproc,
        job_id=job_id_for(None, source, 1),
    )
    status: str | None = None
    error: str | None = None
    stopped: str | None = None
    try:  # run_job puts the sweep's signal handlers back after the elastic agent's
        result = run_job(spec)
        if result.status == "interrupted":
            stopped = (result.error or "SIGINT").rsplit(" ", 1)[-1]
        if result.status != "complete":
            status, error = result.status, result.error
    except (Interrupted, KeyboardInterrupt) as exc:  # a second signal before the agent's handlers were in place
        stopped = getattr(exc, "signame", "SIGINT")
    except Exception as exc:  # noqa: BLE001 - the launcher failed: a failed row, not the end of the sweep
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    if stopped is not None:
        status, error = "interrupted", f"stopped by {stopped}"
    # a signal before the agent's handlers were in place only reached the sweep's: the job ran to its end, and
    # the sweep ends after it
    signame = stopped or _requested(h)
    row = _job_row(h, cfg, out, status=status, error=error, wall_s=time.perf_counter() - t0)
    if signame is not None:
        raise ConfigStopped(signame, row)
    return row


def _job_row(h: Harness, cfg: Config, out: Path, *, status: str | None, error: str | None, wall_s: float) -> SweepRow:
    """The job configuration's row from its directory read back (as ``stallscope report`` reads it)."""
    from profiler.jobs.analysis import summarize_job
    from profiler.jobs.jobdir import JobDirError, load_job

    try:
        job = load_job([out], with_baseline=False)
    except (JobDirError, OSError) as exc:
        return SweepRow(
            cfg.pipeline, cfg.batch_size, cfg.workers, status or "failed", str(out), error or str(exc), wall_s=wall_s,
            nproc=cfg.nproc,
        )  # fmt: skip
    js = summarize_job(job)
    slowest = next((r for r in job.ranks if r.rank == js.slowest_rank and r.record is not None), None)
    step_s = [s.t_end - s.t_start for s in measured_steps(slowest.record)] if slowest and slowest.record else []
    price = h.base.extra_meta.get("price_per_hour")
    price = float(price) if isinstance(price, (int, float)) else None
    return row_from_job(
        js, cfg, run_dir=str(out), step_s=step_s, wall_s=wall_s, status=status, error=error, price_per_hour=price
    )


def _row(
    cfg: Config,
    out: Path,
    rule: StopRule,
    session: Session | None,
    *,
    status: str | None,
    error: str | None,
    wall_s: float,
    role: str | None,
) -> SweepRow:
    """The configuration's row from the Summary its run built at close (no read back of the store)."""
    summary = session.summary() if session is not None else None
    if session is None or summary is None:
        return SweepRow(
            cfg.pipeline, cfg.batch_size, cfg.workers, status or "failed", None, error or "no run store", wall_s=wall_s,
            role=role,
        )  # fmt: skip
    return row_from_summary(
        summary,
        pipeline=cfg.pipeline,
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        run_dir=str(out),
        step_s=session.step_times(),
        own_step_s=session.own_step_times(),
        stop_reason=rule.reason or ("steps" if status is None else None),
        wall_s=wall_s,
        status=status,
        error=error,
        role=role,
    )


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def run_sweep(h: Harness, configs: Sequence[Config], out_dir: Path) -> tuple[SweepResult, str | None]:
    """Every configuration in order into ``out_dir``; the analysed table and the signal that stopped it, if any."""
    rows: list[SweepRow] = []
    stopped: str | None = None
    n = len(configs)

    def result() -> SweepResult:
        return analyse_sweep(
            rows,
            scenario=h.scenario.name,
            device=h.base.device.label,
            planned=n,
            status="interrupted" if stopped else "complete",
        )

    failing = True
    try:
        for i, cfg in enumerate(configs, 1):
            stopped = _requested(h)
            if stopped:
                break
            run_dir = out_dir / cfg.name
            if h.on_start is not None:
                h.on_start(i, n, cfg, run_dir)
            try:
                row = run_config(h, cfg, run_dir)
            except ConfigStopped as exc:
                rows.append(exc.row)
                stopped = exc.signame
                break
            rows.append(row)
            if h.on_finish is not None:
                h.on_finish(row)
            write_json(out_dir / "sweep.json", result().to_dict())
        failing = False
    except (Interrupted, KeyboardInterrupt) as exc:  # between configurations
        stopped = getattr(exc, "signame", "SIGINT")
        failing = False
    finally:
        final = result()
        try:
            write_json(out_dir / "sweep.json", final.to_dict())
        except OSError:
            if not failing:  # else the failure on its way out says why (a full disk fails both alike)
                raise
    return final, stopped


def tune_pipelines(scenario: Scenario, asked: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The pipelines a tune searches and those it leaves out, with why. ``asked`` None: every registered
    pipeline that can train ``scenario`` here; given: those, each of which must be able to (a PipelineError,
    one line, names the first that cannot, why, and the ones that can)."""
    if asked is None:
        return applicable(scenario.data)
    require(asked, scenario.data, scenario.name)
    return list(asked), {}


class _TuneTrials:
    """The tuner's ``trial``: one configuration into run store ``out_dir/label``, ``tune.json`` rewritten (status
    "running") after each, so that a tune killed at any point leaves the table of what finished."""

    def __init__(self, h: Harness, out_dir: Path, skip_inapplicable: bool) -> None:
        self.h = h
        self.out_dir = out_dir
        self.skip_inapplicable = skip_inapplicable
        self.done: list[SweepRow] = []

    def __call__(self, cfg: Config, label: str, role: str) -> SweepRow:
        h = self.h
        signame = _requested(h)
        if signame:
            raise Interrupted(signame)
        run_dir = self.out_dir / label
        if h.on_start is not None:
            h.on_start(len(self.done) + 1, None, cfg, run_dir)
        try:
            with warnings.catch_warnings():
                # torch warns whenever a DataLoader has more workers than cores: the tuner tries that on purpose,
                # on the workers' measured CPU use, and says so in its report
                warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
                row = run_config(h, cfg, run_dir, role=role)
        except TrainingError as exc:
            if not (self.skip_inapplicable and isinstance(exc.__cause__, PipelineError)):
                raise
            row = SweepRow(cfg.pipeline, cfg.batch_size, cfg.workers, "failed", str(run_dir), exc.bad_input, role=role)
            row = with_knobs(row, cfg)
        self.done.append(row)
        if h.on_finish is not None:
            h.on_finish(row)
        running = {"status": "running", "scenario": h.scenario.name, "device": h.base.device.label}
        write_json(self.out_dir / "tune.json", {**running, "runs": [r.to_dict() for r in self.done]})
        return row


def trial_seconds(seconds: float | None, budget_s: float) -> float:
    """A tune trial's measured seconds: ``seconds`` (--seconds) when given, else the budget's TRIAL_SHARE-th."""
    return seconds if seconds is not None else max(TRIAL_MIN_S, budget_s / TRIAL_SHARE)


def run_tune(
    h: Harness,
    out_dir: Path,
    *,
    pipelines: Sequence[str],
    max_batch: int,
    max_workers: int,
    budget_s: float,
    cores: int | None = None,
    left_out: dict[str, str] | None = None,
    skip_inapplicable: bool = False,
    min_trial_s: float = TRIAL_MIN_S,
    batches: Sequence[int] | None = None,
) -> TuneResult:
    """The tuner's search and final comparison (``profiler.sweep.tuner``), every trial a run store in ``out_dir``.
    ``cores`` None: :func:`usable_cores`. ``left_out``: pipelines not searched, with why (for the result).
    ``min_trial_s``: each trial's least measured time (the CLI passes 0 when ``--steps`` was given). Without a
    seconds cap in ``h.limits``, each trial's measured time is capped at ``budget_s / TRIAL_SHARE``."""
    seconds = trial_seconds(h.limits.seconds, budget_s)
    floor = min(min_trial_s, seconds)
    h = replace(h, limits=replace(h.limits, seconds=seconds, min_seconds=max(h.limits.min_seconds, floor)))
    trial = _TuneTrials(h, out_dir, skip_inapplicable)
    result = tune(
        trial,
        pipelines=pipelines,
        default_batch=h.scenario.batch_size,
        max_batch=max_batch,
        max_workers=max_workers,
        budget_s=budget_s,
        cores=usable_cores() if cores is None else cores,
        left_out=left_out,
        batches=batches,
        knobs=scenario_knobs(h.base.device.accelerator),
    )
    result.advice = first_advice(result)
    write_json(out_dir / "tune.json", result.to_dict())
    return result


def first_advice(result: TuneResult) -> list[str]:
    """Where a tune compared nothing with its first trial: the loader advice that trial's own report gives (its
    summary.json's loader recommendations: what ``stallscope run`` on it says), or where it gives none, that it
    advises no change to the loader, with its verdict and measured stall."""
    from profiler.analysis.verdict import LOADER_CODES

    first = result.trials[0] if result.trials else None
    if result.compared or first is None or first.run_dir is None:
        return []
    try:
        summary = json.loads((Path(first.run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(summary, dict):
        return []
    recs = summary.get("recommendations") or []
    advice = [str(r.get("text")) for r in recs if isinstance(r, dict) and r.get("code") in LOADER_CODES]
    stall = summary.get("stall_fraction")
    if advice or not isinstance(stall, (int, float)):
        return advice
    return [f"no change to the loader (its verdict: {summary.get('verdict')}, stall {stall:.1%})"]


def scenario_knobs(accelerator: bool) -> dict[str, LoaderKnobs]:
    """The torch pipelines' DataLoader knobs where a run does not set them (pipelines.naive.data_loader): the
    DataLoader's prefetch_factor 2; naive pins nothing, prefetch pins where it copies to an accelerator (on a
    simulated one its copy is modelled pinned and asynchronous whatever the knob). DALI's loader has neither."""
    from pipelines.naive import PREFETCH_FACTOR

    return {
        "naive": LoaderKnobs(PREFETCH_FACTOR, pin_memory=False, copies=accelerator),
        "prefetch": LoaderKnobs(PREFETCH_FACTOR, pin_memory=accelerator, copies=accelerator),
    }
