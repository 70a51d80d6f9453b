"""Kernel windows recorded during a run: a few steps now and then whose device activity is recorded.

Not ``profiler/kernels/``, which reads a torch.profiler trace file after the fact (``stallscope kernels``).

- ``windows``: :class:`KernelWindows`, where a window opens and closes at a step boundary the Session's tick stops
  at (CUPTI through torch.profiler, or the simulated device's), on a thread of its own (:class:`WindowThread`),
  its activities put as step events (``GPU``, ``GWIN``);
- ``trace_file``: a window handed over as kineto's trace file, read by the sampler process (:func:`fill`).

May import: ``profiler.core.rows`` and ``profiler.core.steps.events`` (the event codes it puts). Called by
``profiler.core.steps.clock`` and ``profiler.core.session`` (the windows' plan), the sampler process's drain
(``trace_file.fill``) and the zero-code reader (``profiler.zerocode.instrument``).
"""
