"""Two runs side by side: which figures moved, which way, and whether any moved beyond a limit.

Pure: takes two summaries (:class:`Summary` objects, read by field, or ``summary.json`` dicts, where NaN is
null) and returns a :class:`Comparison`; reads no clock and no file. ``stallscope compare`` gates CI on
``regressed``. Both kinds are first read into one private view, so every row is built the same way.

Invariants:
- Each figure's direction is fixed: more throughput and a higher device busy fraction are better; lower
  step times, stall fraction and per-step phase times are better.
- A change is flagged (better or worse) only when it is beyond noise on both counts, else it is "same":
  - beyond the runs' own spread: more than ``NOISE_Z`` combined standard errors, sqrt(se_A^2 + se_B^2), of the
    figure's per-step mean in each run (:mod:`profiler.analysis.spread`; a run without one, an old summary.json,
    is checked on the second count alone);
  - a share of the step that can matter: a time at least ``MATTER_SHARE`` of A's mean step time, a fraction of
    the step at least ``MATTER_SHARE`` (1 pp), throughput and step times at least ``SAME_PCT`` of A's value,
    and any time change at least ``SAME_MS``.
  ``Row.flag_at`` is the least change that would have been flagged (in the row's unit), None where unknown.
- Only two figures can regress, each only when its limit is given: throughput, by the drop in percent of
  A's throughput, and stall fraction, by the rise in percentage points. "Beyond" is strictly greater: a
  drop equal to the limit passes.
- A figure missing, NaN or null in either run is "not comparable" and never regresses; a limit that could
  not be checked for that reason is listed in ``unchecked``, so a gate that passed for want of data says so.
- Limits are numbers >= 0 (ValueError otherwise, one line naming the value and what is allowed).
- Nothing here is NaN: a figure that is not there is None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from profiler.analysis.meta import JSON, Scalar, as_json
from profiler.analysis.parts import device_where
from profiler.analysis.summary import Summary

SAME_PCT = 1.0  # |B - A| under 1% of A reads "same"
MATTER_SHARE = 0.01  # a phase's change under 1% of the step time, or a fraction's under 1 pp, reads "same"
SAME_MS = 0.01  # times: under 10 us reads "same" (the host timer's own cost per phase is a few us)
NOISE_Z = 3.0  # a change within 3 combined standard errors of the two runs' means reads "same"
_EPS = 1e-9  # float noise allowed when a change is compared with its limit

BETTER, WORSE, SAME, CHANGED, NOT_COMPARABLE = "better", "worse", "same", "changed", "not comparable"

# More input-bound is worse; "unknown: ..." verdicts have no rank.
_VERDICT_RANK = {"not input-bound": 0, "moderately input-bound": 1, "highly input-bound": 2}


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the comparison.

    ``unit`` says how to read the numbers: ``"samples/s"``, ``"ms"``, ``"%"`` (a and b are percentages and
    ``delta`` is percentage points), or ``""`` for text (verdict, config facts), where delta is None.
    """

    metric: str
    a: float | str | None
    b: float | str | None
    delta: float | None
    delta_pct: float | None
    change: str  # better | worse | same | changed (text that differs) | not comparable
    unit: str = ""
    kind: str = "figure"  # figure | verdict | config
    flag_at: float | None = None  # the least |B - A| flagged better or worse (the row's unit); None: unknown


@dataclass(frozen=True, slots=True)
class Regression:
    metric: str
    reason: str  # one line citing A's and B's figures and the limit
    change: float  # the drop in % (throughput) or rise in pp (stall fraction)
    limit: float


@dataclass(frozen=True, slots=True)
class Comparison:
    rows: list[Row]
    regressions: list[Regression]
    max_stall_increase_pp: float | None = None
    max_throughput_drop_pct: float | None = None
    unchecked: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    def row(self, metric: str) -> Row:
        """The row called ``metric`` (KeyError if there is none)."""
        for r in self.rows:
            if r.metric == metric:
                return r
        raise KeyError(metric)

    def to_dict(self) -> JSON:
        return {
            "regressed": self.regressed,
            "limits": {
                "max_stall_increase_pp": self.max_stall_increase_pp,
                "max_throughput_drop_pct": self.max_throughput_drop_pct,
            },
            "regressions": [asdict(r) for r in self.regressions],
            "unchecked": list(self.unchecked),
            "rows": [asdict(r) for r in self.rows],
        }


def _limit(value: float | None, what: str, unit: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{what} must be a number of {unit} >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class _Run:
    """The figures a comparison reads, from a Summary's fields or a summary.json dict's keys."""

    facts: dict[str, Scalar]  # row name -> value: run id, scenario, ..., measured steps
    throughput: object  # a figure is a number, or anything else (None, a bad value) that is "not comparable"
    step_time: Mapping[str, object]  # mean, p50, p90
    stall_fraction: object
    breakdown: Mapping[str, object]  # part -> ms per step, in report order
    device_busy_fraction: object
    verdict: object
    simulated: bool = False  # a simulated accelerator: its device figures are predictions, labelled so
    spread: Mapping[str, object] = field(default_factory=dict)  # summary.json's step_spread: standard errors


_FACTS = ("run id", "scenario", "pipeline", "batch size", "workers", "device", "status", "measured steps")


def _facts(*values: object) -> dict[str, Scalar]:
    """The config rows' values, in ``_FACTS`` order; a value that is no JSON scalar reads as its text."""
    return {
        k: v if v is None or isinstance(v, (str, int, float)) else str(v) for k, v in zip(_FACTS, values, strict=True)
    }


def _run(s: Summary | Mapping[str, object], which: str) -> _Run:
    if isinstance(s, Summary):
        st, dev = s.step_time_ms, s.device
        facts = _facts(
            s.run_id, s.scenario, s.pipeline, s.batch_size, s.workers, _device(dev.where, dev.name), s.status, s.steps
        )
        step = {"mean": st.mean, "p50": st.p50, "p90": st.p90}
        parts = dict(s.breakdown_ms_per_step.parts())
        return _Run(
            facts,
            s.throughput_samples_per_s,
            step,
            s.stall_fraction,
            parts,
            s.device_busy_fraction,
            s.verdict,
            dev.simulated,
            as_json(s.step_spread.to_dict()) if s.step_spread else {},
        )
    if isinstance(s, dict):
        d = as_json(s.get("device"))
        device = _device(device_where(d), d.get("name")) if d else None
        facts = _facts(
            s.get("run_id"),
            s.get("scenario"),
            s.get("pipeline"),
            s.get("batch_size"),
            s.get("workers"),
            device,
            s.get("status"),
            s.get("steps"),
        )
        return _Run(
            facts,
            s.get("throughput_samples_per_s"),
            as_json(s.get("step_time_ms")),
            s.get("stall_fraction"),
            as_json(s.get("breakdown_ms_per_step")),
            s.get("device_busy_fraction"),
            s.get("verdict"),
            d.get("kind") == "sim",
            as_json(s.get("step_spread")),
        )
    raise TypeError(f"run {which} must be a Summary or a summary.json dict, got {type(s).__name__}")


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


@dataclass(frozen=True, slots=True)
class _Noise:
    """What a row's change must pass to be flagged: the two runs' standard errors of the figure (the row's unit;
    None where a run has none) and the least change that can matter (None: ``SAME_PCT`` of A's value)."""

    se_a: float | None = None
    se_b: float | None = None
    matter: float | None = None

    def flag_at(self, a: float, unit: str) -> float:
        """The least |B - A| flagged: beyond ``NOISE_Z`` combined standard errors and at least what can matter."""
        if self.matter is not None:
            floor = self.matter
        else:
            floor = MATTER_SHARE * 100 if unit == "%" else abs(a) * SAME_PCT / 100
        if unit == "ms":
            floor = max(floor, SAME_MS)
        if self.se_a is None or self.se_b is None:
            return floor
        return max(floor, NOISE_Z * math.hypot(self.se_a, self.se_b))


def _figure(
    metric: str,
    a: object,
    b: object,
    *,
    unit: str,
    higher_is_better: bool,
    scale: float = 1.0,
    noise: _Noise = _Noise(),  # frozen: one shared default is safe
) -> Row:
    x, y = _num(a), _num(b)
    x = None if x is None else x * scale
    y = None if y is None else y * scale
    if x is None or y is None:
        return Row(metric, x, y, None, None, NOT_COMPARABLE, unit)
    delta = y - x
    delta_pct = delta / abs(x) * 100 if x else None
    flag_at = noise.flag_at(x, unit)
    same = delta == 0 or abs(delta) < flag_at
    change = SAME if same else (BETTER if (delta > 0) == higher_is_better else WORSE)
    return Row(metric, x, y, delta, delta_pct, change, unit, flag_at=flag_at)


def _se(spread: Mapping[str, object], key: str, *, scale: float = 1.0) -> float | None:
    """A standard error from summary.json's ``step_spread``: ``key`` of its ``se_ms_per_step``, or a top key."""
    per_step = as_json(spread.get("se_ms_per_step"))
    v = _num(per_step[key] if key in per_step else spread.get(key))
    return None if v is None else v * scale


def _throughput_noise(a: _Run, b: _Run) -> _Noise:
    """Throughput's standard errors, in samples/s: each run's standard error of the mean step time as a share of
    A's mean step time, times A's throughput (throughput is the batch / the step time), so that throughput is
    flagged where the mean step time is, and not by one run's spread seen at two scales."""
    step, thr = _num(a.step_time.get("mean")), _num(a.throughput)
    if not step or thr is None:
        return _Noise()
    se_a, se_b = _se(a.spread, "step"), _se(b.spread, "step")
    return _Noise(None if se_a is None else abs(thr) * se_a / step, None if se_b is None else abs(thr) * se_b / step)


def _fact(metric: str, a: Scalar, b: Scalar) -> Row:
    return Row(metric, a, b, None, None, SAME if a == b else CHANGED, "", "config")


def _simulated_in(a: _Run, b: _Run) -> str:
    """`` (simulated)`` / `` (simulated in A)`` / ...: the suffix of a device figure that is a simulator's."""
    if a.simulated and b.simulated:
        return " (simulated)"
    if a.simulated or b.simulated:
        return f" (simulated in {'A' if a.simulated else 'B'})"
    return ""


def _device(where: str | None, name: object) -> str:
    where = where or "?"
    return f"{where} ({name})" if name else where


def _verdict(a: object, b: object) -> Row:
    a, b = _text(a), _text(b)
    ra, rb = _VERDICT_RANK.get(a) if a is not None else None, _VERDICT_RANK.get(b) if b is not None else None
    if ra is None or rb is None:
        change = SAME if a == b and a is not None else NOT_COMPARABLE
    else:
        change = SAME if ra == rb else (BETTER if rb < ra else WORSE)
    return Row("verdict", a, b, None, None, change, "", "verdict")


def _text(v: object) -> str | None:
    """A verdict as text: a summary.json's is a string or null (anything else reads as its text)."""
    return v if v is None or isinstance(v, str) else str(v)


def _phase_names(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """data_wait, h2d, compute, sync, user phases (A's order, then B's new ones), other last. Sync only when
    either run waited in it (summary.json has it, 0.0, for every single-process run)."""
    names: list[str] = []
    no_sync = not any(_num(d.get("sync")) for d in (a, b))
    for name in [*a, *b]:
        if name not in names and name != "other" and not (name == "sync" and no_sync):
            names.append(name)
    return [*names, "other"] if "other" in a or "other" in b else names


def compare(
    a: Summary | Mapping[str, object],
    b: Summary | Mapping[str, object],
    *,
    max_stall_increase_pp: float | None = None,
    max_throughput_drop_pct: float | None = None,
) -> Comparison:
    """Compare run B against the baseline run A; regressions are B's moves beyond the given limits."""
    stall_limit = _limit(max_stall_increase_pp, "max stall increase", "percentage points")
    drop_limit = _limit(max_throughput_drop_pct, "max throughput drop", "percent")
    rows, throughput, stall = _rows(_run(a, "A"), _run(b, "B"))

    regressions: list[Regression] = []
    unchecked: list[str] = []
    for regression, note in (_check_throughput(throughput, drop_limit), _check_stall(stall, stall_limit)):
        if regression is not None:
            regressions.append(regression)
        if note is not None:
            unchecked.append(note)
    return Comparison(rows, regressions, stall_limit, drop_limit, unchecked)


def _rows(ra: _Run, rb: _Run) -> tuple[list[Row], Row, Row]:
    """Every row, in the report's order, with the throughput and stall fraction rows the limits check."""
    rows = [_fact(name, value, rb.facts[name]) for name, value in ra.facts.items()]

    def noise(key: str, *, scale: float = 1.0, matter: float | None = None) -> _Noise:
        return _Noise(_se(ra.spread, key, scale=scale), _se(rb.spread, key, scale=scale), matter)

    throughput = _figure(
        "throughput",
        ra.throughput,
        rb.throughput,
        unit="samples/s",
        higher_is_better=True,
        noise=_throughput_noise(ra, rb),
    )
    rows.append(throughput)
    for q, key in (("mean", "step"), ("p50", "step_p50"), ("p90", "step_p90")):
        a, b = ra.step_time.get(q), rb.step_time.get(q)
        rows.append(_figure(f"step time {q}", a, b, unit="ms", higher_is_better=False, noise=noise(key)))
    stall_noise = noise("stall_fraction_se", scale=100.0)
    stall = _figure(
        "stall fraction", ra.stall_fraction, rb.stall_fraction, unit="%", higher_is_better=False, scale=100.0,
        noise=stall_noise,
    )  # fmt: skip
    rows.append(stall)
    ba, bb = ra.breakdown, rb.breakdown
    sim = _simulated_in(ra, rb)
    step_a = _num(ra.step_time.get("mean"))
    matter = MATTER_SHARE * step_a if step_a else None  # 1% of A's step: a phase's change that can matter
    for name in _phase_names(ba, bb):
        label = f"{name} / step" + (sim if name == "compute" else "")
        phase_noise = noise(name, matter=matter)
        rows.append(_figure(label, ba.get(name), bb.get(name), unit="ms", higher_is_better=False, noise=phase_noise))
    busy_a, busy_b = ra.device_busy_fraction, rb.device_busy_fraction
    busy_noise = noise("device_busy_fraction_se", scale=100.0)
    rows.append(
        _figure("device busy" + sim, busy_a, busy_b, unit="%", higher_is_better=True, scale=100.0, noise=busy_noise)
    )
    rows.append(_verdict(ra.verdict, rb.verdict))
    return rows, throughput, stall


def _check_throughput(throughput: Row, drop_limit: float | None) -> tuple[Regression | None, str | None]:
    """The throughput drop against its limit: a regression, or a note that it could not be checked."""
    if drop_limit is None:
        return None, None
    if throughput.delta_pct is None:
        return None, f"throughput not checked against the {drop_limit:g}% drop limit: {_why(throughput)}"
    drop = -throughput.delta_pct
    if drop > drop_limit + _EPS:
        regression = Regression(
            "throughput",
            f"throughput dropped {drop:.1f}% ({throughput.a:.1f} -> {throughput.b:.1f} samples/s), "
            f"beyond the limit of {drop_limit:g}%",
            drop,
            drop_limit,
        )
        return regression, None
    return None, None


def _check_stall(stall: Row, stall_limit: float | None) -> tuple[Regression | None, str | None]:
    """The stall fraction's rise against its limit: a regression, or a note that it could not be checked."""
    if stall_limit is None:
        return None, None
    if stall.delta is None:
        return None, f"stall fraction not checked against the {stall_limit:g} pp limit: {_why(stall)}"
    if stall.delta > stall_limit + _EPS:
        regression = Regression(
            "stall fraction",
            f"stall fraction rose {stall.delta:.1f} pp ({stall.a:.1f}% -> {stall.b:.1f}%), "
            f"beyond the limit of {stall_limit:g} pp",
            stall.delta,
            stall_limit,
        )
        return regression, None
    return None, None


def _why(row: Row) -> str:
    missing = [name for name, v in (("A", row.a), ("B", row.b)) if v is None]
    if missing:
        return f"not measured in run {' and '.join(missing)}"
    return "run A's figure is 0, so a relative change is undefined"
