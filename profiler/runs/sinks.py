"""Session's sinks, and what else the recording core needs from the layers above it: ``profiler/__init__.py``
installs them (imported from here when first used), before any Session can be made. The recording core
(:mod:`profiler.core`) imports nothing above it, so what it needs from above is put in here:

- the sinks of ``Session(out_dir, ...)`` (:func:`default_sinks`): its recorder (the sampler process's
  :class:`~profiler.core.sampler_process.client.ProcessRecorder`, or a
  :class:`~profiler.core.recorders.in_thread.ThreadRecorder`), with :func:`profiler.runs.summarize.summarize_run` to
  build its Summary at close, and the Prometheus exporter (:mod:`profiler.export.prometheus`) when asked;
- ``sim:`` device strings, read by the simulator (:mod:`profiler.sim.specs`), imported only when one is asked for;
- what the sampler process does after closing the store of a training process that is gone (killed): the report
  cache (:func:`profiler.runs.read.cache_orphaned`, named in the recorder's ``on_orphaned`` recipe).
"""

from __future__ import annotations

import time

from profiler.core.hooks import Recorder, SessionHook, SinkOptions, Sinks
from profiler.core.recorders.in_thread import ThreadRecorder
from profiler.core.sampler_process.client import ProcessRecorder
from profiler.core.sources.base import Recipe, made_here
from profiler.runs.summarize import summarize_run


def simulated_device(spec: str) -> tuple[object, str]:
    """A ``sim:`` string -> (its SimConfig, the device's full name); the simulator's SimSpecError (a ValueError)."""
    from profiler.sim.specs import parse

    config = parse(spec)
    return config, config.spec.full_name


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
            summarize=summarize_run,
            # a killed run's report cache, built by its sampler process as it closes the store (docs/store.md)
            on_orphaned=Recipe("profiler.runs.read:cache_orphaned"),
        )
    else:
        recording = ThreadRecorder(
            options.out_dir,
            meta=dict(options.meta),
            sample_hz=options.sample_hz,
            sources=made_here(options.sources),
            clock=options.clock,
            store_errors=options.store_errors,
            summarize=summarize_run,
        )
    hooks: list[SessionHook] = []
    if options.log_to is not None:  # experiment trackers (profiler.trackers.live); a bad target: ValueError here
        from profiler.trackers.live import TrackerHook

        hooks.append(TrackerHook(options.log_to, options.out_dir, every_s=options.log_every_s, host=recording))
    if options.prometheus is None:
        return Sinks(recording, hooks)
    from profiler.export.prometheus import SessionExporter

    exporter = SessionExporter(options.prometheus, recording)
    return Sinks(recording, [exporter, *hooks], exporter)
