"""Terminal tables for figures estimated from py-spy stack samples: the main thread's phases (zero-code runs)
and where the loader workers' CPU goes (any run with workers). Formats only; every share shows its 95%
interval and sample count, because these are estimates; and the ranks of a job profiled from outside."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from profiler.analysis.parts import Estimate, LoaderAttribution, PhaseShares, StackEstimate

if TYPE_CHECKING:
    from profiler.zerocode.analysis import ZeroCodeJob

_PHASE_LABEL = {
    "data_wait": "waiting for data (DataLoader / DALI iterator)",
    "h2d": "copying to the device (visible copy lines only)",
    "compute": "forward / backward / optimizer",
    "other": "anything else",
}
_CATEGORY_LABEL = {
    "file_read": "file read",
    "decode": "decode",
    "augment": "augment",
    "collate": "collate",
    "ipc_pickling": "IPC / pickling",
    "other": "other",
}


def _pct(share: Estimate) -> tuple[str, str]:
    return f"{share.fraction:.0%}", f"{share.low:.0%}-{share.high:.0%}"


def estimate_table(est: StackEstimate, overall: PhaseShares) -> Table:
    """``est``'s figures; ``overall`` is its ``overall`` (a caller shows a table only where there is one)."""
    t = Table(
        title=f"Main thread, estimated from {overall.samples} py-spy samples ({est.rate_hz:g} Hz)",
        title_justify="left",
    )
    t.add_column("phase")
    t.add_column("share", justify="right")
    t.add_column("95% interval", justify="right")
    t.add_column("what counts", style="dim")
    for phase, label in _PHASE_LABEL.items():
        share, interval = _pct(overall.phase(phase))
        t.add_row(phase, share, interval, label)
    windows = est.windows
    if len(windows) > 1:
        waits = "  ".join(f"{w.shares.data_wait.fraction:.0%}" for w in windows[:12])
        more = " ..." if len(windows) > 12 else ""
        t.caption = f"data wait per {windows[0].t_end - windows[0].t_start:g} s window: {waits}{more}"
        t.caption_justify = "left"
    return t


def crosscheck_line(overall: PhaseShares, measured_wait_fraction: float) -> Text:
    share, interval = _pct(overall.data_wait)
    return Text(
        f"py-spy cross-check: the main thread was in the loader an estimated {share} ({interval}) of the time; "
        f"the instrumented data wait is {measured_wait_fraction:.0%} of step time.",
        style="dim",
    )


def attribution_table(att: LoaderAttribution) -> Table:
    t = Table(
        title=f"Loader workers' CPU ({att.workers} worker(s), {att.active} busy py-spy samples)",
        title_justify="left",
    )
    t.add_column("category")
    t.add_column("share", justify="right")
    t.add_column("95% interval", justify="right")
    t.add_column("top functions (share of the category)", style="dim")
    for cat, c in att.by_share():
        share, interval = _pct(c.share)
        top = ", ".join(f"{f.function} {f.of_category:.0%}" for f in c.top[:2])
        t.add_row(_CATEGORY_LABEL.get(cat, cat), share, interval, top)
    if att.headline:
        t.caption = att.headline
        t.caption_justify = "left"
    return t


def rank_table(job: ZeroCodeJob) -> Table:
    """One row per rank of a zero-code job: its measured step figures (when the start-up module ran), the
    estimated data wait, CPU and the busiest loader frames."""
    how = "step figures measured in each rank, " if job.measured else ""
    t = Table(
        title=f"Ranks ({len(job.ranks)} of world size {job.world_size or '?'}): {how}data wait "
        f"estimated from py-spy samples{'' if job.measured else ', no step figures'}",
        title_justify="left",
    )
    t.add_column("rank", justify="right")
    t.add_column("pid", justify="right")
    if job.measured:
        for name in ("step ms", "data wait ms", "samples/s"):
            t.add_column(name, justify="right")
    t.add_column("data wait (95%)", justify="right")
    t.add_column("samples", justify="right")
    t.add_column("input-bound")
    t.add_column("CPU main / workers", justify="right")
    t.add_column("top loader frames (of busy worker samples)", style="dim")
    for r in job.ranks:
        dw, o = r.data_wait, r.estimate.overall
        wait = f"{dw.fraction:.0%} ({dw.low:.0%}-{dw.high:.0%})" if dw else "n/a"
        top = ", ".join(f"{_bare(f)} {x:.0%}" for _c, f, x in r.top_loader_frames(2)) or "no worker samples"
        cpu = f"{_cpu(r.main_cpu_pct)} / {_cpu(r.workers_cpu_pct)} ({r.workers})"
        steps = [_fig(r.measured, k) for k in ("step_time_ms", "data_wait_ms", "throughput_samples_per_s")]
        t.add_row(str(r.rank), str(r.pid), *(steps if job.measured else []), wait, str(o.samples if o else 0),
                  _bound(r.verdict), cpu, top)  # fmt: skip
    lines = [job.straggler_evidence() or "no rank's data wait stands apart from the others' (95% intervals overlap)"]
    how = "measured" if job.measured else "estimated"
    lines.append(f"{job.input_bound_ranks} of {len(job.ranks)} ranks input-bound ({how} stall >= 5%)")
    lines.append(f"CPU: psutil means, 100% = one core, (n) worker processes. {job.not_measured}")
    t.caption = "\n".join(lines)
    t.caption_justify = "left"
    return t


def _fig(measured: dict[str, object] | None, key: str) -> str:
    value = (measured or {}).get(key)
    return f"{value:.1f}" if isinstance(value, (int, float)) else "n/a"


def _bound(verdict: str) -> str:
    """The verdict in one word: ``highly input-bound`` -> ``highly``, ``not input-bound`` -> ``no``."""
    word = verdict.split(maxsplit=1)[0]
    return {"not": "no", "unknown:": "n/a"}.get(word, word)


def _bare(function: str) -> str:
    """``Items.__getitem__ (train.py)`` -> ``Items.__getitem__``: the table is narrow, the JSON has the file."""
    return function.split(" (", 1)[0]


def render_job(job: ZeroCodeJob, console: Console) -> None:
    """The ranks table of a zero-code job, with what the report above means for a launcher."""
    console.print(rank_table(job))
    if job.launcher_pid is not None:
        console.print(
            Text(
                f"note: in the report above, 'main' CPU is the launcher (pid {job.launcher_pid}) and its 'workers' "
                "are every process under it; the main-thread estimate and the loader attribution pool every rank",
                style="yellow",
            )
        )


def _cpu(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}%"
