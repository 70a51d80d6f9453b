"""The recording core: Session and its hooks, the ThreadRecorder (store + sampler + close), metric sources, the
sampler, devices and the run store. Everything a run's figures are measured by lives here.

This package's one piece of wiring: Session imports no sink, so the sinks of ``Session(out_dir, ...)`` (the
ThreadRecorder, and the Prometheus exporter when asked) are installed here, before any Session can be made.
"""

from __future__ import annotations

from profiler.core import hooks, sinks

hooks.install(sinks.default_sinks)
