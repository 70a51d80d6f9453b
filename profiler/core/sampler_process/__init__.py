"""The sampler process beside the training process, and what joins them (docs/architecture.md, "Two processes").

- ``ring``: the shared-memory ring the training process packs its steps into;
- ``client``: the training process's recorder hook (:class:`~profiler.core.sampler_process.client.ProcessRecorder`): the
  lock, the store's creation, the ring, the sampler process's start, the watch and the take-over, the close;
- ``process``: the sampler process itself (sources, the store's writer, py-spy);
- ``drain``: the ring's records into the store, on either side.
"""
