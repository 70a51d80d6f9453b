"""Paired runs for overhead ratios: each pair runs both sides back to back, alternating which goes first so
that drift on a shared machine cancels; the caller reports the median of the ratios."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def paired_ratios(
    measure: Callable[[bool, int], float], pairs: int, show: Callable[[int, float, float], None]
) -> list[float]:
    """``measure(with_it, pair)`` -> a throughput; returns with / without per pair, after ``show(pair, without,
    with)`` for each."""
    ratios = []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {side: measure(side, i) for side in order}
        ratios.append(got[True] / got[False])
        show(i, got[False], got[True])
    return ratios


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range of a benchmark's values (rounds' ratios, windows' means)."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values), "max": max(values)}
