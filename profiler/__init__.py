"""stallscope: is the accelerator waiting for data, and what would fix it?

Public surface: :class:`Session` (instrument a training loop) and :class:`Summary` (its result).
Everything else is internal and may change.
"""

from __future__ import annotations

from profiler.analysis import Summary
from profiler.core.session import Session

__all__ = ["Session", "Summary"]
