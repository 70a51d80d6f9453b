"""``run --headspace``: the loader iterated alone, before training, for a few seconds.

A second loader is built with the run's own pipeline, data set and knobs, iterated with no model (batches are
taken and dropped: no copy), and shut down before the run's own loader starts. Its rate is the loader's capacity
on this host when nothing else runs (SPDL's "headspace"); the summary sets it beside what the training consumed
(profiler.analysis.stages.headspace). Its first ``warmup`` batches (workers starting) are not timed.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from pipelines import BuiltLoader
from profiler.core.steps.batch_facts import batch_len

SECONDS = 3.0  # the timed window: at most this long ...
MAX_BATCHES = 40  # ... or this many batches, whichever comes first
WARMUP = 2


def loader_alone(
    build: Callable[[], BuiltLoader],
    *,
    seconds: float = SECONDS,
    max_batches: int = MAX_BATCHES,
    warmup: int = WARMUP,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, object]:
    """The meta record ``loader_alone``: samples/s over the timed batches, their count, the window's seconds and
    its start and end on ``clock`` (the run's timeline, as its samples: the stage readings of the window)."""
    built = build()
    t0 = t1 = None
    batches = samples = 0
    try:
        it = iter(built.batches)
        for k, batch in enumerate(it, start=1):
            now = clock()
            if k == warmup:
                t0 = now
            elif k > warmup and t0 is not None:
                batches, samples, t1 = batches + 1, samples + (batch_len(batch) or 0), now
                if now - t0 >= seconds or batches >= max_batches:
                    break
        del it
    finally:
        built.close()
        gc.collect()  # an abandoned DataLoader iterator shuts its workers down when it is collected
    if t0 is None or t1 is None or not t1 > t0 or not samples:
        return {"samples_per_s": None, "batches": batches, "seconds": 0.0, "warmup_batches": warmup, "t0": t0}
    return {
        "samples_per_s": samples / (t1 - t0),
        "batches": batches,
        "seconds": t1 - t0,
        "warmup_batches": warmup,
        "t0": t0,
        "t1": t1,
    }
