"""The sweep's and the tuner's defaults that the command line shows in its help: here, importing nothing, so that
building the parser (every ``stallscope`` command) does not import the sweep's analysis and, through it, the run
analysis (0.18 s of each ``stallscope report`` on 2026-11-28: benchmarks/soak.py)."""

DEFAULT_STEPS = 30  # cap on measured steps per configuration when neither --steps nor --seconds is given
SECONDS_ONLY_STEPS = 1_000_000  # the steps cap when only --seconds bounds a configuration
MAX_BATCH_FACTOR = 8  # tune's default --max-batch-size: 8x the scenario's batch
# tune's default --max-workers: a hard cap on the climb past the cores (each worker is a process holding a
# copy of the dataset object and prefetch_factor batches); the ceiling from the workers' CPU use and the
# throughput rule stop it long before this on most loaders
WORKER_CAP = 64
