"""stallscope: is the accelerator waiting for data, and what would fix it?

Public surface: :class:`Session` (instrument a training loop) and :class:`Summary` (its result).
Everything else is internal and may change.

Both are imported when first asked for (PEP 562), so that a process that needs only the recording core (the
sampler process, ``python -m profiler.core.sampler_process``, started beside every run) does not import the analysis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from profiler.runs import sinks

sinks.install()  # what the recording core needs from the layers above it (Session's sinks, sim: devices)

if TYPE_CHECKING:
    from profiler.analysis import Summary
    from profiler.core.session import Session

__all__ = ["Session", "Summary"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from profiler.core.session import Session

        return Session
    if name == "Summary":
        from profiler.analysis import Summary

        return Summary
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
