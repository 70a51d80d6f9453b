"""One step's timing in the training process: where a data wait, a phase and a step's boundaries are timed.

- ``clock``: :class:`StepClock`, a Session's hot path: ``wrap``'s ``next()`` timed (the data wait), the phase
  stack, a step event put at each boundary, the hand-over every 64 steps or 0.1 s (a tick);
- ``events``: the step events the hot path puts, and the :class:`Assembler` that makes rows of them (in the
  sampler process for the store; here only where rows are asked for);
- ``boundaries``: :class:`StepEdges`, what a boundary reads besides the clock (the run-queue wait, device marks);
- ``device_timers``: which device a run uses and its timer (CUDA events, the host clock); ``device_marks``: the
  steps' device marks in flight until the device has passed them;
- ``local_rows``: :class:`RowsHere`, rows made in the training process only for a hook that takes rows and for
  ``Session.recent``; ``batch_facts``: a batch's item count, a DataLoader's knobs.

May import: ``profiler.core.rows``, ``profiler.core.hooks``, ``profiler.core.sources``, and of the sibling packages
only ``kernel_windows.windows`` (a window opens at a tick) and ``sampling.worker_memory_asks``. Called by
``profiler.core.session`` (its hot path), the sampler process's drain (``events.Assembler``) and, for
``device_timers``, the drivers and the layers above.
"""
