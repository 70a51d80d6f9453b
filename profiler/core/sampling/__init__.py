"""What samples a run besides its steps: the sampler of the metric sources, py-spy, and the readings the
training process takes of itself at its own times.

- ``sampler``: :class:`Sampler`, every source on absolute deadlines, one thread per source, never dies of one;
- ``sampler_and_pyspy``: :class:`Watchers`, the sampler and py-spy writing into a run's store (built by the
  sampler process and by the in-thread recorder);
- ``pyspy``: py-spy beside the training process (attach, record to a file, stop);
- ``on_training_thread``: :class:`TickReads`, the sources only the training process can read of itself (the pin
  source), read on its training thread at the Session's hand-overs;
- ``worker_memory_asks``: when the training process asks for its loader workers' memory (a short run's growth).

May import: ``profiler.core.sources`` and ``profiler.core.store``. Called by the recorders
(``profiler.core.recorders``, ``profiler.core.sampler_process``) and ``profiler.core.steps.clock``.
"""
