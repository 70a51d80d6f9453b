"""What a sweep or a tune will run, decided before anything trains: the configurations from the command's lists
and the scenario's defaults, the rank counts it can run, the tuner's search bounds. Imports no torch except to
count CUDA devices for a CUDA job."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pipelines import usable_cores
from profiler.sweep.analysis import Config
from profiler.sweep.defaults import MAX_BATCH_FACTOR, WORKER_CAP


def default_batch_sizes(batch_size: int) -> list[int]:
    """Half, once and twice the scenario's batch."""
    return sorted({max(1, batch_size // 2), batch_size, batch_size * 2})


def default_workers() -> list[int]:
    """0 and min(2, the usable cores)."""
    return sorted({0, min(2, usable_cores())})


def sweep_configs(
    pipelines: Sequence[str],
    scenario_batch: int,
    batch_sizes: Sequence[int] | None,
    workers: Sequence[int] | None,
    nproc: Sequence[int],
) -> list[Config]:
    """Every pipeline x workers x rank count x batch size, in that order; None: the defaults above."""
    sizes = batch_sizes or default_batch_sizes(scenario_batch)
    counts = workers if workers is not None else default_workers()
    return [Config(p, b, w, n) for p in pipelines for w in counts for n in nproc for b in sizes]


def nproc_problem(nproc: Sequence[int], *, seconds: float | None, steps: int | None, cuda: bool) -> str | None:
    """Why these rank counts cannot run (one line naming the value and what is allowed), or None: a job of
    several ranks needs a step cap, and a CUDA job a device per rank."""
    if max(nproc) <= 1:
        return None
    if seconds is not None and steps is None:
        return (
            f"--nproc {','.join(map(str, nproc))} with --seconds alone: a job of several ranks runs a fixed "
            "number of steps, allowed --steps N (with or without --seconds)"
        )
    if cuda:
        import torch

        if max(nproc) > torch.cuda.device_count():
            return f"--nproc {max(nproc)}: this node has {torch.cuda.device_count()} CUDA device(s)"
    return None


class TuneBounds(NamedTuple):
    """The tuner's search space: the largest batch and the most workers it may try."""

    max_batch: int
    max_workers: int


def tune_bounds(scenario_batch: int, max_batch: int | None, max_workers: int | None, ceiling: int) -> TuneBounds:
    """The given bounds, else MAX_BATCH_FACTOR x the scenario's batch (at most ``ceiling``) and WORKER_CAP."""
    return TuneBounds(
        max_batch=max_batch or min(ceiling, MAX_BATCH_FACTOR * scenario_batch),
        max_workers=max_workers if max_workers is not None else WORKER_CAP,
    )


def tune_plan(
    what: str,
    *,
    first: str,
    knobs: str,
    max_workers: int,
    cores: int,
    batches: str,
    seconds: float,
    steps: int | None,
    budget_s: float,
    for_real: str,
) -> list[str]:
    """What ``tune --dry-run`` prints: the trials a tune would run, in order, and what each does."""
    from profiler.sweep.climb import FINAL_ROUNDS, IMPROVE, KNOB_NOTABLE, MAX_PASSES, worker_ladder
    from profiler.sweep.tuner import CONTESTED_GAIN, FINAL_MAX_ROUNDS

    ladder = worker_ladder(max_workers, cores)
    inside = [w for w in ladder if w <= cores]
    past = [w for w in ladder if w > cores]
    climb = ", ".join(map(str, inside)) + (
        f", then {', '.join(map(str, past[:3]))}{', ...' if len(past) > 3 else ''} (up to {max_workers}) only while "
        "the workers' measured CPU use leaves room on the cores"
        if past
        else ""
    )
    cap = f" (or {steps} measured steps)" if steps is not None else ""
    return [
        f"tune {what}: the plan (nothing is run now)",
        f"  each trial: {for_real.format(measured=f'{seconds:g} s{cap}')}",
        f"  1. {first}",
        f"  2. workers {climb}, each step taken only when throughput improves by more than {IMPROVE:.0%} and more "
        "than the two trials' uncertainty (measured again where it is within it); a loader-bound first trial seeds "
        f"the climb at the count it predicts would feed the step ({cores} core{'' if cores == 1 else 's'} "
        f"here){knobs}",
        f"  3. batch size: {batches}; where it moves, the workers again at the new batch (up and down), then the "
        f"batch again where they moved (at most {MAX_PASSES} passes)",
        f"  4. at the pick, the DataLoader's prefetch_factor (2x, then 4x its own, where there are workers and the "
        f"loop waited for data {KNOB_NOTABLE:.0%} of the step or more), then pin_memory on (where the batches are "
        f"copied to an accelerator, the loader does not pin, and the copy took {KNOB_NOTABLE:.0%} of the step or "
        "more), each kept only as a step of the climb",
        f"  5. the pick and the setting to beat re-run alternately, {FINAL_ROUNDS} rounds each "
        f"(up to {FINAL_MAX_ROUNDS} while they split or vary more than they differ, or give no gain where the "
        f"trials saw x{CONTESTED_GAIN:g} or more): the speedup is the ratio of their median throughputs (of every "
        "run of each, trials too, where the rounds still give none)",
        f"  budget {budget_s:g} s for all of it: a trial starts only when it and the final comparison fit; where the "
        "first trial's length leaves room for more trials but not for a round of the final comparison too, the "
        "budget goes to trials, compared as they ran (one each), and where it leaves room for none, the result "
        "says by how much it is short",
    ]
