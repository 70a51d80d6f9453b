"""The GPU's own view of a run: kernels, copies and sets from a torch.profiler (kineto) trace, and why each
stream idled (``analysis``: pure; ``read``: the trace file; ``render``: the text ``stallscope kernels`` prints)."""
