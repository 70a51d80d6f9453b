"""Terminal output of ``stallscope whatif``: the predictions (and with ``--check`` the measured beside them).

Formats what ``profiler.whatif`` computed; computes no figure. Every predicted column says "predicted", and a
header line names the run and the measured loader cost the predictions come from.
"""

from __future__ import annotations

import math

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from profiler.whatif import Checked, Prediction, WhatIf, worst_error


def _n(x: float, fmt: str = ".1f") -> str:
    return "n/a" if math.isnan(x) else format(x, fmt)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0%}"


def _err(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def _row(p: Prediction) -> list[str]:
    t = p.target
    head = [t.device, t.pipeline, str(t.batch_size), str(t.workers)]
    if p.status == "OOM":
        gib = t.memory_bytes / (1 << 30)
        return [*head, "OOM", f"needs {gib:.1f} GiB of {t.memory_total_bytes / (1 << 30):.0f}", "", "", "", ""]
    needed = f"{p.workers_needed} / {p.cores_needed}" if p.workers_needed is not None else "n/a"
    return [
        *head,
        _n(p.samples_per_s),
        _n(p.step_ms, ".2f"),
        _pct(p.stall_fraction),
        _pct(p.device_utilisation),
        p.binding,
        needed,
    ]


def whatif_table(result: WhatIf) -> Table:
    checked = {id(c.prediction): c for c in result.checked}
    table = Table(box=box.SIMPLE_HEAD, title="What if (PREDICTED; simulated devices)", title_justify="left")
    for name in ("device", "pipeline", "batch", "workers"):
        table.add_column(name)
    for name in ("predicted samples/s", "predicted step ms", "predicted stall", "predicted device util"):
        table.add_column(name, justify="right")
    table.add_column("predicted bound")
    table.add_column("workers / cores to feed it", justify="right")
    if result.checked:
        for name in ("measured samples/s", "measured stall", "error"):
            table.add_column(name, justify="right")
    for p in result.predictions:
        cells = _row(p)
        if result.checked:
            c: Checked | None = checked.get(id(p))
            if c is None:
                cells += ["", "", ""]
            elif math.isnan(c.measured_samples_per_s):
                cells += [c.status, "", ""]
            else:
                cells += [_n(c.measured_samples_per_s), _pct(c.measured_stall_fraction), _err(c.error)]
        table.add_row(*cells)
    return table


def render_whatif(result: WhatIf, console: Console) -> None:
    parts: list[Text | Table] = [Text(result.header, style="bold"), whatif_table(result)]
    parts.append(
        Text(
            "stall: the share of the step the device does not compute; bound: the largest part of the step "
            "(loader, device, launch = host's kernel launches + loop overhead, host link = the copy); workers / "
            "cores to feed it: ceil(batch x loader cost / step time with an instant loader)",
            style="dim",
        )
    )
    if result.checked:
        worst = worst_error(list(result.checked))
        parts.append(Text(f"worst |error| of predicted against measured throughput: {_err(worst).lstrip('+')}"))
        for c in result.checked:
            parts.append(Text(f"  {c.prediction.target.label}: {c.run_dir}", style="dim"))
    parts.extend(Text(f"note: {n}", style="yellow") for n in result.notes)
    console.print(Group(*parts))
