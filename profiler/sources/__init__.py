"""Metric sources: one module per source behind :class:`profiler.sources.base.Source`."""

from __future__ import annotations

from profiler.sources.base import Source, SourceLost

__all__ = ["Source", "SourceLost"]
