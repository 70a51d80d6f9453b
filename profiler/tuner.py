"""The tuner's search: workers, batch size and pipeline with the best throughput, without a full grid.

For each pipeline, starting at the scenario's batch size and 0 workers:
1. hill-climb on workers over 0, 1, 2, 4, ... up to the core count, moving up only while a step improves
   throughput by more than ``IMPROVE`` (more workers cost memory and CPU: a tie keeps the fewer);
2. double the batch at the best worker count while throughput improves by more than ``IMPROVE``, up to
   ``max_batch``; a configuration that fails (out of memory, or any RuntimeError) is the ceiling. If the
   first doubling does not improve, halve instead while halving improves (the default was past the knee).
Then the recommendation is the best of the pipelines' climbs, and it is re-run side by side with the
default configuration (the scenario's batch, 0 workers, ``naive``): ``rounds`` rounds, alternating which
runs first so that drift of the machine cancels, the speedup being the ratio of the median throughputs.
A pick that is no faster than the default side by side (speedup <= 1) is not confirmed: the recommendation
becomes the default, and the pick with its measured speedup is kept as ``unconfirmed``.

Invariants: the search is a pure function of the ``trial`` callable's results and the ``clock``; a
configuration is tried at most once (results are cached); a trial is started only when the time spent so
far, its estimated duration and the time reserved for the final comparison fit in ``budget_s`` (the first
trial always runs); the final comparison always runs at least one round, so a budget too small for even
that is exceeded by it and ``notes`` says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from profiler.analysis.stats import finite_or_none, quantile
from profiler.analysis.sweep import Config, SweepRow
from profiler.session import Interrupted

IMPROVE = 0.03
FINAL_ROUNDS = 2
DEFAULT_PIPELINE = "naive"


# (configuration, label for its run directory, role) -> the configuration's row
Trial = Callable[[Config, str, str], SweepRow]


class BudgetSpent(Exception):
    """Internal: the next trial does not fit in the budget."""


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

    def medians(self) -> dict[str, float | None]:
        return {role: finite_or_none(_median(self.final, role)) for role in ("recommended", "default")}

    def to_dict(self) -> dict[str, Any]:
        """The ``tune.json`` object (and ``tune --json``)."""
        return {
            "recommended": self.recommended.to_dict() if self.recommended else None,
            "default": self.default.to_dict(),
            "speedup": finite_or_none(self.speedup),
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
            "rules": {
                "improve": f"a step of the search is taken only when throughput improves by more than {IMPROVE:.0%}",
                "final": f"recommended and default re-run alternately, up to {FINAL_ROUNDS} rounds each; "
                "speedup = ratio of median throughputs",
            },
            "notes": list(self.notes),
        }


def worker_ladder(max_workers: int) -> list[int]:
    """0, 1, 2, 4, ... up to ``max_workers``, which is included even when it is not a power of two."""
    out = [0]
    w = 1
    while w <= max_workers:
        out.append(w)
        w *= 2
    if max_workers > 0 and out[-1] != max_workers:
        out.append(max_workers)
    return out


class _Search:
    """Runs trials through the cache and the budget gate; remembers every row in the order it ran."""

    def __init__(self, trial: Trial, budget_s: float, clock: Callable[[], float], default: Config) -> None:
        self.trial = trial
        self.budget_s = budget_s
        self.clock = clock
        self.t0 = clock()
        self.default = default
        self.rows: list[SweepRow] = []
        self.cache: dict[Config, SweepRow] = {}
        self.notes: list[str] = []
        self.spent: str | None = None  # why the budget stopped the search

    def best_of(self, pipeline: str) -> SweepRow | None:
        """The best completed trial of ``pipeline`` so far, by the same rule as the climb (ties to the first)."""
        best: SweepRow | None = None
        for r in self.rows:
            if r.pipeline == pipeline and r.ok and (best is None or _better(r, best)):
                best = r
        return best

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def estimate(self, cfg: Config) -> float:
        """Duration of a trial of ``cfg``: the nearest tried batch's wall time, scaled by the batch ratio
        (the early-stop rule needs about as many steps at any batch, and a step grows with the batch)."""
        timed = [r for r in self.rows if math.isfinite(r.wall_s)]
        if not timed:
            return 0.0
        near = min(timed, key=lambda r: (abs(math.log(cfg.batch_size / r.batch_size)), -r.wall_s))
        return near.wall_s * max(1.0, cfg.batch_size / near.batch_size)

    def reserve(self, best: SweepRow | None) -> float:
        """Time kept for the final comparison: the rounds of default + best so far."""
        d = self.cache.get(self.default)
        d_s = d.wall_s if d is not None and math.isfinite(d.wall_s) else 0.0
        b_s = best.wall_s if best is not None and math.isfinite(best.wall_s) else d_s
        return FINAL_ROUNDS * (d_s + b_s)

    def run(self, cfg: Config, best: SweepRow | None) -> SweepRow:
        hit = self.cache.get(cfg)
        if hit is not None:
            return hit
        if self.rows and self.elapsed() + self.estimate(cfg) + self.reserve(best) > self.budget_s:
            raise BudgetSpent(cfg.name)
        row = self.trial(cfg, f"t{len(self.rows) + 1:02d}-{cfg.name}", "trial")
        self.rows.append(row)
        self.cache[cfg] = row
        return row


def _better(new: SweepRow, old: SweepRow) -> bool:
    return new.ok and new.throughput_samples_per_s > old.throughput_samples_per_s * (1 + IMPROVE)


def _climb(s: _Search, pipeline: str, start_batch: int, max_batch: int, max_workers: int) -> SweepRow | None:
    """One pipeline's search; the best row it found (None when the pipeline failed at the start). When the
    budget runs out, the best so far (None before the pipeline's first trial), with ``s.spent`` set."""
    try:
        best = s.run(Config(pipeline, start_batch, 0), None)
        if not best.ok:
            s.notes.append(f"pipeline {pipeline} failed at {best.name}: {best.error or best.status}; not searched")
            return None
        return _climb_from(s, best, max_batch, max_workers)
    except BudgetSpent as spent:
        s.spent = f"budget of {s.budget_s:g} s reached before trying {spent}: search stopped early"
        s.notes.append(s.spent)
        return s.best_of(pipeline)


def _climb_from(s: _Search, best: SweepRow, max_batch: int, max_workers: int) -> SweepRow:
    pipeline, start_batch = best.pipeline, best.batch_size
    for w in worker_ladder(max_workers)[1:]:
        row = s.run(Config(pipeline, start_batch, w), best)
        if not _better(row, best):
            break
        best = row
    grew = False
    b = best.batch_size * 2
    while b <= max_batch:
        row = s.run(Config(pipeline, b, best.workers), best)
        if not row.ok:
            s.notes.append(f"{row.name} failed ({row.error or row.status}): batch ceiling for {pipeline}")
            break
        if not _better(row, best):
            break
        best, grew = row, True
        b *= 2
    if not grew:
        b = best.batch_size // 2
        while b >= 1:
            row = s.run(Config(pipeline, b, best.workers), best)
            if not _better(row, best):
                break
            best = row
            b //= 2
    return best


def tune(
    trial: Trial,
    *,
    pipelines: Sequence[str],
    default_batch: int,
    max_batch: int,
    max_workers: int,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Search, then measure the recommendation against the default side by side (see the module docstring).

    KeyboardInterrupt (or the CLI's :class:`Interrupted`) during a trial ends the search: the result then
    has status "interrupted", ``stopped_by`` the signal, and holds whatever ran.
    """
    default = Config(DEFAULT_PIPELINE, default_batch, 0)
    start = min(default_batch, max_batch)
    s = _Search(trial, budget_s, clock, default)
    final: list[SweepRow] = []
    result = TuneResult(None, default, None, s.rows, final, budget_s, 0.0, notes=s.notes)
    try:
        bests: list[SweepRow] = []
        for p in pipelines:
            best = _climb(s, p, start, max_batch, max_workers)
            if best is not None:
                bests.append(best)
            if s.spent:
                break
        if not bests:
            s.notes.append("no configuration completed: nothing to recommend")
            return _finish(result, s)
        rec = result.recommended = _fastest(bests)
        if rec == default:
            s.notes.append("the default configuration is the best found: speedup 1 by definition, not re-run")
            result.speedup = 1.0
            return _finish(result, s)
        _final_pair(result, s, rec)
    except (Interrupted, KeyboardInterrupt) as exc:
        result.status = "interrupted"
        result.stopped_by = getattr(exc, "signame", "SIGINT")
        row = getattr(exc, "row", None)  # the orchestration's ConfigStopped carries the interrupted run's row
        if isinstance(row, SweepRow):
            (s.rows if row.role == "trial" else final).append(row)
        s.notes.append(f"stopped by {result.stopped_by} after {len(s.rows)} trials: the result is partial")
        ok = [r for r in s.rows if r.ok]
        if result.recommended is None and ok:
            result.recommended = _fastest(ok)
            s.notes.append("recommended: the best trial before the stop (the search did not finish)")
    return _finish(result, s)


def _final_pair(result: TuneResult, s: _Search, rec: Config) -> None:
    """Re-run recommended and default alternately; the speedup is the ratio of the medians."""
    per_round = s.estimate(rec) + s.estimate(result.default)
    rounds = FINAL_ROUNDS
    while rounds > 1 and s.elapsed() + rounds * per_round > s.budget_s:
        rounds -= 1
    if s.elapsed() + per_round > s.budget_s:
        s.notes.append(f"the final comparison ({per_round:.0f} s a round) runs past the {s.budget_s:g} s budget")
    for i in range(rounds):
        order = [("default", result.default), ("recommended", rec)]
        if i % 2:
            order.reverse()
        for role, cfg in order:
            result.final.append(s.trial(cfg, f"final{i + 1}-{role}-{cfg.name}", role))
    rec_m, def_m = _median(result.final, "recommended"), _median(result.final, "default")
    if math.isfinite(rec_m) and math.isfinite(def_m) and def_m > 0:
        result.speedup = rec_m / def_m
        if result.speedup <= 1.0:
            # the search's pick won on one short trial each; side by side it was no faster: that was noise
            s.notes.append(
                f"re-run side by side, the search's best {rec.name} made x{result.speedup:.2f} of the default's "
                f"throughput (median of {rounds} rounds): not confirmed, the default is kept"
            )
            result.unconfirmed, result.unconfirmed_speedup = rec, result.speedup
            result.recommended, result.speedup = result.default, 1.0
    else:
        s.notes.append("the final comparison did not complete for both configurations: no measured speedup")


def _fastest(rows: Sequence[SweepRow]) -> Config:
    return max(rows, key=lambda r: r.throughput_samples_per_s).config


def _median(rows: Sequence[SweepRow], role: str) -> float:
    return quantile([r.throughput_samples_per_s for r in rows if r.role == role and r.ok], 0.5)


def _finish(result: TuneResult, s: _Search) -> TuneResult:
    result.elapsed_s = s.elapsed()
    return result
