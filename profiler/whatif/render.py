"""Terminal output of ``stallscope whatif``: the predictions (and with ``--check`` the measured beside them).

Formats what ``profiler.whatif.model`` computed; computes no figure. Every predicted column says "predicted", and a
header line names the run and the measured loader cost the predictions come from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from profiler.whatif.confidence import Confidence, ratio_error, speedup
from profiler.whatif.model import Checked, Prediction, WhatIf, worst_error

Interval = tuple[float, float]


def _n(x: float, fmt: str = ".1f") -> str:
    return "n/a" if math.isnan(x) else format(x, fmt)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0%}"


def _pct1(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def _err(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def _config(p: Prediction) -> str:
    t = p.target
    if t.pipeline == "ray":
        return f"ray b{t.batch_size} {max(1, t.workers)} cpus"
    return f"{t.pipeline} b{t.batch_size} w{t.workers}" + (f" {t.storage.label}" if t.storage.label else "")


def _devices(predictions: Sequence[Prediction]) -> list[str]:
    return list(dict.fromkeys(p.target.device for p in predictions))


def _range(lo_hi: Interval | None) -> str:
    if lo_hi is None or math.isnan(lo_hi[0]):
        return ""
    lo, hi = lo_hi
    if math.isinf(hi):
        return "unknown"
    fmt = ".0f" if hi >= 100 else ".1f"
    return f"{lo:{fmt}}-{hi:{fmt}}"


def _oom(p: Prediction) -> str:
    t = p.target
    return f"OOM: {t.memory_bytes / (1 << 30):.1f} of {t.memory_total_bytes / (1 << 30):.0f} GiB"


def _table(title: str, columns: list[tuple[str, str]], *, padding: int = 2) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD,
        title=title,
        title_justify="left",
        padding=(0, padding // 2, 0, padding - padding // 2),
        pad_edge=padding == 2,
    )
    for name, justify in columns:
        table.add_column(name, justify="right" if justify == "r" else "left", no_wrap=name == "configuration")
    return table


def prediction_table(
    device: str, predictions: Sequence[Prediction], intervals: Sequence[Interval] | None = None
) -> Table:
    table = _table(
        f"{device} (simulated): PREDICTED",
        [
            ("configuration", "l"),
            ("samples/s", "r"),
            ("95%\nrange", "r"),
            ("step ms", "r"),
            ("stall", "r"),
            ("device\nutil", "r"),
            ("bound", "l"),
            ("to feed it:\nw / cores", "r"),
        ],
        padding=1,
    )
    for i, p in enumerate(predictions):
        if p.status == "OOM":
            table.add_row(_config(p), _oom(p), "", "", "", "", "memory", "")
            continue
        feed = f"{p.workers_needed} / {p.cores_needed}" if p.workers_needed is not None else "n/a"
        table.add_row(
            _config(p),
            _n(p.samples_per_s),
            _range(intervals[i] if intervals is not None else None),
            _n(p.step_ms, ".2f"),
            _pct(p.stall_fraction),
            _pct(p.device_utilisation),
            p.binding,
            feed,
        )
    return table


def check_table(
    device: str,
    checked: Sequence[Checked],
    repeat: int = 1,
    intervals: Sequence[Interval] | None = None,
    base: tuple[float, float] = (math.nan, math.nan),
) -> Table:
    """Predicted against measured: absolute (with the prediction's 95% range) and as a speedup against the base's
    own configuration, ``base`` = (its prediction, its re-measurement)."""
    measured = "MEASURED (--check)" if repeat == 1 else f"MEASURED (--check, median of {repeat} runs, min-max)"
    table = _table(
        f"{device} (simulated): PREDICTED against {measured}",
        [
            ("configuration", "l"),
            ("pred.\nsamples/s", "r"),
            ("95%\nrange", "r"),
            ("meas.\nsamples/s", "r"),
            ("abs.\nerror", "r"),
            ("speedup vs\nbase p/m", "r"),
            ("speedup\nerror", "r"),
        ],
        padding=1,  # seven columns in 80 (the bound is in the predictions' table above)
    )
    for i, c in enumerate(checked):
        p = c.prediction
        predicted = _oom(p) if p.status == "OOM" else _n(p.samples_per_s)
        span = _range(intervals[i] if intervals is not None else None)
        if math.isnan(c.measured_samples_per_s):
            table.add_row(_config(p), predicted, span, c.status, "", "", "")
            continue
        lo, hi = c.spread
        meas = _n(c.measured_samples_per_s) + (f" ({_n(lo)}-{_n(hi)})" if repeat > 1 else "")
        ps, ms = speedup(p.samples_per_s, base[0]), speedup(c.measured_samples_per_s, base[1])
        ratio = "" if math.isnan(ps) or math.isnan(ms) else f"{ps:.2f}/{ms:.2f}"
        table.add_row(_config(p), predicted, span, meas, _err(c.error), ratio, _err(ratio_error(ps, ms)))
    return table


def render_whatif(result: WhatIf, console: Console, confidence: Confidence | None = None) -> None:
    parts: list[Text | Table] = [Text(result.header, style="bold"), Text(result.gap_line)]
    if result.storage_line:
        parts.append(Text(result.storage_line))
    parts.extend(Text(line) for line in result.ray_lines)
    conf = confidence

    def pick(device: str) -> tuple[list[int], list[Interval] | None]:
        idx = [i for i, p in enumerate(result.predictions) if p.target.device == device]
        return idx, [conf.intervals[i] for i in idx] if conf is not None and conf.intervals else None

    for device in _devices(result.predictions):
        idx, spans = pick(device)
        parts.append(prediction_table(device, [result.predictions[i] for i in idx], spans))
    parts.append(
        Text(
            "stall: the share of the step the device does not compute; bound: the largest part of the step "
            "(loader; device; launch: the host's kernel launches and loop overhead; host link: the copy; cores: a "
            "ray row's CPU on this host's free cores); to feed it: the fewest workers (cores) that deliver batch x "
            "loader cost (CPU) per sample / step time with an instant loader, at the measured workers' scaling; "
            "95% range: the prediction again with the base's measured costs as uncertain as its steps (and, "
            "checked, its re-measurement) show, and the worker gap's as its rounds show where the prediction uses it",
            style="dim",
        )
    )
    if result.checked:
        base = (math.nan, math.nan)
        if conf is not None and conf.base is not None:
            base = (result.predictions[conf.base].samples_per_s, conf.remeasured)
        for device in _devices(result.predictions):
            idx, spans = pick(device)
            parts.append(check_table(device, [result.checked[i] for i in idx], result.repeat, spans, base))
        parts.extend(_worst(result, conf, base))
        parts.append(Text(f"check runs: {Path(result.run_dir) / 'whatif'}/<configuration>", style="dim"))
    if conf is not None:
        parts.extend(Text(f"confidence: {line}", style="cyan") for line in conf.lines)
    parts.extend(Text(f"note: {n}", style="yellow") for n in result.notes)
    console.print(Group(*parts))


def _worst(result: WhatIf, conf: Confidence | None, base: tuple[float, float]) -> list[Text]:
    worst = worst_error(list(result.checked))
    out = [Text(f"worst |error| of predicted against measured throughput: {_pct1(worst)}", style="bold")]
    errors = [
        abs(ratio_error(speedup(c.prediction.samples_per_s, base[0]), speedup(c.measured_samples_per_s, base[1])))
        for c in result.checked
    ]
    errors = [e for e in errors if not math.isnan(e)]
    if errors:
        out.append(
            Text(
                f"worst |error| of the predicted speedup against the re-measured base: {max(errors):.1%} (the "
                "host's drift between runs cancels in it)",
                style="bold",
            )
        )
    elif conf is not None:
        out.append(Text("speedups: the base's own configuration was not re-measured (the run is not simulated)"))
    return out
