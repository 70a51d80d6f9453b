"""Views of a run served from the sampler process: the live view and the Prometheus endpoint read the rows as the
sampler process drains them, so that no thread of theirs runs in the training process (docs/architecture.md,
"Two processes").

A view crosses the process boundary as a :class:`ViewRecipe` (a factory named "package.module:function" and
JSON-able arguments, like a source's recipe); the sampler process calls ``factory(feed, **kwargs)`` with its
:class:`SamplerFeed` and holds the context manager it returns open until the run's close item comes.

Invariants:
- The feed only moves rows (the live-feed contract of ``profiler.live.feeds``): it computes nothing, never blocks
  the drain, and hands the newest ``RECENT`` steps and the sampler's buffered readings to whoever polls.
- A view that fails to open or to close costs one warning; the run is recorded all the same.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from profiler.core.rows import KernelWindow, PhaseRow, StepRow
from profiler.core.sources.base import Recipe

log = logging.getLogger("stallscope")

RECENT = 1024  # the newest steps a poll hands over (as the training process's own buffer of them holds)

Samples = list[tuple[float, dict[str, float]]]


class ViewRecipe(Recipe):
    """A view to be opened in the sampler process: ``factory(feed, **kwargs)``, a context manager (``pass_fds``: a
    bound listening socket, for one)."""

    __slots__ = ()
    what = "view recipe"


@runtime_checkable
class SamplerViews(Protocol):
    """What a caller hands the runner to show a run: views for the sampler process (:meth:`recipes`), and the
    same views in this process over a feed (calling it), where no sampler process runs them."""

    def recipes(self) -> list[ViewRecipe]: ...

    def __call__(self, feed: Any) -> AbstractContextManager[object]: ...


class SamplerFeed:
    """The sampler process's live feed: the steps as drained, the meta as announced, the sampler's readings."""

    def __init__(self, meta: Mapping[str, object], samples: Callable[[], Samples]) -> None:
        self._meta = dict(meta)
        self._samples = samples
        self.recent: deque[tuple[StepRow, Sequence[PhaseRow]]] = deque(maxlen=RECENT)
        self._windows: deque[KernelWindow] = deque(maxlen=1)  # the newest kernel window
        self._status = "running"

    def add_step(self, row: StepRow, phases: Sequence[PhaseRow]) -> None:
        self.recent.append((row, phases))

    def add_window(self, window: KernelWindow) -> None:
        self._windows.append(window)

    def windows(self) -> list[KernelWindow]:
        """The newest kernel window (none yet: empty)."""
        return list(self._windows)

    def add_meta(self, items: Mapping[str, object]) -> None:
        self._meta.update(items)

    def set_status(self, status: str) -> None:
        self._status = status

    def poll(self) -> tuple[list[tuple[StepRow, Sequence[PhaseRow]]], Samples]:
        return list(self.recent), self._samples()

    def status(self) -> str:
        return self._status

    def meta(self) -> Mapping[str, object]:
        return self._meta


def open_views(recipes: Sequence[Mapping[str, Any]], feed: SamplerFeed) -> contextlib.ExitStack:
    """Each recipe's view opened over ``feed`` (one that fails is said and left out); closing the stack closes
    them, latest first."""
    stack = contextlib.ExitStack()
    for r in recipes:
        factory = str(r["factory"])
        try:
            module, _, name = factory.partition(":")
            view = getattr(importlib.import_module(module), name)(feed, **r["kwargs"])
            stack.enter_context(view)
        except Exception as exc:  # noqa: BLE001 - a view is not the run: said, and the run goes on
            log.warning("stallscope: the view %s could not start: %s: %s", factory, type(exc).__name__, exc)
    return stack


def close_views(stack: contextlib.ExitStack) -> None:
    try:
        stack.close()
    except Exception as exc:  # noqa: BLE001 - the run's close goes on
        log.warning("stallscope: a view failed as it closed: %s: %s", type(exc).__name__, exc)
