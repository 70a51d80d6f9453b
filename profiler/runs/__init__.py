"""A run's record above the recording core: the sinks a Session records through and the wiring that installs them
(sinks), the Summary built at close (summarize), and what ``report``, ``compare`` and ``watch`` take from a run
directory (read, cache; docs/store.md)."""
