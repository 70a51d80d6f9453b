"""The recorder a Session keeps its run with when no sampler process runs: :class:`ThreadRecorder`
(``in_thread``), the run store and its watchers in threads of this process, from start to close.

The other recorder, :class:`ProcessRecorder`, is the sampler process's client (``profiler.core.sampler_process``).
Both implement :class:`profiler.core.hooks.Recorder`.

May import: ``profiler.core.hooks``, ``profiler.core.rows``, ``profiler.core.sampling``, ``profiler.core.sources``,
``profiler.core.store``. Called by ``profiler.runs.sinks`` (a Session with ``sampling="thread"``), the zero-code
profiler and the job launcher, and by the sampler process's client (its default sources, its take-over).
"""
