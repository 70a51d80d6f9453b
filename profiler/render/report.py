"""Terminal report of a Summary, with rich. Formats figures; computes none.

Every table cell names the instrument it came from (the Summary's ``sources``), and a figure that was
not measured is printed as "n/a" with the reason, never as zero.
"""

from __future__ import annotations

import math

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from profiler.analysis import Summary
from profiler.render.figures import breakdown_title, figure_rows, legend, part_label, sampler_text, simulated_line
from profiler.render.figures import num as _num
from profiler.render.figures import pct as _pct
from profiler.render.loader import (
    headspace_text,
    loader_time_table,
    memory_table,
    ray_table,
    shm_line,
    stages_table,
)

_VERDICT_STYLE = {
    "highly input-bound": "bold red",
    "moderately input-bound": "bold yellow",
    "not input-bound": "bold green",
}


def header(s: Summary) -> Text:
    dev = s.device
    t = Text()
    t.append(f"{s.scenario or 'run'}", style="bold")
    t.append(f"  pipeline={s.pipeline or '?'}  batch={s.batch_size or '?'}  workers={_num(s.workers, '{}')}  ")
    t.append(f"device={dev.where} ({dev.name or '?'})  ")
    t.append(f"status={s.status}", style="bold" if s.status == "complete" else "bold red")
    if s.run_id:
        t.append(f"  run={s.run_id}", style="dim")
    return t


def breakdown_table(s: Summary) -> Table:
    b = s.breakdown_ms_per_step
    step = s.step_time_ms.mean
    table = Table(title=breakdown_title(s), title_justify="left", expand=False)
    table.add_column("phase")
    table.add_column("ms/step", justify="right")
    table.add_column("share", justify="right")
    table.add_column("measured by", style="dim")
    for name, value in b.items():
        share = value / step if step and not math.isnan(step) and not math.isnan(value) else math.nan
        how = s.sources.part(name) or (
            "remainder: step time minus the phases above" if name == "other" else "host perf_counter"
        )
        table.add_row(part_label(s, name), _num(value, "{:.2f}"), _pct(share), how)
    table.add_row("step", _num(step, "{:.2f}"), "100%", s.sources.step_time, style="bold")
    return table


def figures_table(s: Summary) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for label, text in figure_rows(s):
        t.add_row(label, text)
    return t


def verdict_block(s: Summary) -> Group:
    style = _VERDICT_STYLE.get(s.verdict, "bold")
    parts: list[RenderableType] = [
        Text.assemble(
            ("Verdict: ", "bold"),
            (s.verdict, style),
            f"  (stall {_pct(s.stall_fraction)}; bands: >=20% highly, >=5% moderately)",
        )
    ]
    for i, r in enumerate(s.recommendations, 1):
        parts.append(Text.assemble(f"{i}. ", (f"[{r.code}] ", "cyan"), r.text))
    return Group(*parts)


def sampler_block(s: Summary) -> Text:
    sm = s.sampler
    t = Text()
    t.append("Sampler: ", style="bold")
    t.append(sampler_text(s))
    for name in sorted(sm.sources):
        status = sm.status_at(name)
        errors = sm.errors.get(name, 0)
        last = sm.last_error.get(name)
        detail = (f" ({errors} read errors" + (f", last: {last})" if last else ")")) if errors else ""
        t.append(f"\n  source {name}: {status}{detail}")
    return t


def render_report(s: Summary, console: Console) -> None:
    from profiler.render.sampled import attribution_table, crosscheck_line, estimate_table

    est, att = s.stack_estimate, s.loader_attribution
    zero_code = s.mode == "zero-code"
    body: list[RenderableType] = [header(s), figures_table(s)]
    sim = simulated_line(s)
    if sim:
        body.insert(1, Text.assemble(("Device: ", "bold"), (sim, "bold magenta")))
    overall = est.overall if est else None
    if zero_code:
        if est and est.overall:
            body.append(estimate_table(est, est.overall))
    else:
        body.append(breakdown_table(s))
        step, wait = s.step_time_ms.mean, s.breakdown_ms_per_step.data_wait
        if overall and overall.samples and step and not math.isnan(step):
            body.append(crosscheck_line(overall, wait / step))
    if att:
        body.append(attribution_table(att))
    if s.loader_time is not None and s.loader_time.workers is not None:
        body.append(loader_time_table(s.loader_time))
    if s.stages is not None:
        body.append(stages_table(s.stages))
    if s.ray is not None:
        body.append(ray_table(s.ray))
    if s.headspace is not None:
        body.append(Text(headspace_text(s.headspace)))
    if s.memory is not None and len(s.memory.processes) > 1:
        body.append(memory_table(s.memory))
    elif s.memory is not None and s.memory.shm_need is not None:  # no smaps reading in the window: the shm figures
        body.append(Text("\n".join(h for h in (s.memory.shm_headline, shm_line(s.memory)) if h)))
    body += [verdict_block(s), sampler_block(s), Text(legend(s), style="dim")]
    if s.error:
        body.insert(1, Text(f"Run stopped: {s.error}", style="bold red"))  # above everything but the header
    body.extend(Text(f"note: {n}", style="yellow") for n in s.notes)
    console.print(Panel(Group(*body), title="stallscope report", title_align="left"))


def make_console(stderr: bool = False, width: int | None = None) -> Console:
    return Console(stderr=stderr, width=width, highlight=False)
