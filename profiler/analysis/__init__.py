"""Analyses: pure functions from a stored run to figures, verdicts and recommendations.

Nothing here imports rendering code or reads a clock; ``summarize(load_run(dir))`` is the whole report.
"""

from __future__ import annotations

from profiler.analysis.summary import Summary, summarize
from profiler.analysis.verdict import Recommendation, recommend, verdict_for

__all__ = ["Recommendation", "Summary", "recommend", "summarize", "verdict_for"]
