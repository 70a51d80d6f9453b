"""The tuner's climb over one pipeline's workers and batch size (docs/sweep-and-tune.md, "The search").

Invariants: every decision is a pure function of the trials' rows (their throughput and its measured uncertainty,
the workers' CPU use, the breakdown), the budget gate and the arguments; a configuration runs at most twice (a
second time only to settle a comparison its first trial left within the two trials' uncertainty), and its figure is
then the pooled one; a trial starts only when it and the reserve for the final comparison fit in the budget (the
first always runs; where the first's length leaves room for trials but not for that reserve too, no reserve is
kept and nothing is measured twice: Search.plan). The stop reason of each knob is written as the climb stops it,
in the figures that decided.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from profiler.analysis.contention import THRESHOLD as CONTENTION_THRESHOLD
from profiler.sweep.analysis import Config, SweepRow, with_knobs

IMPROVE = 0.03
FINAL_ROUNDS = 2  # the final comparison's rounds (profiler.sweep.tuner), reserved in the budget
# a rejected step whose training thread waited for a CPU this share of its compute or more: said, with the
# figure, by the same threshold as the report's CPU_CONTENTION
RUNQ_NOTABLE = CONTENTION_THRESHOLD
# the share of a step the loop waited for data from which a trial is loader-bound (TensorFlow's "highly input-bound"
# band, as the whatif model's LOADER_BOUND): its workers' rate is then the loader's, and it predicts the workers
# needed
LOADER_BOUND = 0.20
# a worker process loads a sample this much slower than the training process (whatif's measured gap on the
# built-in scenarios: 1.1-1.35): the prediction from a 0-worker trial allows for it
WORKER_GAP = 1.25
# passes of (batch climb, workers re-climb) after the first workers climb: each pass re-climbs the workers only
# where the batch moved, and the batch only where the workers moved
MAX_PASSES = 3

# the knobs whose stop reasons a tune records, in the order the search settles them
KNOB_ORDER = ("workers", "batch", "prefetch_factor", "pin_memory")
# the loader's queue and copy are tried only where they could matter at the pick: the loop waited for data (for a
# deeper queue) or copied (for page-locked memory) this share of the step or more
KNOB_NOTABLE = 0.05
PREFETCH_STEPS = 2  # prefetch_factor tried at 2x and 4x the loader's own (DataLoader's 2: 4, then 8)


@dataclass(frozen=True, slots=True)
class LoaderKnobs:
    """A pipeline's DataLoader knobs where the search does not set them (None: it has no such knob, as DALI's
    loader has no prefetch_factor), and whether its batches are copied to an accelerator (CUDA, or a simulated
    one): page-locked memory speeds that copy and nothing else."""

    prefetch_factor: int | None = 2
    pin_memory: bool | None = False
    copies: bool = False


# (configuration, label for its run directory, role) -> the configuration's row
Trial = Callable[[Config, str, str], SweepRow]
GAIN, LOSS, EVEN, UNCLEAR = "gain", "loss", "even", "unclear"


class BudgetSpent(Exception):
    """The next trial does not fit in the budget."""


# How the budget is spent, decided from the first trial's measured length (Search.plan): FINAL, trials with the
# final comparison's reserve kept; TRIALS, a budget that holds a second trial but not that and a round of the final
# comparison besides: every trial it holds, compared as they ran (no re-measure, no final rounds)
FINAL, TRIALS = "final", "trials"


def worker_ladder(max_workers: int, cores: int | None = None) -> list[int]:
    """0, 1, 2, 4, ... up to ``max_workers``; ``max_workers`` and the core count (when not above it) are
    included even when they are not powers of two."""
    out = {0}
    w = 1
    while w <= max_workers:
        out.add(w)
        w *= 2
    out.add(max_workers)
    if cores is not None and 0 < cores <= max_workers:
        out.add(cores)
    return sorted(out)


def rel_ci(row: SweepRow) -> float:
    """A trial's relative uncertainty of throughput (its step time's 95% CI half-width over the mean; 0 where it
    was not measured)."""
    ci = row.step_time_rel_ci
    return ci if math.isfinite(ci) and ci > 0 else 0.0


def judge(new: SweepRow, ref: SweepRow) -> str:
    """``new`` against ``ref``: GAIN or LOSS where they differ by more than IMPROVE and more than their uncertainties
    summed (a failed ``new`` is a LOSS); EVEN where both are known to within IMPROVE and differ by less; UNCLEAR
    where the difference is within their uncertainty (measuring again may tell)."""
    if not new.ok:
        return LOSS
    gain = new.throughput_samples_per_s / ref.throughput_samples_per_s - 1
    margin = max(IMPROVE, rel_ci(new) + rel_ci(ref))
    if abs(gain) > margin:
        return GAIN if gain > 0 else LOSS
    return EVEN if margin <= IMPROVE else UNCLEAR


def pooled(first: SweepRow, again: SweepRow) -> SweepRow:
    """Two trials of one configuration as one: the mean throughput, the uncertainty of a mean of two
    (``sqrt(a^2 + b^2) / 2``), the wall time of one; a failed re-run leaves the first."""
    if not again.ok:
        return first
    ci = math.hypot(rel_ci(first), rel_ci(again)) / 2
    thr = (first.throughput_samples_per_s + again.throughput_samples_per_s) / 2
    return replace(first, throughput_samples_per_s=thr, step_time_rel_ci=ci if ci > 0 else math.nan)


def fed_step_ms(row: SweepRow) -> float:
    """The row's step with an instant loader (whatif's fed period, from what the row measured): the step less its
    data wait, or the device's busy time a step where that is longer. On a CPU they are one (the device is the
    compute phase); on a GPU or a simulated one, a loader-bound loop with 0 workers launches a step's kernels and
    goes back to loading while the device runs them, so the step less its wait is the launch time alone (about 8 ms
    where the device took 40: several times the workers), and the device's own time (CUDA events or the simulated
    device's) is the rate that says how many workers would feed it. NaN where the row lacks the figures."""
    wait = row.breakdown_ms_per_step.get("data_wait", math.nan)
    step = row.step_time_ms.get("mean", math.nan)
    if not (wait is not None and math.isfinite(wait) and math.isfinite(step) and step > wait):
        return math.nan
    busy = row.device_busy_fraction
    device = busy * step if math.isfinite(busy) else 0.0
    return max(step - wait, device)


def workers_to_feed(row: SweepRow) -> int | None:
    """The workers a loader-bound trial says would feed its step, from what it measured: the loader's time for a
    batch (with 0 workers the loop's data wait, times WORKER_GAP for a worker process; with w workers w x the step,
    each delivering one batch in w steps) over the step with an instant loader (:func:`fed_step_ms`). None where
    the trial was not loader-bound or its breakdown is missing."""
    wait = row.breakdown_ms_per_step.get("data_wait", math.nan)
    step = row.step_time_ms.get("mean", math.nan)
    fed = fed_step_ms(row)
    if not (row.ok and math.isfinite(fed) and fed > 0 and wait >= LOADER_BOUND * step):
        return None
    per_batch = wait * WORKER_GAP if row.workers == 0 else row.workers * step
    return max(1, math.ceil(per_batch / fed - 1e-9))


class Search:
    """Runs trials through the cache and the budget gate; remembers every row in the order it ran."""

    def __init__(
        self,
        trial: Trial,
        budget_s: float,
        clock: Callable[[], float],
        default: Config,
        *,
        max_batch: int,
        max_workers: int,
        cores: int,
        batches: Sequence[int] | None = None,
        knobs: Mapping[str, LoaderKnobs] | None = None,
    ) -> None:
        self.trial = trial
        self.batches = batches
        self.knobs = dict(knobs or {})  # pipeline -> its loader's own knobs (absent: none searched)
        self.budget_s = budget_s
        self.clock = clock
        self.t0 = clock()
        self.default = default
        self.max_batch = max_batch
        self.max_workers = max_workers
        self.cores = cores
        self.rows: list[SweepRow] = []  # every trial as it ran (a re-measure is a row of its own)
        self.cache: dict[Config, SweepRow] = {}  # each configuration's figure (pooled once re-measured)
        self.again: set[Config] = set()  # configurations run twice
        self.notes: list[str] = []
        self.spent: str | None = None  # why the budget stopped the search
        self.stopped: dict[str, dict[str, str]] = {}
        self.best: SweepRow | None = None  # the climb's best so far, for the budget's reserve
        self.mode: str | None = None  # FINAL or TRIALS, once the first trial's length is known (plan)
        self.budget_note: str | None = None  # what the budget holds, said where it cannot hold the usual search
        self.close: list[SweepRow] = []  # this pass's batch steps left within the uncertainty of the best (or even)

    def best_of(self, pipeline: str) -> SweepRow | None:
        """The best configuration of ``pipeline`` so far, by its (pooled) figure."""
        rows = [r for c, r in self.cache.items() if c.pipeline == pipeline and r.ok]
        return max(rows, key=lambda r: r.throughput_samples_per_s, default=None)

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

    def reserve(self) -> float:
        """Time kept for the final comparison: the rounds of default + best so far. One round only before the
        second trial: a budget that holds two trials and one round compares the default with its first step
        rather than stopping at the default alone, with nothing measured against it."""
        d = self.cache.get(self.default)
        d_s = d.wall_s if d is not None and math.isfinite(d.wall_s) else 0.0
        b_s = self.best.wall_s if self.best is not None and math.isfinite(self.best.wall_s) else d_s
        if self.mode == TRIALS:
            return 0.0
        return (FINAL_ROUNDS if len(self.rows) >= 2 else 1) * (d_s + b_s)

    def plan(self, cfg: Config) -> None:
        """Once, before the second trial (``cfg``): from the first trial's measured length, whether the budget left
        holds that trial and a round of the final comparison (FINAL), that trial alone or more of them (TRIALS: the
        budget goes to trials, compared as they ran), or not even one more (said, with the budget that would)."""
        if self.mode is not None or not self.rows:
            return
        first = self.estimate(cfg)
        left = self.budget_s - self.elapsed()
        need = first + self.reserve()  # the second trial and one round of the default beside the pick
        self.mode = FINAL if need <= left else TRIALS
        if self.mode == FINAL:
            return
        spent = self.elapsed()
        full = f"--budget-s {math.ceil(spent + need)} or more also re-runs the pick beside the default"
        if first <= left:
            n = math.floor(left / first) if first > 0 else 1
            self.budget_note = (
                f"the first trial took {first:.0f} s: the {left:.0f} s left of the {self.budget_s:g} s budget hold "
                f"{n} more trial{'s' if n != 1 else ''} of that length, not a side-by-side re-run besides "
                f"({need:.0f} s for a second trial and one round of the pick beside the default): the trials are "
                f"compared as they ran, one each ({full})"
            )
        else:
            self.budget_note = (
                f"the budget of {self.budget_s:g} s is too small for a second trial: the first took {first:.0f} s, "
                f"and a second needs {spent + first - self.budget_s:.0f} s more than the budget (--budget-s "
                f"{math.ceil(spent + first)} or more tries a second configuration; {full})"
            )
        self.notes.append(self.budget_note)

    def _gate(self, cfg: Config) -> None:
        self.plan(cfg)
        if self.rows and self.elapsed() + self.estimate(cfg) + self.reserve() > self.budget_s:
            raise BudgetSpent(cfg.name)

    def run(self, cfg: Config) -> SweepRow:
        """``cfg``'s figure: from the cache, else from a trial (BudgetSpent when it does not fit)."""
        hit = self.cache.get(cfg)
        if hit is not None:
            return hit
        self._gate(cfg)
        row = with_knobs(self.trial(cfg, f"t{len(self.rows) + 1:02d}-{cfg.name}", "trial"), cfg)
        self.rows.append(row)
        self.cache[cfg] = row
        return row

    def remeasure(self, cfg: Config) -> SweepRow | None:
        """Run ``cfg`` a second time and pool the two; None where it ran twice already or the budget has no room
        (a re-measure never ends the search: the comparison then stands as it is)."""
        if cfg in self.again or cfg not in self.cache or self.mode == TRIALS:
            return None  # TRIALS: a trial the budget holds goes to a configuration not yet tried
        try:
            self._gate(cfg)
        except BudgetSpent:
            return None
        row = with_knobs(self.trial(cfg, f"t{len(self.rows) + 1:02d}-{cfg.name}-again", "trial"), cfg)
        self.rows.append(row)
        self.again.add(cfg)
        self.cache[cfg] = pooled(self.cache[cfg], row)
        return self.cache[cfg]

    def compare(self, new: SweepRow, ref: SweepRow) -> tuple[str, SweepRow, SweepRow]:
        """:func:`judge`, and where it is UNCLEAR, again after re-measuring the one run fewer times (then the
        other): the verdict and the two rows as they then stand."""
        verdict = judge(new, ref)
        for _ in range(2):
            if verdict != UNCLEAR:
                break
            first, second = (new, ref) if new.config not in self.again else (ref, new)
            again = self.remeasure(first.config)
            if again is None and (again := self.remeasure(second.config)) is None:
                break
            new, ref = self.cache[new.config], self.cache[ref.config]
            verdict = judge(new, ref)
        return verdict, new, ref


def step_text(
    best: SweepRow,
    row: SweepRow,
    knob: str,
    verdict: str = "",
    *,
    remeasured: bool = False,
    names: tuple[str, str] | None = None,
) -> str:
    """Why ``row``, a step of the climb from ``best``, was or was not taken, in their figures (``names``: how the
    two are named, where the knob is not the workers or the batch)."""
    what, ref = names or (
        (f"{row.workers} workers", f"{best.workers}")
        if knob == "workers"
        else (f"batch {row.batch_size}", f"batch {best.batch_size}")
    )
    if not row.ok:
        return f"{what} failed ({row.error or row.status})"
    new, old = row.throughput_samples_per_s, best.throughput_samples_per_s
    gain = new / old - 1
    faster = f"{gain:.1%} faster" if gain >= 0 else f"{-gain:.1%} slower"
    text = f"{what} was {faster} than {ref} ({new:.1f} vs {old:.1f} samples/s"
    if 0 <= gain <= IMPROVE:
        text += f": within {IMPROVE:.0%}"
    elif verdict == UNCLEAR:
        text += f": within the two trials' uncertainty, +-{rel_ci(row) + rel_ci(best):.0%}"
    text += ", measured again)" if remeasured else ")"
    runq = row.runq_compute_fraction
    if knob == "workers" and math.isfinite(runq) and runq >= RUNQ_NOTABLE:
        text += f"; the training thread waited for a CPU {runq:.0%} of compute at {row.workers} workers"
    return text


def climb(s: Search, pipeline: str, start_batch: int) -> SweepRow | None:
    """One pipeline's search: the workers at the start batch, then the batch and the workers again in turn while
    either moves (at most MAX_PASSES); the best row (None when the pipeline failed at the start). When the budget
    runs out, the best so far (None before the pipeline's first trial), with ``s.spent`` set."""
    why = s.stopped.setdefault(pipeline, {})
    try:
        best = s.run(Config(pipeline, start_batch, 0))
        if not best.ok:
            s.notes.append(f"pipeline {pipeline} failed at {best.name}: {best.error or best.status}; not searched")
            why.update(workers=f"not searched: {best.name} failed", batch=f"not searched: {best.name} failed")
            return None
        _taken(s, best)
        best, why["workers"] = climb_workers(s, best)
        best = _passes(s, best, why)
        return loader_knobs(s, best, why)
    except BudgetSpent as spent:
        s.spent = f"budget of {s.budget_s:g} s reached before trying {spent}: search stopped early"
        s.notes.append(s.spent)
        so_far = s.best_of(pipeline)
        for knob in KNOB_ORDER:
            own = s.knobs.get(pipeline)
            where = "not searched" if so_far is None else f"stopped at {knob_value(so_far.config, knob, own)}"
            why.setdefault(knob, f"{where}: the budget of {s.budget_s:g} s was reached before trying {spent}")
        return so_far


def _passes(s: Search, best: SweepRow, why: dict[str, str]) -> SweepRow:
    """The batch climb, then the workers again where the batch moved, and at the batch sizes the climb could not
    tell from the best (within the trials' uncertainty, or even): a rival whose workers, climbed again, beat the
    best becomes it. Another pass only where the workers moved (at most MAX_PASSES); a later pass's batch climb
    does not step back to a size an earlier one left."""
    left: set[int] = set()
    for _ in range(MAX_PASSES):
        s.close = []
        start = best
        best, why["batch"] = climb_batch(s, best, left)
        if best.batch_size != start.batch_size:
            left.add(start.batch_size)
        rivals = [r for r in s.close if r.batch_size != best.batch_size]
        settled = best
        if best.batch_size != start.batch_size:
            best, again = climb_workers(s, best, revisit=True)
            why["workers"] = f"{again} (re-climbed at batch {best.batch_size})"
        for rival in rivals:
            best = _rival(s, best, rival, why)
        if best.workers == settled.workers and best.batch_size == settled.batch_size:
            break
    return best


def _rival(s: Search, best: SweepRow, rival: SweepRow, why: dict[str, str]) -> SweepRow:
    """``rival`` (a batch size the climb could not tell from ``best``'s) with its workers climbed again; it becomes
    the best where it then beats it."""
    got, again = climb_workers(s, rival, revisit=True)
    verdict, got, best = s.compare(got, best)
    if not (verdict == GAIN or (verdict == UNCLEAR and _ahead(got, best))):
        return best
    text = step_text(best, got, "batch", verdict)
    why["batch"] = (
        f"stopped at {got.batch_size}: batch {rival.batch_size} was within the trials' uncertainty of batch "
        f"{best.batch_size} at {rival.workers} workers; with its workers climbed again "
        f"{text.removeprefix('batch ')}"
    )
    why["workers"] = f"{again} (re-climbed at batch {got.batch_size})"
    return _taken(s, got)


def knob_value(cfg: Config, knob: str, own: LoaderKnobs | None = None) -> int | str:
    """``cfg``'s value of ``knob`` as the stop reasons name it: a loader knob the configuration did not set is its
    pipeline's own (``own``)."""
    if knob == "workers":
        return cfg.workers
    if knob == "batch":
        return cfg.batch_size
    own = own or LoaderKnobs()
    if knob == "prefetch_factor":
        return cfg.prefetch_factor or own.prefetch_factor or "its own"
    pin = cfg.pin_memory if cfg.pin_memory is not None else own.pin_memory
    return "its own" if pin is None else "on" if pin else "off"


def _taken(s: Search, best: SweepRow) -> SweepRow:
    s.best = best if s.best is None or best.throughput_samples_per_s > s.best.throughput_samples_per_s else s.best
    return best


def climb_workers(s: Search, best: SweepRow, *, revisit: bool = False) -> tuple[SweepRow, str]:
    """The workers at ``best``'s batch, up and then down the ladder; the best row and why the climb stopped.

    Up: from the rung the trial predicts would feed the step (:func:`workers_to_feed`) when that is above the next
    rung, else from the next rung; the rungs it jumped are tried only if that seed did not help. Down (on a
    re-climb, or below a seed that helped): fewer workers while they are no slower (a tie keeps the fewer)."""
    ladder = worker_ladder(s.max_workers, s.cores)
    up = [w for w in ladder if w > best.workers]
    said: list[str] = []
    need = workers_to_feed(best)
    # not past the cores: whether workers there fit is told by their CPU use, which no trial has measured yet
    seed = next((w for w in up if w >= min(need, s.cores)), up[-1]) if need is not None and up else None
    start, seeded = best.workers, False
    if seed is not None and up and seed > up[0]:
        said.append(f"seeded at {seed}: the trial at {start} predicted {need} to feed the step")
        best, stop = _up(s, best, [w for w in up if w >= seed], said)
        seeded = best.workers != start
        if not seeded:  # the seed did not help: the rungs it jumped, as a plain climb
            said.append(stop)
            best, stop = _up(s, best, [w for w in up if w < seed], said, end="")
    else:
        best, stop = _up(s, best, up, said, every=not revisit)
    down = ""
    if revisit or seeded:  # fewer workers than the best were not all tried at this batch
        floor = _floor(s, best.pipeline)
        best, down = _down(s, best, [w for w in ladder if floor <= w < best.workers], said)
        if floor > 0 and not down and best.workers > floor:
            down = f"fewer than {floor} not tried: a loader-bound trial predicted {2 * floor} or more to feed the step"
    return best, f"stopped at {best.workers}: {'; '.join(x for x in (*said, stop, down) if x)}"


def _floor(s: Search, pipeline: str) -> int:
    """The fewest workers the way down tries: half what a loader-bound 0-worker trial of ``pipeline`` predicted
    would feed the step (a batch larger or smaller scales the loading and the step alike; half, for the
    prediction's own error), rounded up, and at most the cores; 0 where no trial predicted."""
    needs = [workers_to_feed(r) or 0 for c, r in s.cache.items() if c.pipeline == pipeline and c.workers == 0]
    return min(math.ceil(max(needs, default=0) / 2), s.cores)


_MOST = "the most workers allowed (--max-workers)"


def _up(
    s: Search, best: SweepRow, rungs: Sequence[int], said: list[str], end: str = _MOST, *, every: bool = True
) -> tuple[SweepRow, str]:
    """Climb ``rungs`` (ascending) from ``best``. Up to the cores every rung is tried (one worker that only moves
    the loading off the training process can gain nothing where two gain much; not on a re-climb, ``every``
    False, which is local: it stops where a first climb past the cores would); past them a rung is tried only
    while ``w x f <= cores`` (f: the workers' CPU busy fraction: waiting workers need no core of their own), and
    the climb stops at a loss or a tie, or at a second step in a row left within the trials' uncertainty; ``end``
    is the reason when every rung was taken or passed."""
    cores, unclear = s.cores, 0
    unmeasured: int | None = None
    for w in rungs:
        f = best.worker_cpu_busy_fraction
        if w > cores and not math.isfinite(f):
            unmeasured = best.workers if unmeasured is None else unmeasured
        elif w > cores and f * w > cores:  # w > cores / f: w workers would need more than the cores
            fit = max(best.workers, math.floor(cores / f))
            return best, (
                f"the workers were {f:.0%} busy on CPU per item at {best.workers}, so about {fit} fit on {cores} "
                f"core{'' if cores == 1 else 's'} ({w} would not)"
            )
        row = s.run(Config(best.pipeline, best.batch_size, w))
        verdict, row, best = s.compare(row, best)
        twice = row.config in s.again
        if verdict == GAIN or (verdict == UNCLEAR and _ahead(row, best)):
            best, unclear = _taken(s, row), 0
            continue
        text = step_text(best, row, "workers", verdict, remeasured=twice)
        unclear = unclear + 1 if verdict == UNCLEAR else 0
        if (every and w < min(cores, s.max_workers)) or (verdict == UNCLEAR and unclear < 2):
            said.append(text)
            continue
        return best, _unsampled(text, unmeasured)
    return best, _unsampled(end, unmeasured) if rungs and end else ""


def _ahead(row: SweepRow, best: SweepRow) -> bool:
    """Still within their uncertainty once measured again (as far as the budget allowed): the figures as they stand
    decide, by more than IMPROVE."""
    return row.throughput_samples_per_s > best.throughput_samples_per_s * (1 + IMPROVE)


def _down(s: Search, best: SweepRow, rungs: Sequence[int], said: list[str]) -> tuple[SweepRow, str]:
    """Fewer workers from ``best`` (``rungs`` ascending, tried from the top) while each is no slower than the best:
    a tie (within IMPROVE) keeps the fewer; a loss, or a slowdown left within the trials' uncertainty after
    re-measuring, ends it."""
    for w in sorted(rungs, reverse=True):
        row = s.run(Config(best.pipeline, best.batch_size, w))
        verdict, row, best = s.compare(row, best)
        if verdict in (GAIN, EVEN) or (verdict == UNCLEAR and not _ahead(best, row)):
            said.append(f"fewer: {step_text(best, row, 'workers', verdict)}, so {w} is kept")
            best = _taken(s, row) if verdict == GAIN else row
            continue
        twice = row.config in s.again
        return best, f"fewer: {step_text(best, row, 'workers', verdict, remeasured=twice)}"
    return best, ""


def _unsampled(reason: str, at: int | None) -> str:
    if at is None:
        return reason
    return f"{reason}; the workers' CPU use was not sampled at {at}, so past the cores throughput alone decided"


def climb_batch(s: Search, best: SweepRow, left: set[int] | None = None) -> tuple[SweepRow, str]:
    """Double the batch at ``best``'s workers while it helps; when no doubling helps, halve it while halving helps
    (the default was past the knee). The best row and why the climb stopped. With ``s.batches``, the same climb
    over those batch sizes only. A direction whose first size is in ``left`` (where an earlier pass came from) is
    not taken."""
    start, left = best.batch_size, left or set()
    if s.batches is not None:
        listed = sorted(set(s.batches))
        if not [b for b in listed if b != start]:
            return best, f"stopped at {start}: not searched (the script's own batch size; --batch-sizes to try others)"
        ups, downs = [b for b in listed if b > start], [b for b in reversed(listed) if b < start]
        end_up = end_down = "batch {} is the last of --batch-sizes that way"
    else:
        ups = [start * 2**k for k in range(1, 64) if start * 2**k <= s.max_batch]
        downs = [start // 2**k for k in range(1, 64) if start // 2**k >= 1]
        end_up = f"batch {start * 2 ** (len(ups) + 1)} is above --max-batch-size {s.max_batch}"
        end_down = "batch 1 is the smallest"
    if ups and ups[0] in left:
        ups, end_up = [], f"batch {ups[0]} was left in an earlier pass"
    if downs and downs[0] in left:
        downs, end_down = [], f"batch {downs[0]} was left in an earlier pass"
    best, up = _batch_ladder(s, best, ups, end_up)
    if best.batch_size != start:
        return best, f"stopped at {best.batch_size}: {up}"
    best, down = _batch_ladder(s, best, downs, end_down)
    return best, f"stopped at {best.batch_size}: {'; '.join(x for x in (up, down) if x) or 'no other batch size'}"


def _batch_ladder(s: Search, best: SweepRow, sizes: Sequence[int], end: str) -> tuple[SweepRow, str]:
    """Step through ``sizes`` from ``best`` while each step gains (measured again where a first trial left it within
    the two trials' uncertainty; a step still within it is passed once, not taken); the best row and why it stopped
    (``end`` when every size was taken or passed)."""
    passed: list[str] = []
    for b in sizes:
        row = s.run(Config(best.pipeline, b, best.workers))
        if not row.ok:
            s.notes.append(f"{row.name} failed ({row.error or row.status}): batch ceiling for {best.pipeline}")
        verdict, row, best = s.compare(row, best)
        if verdict == GAIN or (verdict == UNCLEAR and _ahead(row, best)):
            best, passed = _taken(s, row), []
            continue
        twice = row.config in s.again
        text = step_text(best, row, "batch", verdict, remeasured=twice)
        if verdict in (UNCLEAR, EVEN):
            s.close.append(row)
        if verdict == UNCLEAR and not passed:
            passed.append(text)
            continue
        return best, "; ".join([*passed, text])
    if s.batches is not None:  # listed sizes: the last one tried that way, where there was one
        return best, "; ".join([*passed, end.format(sizes[-1])]) if sizes else ""
    return best, "; ".join([*passed, end])


def loader_knobs(s: Search, best: SweepRow, why: dict[str, str]) -> SweepRow:
    """At the pick of the workers and batch climb, the DataLoader's own knobs: ``prefetch_factor`` (2x, 4x the
    loader's own, while each gains) where there are workers and the loop waited for data, then ``pin_memory`` on
    where the batches are copied to an accelerator, the loader does not pin, and the copy took part of the step.
    Each is taken only as the climb takes a step (past IMPROVE and the trials' uncertainty); why each stopped, or
    was not searched, goes in ``why``."""
    own = s.knobs.get(best.pipeline)
    best, why["prefetch_factor"] = _prefetch(s, best, own)
    best, why["pin_memory"] = _pin(s, best, own)
    return best


def _share(row: SweepRow, part: str) -> float:
    """``part`` of the row's breakdown as a share of its mean step (NaN where either is missing)."""
    step = row.step_time_ms.get("mean", math.nan)
    value = row.breakdown_ms_per_step.get(part, math.nan)
    return value / step if value is not None and math.isfinite(value) and step > 0 else math.nan


def _prefetch(s: Search, best: SweepRow, own: LoaderKnobs | None) -> tuple[SweepRow, str]:
    if own is None or own.prefetch_factor is None:
        return best, f"not searched: the {best.pipeline} pipeline's loader has no prefetch_factor"
    if best.workers == 0:
        return best, "not searched: no worker processes at the pick (it is the batches each worker loads ahead)"
    wait = _share(best, "data_wait")
    if math.isnan(wait):
        return best, "not searched: the pick's data wait was not measured"
    if not wait >= KNOB_NOTABLE:
        return best, (
            f"not searched: the loop waited for data {wait:.0%} of the step at the pick (under {KNOB_NOTABLE:.0%}): "
            "a deeper queue has nothing to hide"
        )
    base = own.prefetch_factor
    for factor in (base * 2**k for k in range(1, PREFETCH_STEPS + 1)):
        row = s.run(replace(best.config, prefetch_factor=factor))
        verdict, row, best = s.compare(row, best)
        if verdict == GAIN or (verdict == UNCLEAR and _ahead(row, best)):
            best = _taken(s, row)
            continue
        names = (f"prefetch_factor {factor}", str(best.prefetch_factor or base))
        text = step_text(best, row, "prefetch_factor", verdict, remeasured=row.config in s.again, names=names)
        return best, f"stopped at {best.prefetch_factor or base}: {text}"
    return best, f"stopped at {best.prefetch_factor}: {base * 2**PREFETCH_STEPS} is the deepest tried"


def _pin_skipped(best: SweepRow, own: LoaderKnobs | None) -> str | None:
    """Why ``pin_memory`` is not tried at ``best`` (None: it is)."""
    if own is None or own.pin_memory is None:
        return f"not searched: the {best.pipeline} pipeline's loader has no pin_memory"
    if not own.copies:
        return "not searched: the batches are not copied to an accelerator (page-locked memory speeds that copy)"
    if own.pin_memory:
        return "not searched: the loader pins its batches already"
    copy = _share(best, "h2d")
    if math.isnan(copy):
        return "not searched: the pick's copy to the device was not measured"
    if not copy >= KNOB_NOTABLE:
        return f"not searched: the copy took {copy:.0%} of the step at the pick (under {KNOB_NOTABLE:.0%})"
    return None


def _pin(s: Search, best: SweepRow, own: LoaderKnobs | None) -> tuple[SweepRow, str]:
    skipped = _pin_skipped(best, own)
    if skipped is not None:
        return best, skipped
    row = s.run(replace(best.config, pin_memory=True))
    verdict, row, best = s.compare(row, best)
    if verdict == GAIN or (verdict == UNCLEAR and _ahead(row, best)):
        text = step_text(best, row, "pin_memory", verdict, names=("pin_memory on", "off"))
        return _taken(s, row), f"stopped at on: {text}"
    text = step_text(best, row, "pin_memory", verdict, remeasured=row.config in s.again, names=("pin_memory on", "off"))
    return best, f"stopped at off: {text}"
