"""The knobs of DALI's and torchdata's loaders as built, for the start-up module (stallscope_instrument.py beside
it, which loads this file when it patches them). Reads attributes only, each with a default: nothing here can
raise into the script."""

from __future__ import annotations

from typing import Any


def dali_knobs(iterator: Any) -> dict[str, object]:
    """A DALI iterator's knobs, from its (first) pipeline: batch size, CPU threads, device, queue depth."""
    pipes = getattr(iterator, "_pipes", None) or [None]
    pipe = pipes[0]
    out = {
        "batch_size": getattr(pipe, "max_batch_size", None),
        "num_threads": getattr(pipe, "num_threads", None),
        "device_id": getattr(pipe, "device_id", None),
        "prefetch_queue_depth": getattr(pipe, "prefetch_queue_depth", None),
        "pipelines": len(pipes),
        "reader_name": getattr(iterator, "_reader_name", None),
    }
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else repr(v) for k, v in out.items()}


def node_knobs(loader: Any) -> dict[str, object]:
    """A torchdata.nodes Loader's knobs, from its graph (root first, following each node's ``source``): the
    batch size, the widest mapper's workers and method, the prefetch depth, pinning, the nodes' names in order."""
    out: dict[str, Any] = {"batch_size": None, "num_workers": None, "prefetch_factor": None, "pin_memory": False}
    names = []
    node = getattr(loader, "root", None)
    for _ in range(64):  # a graph is a chain here; a cycle (never built by torchdata) must not hang the script
        if node is None:
            break
        kind = type(node).__name__
        names.append(kind)
        for key in ("batch_size", "prefetch_factor"):
            value = getattr(node, key, None)
            if out[key] is None and isinstance(value, int):
                out[key] = value
        workers = getattr(node, "num_workers", None)
        if isinstance(workers, int) and workers >= (out["num_workers"] or 0):  # the widest mapper's
            out["num_workers"], out["method"] = workers, getattr(node, "method", None)
        out["pin_memory"] = out["pin_memory"] or kind == "PinMemory"
        node = getattr(node, "source", None)
    out["nodes"] = " <- ".join(names)
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else repr(v) for k, v in out.items()}
