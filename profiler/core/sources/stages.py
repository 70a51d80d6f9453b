"""The loader's stage times: seconds and items per stage (fetch, decode, augment, collate) summed over the loader
processes, as the built-in data sets time them (:mod:`pipelines.stages`). The source reads the totals through a
callable, so that the recording core does not import the pipelines.

Metrics: ``stage.<name>.s`` and ``stage.<name>.n``, cumulative since the loader started (a difference over a
window is that window's time and items); with an emulated store (:mod:`pipelines.store`), ``store.wait_s``,
``store.bytes`` and ``store.reads`` the same way. docs/metrics.md, "Loader stages", defines the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class StageSource:
    name = "stages"

    def __init__(
        self,
        totals: Callable[[], Mapping[str, tuple[float, float]]],
        store: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._totals = totals
        self._store = store

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
