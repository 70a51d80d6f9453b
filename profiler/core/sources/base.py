"""The contract every metric source meets, and the one choke point the sampler calls through.

Invariants:
- ``open()`` probes the hardware once; it returns ``None`` when the source works, or a one-line reason
  when it does not (no driver, no NVML, no permission). An unavailable source is never read.
- ``read()`` returns ``{metric: value}``; values are floats, NaN where a single metric could not be read.
  ``read()`` may raise: the sampler catches, counts and records the reason, and the training loop never
  sees it. A source that decides it is gone for good (GPU lost) raises :class:`SourceLost`.
- Metric names are ``<scope>.<quantity>[_<unit>]`` (``gpu0.util_pct``, ``proc.main.cpu_pct``) so a
  metric is self-describing in the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable


class SourceLost(Exception):
    """Raised by ``read()`` when the source can never be read again (device lost, driver unloaded)."""


class SourceEnded(SourceLost):
    """Raised by ``read()`` when what the source follows has ended (the process it reads exited): its subject's end,
    not a fault. The sampler retires it as ``ended: <why>``, without a warning: a script that finishes is not a loss
    (issue #57: three "source host lost ... sampling goes on without it" lines at a normal end)."""


@runtime_checkable
class Source(Protocol):
    """A metric source sampled by :class:`profiler.core.sampling.sampler.Sampler`."""

    name: str

    def open(self) -> str | None:
        """Probe once. ``None`` when usable, else the reason it is unavailable."""

    def read(self) -> dict[str, float]:
        """One reading of every metric this source offers."""

    def close(self) -> None:
        """Release handles. Idempotent."""


@runtime_checkable
class Rescans(Protocol):
    """A source that rescans a process tree on a schedule of its own (once a second) and can be told that the
    tree has just changed (a loader started its workers), so that it finds the new processes at its next read."""

    def rescan_soon(self) -> None:
        """Rescan at the next read. Called from any thread: it only sets a flag."""


@runtime_checkable
class Paced(Protocol):
    """A source that reads some of its figures rarely, on a schedule of its own (smaps: seconds apart), and can be
    told to read them all at its next read: the last round before the sampler stops, so that a short run still has
    them."""

    def read_all_next(self) -> None:
        """Read every figure at the next read. Called from any thread: it only sets a flag."""


class MemoryInfo(Protocol):
    @property
    def rss(self) -> int: ...


class ProcessHandle(Protocol):
    """What the process sources call on a ``psutil.Process`` (psutil has no types; tests stand in fakes)."""

    @property
    def pid(self) -> int: ...

    def oneshot(self) -> AbstractContextManager[object]: ...

    def status(self) -> str: ...

    def cpu_percent(self, interval: float | None) -> float: ...

    def memory_info(self) -> MemoryInfo: ...

    def children(self, recursive: bool) -> Sequence[ProcessHandle]: ...

    def create_time(self) -> float: ...


class Recipe:
    """Something to be made in the sampler process (:mod:`profiler.core.sampler_process`) rather than in the training
    process:
    ``factory`` ("package.module:function") called there with ``kwargs`` (JSON-able). A recipe crosses the process
    boundary as JSON, so what it makes never shares the training process's GIL."""

    __slots__ = ("factory", "kwargs", "pass_fds")
    what = "recipe"  # how an error names it

    def __init__(self, factory: str, *, pass_fds: Sequence[int] = (), **kwargs: object) -> None:
        """``pass_fds``: file descriptors what it makes uses (shared counters' memory files, a bound socket), open
        in the sampler process under the same numbers."""
        if ":" not in factory:
            raise ValueError(f"{self.what} {factory!r}: allowed 'package.module:function'")
        self.factory = factory
        self.kwargs = kwargs
        self.pass_fds = tuple(pass_fds)

    def to_json(self) -> dict[str, object]:
        return {"factory": self.factory, "kwargs": self.kwargs}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.factory!r}, **{self.kwargs!r})"


class SourceRecipe(Recipe):
    """Sources to be made in the sampler process: ``factory(**kwargs)`` returns a list of sources."""

    __slots__ = ()
    what = "source recipe"

    def build(self) -> list[Source]:
        """The sources (in the process that calls it)."""
        import importlib

        module, _, name = self.factory.partition(":")
        made = getattr(importlib.import_module(module), name)(**self.kwargs)
        return list(made) if isinstance(made, (list, tuple)) else [made]


def split_recipes(sources: Sequence[Source | SourceRecipe]) -> tuple[list[SourceRecipe], list[Source]]:
    """A run's ``sources=`` parted: (the recipes, to be made where the sampling runs; the source objects)."""
    return [s for s in sources if isinstance(s, SourceRecipe)], [s for s in sources if not isinstance(s, SourceRecipe)]


def made_here(sources: Sequence[Source | SourceRecipe] | None) -> list[Source] | None:
    """A run's ``sources=`` all made in this process (its sampling runs here: the recipes built); None stays None
    (the defaults)."""
    if sources is None:
        return None
    recipes, objects = split_recipes(sources)
    return [*objects, *(made for r in recipes for made in r.build())]
