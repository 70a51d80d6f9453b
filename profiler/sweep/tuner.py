"""The tuner's search: the workers, batch size and pipeline with the best throughput without a full grid, then the
pick re-run side by side with the default (docs/sweep-and-tune.md, "The search", states the rules).

Invariants: the search and the stop reasons it records are a pure function of the ``trial`` callable's rows, the
``clock`` and the arguments (the core count included); a configuration is tried at most once; a trial starts
only when it and the reserve for the final comparison fit in ``budget_s`` (the first always runs), or, where the
first trial's length leaves room for more trials but not for a round of the final comparison too, when it fits
alone (then the trials are compared as they ran, one each, and nothing is called better than the default unless
its trial beat the default's past their uncertainty); a tune that compared nothing gives no speedup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from profiler.analysis.stats import finite_or_none, quantile
from profiler.core.session import Interrupted
from profiler.sweep.analysis import Config, SweepRow, config_from_dict, row_from_dict, with_knobs
from profiler.sweep.climb import (
    FINAL_ROUNDS,
    GAIN,
    IMPROVE,
    KNOB_NOTABLE,
    KNOB_ORDER,
    MAX_PASSES,
    TRIALS,
    LoaderKnobs,
    Search,
    Trial,
    climb,
    judge,
    knob_value,
    rel_ci,
)

RUNNER_UP = "runner-up"  # the final comparison's role for a trial the pick beat only within their uncertainty
# more rounds, while the budget allows, when the rounds are not settled: they split (the pick faster than the
# default beside it in one, slower in another), or a configuration's own throughput varied from round to round
# by more than the two differ. Two short trials each decide nothing on a busy host: a pick 1.25x in the search
# read 147 and 110 against the default's 131 and 139 (x0.95, while the same pair re-run a minute later read
# 1.7x); two computing workers read 141 and 38 samples/s in two rounds beside the default's 95 and 81, and the
# default was kept where alternating runs put the pick at x1.37
FINAL_MAX_ROUNDS = 5
# A gain the trials saw, of this or more and past the two trials' own uncertainty, that the final rounds do not
# confirm is contested: a burst of other work on a shared host during one round must not outvote every trial
# (issue #56: trials x1.68, one final round x0.87). More rounds run while the budget allows, then every run of each
# weighs in. A smaller gain is what two short trials' noise on a shared host can make (each +-10% or more), and the
# rounds decide it alone (tests/test_tune.py: trials x1.4, one round x1.05 within its +-9%: not confirmed).
CONTESTED_GAIN = 1.5
WEIGHED = "trials+final"  # TuneResult.basis: the speedup from every run of each, the trials and the final rounds
# TuneResult.basis where the budget held no final round (climb.TRIALS): the speedup from one trial of each
ONE_TRIAL_EACH = "trials"
DEFAULT_PIPELINE = "naive"


@dataclass(slots=True)
class TuneResult:
    recommended: Config | None
    default: Config
    speedup: float | None
    trials: list[SweepRow]
    final: list[SweepRow]
    budget_s: float
    elapsed_s: float
    status: str = "complete"  # or "interrupted"
    # the search's best when the side-by-side re-run found it no faster than the default (then recommended is
    # the default), with the speedup measured for it
    unconfirmed: Config | None = None
    unconfirmed_speedup: float | None = None
    stopped_by: str | None = None  # the signal that interrupted it
    notes: list[str] = field(default_factory=list)
    # pipeline -> {"workers": why that climb stopped, "batch": ...}, each naming the figures that decided it
    stopped: dict[str, dict[str, str]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # pipelines not searched (they cannot train it)
    cores: int = 0
    max_workers: int = 0
    # a tune of a command: the training loader's site and the knobs the recommendation changes there
    # (``{"site", "file", "line", "kind", "args"}``), and the command
    change: dict[str, Any] | None = None
    command: list[str] | None = None
    # what the speedup is the ratio of: "final", the medians of the final rounds; WEIGHED, where the rounds
    # contested the trials' gain, the medians of every run of each, trials and final rounds; ONE_TRIAL_EACH, where
    # the budget held no final round, the trials
    basis: str = "final"
    # the loader advice of the first trial's own report (what `stallscope run` on it advises), for a tune that
    # could compare nothing with it
    advice: list[str] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        """Whether any configuration other than the default was measured (a trial, failed or not, or a final run)."""
        return bool(self.final) or any(r.config != self.default for r in self.trials)

    def medians(self) -> dict[str, float | None]:
        """The median throughput of the pick and of the default, over the runs the speedup is made of."""
        if self.basis not in (WEIGHED, ONE_TRIAL_EACH):
            return {role: finite_or_none(_median(self.final, role)) for role in ("recommended", "default")}
        pick = self.unconfirmed or self.recommended
        return {
            "recommended": finite_or_none(quantile(_runs(self.trials, self.final, pick, "recommended"), 0.5)),
            "default": finite_or_none(quantile(_runs(self.trials, self.final, self.default, "default"), 0.5)),
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``tune.json`` object (and ``tune --json``)."""
        return {
            "recommended": self.recommended.to_dict() if self.recommended else None,
            "default": self.default.to_dict(),
            "speedup": finite_or_none(self.speedup),
            "speedup_basis": self.basis,
            "final_median_samples_per_s": self.medians(),
            "unconfirmed": (
                {**self.unconfirmed.to_dict(), "speedup": finite_or_none(self.unconfirmed_speedup)}
                if self.unconfirmed
                else None
            ),
            "trials": [r.to_dict() for r in self.trials],
            "final": [r.to_dict() for r in self.final],
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "status": self.status,
            "stopped": {p: dict(why) for p, why in self.stopped.items()},
            "left_out": dict(self.left_out),
            "cores": self.cores,
            "max_workers": self.max_workers,
            "rules": {
                "improve": f"a step of the search is taken only when throughput improves by more than {IMPROVE:.0%} "
                "and more than the two trials' uncertainty; a difference within it is measured again",
                "workers": f"workers climb 0, 1, 2, 4, ... (from the count a loader-bound trial predicts would feed "
                f"the step) up to the {self.cores} cores (every count tried), then further only while each step helps "
                "and the next count stays under cores / (the workers' CPU busy fraction), at most "
                f"{self.max_workers}; after the batch moves they are climbed again, up and down",
                "batch": f"doubled while it helps, else halved; the batch and the workers in turn, at most "
                f"{MAX_PASSES} passes",
                "loader knobs": f"at the pick: prefetch_factor 2x then 4x the loader's own while each step helps (with "
                f"workers, where the loop waited for data {KNOB_NOTABLE:.0%} of the step or more); then pin_memory on "
                "where the batches are copied to an accelerator, the loader does not pin, and the copy took "
                f"{KNOB_NOTABLE:.0%} of the step or more",
                "final": f"recommended and default re-run alternately, {FINAL_ROUNDS} rounds each (up to "
                f"{FINAL_MAX_ROUNDS} while they split or vary more than they differ, or give no gain where the trials "
                f"saw x{CONTESTED_GAIN:g} or more); speedup = ratio of median throughputs (of the final rounds; "
                "where they still contest the trials' gain, of every run of each, trials and final rounds)",
            },
            "notes": list(self.notes),
        } | self._extra()

    def _extra(self) -> dict[str, Any]:
        """tune.json's keys only some tunes have: the first trial's advice (a tune that compared nothing), the
        command and its change (a tune of a command)."""
        out: dict[str, Any] = {"advice": list(self.advice)} if self.advice else {}
        return out | ({"command": list(self.command), "change": self.change} if self.command is not None else {})


def tune_from_dict(d: dict[str, Any]) -> TuneResult:
    """The tune as ``TuneResult.to_dict`` wrote it (``tune.json``): what ``stallscope report TUNE_DIR`` prints."""

    def config(c: dict[str, Any] | None) -> Config | None:
        return config_from_dict(c) if c else None

    default = config(d["default"])
    assert default is not None
    unconfirmed = d.get("unconfirmed")
    return TuneResult(
        recommended=config(d.get("recommended")),
        default=default,
        speedup=d.get("speedup"),
        trials=[row_from_dict(r) for r in d.get("trials", [])],
        final=[row_from_dict(r) for r in d.get("final", [])],
        budget_s=float(d.get("budget_s", math.nan)),
        elapsed_s=float(d.get("elapsed_s", math.nan)),
        status=str(d.get("status", "complete")),
        unconfirmed=config(unconfirmed),
        unconfirmed_speedup=unconfirmed.get("speedup") if unconfirmed else None,
        notes=list(d.get("notes", [])),
        stopped={p: dict(why) for p, why in d.get("stopped", {}).items()},
        left_out=dict(d.get("left_out", {})),
        cores=int(d.get("cores", 0)),
        max_workers=int(d.get("max_workers", 0)),
        change=d.get("change"),
        command=d.get("command"),
        basis=str(d.get("speedup_basis", "final")),
        advice=[str(a) for a in d.get("advice", [])],
    )


def tune(
    trial: Trial,
    *,
    pipelines: Sequence[str],
    default_batch: int,
    max_batch: int,
    max_workers: int,
    budget_s: float,
    cores: int,
    left_out: dict[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    default: Config | None = None,
    first: SweepRow | None = None,
    batches: Sequence[int] | None = None,
    knobs: Mapping[str, LoaderKnobs] | None = None,
) -> TuneResult:
    """Search, then measure the recommendation against the default side by side (see the module docstring).

    ``default``: the configuration to beat (the naive pipeline at ``default_batch`` with no workers when None);
    ``first``: its row, already measured (a script's own setting: it counts as the first trial and its time as
    spent); ``batches``: the batch sizes the climb may try (None: doubling and halving up to ``max_batch``);
    ``knobs``: each pipeline's DataLoader knobs where not set, for the climb's last step (none: not searched).
    KeyboardInterrupt (or the CLI's :class:`Interrupted`) during a trial ends the search: the result then
    has status "interrupted", ``stopped_by`` the signal, and holds whatever ran.
    """
    default = default or Config(DEFAULT_PIPELINE, default_batch, 0)
    s = Search(
        trial, budget_s, clock, default, max_batch=max_batch, max_workers=max_workers, cores=max(1, cores),
        batches=batches, knobs=knobs,
    )  # fmt: skip
    if first is not None:
        s.rows.append(first)
        s.cache[default] = first
        s.t0 -= first.wall_s if math.isfinite(first.wall_s) else 0.0
    result = TuneResult(
        None, default, None, s.rows, [], budget_s, 0.0, notes=s.notes, stopped=s.stopped,
        left_out=dict(left_out or {}), cores=cores, max_workers=max_workers,
    )  # fmt: skip
    try:
        _search(result, s, pipelines, start=min(default_batch, max_batch))
    except (Interrupted, KeyboardInterrupt) as exc:
        _interrupted(result, s, exc)
    return _finish(result, s)


def _search(result: TuneResult, s: Search, pipelines: Sequence[str], start: int) -> None:
    """Each pipeline's climb from batch ``start``, then the pick re-run beside the default (``_final_pair``)."""
    default = result.default
    bests: list[SweepRow] = []
    for p in pipelines:
        best = climb(s, p, start)
        if best is not None:
            bests.append(best)
        if s.spent:
            break
    if not bests:
        s.notes.append("no configuration completed: nothing to recommend")
        return
    rec = result.recommended = _fastest(bests)
    others = [r for r in s.rows if r.ok and r.config != default]
    if not others:
        failed = len({r.config for r in s.rows if r.config != default})
        if failed:  # the alternatives ran and failed: keeping the default is what was measured
            others_failed = f"{failed} other{'s' if failed != 1 else ''} failed"
            s.notes.append(f"the default configuration is the only one that completed ({others_failed})")
            result.speedup = 1.0
        elif s.budget_note is None:  # nothing ran beside it (the budget's note says why, where it was the budget)
            s.notes.append("no other configuration was tried: nothing was compared with the default")
        return
    if s.mode == TRIALS:
        _one_trial_each(result, s)
        return
    if rec == default:
        # the default won its single trial: measure it against the best alternative side by side, so that
        # "keep the default" rests on a re-run too, not on one short trial each
        rec = result.recommended = _fastest(others)
        s.notes.append(f"the default was the best trial; the best alternative, {rec.name}, is re-run beside it")
    _final_pair(result, s, rec)


def _one_trial_each(result: TuneResult, s: Search) -> None:
    """A budget that held no final round (climb.TRIALS): the best alternative against the default as their trials
    measured them, one each; it is recommended only past IMPROVE and the two trials' own uncertainty."""
    default = result.default
    ref = s.cache.get(default)
    best = max((r for c, r in s.cache.items() if r.ok and c != default), key=lambda r: r.throughput_samples_per_s)
    result.basis = ONE_TRIAL_EACH
    if ref is None or not ref.ok:  # nothing measured to compare the best with: it is recommended, with no speedup
        result.recommended = best.config
        s.notes.append(f"the default did not complete: {best.name}, the best trial, has no measured speedup")
        return
    x = best.throughput_samples_per_s / ref.throughput_samples_per_s
    margin = max(IMPROVE, rel_ci(best) + rel_ci(ref))
    head = f"{best.name} made x{x:.2f} of the default's throughput in one trial each"
    if judge(best, ref) == GAIN:
        result.recommended, result.speedup = best.config, x
        s.notes.append(f"{head}, past the two trials' uncertainty (+-{margin:.0%}); not re-run side by side")
        return
    why = "no faster" if x <= 1.0 else f"within the two trials' uncertainty (+-{margin:.0%})"
    s.notes.append(f"{head}: {why}, the default is kept (not re-run side by side)")
    result.unconfirmed, result.unconfirmed_speedup = best.config, x
    result.recommended, result.speedup = default, 1.0


def _interrupted(result: TuneResult, s: Search, exc: BaseException) -> None:
    """A signal ended the search: the result is partial, its recommendation the best trial so far."""
    result.status = "interrupted"
    result.stopped_by = getattr(exc, "signame", "SIGINT")
    row = getattr(exc, "row", None)  # the orchestration's ConfigStopped carries the interrupted run's row
    if isinstance(row, SweepRow):
        (s.rows if row.role == "trial" else result.final).append(row)
    s.notes.append(f"stopped by {result.stopped_by} after {len(s.rows)} trials: the result is partial")
    for why in s.stopped.values():
        for knob in KNOB_ORDER:
            why.setdefault(knob, f"stopped by {result.stopped_by}")
    ok = [r for r in s.rows if r.ok]
    if result.recommended is None and ok:
        result.recommended = _fastest(ok)
        s.notes.append("recommended: the best trial before the stop (the search did not finish)")


def _runner_up(s: Search, rec: Config, default: Config) -> Config | None:
    """The trial the pick beat by less than the two trials' own uncertainty (their step-time 95% CIs, relative,
    summed), the fastest such; None where every other trial lost clearly or the uncertainty was not measured."""
    picked = s.cache.get(rec)
    if picked is None or not picked.ok:
        return None
    thr = picked.throughput_samples_per_s
    close = [
        r
        for r in s.rows
        if r.ok
        and r.config not in (rec, default)
        and r.throughput_samples_per_s >= thr * (1 - picked.step_time_rel_ci - r.step_time_rel_ci)
    ]  # NaN (not measured) compares False
    return _fastest(close) if close else None


def _final_pair(result: TuneResult, s: Search, rec: Config) -> None:
    """Re-run recommended and default alternately (and the runner-up, where the pick beat it only within the two
    trials' uncertainty: the better median of the two is then the pick); the speedup is the ratio of the medians."""
    runner = _runner_up(s, rec, result.default)
    per_round = s.estimate(rec) + s.estimate(result.default)
    if runner is not None and s.elapsed() + per_round + s.estimate(runner) > s.budget_s:
        runner = None  # the budget holds no round of three: the pick and the default alone
    if runner is not None:
        per_round += s.estimate(runner)
    rounds = FINAL_ROUNDS
    while rounds > 1 and s.elapsed() + rounds * per_round > s.budget_s:
        rounds -= 1
    if s.elapsed() + per_round > s.budget_s:
        s.notes.append(f"the final comparison ({per_round:.0f} s a round) runs past the {s.budget_s:g} s budget")
    i = _rounds(result, s, (rec, runner), 0, least=rounds, more=lambda: _unsettled(result.final) is not None)
    if i > rounds:
        per = 3 if runner is not None else 2
        s.notes.append(f"the final comparison's rounds {_unsettled(result.final[: per * rounds])}: {i} rounds")
    if runner is not None:
        rec = _settle_runner_up(result, s, rec, runner)
    rec_m, def_m = _median(result.final, "recommended"), _median(result.final, "default")
    if not (math.isfinite(rec_m) and math.isfinite(def_m) and def_m > 0):
        s.notes.append("the final comparison did not complete for both configurations: no measured speedup")
        return
    result.speedup = rec_m / def_m
    # one round (the budget allowed no second) has no other round to agree with: its gain must clear the two
    # runs' own uncertainty (a real script's x1.05 from one pair of runs known to +-4.5% and +-4.8% each)
    noise = _final_noise(result.final) if i < FINAL_ROUNDS else math.nan
    if result.speedup <= 1.0 + (0.0 if math.isnan(noise) else noise):
        i = _contested(result, s, (rec, runner), i)
        noise = _final_noise(result.final) if i < FINAL_ROUNDS else math.nan
    if result.speedup <= 1.0 or result.speedup <= 1.0 + noise:
        # the search's pick won on one short trial each; side by side it was no faster: that was noise
        why = (
            "not confirmed, the default is kept"
            if result.speedup <= 1.0
            else f"within the two runs' own uncertainty (+-{noise:.0%}) in the one round the budget allowed: "
            "not confirmed, the default is kept (a larger --budget-s runs more rounds)"
        )
        ran = f"{i} round{'s' if i != 1 else ''}"
        how = f"every run of each, the trials and {ran}" if result.basis == WEIGHED else f"median of {ran}"
        s.notes.append(
            f"re-run side by side, {rec.name} made x{result.speedup:.2f} of the default's throughput ({how}): {why}"
        )
        result.unconfirmed, result.unconfirmed_speedup = rec, result.speedup
        result.recommended, result.speedup = result.default, 1.0


def _rounds(
    result: TuneResult, s: Search, pair: tuple[Config, Config | None], i: int, *, least: int, more: Callable[[], bool]
) -> int:
    """Final rounds from round ``i`` (the default, the pick and the runner-up where there is one, in alternating
    order): up to ``least``, then on while ``more()`` and the budget allow, at most FINAL_MAX_ROUNDS in all."""
    rec, runner = pair
    per_round = s.estimate(rec) + s.estimate(result.default) + (s.estimate(runner) if runner else 0.0)
    while i < least or (i < FINAL_MAX_ROUNDS and more() and s.elapsed() + per_round <= s.budget_s):
        order = [("default", result.default), ("recommended", rec)] + ([(RUNNER_UP, runner)] if runner else [])
        if i % 2:
            order.reverse()
        for role, cfg in order:
            result.final.append(with_knobs(s.trial(cfg, f"final{i + 1}-{role}-{cfg.name}", role), cfg))
        i += 1
    return i


def _contested(result: TuneResult, s: Search, pair: tuple[Config, Config | None], i: int) -> int:
    """Where the final rounds (``i`` so far) do not confirm a gain the trials saw beyond CONTESTED_GAIN and their
    own uncertainty: more rounds while they still do not and the budget allows; still contested, the speedup is
    the ratio of the medians of every run of each, trials and final rounds (``result.basis``). The rounds run."""
    rec, default = pair[0], result.default
    mine, theirs = _runs(s.rows, [], rec, ""), _runs(s.rows, [], default, "")
    ci = [r.step_time_rel_ci for r in s.rows if r.ok and r.config in (rec, default)]
    gain = quantile(mine, 0.5) / quantile(theirs, 0.5) if mine and theirs else math.nan
    if not gain >= max(CONTESTED_GAIN, 1.0 + math.fsum(c for c in ci if not math.isnan(c))):
        return i

    def disagree() -> bool:  # the rounds so far give no gain (one round: none past its own uncertainty)
        x = _median(result.final, "recommended") / _median(result.final, "default")
        one = sum(r.role == "recommended" for r in result.final) < FINAL_ROUNDS
        noise = _final_noise(result.final) if one else 0.0
        return not x > 1.0 + (0.0 if math.isnan(noise) else noise)

    before = i
    i = _rounds(result, s, pair, i, least=i, more=disagree)
    rounds_x = _median(result.final, "recommended") / _median(result.final, "default")
    more = f"{i - before} more round{'s' if i - before != 1 else ''} ran" if i > before else "no more fitted the budget"
    if not disagree():
        result.speedup = rounds_x
        s.notes.append(f"the final rounds did not confirm the trials' x{gain:.2f} at first: {more}, x{rounds_x:.2f}")
        return i
    result.basis = WEIGHED
    med = result.medians()
    result.speedup = (med["recommended"] or math.nan) / (med["default"] or math.nan)
    s.notes.append(
        f"the final rounds (x{rounds_x:.2f}, {i} round{'s' if i != 1 else ''}) contested the trials' x{gain:.2f}: "
        f"{more}; weighed together, the median of every run of each (trials and final rounds: "
        f"{len(_runs(s.rows, result.final, rec, 'recommended'))} and "
        f"{len(_runs(s.rows, result.final, default, 'default'))} runs) gives x{result.speedup:.2f}"
    )
    return i


def _runs(trials: Sequence[SweepRow], final: Sequence[SweepRow], cfg: Config | None, role: str) -> list[float]:
    """The throughputs of ``cfg``'s trials and of the final runs in ``role``."""
    return [r.throughput_samples_per_s for r in trials if r.ok and r.config == cfg] + [
        r.throughput_samples_per_s for r in final if r.ok and r.role == role
    ]


def _settle_runner_up(result: TuneResult, s: Search, rec: Config, runner: Config) -> Config:
    """The pick or the runner-up, whichever had the better median beside the default; the winner's final rows
    carry the role "recommended", the other's "runner-up"."""
    rec_m, run_m = _median(result.final, "recommended"), _median(result.final, RUNNER_UP)
    tried = {r.config: r.throughput_samples_per_s for r in s.rows if r.ok}
    head = (
        f"{runner.name} ({tried[runner]:.1f} samples/s) was within the two trials' uncertainty of {rec.name} "
        f"({tried[rec]:.1f}) and was re-run beside it: medians {run_m:.1f} against {rec_m:.1f} samples/s"
    )
    if _tied(result.final):  # no change worth making between them: the climb's pick stands
        s.notes.append(f"{head}: a tie (within {IMPROVE:.0%}); {rec.name} stays the pick")
        return rec
    if not run_m > rec_m:
        s.notes.append(f"{head}; {rec.name} stays the pick")
        return rec
    s.notes.append(f"{head}; {runner.name} is the pick")
    why = s.stopped.get(runner.pipeline, {})
    own = s.knobs.get(runner.pipeline)
    for knob in KNOB_ORDER:
        was, now = knob_value(rec, knob, own), knob_value(runner, knob, own)
        if knob in why and was != now and runner.pipeline == rec.pipeline:
            why[knob] = (
                f"stopped at {now}: re-run beside {was} in the final rounds, its median {run_m:.1f} against "
                f"{rec_m:.1f} samples/s (the climb had {why[knob]})"
            )
    swap = {"recommended": RUNNER_UP, RUNNER_UP: "recommended"}
    result.final[:] = [replace(r, role=swap.get(r.role or "", r.role)) for r in result.final]
    result.recommended = runner
    return runner


def _final_noise(final: Sequence[SweepRow]) -> float:
    """The final runs' relative uncertainty together: each role's widest step-time CI (95%, relative), summed;
    NaN where a run did not measure it."""
    widest = [max((r.step_time_rel_ci for r in final if r.role == role and r.ok), default=math.nan)
              for role in ("recommended", "default")]  # fmt: skip
    return math.fsum(widest)


def _unsettled(final: Sequence[SweepRow]) -> str | None:
    """Why the final comparison's rounds so far do not settle it, or None: the pick against the default, and
    against the runner-up where one runs (:func:`_unsettled_pair`) and the two are not a tie (:func:`_tied`)."""
    why = _unsettled_pair(final, "default")
    if why is None and any(r.role == RUNNER_UP for r in final) and not _tied(final):
        why = _unsettled_pair(final, RUNNER_UP)
        return None if why is None else f"{why} (the pick against the runner-up)"
    return why


def _tied(final: Sequence[SweepRow]) -> bool:
    """The pick and the runner-up a tie: FINAL_ROUNDS rounds or more each, their medians within IMPROVE of each
    other (the climb's own margin for a gain). More rounds could only order two settings whose difference is no
    change worth making: two near-equal ones split round after round (a tune of a script ran all
    FINAL_MAX_ROUNDS rounds of three for medians 109.2 and 109.0 samples/s, 45 s of its 128)."""
    rec = [r.throughput_samples_per_s for r in final if r.role == "recommended" and r.ok]
    run = [r.throughput_samples_per_s for r in final if r.role == RUNNER_UP and r.ok]
    if min(len(rec), len(run)) < FINAL_ROUNDS:
        return False
    rec_m, run_m = quantile(rec, 0.5), quantile(run, 0.5)
    return rec_m > 0 and run_m > 0 and abs(rec_m / run_m - 1) < IMPROVE


def _unsettled_pair(final: Sequence[SweepRow], other: str) -> str | None:
    """Why the rounds do not settle the pick against ``other``, or None: they split (as many rounds had the pick
    faster than ``other`` beside it as slower), or one configuration's throughput varied across the rounds
    (:func:`_spread`) by more than the ratio of the medians differs from 1."""
    rec = [r.throughput_samples_per_s for r in final if r.role == "recommended" and r.ok]
    dflt = [r.throughput_samples_per_s for r in final if r.role == other and r.ok]
    faster = [a > b for a, b in zip(rec, dflt, strict=False)]
    if not faster:
        return None
    if 2 * sum(faster) == len(faster):
        return "split (the pick faster in one, slower in another)"
    rec_m, def_m = quantile(rec, 0.5), quantile(dflt, 0.5)
    if not (rec_m > 0 and def_m > 0):
        return None
    spread = max(_spread(rec, rec_m), _spread(dflt, def_m))
    gap = abs(rec_m / def_m - 1)
    if spread > gap:
        return f"varied by {spread:.0%} from round to round, more than the two differ ({gap:.0%})"
    return None


def _spread(xs: Sequence[float], median: float) -> float:
    """(max - min) / median of ``xs``, less the one farthest from the median once there are three or more: one
    disturbed trial is what the median already outvotes, and it must not hold the rounds open to the last."""
    kept = sorted(xs, key=lambda x: abs(x - median))[: len(xs) - 1] if len(xs) >= 3 else list(xs)
    return (max(kept) - min(kept)) / median


def _fastest(rows: Sequence[SweepRow]) -> Config:
    return max(rows, key=lambda r: r.throughput_samples_per_s).config


def _median(rows: Sequence[SweepRow], role: str) -> float:
    return quantile([r.throughput_samples_per_s for r in rows if r.role == role and r.ok], 0.5)


def _finish(result: TuneResult, s: Search) -> TuneResult:
    result.elapsed_s = s.elapsed()
    return result
