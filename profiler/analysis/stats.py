"""Small numeric helpers shared by the analyses: quantiles and interval arithmetic.

Pure functions on plain floats, so analyses stay testable without numpy arrays or a store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import overload

from profiler.analysis.meta import JSON

Interval = tuple[float, float]


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method); NaN for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping intervals; empty and inverted ones are dropped."""
    out: list[Interval] = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def total(intervals: Iterable[Interval]) -> float:
    return math.fsum(b - a for a, b in intervals)


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def subtract(intervals: Sequence[Interval], holes: Sequence[Interval]) -> list[Interval]:
    """``intervals`` minus ``holes``; both must be unions (sorted, disjoint)."""
    out: list[Interval] = []
    j = 0
    for a, b in intervals:
        cur = a
        while j < len(holes) and holes[j][1] <= cur:
            j += 1
        k = j
        while k < len(holes) and holes[k][0] < b:
            ha, hb = holes[k]
            if ha > cur:
                out.append((cur, ha))
            cur = max(cur, hb)
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


@overload
def json_safe(x: dict[str, object]) -> JSON: ...
@overload
def json_safe(x: object) -> object: ...
def json_safe(x: object) -> object:
    """``x`` with NaN/inf floats as None, recursively: JSON has no NaN."""
    if isinstance(x, float):
        return finite_or_none(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
