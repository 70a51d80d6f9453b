"""stallscope: is the accelerator waiting for data, and what would fix it?

Public surface: :class:`Session` (instrument a training loop) and :class:`Summary` (its result).
Everything else is internal and may change.

Both are imported when first asked for (PEP 562), so that a process that needs only the recording core (the
sampler process, ``python -m profiler.core.sampler_process``, started beside every run) does not import the analysis.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from profiler.core import hooks
from profiler.core.steps import device_timers as devices


def _wiring() -> ModuleType:
    """profiler.runs.sinks, imported when a Session or a ``sim:`` device first needs it: a ``report`` or a
    ``--help`` imports no recorder."""
    from profiler.runs import sinks

    return sinks


# what the recording core needs from the layers above it (docs/architecture.md, "The core at the bottom")
hooks.install(lambda options: _wiring().default_sinks(options))
devices.SIMULATED[:] = [lambda spec: _wiring().simulated_device(spec)]

if TYPE_CHECKING:
    from profiler.analysis import Summary
    from profiler.runs.session import Session

__all__ = ["Session", "Summary"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from profiler.runs.session import Session

        return Session
    if name == "Summary":
        from profiler.analysis import Summary

        return Summary
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
