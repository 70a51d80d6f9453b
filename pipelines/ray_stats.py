"""Ray Data's own figures for a ``ray`` pipeline run, as plain data for the run's meta (``loader.ray_stats``).

Two sources, both Ray's: the dataset's stats summary (per operator: remote wall and CPU time, rows out, tasks, and
the streaming executor's backpressure on it) and the iteration's ``DatasetStats`` timers (the time the user's
thread was blocked in ``iter_batches``, the wait for the first batch, the time spent in the user's code between
batches). The summary's own copy of the iteration
timers stays at zero in Ray 2.60 when iterating through a ``DataIterator``, so the pipeline keeps the stats object
the iteration itself updates (``capture_iteration``). Reading never raises: a figure Ray does not give is absent.
"""

from __future__ import annotations

from typing import Any

SOURCE = "Ray Data's own stats (Dataset.get_stats_summary() and the iteration's timers), not stallscope's clock"


def capture_iteration(iterator: Any, sink: list[Any]) -> None:
    """Make ``iterator`` (a ``DataIterator``) append the ``DatasetStats`` its next iteration updates to ``sink``."""
    original = getattr(iterator, "_to_ref_bundle_iterator", None)
    if original is None:
        return

    def capturing() -> Any:
        result = original()
        if isinstance(result, tuple) and len(result) >= 2 and result[1] is not None:
            sink.append(result[1])
        return result

    iterator._to_ref_bundle_iterator = capturing


def _timer(stats: Any, name: str) -> float | None:
    timer = getattr(stats, name, None)
    get = getattr(timer, "get", None)
    return round(float(get()), 6) if callable(get) else None


def _total(summary: Any, name: str) -> float | None:
    stat = getattr(summary, name, None)
    total = getattr(stat, "sum", None)
    return None if total is None else round(float(total), 6)


def _backpressure(metrics: Any, name: str) -> float | None:
    value = metrics.get(name) if isinstance(metrics, dict) else None
    return round(float(value), 6) if isinstance(value, (int, float)) else None


def operators(summary: Any) -> list[dict[str, Any]]:
    """Per operator of the dataset's own summary (the map stage; its input, in the summary's parents, is left out:
    it counts the whole epoch's index rows at once): Ray's remote wall and CPU seconds (summed over tasks), rows
    out, tasks, and the executor's backpressure (wall seconds it could launch no task of the operator; seconds it
    read none of its outputs)."""
    metrics = getattr(summary, "extra_metrics", None)
    out = []
    for op in getattr(summary, "operators_stats", None) or []:
        wall = getattr(op, "wall_time", None)
        out.append(
            {
                "operator": str(getattr(op, "operator_name", "?")),
                "wall_s": _total(op, "wall_time"),
                "cpu_s": _total(op, "cpu_time"),
                "rows": _total(op, "output_num_rows"),
                "tasks": int(getattr(wall, "count", 0) or 0),
                "backpressure_s": _backpressure(metrics, "task_submission_backpressure_time"),
                "output_backpressure_s": _backpressure(metrics, "task_output_backpressure_time"),
            }
        )
    return out


def read_stats(summary: Any, iteration: Any) -> dict[str, Any]:
    """Ray's figures for one epoch: ``summary`` a ``DatasetStatsSummary`` (or None), ``iteration`` the
    ``DatasetStats`` the iteration updated (or None)."""
    out: dict[str, Any] = {"source": SOURCE, "operators": operators(summary) if summary is not None else []}
    if iteration is not None:
        out.update(
            user_thread_blocked_s=_timer(iteration, "iter_total_blocked_s"),
            first_batch_s=_timer(iteration, "iter_time_to_first_batch_s"),
            user_code_s=_timer(iteration, "iter_user_s"),
            total_s=_timer(iteration, "iter_total_s"),
            blocked_on_production_s=_timer(iteration, "iter_blocked_production_wait_s"),
            batches=int(getattr(iteration, "iter_batches_total", 0) or 0),
        )
    return out
