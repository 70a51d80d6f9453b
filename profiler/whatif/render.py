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

from profiler.whatif.model import Checked, Prediction, WhatIf, worst_error


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
    return f"{t.pipeline} b{t.batch_size} w{t.workers}" + (f" {t.storage.label}" if t.storage.label else "")


def _devices(predictions: Sequence[Prediction]) -> list[str]:
    return list(dict.fromkeys(p.target.device for p in predictions))


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


def prediction_table(device: str, predictions: Sequence[Prediction]) -> Table:
    table = _table(
        f"{device} (simulated): PREDICTED",
        [
            ("configuration", "l"),
            ("samples/s", "r"),
            ("step ms", "r"),
            ("stall", "r"),
            ("device\nutil", "r"),
            ("bound", "l"),
            ("to feed it:\nw / cores", "r"),
        ],
    )
    for p in predictions:
        if p.status == "OOM":
            table.add_row(_config(p), _oom(p), "", "", "", "memory", "")
            continue
        feed = f"{p.workers_needed} / {p.cores_needed}" if p.workers_needed is not None else "n/a"
        table.add_row(
            _config(p),
            _n(p.samples_per_s),
            _n(p.step_ms, ".2f"),
            _pct(p.stall_fraction),
            _pct(p.device_utilisation),
            p.binding,
            feed,
        )
    return table


def check_table(device: str, checked: Sequence[Checked], repeat: int = 1) -> Table:
    measured = "MEASURED (--check)" if repeat == 1 else f"MEASURED (--check, median of {repeat} runs)"
    table = _table(
        f"{device} (simulated): PREDICTED against {measured}",
        [
            ("configuration", "l"),
            ("pred.\nsamples/s", "r"),
            ("meas.\nsamples/s", "r"),
            ("runs\nmin-max", "r"),
            ("error", "r"),
            ("pred.\nstall", "r"),
            ("meas.\nstall", "r"),
            ("pred.\nbound", "l"),
        ],
        padding=1,  # eight columns in 80
    )
    for c in checked:
        p = c.prediction
        predicted = _oom(p) if p.status == "OOM" else _n(p.samples_per_s)
        if math.isnan(c.measured_samples_per_s):
            table.add_row(_config(p), predicted, c.status, "", "", _pct(p.stall_fraction), "", p.binding)
            continue
        lo, hi = c.spread
        table.add_row(
            _config(p),
            predicted,
            _n(c.measured_samples_per_s),
            f"{_n(lo)}-{_n(hi)}",
            _err(c.error),
            _pct(p.stall_fraction),
            _pct(c.measured_stall_fraction),
            p.binding,
        )
    return table


def render_whatif(result: WhatIf, console: Console) -> None:
    parts: list[Text | Table] = [Text(result.header, style="bold"), Text(result.gap_line)]
    if result.storage_line:
        parts.append(Text(result.storage_line))
    for device in _devices(result.predictions):
        parts.append(prediction_table(device, [p for p in result.predictions if p.target.device == device]))
    parts.append(
        Text(
            "stall: the share of the step the device does not compute; bound: the largest part of the step "
            "(loader; device; launch: the host's kernel launches and loop overhead; host link: the copy); to feed "
            "it: the fewest workers (cores) that deliver batch x loader cost (CPU) per sample / step time with an "
            "instant loader, at the measured workers' scaling",
            style="dim",
        )
    )
    if result.checked:
        worst = worst_error(list(result.checked))
        for device in _devices(result.predictions):
            rows = [c for c in result.checked if c.prediction.target.device == device]
            parts.append(check_table(device, rows, result.repeat))
        parts.append(Text(f"worst |error| of predicted against measured throughput: {_pct1(worst)}", style="bold"))
        parts.append(Text(f"check runs: {Path(result.run_dir) / 'whatif'}/<configuration>", style="dim"))
    parts.extend(Text(f"note: {n}", style="yellow") for n in result.notes)
    console.print(Group(*parts))
