"""The sinks of ``Session(out_dir, ...)``: the run's Recording (store, sampler, py-spy) and, for
``prometheus=``, the exporter; installed as Session's sink factory by ``profiler/core/__init__.py``."""

from __future__ import annotations

from profiler.core.hooks import SinkOptions, Sinks
from profiler.core.recording import Recording


def default_sinks(options: SinkOptions) -> Sinks:
    """The Recording of ``options.out_dir``, and the Prometheus exporter when ``options.prometheus`` is set
    (ValueError for a bad endpoint: checked here, where the Session is made; bound when it starts)."""
    recording = Recording(
        options.out_dir,
        meta=dict(options.meta),
        sample_hz=options.sample_hz,
        sources=options.sources,
        clock=options.clock,
        store_errors=options.store_errors,
    )
    if options.prometheus is None:
        return Sinks(recording)
    from profiler.export.prometheus import SessionExporter

    exporter = SessionExporter(options.prometheus)
    return Sinks(recording, [exporter], exporter)
