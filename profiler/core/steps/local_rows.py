"""RowsHere: a run's step rows made in the training process from its step events, for the hooks that take rows (a
ThreadRecorder, a user's hook) and for ``Session.recent`` (a live view, a sweep's early stop).

Invariants: the rows are made when the Session hands its events on (every HANDOFF_STEPS steps or HANDOFF_S), never
on the hot path; where no hook takes rows and nothing asked for ``recent``, none exist (the sampler process makes
the run's rows). A kernel window's activities, once assembled, go to the hooks that take rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from profiler.core.rows import PhaseRow, StepRow
from profiler.core.steps.events import Assembler, ListLog

RECENT = 1024  # resolved steps kept for live views and a sweep's early stop

RowSink = Callable[[StepRow, Sequence[PhaseRow]], None]


class RowsHere:
    """The step events kept in this process (``log``) and the rows made of them."""

    __slots__ = ("_asm", "_on_window", "_sinks", "log", "recent")

    def __init__(
        self,
        names: dict[int, str],
        start: tuple[float, int, int],
        sinks: Sequence[RowSink],
        hooks: Iterable[object],
        recent: deque[tuple[StepRow, list[PhaseRow]]],
    ) -> None:
        """``names``: the phase names' ids so far; ``start``: the run's zero, its warm-up steps and the first step
        kept here; ``sinks``: the hooks' ``on_step``; ``hooks``: those whose ``on_window`` takes a window's rows;
        ``recent``: the Session's deque of the newest steps."""
        t0, warmup, first_step = start
        self.log = ListLog(dict(names))
        self._asm = Assembler(t0, warmup, self.log.names, first_step=first_step)
        self._sinks = tuple(sinks)
        self._on_window = tuple(
            w for hook in hooks if callable(w := getattr(hook, "on_window", None)) and getattr(hook, "wants_rows", True)
        )
        self.recent = recent

    def deliver(self, final: bool = False) -> None:
        """The rows of the events put since the last call, to the hooks that take rows and to :attr:`recent`
        (``final``: the run ended, a step still open is finished)."""
        asm = self._asm
        asm.feed(self.log.take())
        if final:
            asm.finish()
        sinks, recent = self._sinks, self.recent
        for row, phases in asm.take():
            for on_step in sinks:
                on_step(row, phases)
            recent.append((row, phases))
        for window in asm.take_windows():
            for on_window in self._on_window:
                on_window(window)
