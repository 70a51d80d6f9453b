"""Terminal rendering of a Comparison, with rich: A and B side by side, the change, and the regressions.

Formats only: every number printed is a field of the Comparison's rows or regressions, and a figure that
is not there prints as "n/a", never as zero. The change column's arrow points up when B is better.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from profiler.analysis.compare import BETTER, CHANGED, NOISE_Z, NOT_COMPARABLE, SAME, WORSE, Comparison, Row

_CHANGE = {
    BETTER: ("▲ better", "green"),
    WORSE: ("▼ worse", "red"),
    SAME: ("= same", "dim"),
    CHANGED: ("≠ changed", "yellow"),
    NOT_COMPARABLE: ("? not comparable", "dim"),
}


def _value(row: Row, x: float | str | None) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str) or row.kind != "figure":
        return str(x)
    if row.unit == "%":
        return f"{x:.1f}%"
    if row.unit == "ms":
        return f"{x:.2f} ms"
    return f"{x:.1f} {row.unit}".rstrip()


def _delta(row: Row) -> str:
    if row.delta is None:
        return ""
    if row.unit == "%":
        return f"{row.delta:+.1f} pp"
    text = f"{row.delta:+.2f}" if row.unit == "ms" else f"{row.delta:+.1f}"
    return text + (f" ({row.delta_pct:+.1f}%)" if row.delta_pct is not None else "")


def compare_table(cmp: Comparison) -> Table:
    table = Table(title="Run B against run A", title_justify="left", expand=False)
    table.add_column("")
    table.add_column("A", overflow="fold")
    table.add_column("B", overflow="fold")
    table.add_column("B - A", justify="right", no_wrap=True)
    table.add_column("change", no_wrap=True)
    kind = None
    for row in cmp.rows:
        if kind is not None and row.kind != kind:
            table.add_section()
        kind = row.kind
        label, style = _CHANGE.get(row.change, (row.change, ""))
        table.add_row(row.metric, _value(row, row.a), _value(row, row.b), _delta(row), Text(label, style=style))
    return table


def _limits(cmp: Comparison) -> str:
    parts = []
    if cmp.max_stall_increase_pp is not None:
        parts.append(f"max stall increase {cmp.max_stall_increase_pp:g} pp")
    if cmp.max_throughput_drop_pct is not None:
        parts.append(f"max throughput drop {cmp.max_throughput_drop_pct:g}%")
    return ", ".join(parts) if parts else "no limits given"


def outcome_block(cmp: Comparison) -> Group:
    lines: list[Text] = []
    if cmp.regressed:
        lines.append(Text(f"REGRESSION beyond the limits ({_limits(cmp)}):", style="bold red"))
        lines.extend(Text(f"  - {r.reason}", style="red") for r in cmp.regressions)
    else:
        lines.append(Text(f"no regression beyond the limits ({_limits(cmp)})", style="bold green"))
    lines.extend(Text(f"note: {u}", style="yellow") for u in cmp.unchecked)
    return Group(*lines)


LEGEND = (
    "= same: within noise: the change is under {z:g} standard errors of the two runs' own step-to-step spread, "
    "or under 1% of the step time; pp: percentage points (docs/trace-and-compare.md)"
)


def render_compare(cmp: Comparison, console: Console) -> None:
    console.print(compare_table(cmp))
    console.print(Text(LEGEND.format(z=NOISE_Z), style="dim"))
    console.print(outcome_block(cmp))
