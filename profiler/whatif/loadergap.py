"""Measure how much more a sample costs a DataLoader worker process than the training process, and how much the
usable cores' worth of workers deliver together, on the run's own dataset (docs/whatif.md, "Where the loading
runs", gives the method and the figures that made it necessary).

Invariants: the process's intra-op thread count is restored; the items and their order are the same both ways;
at least ``rounds`` interleaved rounds, then more (up to ``max_rounds`` or ``max_s``) until the medians settle.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from profiler.whatif.model import LoaderGap, gap_from_rounds, settled, with_cores

DEFAULT_SAMPLES = 128
DEFAULT_ROUNDS = 5  # at least
DEFAULT_MAX_ROUNDS = 15
DEFAULT_MAX_S = 30.0  # more rounds stop after this many seconds of calibration in all
DEFAULT_PRECISION = 0.03  # the medians' relative standard error to stop at
# each timing stops after this many seconds (at least one batch), so a slow loader (20 ms an item) is not timed
# for long: the rounds, not the length of one, are what the noise of a shared host is fought with
DEFAULT_BUDGET_S = 1.0


def _seconds_per_sample(
    dataset: Any,
    batch_size: int,
    workers: int,
    batches: int,
    *,
    seed: int,
    budget_s: float,
    clock: Callable[[], float],
) -> tuple[float, int]:
    """(seconds per sample, samples timed) of up to ``batches`` batches after the start-up ones (fewer when
    ``budget_s`` runs out), loaded with ``workers`` (0: in-process). Start-up is one batch from each worker:
    batches come back in order, so a worker that forked late would otherwise hold the timed window back (two
    workers that wait side by side read 0.78 of their rate together beside busy processes, 1.0 once both had
    delivered before the clock started)."""
    from pipelines.base import LoaderSpec
    from pipelines.naive import data_loader

    spec = LoaderSpec(batch_size, workers, seed=seed, shuffle=True, drop_last=True)
    loader, _, _ = data_loader(dataset, spec, pin_memory=False, persistent_workers=False)
    it = iter(loader)
    try:
        for _ in range(max(1, workers)):  # start-up (each worker's fork and first batch) is not the steady state
            next(it)
        t0 = clock()
        n = 0
        elapsed = 0.0
        for _ in range(batches):
            try:
                next(it)
            except StopIteration:
                break
            n += 1
            elapsed = clock() - t0
            if elapsed >= budget_s:
                break
    finally:
        del it
    if n < 1:
        raise ValueError(f"the dataset has too few items to time {batch_size * 2} of them")
    return elapsed / (n * batch_size), n * batch_size


def measure_gap(
    dataset: Any,
    batch_size: int,
    *,
    threads: int | None = None,
    samples: int = DEFAULT_SAMPLES,
    rounds: int = DEFAULT_ROUNDS,
    seed: int = 0,
    budget_s: float = DEFAULT_BUDGET_S,
    cores: int | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_s: float = DEFAULT_MAX_S,
    precision: float = DEFAULT_PRECISION,
    clock: Callable[[], float] = time.perf_counter,
) -> LoaderGap:
    """The worker / main-process cost ratio of ``dataset`` at ``batch_size``, and how much ``cores`` workers
    deliver together. ``threads``: the main process's intra-op threads while it
    loads (the measured run's; None: as it is). ``cores``: how many workers to time together (None: the
    usable cores; 1 or fewer: not timed). ``rounds`` at least, then up to ``max_rounds`` (and ``max_s`` seconds)
    until both medians are known to ``precision`` (:func:`profiler.whatif.model.settled`)."""
    from pipelines.base import usable_cores

    if len(dataset) < 2 * batch_size:
        raise ValueError(f"the dataset has {len(dataset)} items: too few to time batches of {batch_size}")
    k = usable_cores() if cores is None else cores
    batches = max(1, min(math.ceil(samples / batch_size), len(dataset) // batch_size - 1))
    main_s: list[float] = []
    worker_s: list[float] = []
    together_s: list[float] = []
    timed = 0
    started = clock()
    for r in range(max(rounds, max_rounds)):
        if r >= rounds and (clock() - started >= max_s or _settled(main_s, worker_s, together_s, precision)):
            break
        main, worker, together, n = _round(
            dataset, batch_size, batches, k, seed=seed + r, threads=threads, budget_s=budget_s, clock=clock
        )
        main_s.append(main)
        worker_s.append(worker)
        if together is not None:
            together_s.append(together)
        timed += n
    gap = gap_from_rounds(main_s, worker_s, timed // 2)
    return with_cores(gap, k, worker_s, together_s) if together_s else gap


def _settled(main_s: list[float], worker_s: list[float], together_s: list[float], precision: float) -> bool:
    """Whether the gap's median and (when timed) the cores' scaling's are known to ``precision``."""
    if not settled([w / m for m, w in zip(main_s, worker_s, strict=True)], precision):
        return False
    return not together_s or settled([w / t for w, t in zip(worker_s, together_s, strict=True)], precision)


def _round(
    dataset: Any,
    batch_size: int,
    batches: int,
    k: int,
    *,
    seed: int,
    threads: int | None,
    budget_s: float,
    clock: Callable[[], float],
) -> tuple[float, float, float | None, int]:
    """One round: (seconds per sample in the main process at ``threads`` intra-op threads, through one worker,
    through ``k`` workers together or None when ``k`` <= 1, samples timed the first two ways)."""
    import torch

    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        main, n = _seconds_per_sample(dataset, batch_size, 0, batches, seed=seed, budget_s=budget_s, clock=clock)
    finally:
        torch.set_num_threads(before)
    # the worker loads the items the main process just loaded, in the same order
    worker, m = _seconds_per_sample(dataset, batch_size, 1, n // batch_size, seed=seed, budget_s=math.inf, clock=clock)
    together = None
    if 1 < k < len(dataset) // batch_size:  # k workers at once, k batches each at least: what the cores add together
        nk = min(max(k * (n // batch_size), 2 * k), len(dataset) // batch_size - k)
        together, _ = _seconds_per_sample(dataset, batch_size, k, nk, seed=seed, budget_s=math.inf, clock=clock)
    return main, worker, together, n + m
