"""Metric sources: one module per source behind :class:`profiler.core.sources.base.Source`."""

from __future__ import annotations

from profiler.core.sources.base import Source, SourceLost

__all__ = ["Source", "SourceLost"]
