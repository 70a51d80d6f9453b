"""The steps a kernel window held, recorded apart: the profiler's own pause is never the program's time.

Pure. A kernel window (:mod:`profiler.core.kernel_windows.windows`) costs the training thread its opening and closing
(CUPTI's start, the profiler's stop and the read of its activities: 0.4-1.6 s on an H200), and the steps inside it run
slower (launches traced). So every step that overlaps a window's span is **held**: left out of the run's
throughput, step time, phases, stall, verdict and advice, and shown apart (:class:`WindowsApart`). The span runs
from the moment its opening began (at a step's batch arrival: that step holds the start's cost) to the moment its
closing ended (at another step's batch arrival, or at the run's close, after its last step); a step overlaps it
where it starts before the span ends and ends after it begins. Steps from ``meta["kernel_window_tail_from"]`` on
are the tail window's (run after the measured steps, where the run's length is known) and are held whether or not
the window opened.

The loader's start-up is held out the same way, and shown by its loader's view: the run's first
``meta["loader"]["startup_steps"]`` steps (the ray pipeline's, until every Ray CPU had run a task; a Ray CPU's
worker starts when its first task does, on a step after the first batch), whether or not they were warm-up.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from profiler.core.rows import TAIL_KEY, KernelWindow, RunRecord, StepRow, held_steps

# meta.loader's key: the run's first steps that were the loader's start-up (the ray pipeline's, until every Ray CPU
# had run a task: pipelines.ray_data.StartUp), held out of the measured steps as warm-up is
STARTUP_KEY = "startup_steps"


def startup_steps(meta: dict[str, object]) -> int:
    """How many of the run's first steps the loader named its start-up (0: none)."""
    loader = meta.get("loader")
    n = loader.get(STARTUP_KEY) if isinstance(loader, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def measured_steps(rec: RunRecord) -> list[StepRow]:
    """The run's measured steps: neither warm-up, nor the loader's start-up (where a step is left after it: see
    :func:`startup_held`), nor held by a kernel window."""
    held = held_steps(spans(rec.windows), rec.steps, rec.meta.get(TAIL_KEY))
    steps = [s for s in rec.steps if not s.warmup and s.step not in held]
    first = startup_steps(rec.meta)
    after = [s for s in steps if s.step >= first]
    return after or steps


def startup_held(rec: RunRecord) -> bool:
    """Whether the loader's start-up is held out of the measured steps: it is named and a measured step is left
    after it (a start-up that lasted past them all is not: the figures then include it, and the loader's view says
    so)."""
    first = startup_steps(rec.meta)
    if not first:
        return False
    held = held_steps(spans(rec.windows), rec.steps, rec.meta.get(TAIL_KEY))
    return any(not s.warmup and s.step >= first and s.step not in held for s in rec.steps)


def spans(windows: Iterable[KernelWindow]) -> list[tuple[float, float]]:
    return [(w.t_start, w.t_end) for w in windows]


@dataclass(frozen=True, slots=True)
class WindowsApart:
    """The steps the kernel windows held, and what the windows cost the run."""

    windows: int  # windows recorded
    steps: int  # steps held (left out of every other figure)
    wall_s: float  # the held steps' time, plus the windows' opening and closing outside any step
    cost_s: float  # the training thread's time opening and closing the windows (part of wall_s)
    step_ms: float  # median held step (NaN: none)
    other_step_ms: float  # median measured step (NaN: none)
    throughput_samples_per_s: float  # over the held steps (NaN: a batch size not known)

    @property
    def added_s(self) -> float:
        """What the windows added to the run's wall time beyond the measured pace: the held time less as many
        steps at the median measured step (NaN without a measured step)."""
        return self.wall_s - self.steps * self.other_step_ms / 1e3

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "windows": self.windows,
            "steps": self.steps,
            "wall_s": self.wall_s,
            "cost_ms": self.cost_s * 1e3,
            "added_s": num(self.added_s),
            "step_ms": num(self.step_ms),
            "other_step_ms": num(self.other_step_ms),
            "throughput_samples_per_s": num(self.throughput_samples_per_s),
        }


def windows_apart(rec: RunRecord, measured: Sequence[StepRow]) -> WindowsApart | None:
    """The held steps' figures (None: no window was recorded and no step held)."""
    held_ids = held_steps(spans(rec.windows), rec.steps, rec.meta.get(TAIL_KEY))
    held = [s for s in rec.steps if not s.warmup and s.step in held_ids]
    if not rec.windows and not held:
        return None
    step_s = [s.t_end - s.t_start for s in held]
    counted = [s.samples for s in held if s.samples is not None]
    wall = math.fsum(step_s)
    return WindowsApart(
        windows=len(rec.windows),
        steps=len(held),
        wall_s=wall + math.fsum(_after_steps(w, rec.steps) for w in rec.windows),
        cost_s=math.fsum(w.cost_s for w in rec.windows),
        step_ms=statistics.median(step_s) * 1e3 if step_s else math.nan,
        other_step_ms=statistics.median([s.t_end - s.t_start for s in measured]) * 1e3 if measured else math.nan,
        throughput_samples_per_s=sum(counted) / wall if wall > 0 and len(counted) == len(held) else math.nan,
    )


def _after_steps(w: KernelWindow, steps: Sequence[StepRow]) -> float:
    """The part of a window's span after the last step that began in it: a window the run's close closed ends
    after every step (its closing is time the run added outside any step)."""
    last = max((s.t_end for s in steps if s.t_start < w.t_end), default=w.t_start)
    return max(0.0, w.t_end - max(last, w.t_start))
