"""Experiment trackers (TensorBoard, MLflow, Weights & Biases): a run's figures under ``stall/``, after the run
(``report --to``: :mod:`profiler.trackers.export`) and while it runs (``Session(log_to=)``, ``run --log-to``:
:mod:`profiler.trackers.live`). The records are computed once, in :mod:`profiler.trackers.analysis`; each tracker
is one adapter behind :class:`profiler.trackers.base.Tracker`; calls that may block run off the training thread
(:mod:`profiler.trackers.deliver`). docs/integrations.md, "Experiment trackers"."""
