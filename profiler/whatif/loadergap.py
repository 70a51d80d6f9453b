"""Measure how much more a sample costs a DataLoader worker process than the training process.

``stallscope whatif`` predicts 1- and 2-worker configurations from a 0-worker run and back. The same item does
not cost the same in both places: on the project's 2-core host ssd's augmentation took a median 9.2 ms per item
inside a worker against 6.8 ms in the main process, both at one intra-op thread (the main process at 1 and at 2
threads took the same), so the gap is not torch's intra-op threads; it is the worker process itself (a second
busy process on a small host, its own cold caches and heap, and the collated batch's trip through shared
memory). Rather than a constant, :func:`measure_gap` times it for the run's own dataset: ``rounds`` interleaved
rounds, each loading the same items (up to ``samples``, or what ``budget_s`` allows; the same shuffled order)
through the naive pipeline's ``DataLoader`` in the main process (at the run's intra-op thread count) and then
through one worker, timed from the first batch delivered (so the worker's start-up is not counted: a run's
steady state does not pay it per step). Each round then times ``cores`` workers loading together (the usable
cores by default): on the 2-core host two workers delivered 1.4-1.8x one worker's rate, not 2x (the training
process, the workers and the host's other work share the cores), and the ratio of the medians is the cores'
scaling that ``whatif`` applies to more than one worker.

How many rounds: at least ``rounds``; then more, up to ``max_rounds`` or ``max_s`` seconds in all, while the
median of either ratio is not yet known to ``precision`` (its standard error, from the rounds' spread, over the
median; :func:`profiler.whatif.model.settled`). On a quiet host the rounds agree and five suffice; on the project's
2-core VM the cores' scaling of single rounds read 0.83-1.05 around a median of 0.93, and five rounds left that
median about 5% uncertain, a third of the 15% a prediction may miss by.

Invariants: the process's intra-op thread count is restored; the items and their order are the same both ways.
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
    """(seconds per sample, samples timed) of up to ``batches`` batches after the first (fewer when
    ``budget_s`` runs out), loaded with ``workers`` (0: in-process)."""
    from pipelines.base import LoaderSpec
    from pipelines.naive import data_loader

    spec = LoaderSpec(batch_size, workers, seed=seed, shuffle=True, drop_last=True)
    loader, _, _ = data_loader(dataset, spec, pin_memory=False, persistent_workers=False)
    it = iter(loader)
    try:
        next(it)  # start-up (a worker's fork and first batch) is not the steady state
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
    deliver together (see the module docstring). ``threads``: the main process's intra-op threads while it
    loads (the measured run's; None: as it is). ``cores``: how many workers to time together (None: the
    usable cores; 1 or fewer: not timed). ``rounds`` at least, then up to ``max_rounds`` (and ``max_s`` seconds)
    until both medians are known to ``precision``: see the module docstring."""
    import torch

    from pipelines.base import usable_cores

    if len(dataset) < 2 * batch_size:
        raise ValueError(f"the dataset has {len(dataset)} items: too few to time batches of {batch_size}")
    k = usable_cores() if cores is None else cores
    batches = max(1, min(math.ceil(samples / batch_size), len(dataset) // batch_size - 1))
    before = torch.get_num_threads()
    main_s: list[float] = []
    worker_s: list[float] = []
    together_s: list[float] = []
    timed = 0
    started = clock()
    try:
        for r in range(max(rounds, max_rounds)):
            if r >= rounds and (
                clock() - started >= max_s
                or (
                    settled([w / m for m, w in zip(main_s, worker_s, strict=True)], precision)
                    and (
                        not together_s or settled([w / t for w, t in zip(worker_s, together_s, strict=True)], precision)
                    )
                )
            ):
                break
            if threads:
                torch.set_num_threads(threads)
            s, n = _seconds_per_sample(dataset, batch_size, 0, batches, seed=seed + r, budget_s=budget_s, clock=clock)
            main_s.append(s)
            torch.set_num_threads(before)
            # the worker loads the items the main process just loaded, in the same order
            s, m = _seconds_per_sample(
                dataset, batch_size, 1, n // batch_size, seed=seed + r, budget_s=math.inf, clock=clock
            )
            worker_s.append(s)
            timed += n + m
            if k > 1:  # k workers at once, k batches each at least: what the cores add together
                nk = min(max(k * (n // batch_size), 2 * k), len(dataset) // batch_size - 1)
                s, _ = _seconds_per_sample(dataset, batch_size, k, nk, seed=seed + r, budget_s=math.inf, clock=clock)
                together_s.append(s)
    finally:
        torch.set_num_threads(before)
    gap = gap_from_rounds(main_s, worker_s, timed // 2)
    return with_cores(gap, k, worker_s, together_s) if together_s else gap
