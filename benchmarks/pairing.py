"""Paired runs for overhead ratios: each pair runs both sides back to back, alternating which goes first so
that drift on a shared machine cancels; the caller reports the median of the ratios."""

from __future__ import annotations

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
