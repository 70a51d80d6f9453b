"""The sinks of ``Session(out_dir, ...)``: the run's ThreadRecorder (store, sampler, py-spy) and, for
``prometheus=``, the exporter; installed as Session's sink factory by ``profiler/core/__init__.py``."""

from __future__ import annotations

import time

from profiler.core.hooks import Recorder, SinkOptions, Sinks
from profiler.core.recording import ThreadRecorder
from profiler.core.sampler_process.client import ProcessRecorder
from profiler.core.sources.base import SourceRecipe

SAMPLING = ("process", "thread")


def default_sinks(options: SinkOptions) -> Sinks:
    """The run's recorder, and the Prometheus exporter when ``options.prometheus`` is set (ValueError for a bad
    endpoint: checked here, where the Session is made; bound when it starts).

    The recorder is a sampler process beside the training process (:mod:`profiler.core.sampler_process`), unless
    ``sampling="thread"`` or the Session's clock is not ``time.perf_counter`` (a test's fake clock cannot be read
    from another process): then the ThreadRecorder's threads in this process."""
    if options.sampling not in SAMPLING:
        raise ValueError(f"sampling={options.sampling!r}: allowed {' or '.join(map(repr, SAMPLING))}")
    recording: Recorder
    if options.sampling == "process" and options.clock is time.perf_counter:
        recording = ProcessRecorder(
            options.out_dir,
            meta=dict(options.meta),
            sample_hz=options.sample_hz,
            sources=options.sources,
            store_errors=options.store_errors,
        )
    else:
        recipes = [s for s in options.sources or () if isinstance(s, SourceRecipe)]
        sources = None if options.sources is None else [
            *(s for s in options.sources if not isinstance(s, SourceRecipe)), *(x for r in recipes for x in r.build())
        ]  # fmt: skip
        recording = ThreadRecorder(
            options.out_dir,
            meta=dict(options.meta),
            sample_hz=options.sample_hz,
            sources=sources,
            clock=options.clock,
            store_errors=options.store_errors,
        )
    if options.prometheus is None:
        return Sinks(recording)
    from profiler.export.prometheus import SessionExporter

    exporter = SessionExporter(options.prometheus, recording if isinstance(recording, ProcessRecorder) else None)
    return Sinks(recording, [exporter], exporter)
