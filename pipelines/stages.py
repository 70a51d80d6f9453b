"""Per-item stage times of the torch pipelines' built-in data sets: fetch (the file's bytes), decode, augment, and
the collate of each batch, timed where they run (a DataLoader worker, or the training process with 0 workers);
and in a worker, the hand-off of each batch (:data:`HANDOFF`: from its collate's end to the next batch's first stage).

The times go into one array of shared memory that the training process makes before its loader starts
(:func:`install`), that its forked workers inherit, and that the sampler process reads (a memory file passed to it:
:class:`profiler.core.sources.stages.SharedDoubles`): a row per loader process (the training process, then each
worker by id), a pair (seconds, items) per stage and the hand-off, each row written by its own process only. Reading it
(:func:`totals`) sums the rows. Without :func:`install` nothing is timed (a data set used outside a stallscope
run pays one ``None`` check). A data set of your own can time its stages with :func:`timed`.

docs/pipelines.md, "Stages", and docs/metrics.md, "Loader stages", say what each stage covers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from profiler.core.sources.stages import SharedDoubles, stage_totals

STAGES = ("fetch", "decode", "augment", "collate")
# not a stage: a worker's wall time from a batch's collate end to the next batch's first stage, where torch hands the
# batch to the training process (the queue put, the pickling into shared memory) and the worker waits for the next
# indices; the analysis takes out that wait (the loader time table's) and counts the rest as loader time per item
HANDOFF = "handoff"
COUNTED = (*STAGES, HANDOFF)  # the shared array's pairs (seconds, items) per row, in order
ROWS = 257  # the training process and up to 256 workers (ids past that share rows: the sums stay right)
_clock: SharedDoubles | None = None  # the shared array, once installed
_collated: tuple[float, int] | None = None  # in a worker: its last collate's end (perf_counter) and batch length


def install() -> None:
    """Make the shared array (once per process): call before the DataLoader's workers start."""
    global _clock  # noqa: PLW0603 - one array per process, inherited by the workers it forks
    if _clock is None:
        _clock = SharedDoubles(ROWS * len(COUNTED) * 2)


def counters() -> SharedDoubles | None:
    """The shared array (its memory file is what the sampler process reads), once installed."""
    return _clock


def installed() -> bool:
    return _clock is not None


_rows: dict[int, int] = {}  # pid -> its row (a forked worker inherits the parent's entry under another pid)


def _row() -> int:
    pid = os.getpid()
    row = _rows.get(pid)
    if row is None:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        row = _rows[pid] = 0 if info is None else 1 + info.id % (ROWS - 1)
    return row


def record(stage: str, seconds: float, items: int = 1) -> None:
    """Add ``seconds`` spent on ``items`` items in ``stage`` (one of :data:`STAGES`) for this loader process."""
    if _clock is None:
        return
    row = _row()
    _add(row, stage, seconds, items)
    if row and _collated is not None:
        _handed_off(row, stage, time.perf_counter() - seconds)


def _add(row: int, stage: str, seconds: float, items: float) -> None:
    assert _clock is not None
    at = (row * len(COUNTED) + COUNTED.index(stage)) * 2
    values = _clock.values
    values[at] += seconds
    values[at + 1] += items


def _handed_off(row: int, stage: str, started: float) -> None:
    """A worker's first stage after a collate began at ``started``: the gap since the collate's end is the batch's
    hand-off (and the wait for the next indices). Where the next timed thing is the collate itself (a data set that
    times no stage) the gap holds the items' own untimed work: it is dropped, not counted as a hand-off."""
    global _collated  # noqa: PLW0603 - per process: each worker its own
    assert _collated is not None
    ended, items = _collated
    _collated = None
    if stage != "collate" and started >= ended:
        _add(row, HANDOFF, started - ended, items)


def collated(items: int) -> None:
    """A worker's collate of ``items`` items ended now: its hand-off runs until its next stage starts."""
    global _collated  # noqa: PLW0603 - per process: each worker its own
    if _clock is not None and _row():
        _collated = (time.perf_counter(), items)


@contextmanager
def timed(stage: str, items: int = 1) -> Iterator[None]:
    """Time the block as ``stage`` for ``items`` items (nothing is timed unless a stallscope run installed it)."""
    if _clock is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        record(stage, time.perf_counter() - t0, items)


def totals() -> dict[str, tuple[float, float]]:
    """Per stage (and the hand-off), (seconds, items) summed over every loader process so far; empty before
    :func:`install`."""
    if _clock is None:
        return {}
    return stage_totals(_clock, COUNTED)


class TimedCollate:
    """A collate function timed as the ``collate`` stage (items: the batch's length); in a worker, its end starts
    the batch's hand-off (:data:`HANDOFF`)."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, items: list[Any]) -> Any:
        with timed("collate", len(items)):
            out = self.collate(items)
        collated(len(items))
        return out
