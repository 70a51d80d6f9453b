"""The rows a run is made of: a step, a phase, and a whole run's record as the analysis reads it.

Shared by the producers (Session), the run store that keeps them and the pure analysis that reads them back;
it imports nothing of the project.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


# StepRow and PhaseRow are the two row types a long run has hundreds of thousands of, built on every load and
# at every close: slotted but not frozen (a frozen dataclass's __init__ sets each field through
# object.__setattr__, 3x slower: 200,000 phases in 0.39 s instead of 0.12 s), hashable as if frozen. Treat them
# as immutable: nothing assigns to a row's fields.
@dataclass(slots=True, unsafe_hash=True)
class StepRow:
    step: int
    t_start: float
    t_end: float
    data_wait_s: float
    samples: int | None
    warmup: bool
    data_wait_runq_s: float | None = None  # schema v2; None: not measured, or a v1 store
    runq_s: float | None = None


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see StepRow
class PhaseRow:
    step: int
    name: str
    depth: int
    t_start: float
    t_end: float
    dev_start: float | None = None
    dev_end: float | None = None
    runq_s: float | None = None  # schema v2; None: not measured, or a v1 store


# meta: the first step run after the measured ones for a tail kernel window
# (profiler.core.kernel_windows.windows.tail_plan); from it on every step is held apart from the run's figures
# (profiler.analysis.apart)
TAIL_KEY = "kernel_window_tail_from"


@dataclass(frozen=True, slots=True)
class KernelWindow:
    """One kernel window: its span and cost (s) and its activities ``(stream, kind, start, end, launch)``, run
    seconds (launch NaN: not known). ``recorded_end``: where the steps it recorded ended, when its stop ran on
    after them (profiler.core.kernel_windows.windows.WindowThread; NaN: at ``t_end``, schema v4)."""

    window: int
    t_start: float
    t_end: float
    cost_s: float
    activities: list[tuple[int, int, float, float, float]]
    recorded_end: float = math.nan

    @property
    def t_recorded(self) -> float:
        """The end of the steps whose device activity the window recorded."""
        return self.t_end if math.isnan(self.recorded_end) else min(self.t_end, self.recorded_end)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """Everything a run store holds, loaded into memory for the (pure) analysis."""

    meta: dict[str, Any]
    steps: list[StepRow]
    phases: list[PhaseRow]
    samples: list[tuple[float, str, str, float | None]]
    events: list[tuple[float, str, str | None, str]]
    stacks_text: str | None = None  # py-spy's collapsed stacks (RUN_DIR/pyspy.txt), when recorded
    # schema v3: the kernel windows (profiler.core.kernel_windows.windows), in order
    windows: tuple[KernelWindow, ...] = ()


def held_steps(spans: Iterable[tuple[float, float]], steps: Sequence[StepRow], tail_from: object = None) -> set[int]:
    """The indices of the steps that overlap a kernel window's span (from its opening's start to its closing's end,
    the steps' seconds), and those from ``tail_from`` on (profiler.analysis.apart)."""
    held = {s.step for s in steps if s.step >= tail_from} if isinstance(tail_from, int) else set()
    spans = list(spans)
    if not spans:  # no window: no sort of a long run's steps (each summary asks three times)
        return held
    ordered = sorted(steps, key=lambda s: s.t_start)
    starts = [s.t_start for s in ordered]
    for a, b in spans:
        i = max(0, bisect.bisect_left(starts, a) - 1)  # the step the window opened in, or the first after
        while i < len(ordered) and ordered[i].t_start < b:
            if ordered[i].t_end > a:
                held.add(ordered[i].step)
            i += 1
    return held
