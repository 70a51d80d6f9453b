"""The loader's stage times: seconds and items per stage (fetch, decode, augment, collate) summed over the loader
processes, as the built-in data sets time them (:mod:`pipelines.stages`), and the emulated store's totals
(:mod:`pipelines.store`).

The loader processes write their counters into :class:`SharedDoubles`: memory files that the training process
makes before its loader starts, that its forked workers inherit mapped, and that the sampler process maps from the
file descriptors it is given at its start (:meth:`StageSource.recipe`). So the counters are read in the sampler
process, not in the training process, and the recording core does not import the pipelines.

Metrics: ``stage.<name>.s`` and ``stage.<name>.n``, cumulative since the loader started (a difference over a
window is that window's time and items); with an emulated store, ``store.wait_s``, ``store.bytes`` and
``store.reads`` the same way. docs/metrics.md, "Loader stages", defines the figures.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from profiler.core.sources.base import SourceRecipe

STORE_KEYS = ("wait_s", "bytes", "reads")  # the emulated store's totals, in order from index STORE_AT
STORE_AT = 2


class SharedDoubles:
    """``n`` doubles in an anonymous memory file, zeroed; indexable like a list (a ctypes array), with a buffer."""

    def __init__(self, n: int, fd: int | None = None) -> None:
        self.n = n
        self.fd = os.memfd_create("stallscope-counters") if fd is None else fd
        if fd is None:
            os.ftruncate(self.fd, n * 8)
        self._mem = mmap.mmap(self.fd, n * 8)
        self.values: Any = (ctypes.c_double * n).from_buffer(self._mem)

    def __getitem__(self, i: int) -> float:
        return float(self.values[i])

    def __setitem__(self, i: int, value: float) -> None:
        self.values[i] = value

    def __len__(self) -> int:
        return self.n


def stage_totals(counters: SharedDoubles, stages: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per stage, (seconds, items) summed over the rows (one per loader process: a pair per stage); stages with no
    item yet are left out."""
    width = len(stages) * 2
    values = memoryview(counters.values).cast("B").cast("d")
    sums = [sum(values[k::width]) for k in range(width)]
    return {stage: (sums[2 * i], sums[2 * i + 1]) for i, stage in enumerate(stages) if sums[2 * i + 1]}


def store_totals(counters: SharedDoubles) -> dict[str, float]:
    return {key: counters[STORE_AT + i] for i, key in enumerate(STORE_KEYS)}


class StageSource:
    name = "stages"

    def __init__(
        self,
        totals: Callable[[], Mapping[str, tuple[float, float]]],
        store: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._totals = totals
        self._store = store

    @staticmethod
    def recipe(stages: SharedDoubles, names: Sequence[str], store: SharedDoubles | None = None) -> SourceRecipe:
        """The source, made in the sampler process over the same counters (their memory files passed to it)."""
        fds = (stages.fd,) if store is None else (stages.fd, store.fd)
        return SourceRecipe(
            "profiler.core.sources.stages:shared_stage_source",
            pass_fds=fds,
            stages_fd=stages.fd,
            rows=stages.n,
            names=list(names),
            store_fd=None if store is None else store.fd,
            store_n=None if store is None else store.n,
        )

    def open(self) -> str | None:
        return None

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for stage, (seconds, items) in self._totals().items():
            out[f"stage.{stage}.s"], out[f"stage.{stage}.n"] = seconds, items
        for key, value in (self._store() if self._store is not None else {}).items():
            out[f"store.{key}"] = value
        return out

    def close(self) -> None:
        return None


def shared_stage_source(
    stages_fd: int, rows: int, names: list[str], store_fd: int | None = None, store_n: int | None = None
) -> StageSource:
    """:class:`StageSource` over counters whose memory files this process was given (the sampler process)."""
    stages = SharedDoubles(rows, stages_fd)
    store = SharedDoubles(store_n, store_fd) if store_fd is not None and store_n is not None else None
    return StageSource(
        lambda: stage_totals(stages, names), (lambda: store_totals(store)) if store is not None else None
    )
