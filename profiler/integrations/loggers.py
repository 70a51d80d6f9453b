"""The stall/ figures of an integration's run for the framework's own loggers (Lightning's ``trainer.loggers``,
the Hugging Face Trainer's ``report_to`` trackers), at the framework's logging steps.

:class:`StepPoints` tails the run's store (written by its sampler process) at each logging step: the point it
hands covers the steps stored since the last one (a step reaches the store about 0.1-0.2 s after it ends, so
the newest few steps go to the next point), and :func:`run_figures` the run's own figures once it has closed.
The training thread reads the store at logging steps only (tens of rows, under a millisecond), never per step.
"""

from __future__ import annotations

from pathlib import Path

from profiler.analysis.summary import Summary
from profiler.live.feeds import StoreFeed
from profiler.trackers.analysis import PREFIX, LiveFold, summary_figures


class StepPoints:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._feed: StoreFeed | None = None
        self._fold = LiveFold()

    def take(self) -> dict[str, float]:
        """The figures of the steps stored since the last call (empty: none), names ``stall/...``."""
        try:
            if self._feed is None:
                self._feed = StoreFeed(self.run_dir)
            steps, _ = self._feed.poll()
            self._fold.add_windows(self._feed.windows())
            self._fold.add(steps, self._feed.meta())
        except Exception:  # noqa: BLE001 - a store briefly locked or not yet there: its steps go to the next point
            return {}
        return {p.name: p.value for p in self._fold.take()}


def run_figures(summary: Summary | None) -> dict[str, float]:
    """The closed run's own figures (``stall/run/...``; none without a Summary)."""
    return summary_figures(summary) if summary is not None else {}


def with_separator(figures: dict[str, float], separator: str) -> dict[str, float]:
    """Names in a logger's own group separator (Lightning's ``Logger.group_separator``)."""
    if separator == "/":
        return figures
    return {PREFIX.rstrip("/") + separator + k.removeprefix(PREFIX).replace("/", separator): v
            for k, v in figures.items()}  # fmt: skip
