"""The recording core: Session and its hooks, the recorders (ProcessRecorder: the sampler process; ThreadRecorder:
store + sampler + close in this process), metric sources, the sampler, devices and the run store. Everything a
run's figures are measured by lives here, and it imports nothing above it: what it needs from above (Session's
sinks, the Summary's builder, ``sim:`` devices) is installed by :mod:`profiler.runs.sinks` when ``profiler`` is
imported.
"""
