"""The recording core: everything a run's figures are measured by. It imports nothing above it, not even for
typing: what it needs from above (Session's sinks, the Summary's builder, ``sim:`` devices) is installed by
:mod:`profiler.runs.sinks` when ``profiler`` is imported, and the Summary is known here only as
:class:`profiler.core.hooks.RunSummary`.

Where things happen:

- ``steps/``: one step's timing in the training process (where a data wait is timed: ``steps/clock.py``);
- ``kernel_windows/``: where a kernel window opens and closes, and its trace handed over;
- ``sampling/``: the sampler of the metric sources, py-spy, the readings the training process takes of itself;
- ``sources/``: one module per metric source; ``store/``: run.sqlite (where a row is written: ``store/writer.py``);
- ``sampler_process/``: the process beside the training process, the ring between them, its recorder (client);
- ``recorders/``: the recorder in threads of this process (``sampling="thread"``, zero-code, jobs).

Top-level modules, and why they are not in a package:

- ``session.py``: Session, the entry point (``from profiler import Session``) that drives all the packages;
- ``hooks.py``: the contract between Session and every sink (SessionHook, Recorder, RunSummary), which the
  packages implement;
- ``rows.py``: the record types (StepRow, PhaseRow, RunRecord) shared by producers, store and analysis; it
  imports nothing of the project.
- ``background.py``: in_background, a thread beside a block, stopped and joined (bounded) at its end: the
  layers above follow a feed with it (the live trackers, the Prometheus exporter); it imports nothing and no
  package here owns it.
"""
