"""Terminal report of a multi-rank job (a :class:`~profiler.jobs.analysis.JobSummary`), with rich. Formats
figures; computes none. A figure that was not measured is "n/a"; on a simulated device, the sync column says
so (it is the simulated device's idle time in the sync phase)."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from profiler.analysis.meta import as_json
from profiler.jobs.analysis import JobSummary
from profiler.render.figures import job_lines, num, rank_cells, rank_columns

_VERDICT_STYLE = {"input": "bold red", "not": "bold green"}


def job_header(j: JobSummary) -> Text:
    t = Text()
    t.append(f"{j.scenario or 'job'}", style="bold")
    dev = as_json(j.device.get("sim")).get("device") if j.simulated else None
    where = dev or j.device.get("torch_device") or j.device.get("kind") or "?"
    t.append(
        f"  pipeline={j.pipeline or '?'}  batch/rank={j.batch_size or '?'}  workers/rank={num(j.workers, '{}')}  "
        f"device={where}  world={j.world_size} ({j.nnodes} node{'s' if j.nnodes != 1 else ''})  "
    )
    t.append(f"status={j.status}", style="bold" if j.status == "complete" else "bold red")
    if j.job_id:
        t.append(f"  job={j.job_id}", style="dim")
    return t


def rank_table(j: JobSummary) -> Table:
    table = Table(title="Per rank (measured steps)", title_justify="left")
    for i, col in enumerate(rank_columns(j)):
        table.add_column(col, justify="left" if i == 2 else "right")
    for r in j.ranks:
        style = "bold" if j.straggler and j.straggler.rank == r.rank else None
        table.add_row(*rank_cells(r), style=style)
    return table


def render_job(j: JobSummary, console: Console) -> None:
    body: list[RenderableType] = [job_header(j)]
    if j.simulated:
        body.append(
            Text(
                "Device: SIMULATED (docs/sim.md): compute and sync are the simulated device's times; the input "
                "pipeline and the ranks' waits for each other ran for real",
                style="bold magenta",
            )
        )
    body.append(rank_table(j))
    lines = Table(show_header=False, box=None, pad_edge=False)
    lines.add_column(style="bold")
    lines.add_column()
    for label, text in job_lines(j):
        lines.add_row(label, text)
    body.append(lines)
    style = _VERDICT_STYLE["input"] if j.verdict.startswith("input") else _VERDICT_STYLE["not"]
    body.append(
        Text.assemble(("Verdict: ", "bold"), (j.verdict, style), "  (per rank: stall >=20% highly, >=5% moderately)")
    )
    body.extend(Text(f"note: {n}", style="yellow") for n in j.notes)
    console.print(Panel(Group(*body), title="stallscope job report", title_align="left"))
