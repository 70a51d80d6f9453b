"""The Session the package exports (``from profiler import Session``): the core's, with its results typed as the
Summary the analysis builds.

The core knows a run's Summary only as :class:`profiler.core.hooks.RunSummary` (it imports nothing above it, not
even for typing); the summarizer that ``profiler.runs.sinks`` gives every recorder returns the analysis' Summary,
so here the type is narrowed and nothing else changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from profiler.core import session

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.hooks import RunSummary


class Session(session.Session):
    __slots__ = ()

    def close(self, status: str = "complete", error: str | None = None) -> Summary | None:
        return cast("Summary | None", super().close(status, error))

    def summary(self) -> Summary | None:
        return cast("Summary | None", super().summary())


def full_summary(summary: RunSummary | None) -> Summary | None:
    """A recorder's Summary (``ThreadRecorder.close()``) with its full type: the summarizer
    ``profiler.runs.sinks`` gives every recorder builds the analysis' Summary."""
    return cast("Summary | None", summary)
