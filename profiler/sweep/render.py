"""Terminal output of ``stallscope sweep`` and ``stallscope tune``, and the sweep's SVG plot.

Formats what ``analysis.sweep`` and ``profiler.sweep.tuner`` computed; computes no figure. Progress lines go to
stderr (stdout keeps the table, or the JSON alone); a figure that was not measured prints as "n/a".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from profiler.render.figures import num, pct
from profiler.render.svg import PALETTE, Line, line_chart
from profiler.sweep.analysis import REL_CI, Config, SweepResult, SweepRow, line_label, lines
from profiler.sweep.climb import KNOB_ORDER
from profiler.sweep.tuner import ONE_TRIAL_EACH, WEIGHED, TuneResult


def start_line(index: int, planned: int | None, cfg: Config, run_dir: Path, what: str) -> str:
    """The header printed to stderr before a configuration starts (and before its live view)."""
    of = f"{index}/{planned}" if planned else f"{index}"
    ranks = f" nproc={cfg.nproc} (a job: batch and workers per rank)" if cfg.nproc > 1 else ""
    return (
        f"stallscope: {what} [{of}] {cfg.name}: pipeline={cfg.pipeline} batch={cfg.batch_size} "
        f"workers={cfg.workers}{ranks} -> {run_dir}"
    )


def trial_line(verb: str, index: int, run_dir: Path, overrides: Mapping[str, object]) -> str:
    """The header printed to stderr before a trial of a command starts (``verb``: tune or sweep)."""
    what = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "the command unchanged"
    return f"{verb} [{index}] {what} -> {run_dir}"


def row_line(row: SweepRow) -> str:
    """One line on stderr when a configuration ends."""
    if not row.ok:
        return f"stallscope:   {row.name}: {row.status}: {row.error or 'no throughput measured'}"
    ci = row.step_time_rel_ci
    precision = f", step time ±{ci:.1%}" if math.isfinite(ci) else ""
    if row.nproc > 1:
        return (
            f"stallscope:   {row.name}: {row.throughput_samples_per_s:.1f} samples/s (sum over {row.nproc} ranks), "
            f"stall {pct(row.stall_fraction)}, sync {num(row.sync_ms_per_step)} ms/step, {row.steps} steps "
            f"(fixed{precision}) in {row.wall_s:.1f} s"
        )
    return (
        f"stallscope:   {row.name}: {row.throughput_samples_per_s:.1f} samples/s, stall {pct(row.stall_fraction)}, "
        f"{row.steps} steps (stopped: {row.stop_reason or '?'}{precision}) in {row.wall_s:.1f} s"
    )


def _steps(row: SweepRow) -> str:
    """Measured steps, "*" when the early-stop rule ended them (the CI is in the JSON and the progress line)."""
    if not row.ok:
        return row.status
    return f"{row.steps}{'*' if row.stop_reason == 'stable' else ''}"


def sweep_table(result: SweepResult, title: str | None = None) -> Table:
    knees = {(k.pipeline, k.workers, k.nproc, k.batch_size) for k in result.knees}
    slower = {(s.pipeline, s.workers, s.nproc, s.batch_size): s for s in result.slowdowns}
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))
    # figures never wrap; only the note column gives way on a narrow terminal
    busy = "busy\n(sim)" if result.device.startswith("sim:") else "busy"
    # with jobs: nproc and sync columns, and p90 left to sweep.json, so that the table still fits 80 columns
    jobs = result.multi_rank
    names = ("pipeline", "batch", "workers", *(("nproc",) if jobs else ()), "samples/s", "stall", busy)
    sync = "sync\n(sim)" if result.device.startswith("sim:") else "sync\nms"
    for name in (*names, *((sync,) if jobs else ("p50\nms", "p90\nms"))):
        t.add_column(name, justify="left" if name == "pipeline" else "right", no_wrap=True)
    if jobs:
        t.add_column("p50\nms", justify="right", no_wrap=True)
    if result.priced:
        t.add_column("cost\n/1k", justify="right", no_wrap=True)
    t.add_column("steps", justify="right", no_wrap=True)
    t.add_column("note", overflow="fold")  # knee / slower: the lines under the table say why
    for r in result.rows:
        key = (r.pipeline, r.workers, r.nproc, r.batch_size)
        note = []
        if key in knees:
            note.append("knee")
        if key in slower:
            note.append("slower")
        cells = [r.pipeline, str(r.batch_size), str(r.workers), *([str(r.nproc)] if jobs else [])]
        cells += [num(r.throughput_samples_per_s), pct(r.stall_fraction), pct(r.device_busy_fraction)]
        if jobs:
            cells += [num(r.sync_ms_per_step) if r.nproc > 1 else "", num(r.step_time_ms.get("p50"))]
        else:
            cells += [num(r.step_time_ms.get("p50")), num(r.step_time_ms.get("p90"))]
        if result.priced:
            cells.append(num(r.cost_per_1k_samples, "{:.4f}"))
        cells += [_steps(r), ", ".join(note)]
        t.add_row(*cells, style=None if r.ok else "red")
    return t


def scaling_lines(result: SweepResult) -> list[Text]:
    """One line per completed job row with its nproc 1 row: the measured speed-up and scaling efficiency."""
    base = {r.name: r for r in result.rows}
    out = []
    for r in result.rows:
        b = base.get(r.speedup_baseline or "")
        if b is None or not math.isfinite(r.speedup):
            continue
        out.append(
            Text.assemble(
                ("Scaling ", "bold"),
                f"({line_label(r.pipeline, r.workers)}, batch {r.batch_size}/rank): {r.nproc} ranks "
                f"{num(r.throughput_samples_per_s)} samples/s vs 1 rank {num(b.throughput_samples_per_s)}: ",
                (f"speed-up x{r.speedup:.2f}, scaling efficiency {pct(r.scaling_efficiency)}", "bold"),
            )
        )
    return out


COMMAND_DEVICE = "chosen by the command"  # a sweep of a command: its script picks the device (sweep.command)


def swept(rows: Sequence[SweepRow]) -> str:
    """The knobs a sweep varied and their values, ``workers 0, 2`` (``x batch 32, 64`` where batches varied too)."""
    knobs: list[tuple[str, Sequence[object]]] = [
        ("pipeline", list(dict.fromkeys(r.pipeline for r in rows))),
        ("batch", sorted({r.batch_size for r in rows})),
        ("workers", sorted({r.workers for r in rows})),
        ("nproc", sorted({r.nproc for r in rows})),
    ]
    varied = [f"{name} {', '.join(map(str, values))}" for name, values in knobs if len(values) > 1]
    return " x ".join(varied) or (f"workers {rows[0].workers}" if rows else "nothing run yet")


def sweep_title(result: SweepResult) -> str:
    """``Sweep of `python main.py --epochs 1`: workers 0, 2 (device chosen by the command): 2 of 2 configurations``
    for a command (its program named without its directory); ``Sweep of SCENARIO on DEVICE: ...`` for a scenario."""
    done = f"{len(result.rows)} of {result.planned} configurations"
    if result.device != COMMAND_DEVICE:
        return f"Sweep of {result.scenario} on {result.device}: {done}"
    program, _, rest = result.scenario.partition(" ")
    command = " ".join(filter(None, (Path(program).name, rest)))
    return f"Sweep of `{command}`: {swept(result.rows)} (device {COMMAND_DEVICE}): {done}"


def render_sweep(result: SweepResult, console: Console, out_dir: Path | None = None) -> None:
    title = sweep_title(result)
    parts: list[Text | Table] = [sweep_table(result, title)]
    busy = "SIMULATED device busy fraction (sim-events)" if result.device.startswith("sim:") else "device busy fraction"
    legend = (
        f"busy: {busy}; p50/p90: step time; steps: measured, * = stopped early once the mean step "
        f"time was known to ±{REL_CI:.0%} (95% CI)"
    )
    if result.multi_rank:
        legend = legend.replace("p50/p90: step time", "p50: step time (p90 in sweep.json)")
        legend += (
            "; nproc: ranks of a job (batch and workers per rank, samples/s the sum over ranks, p50 the slowest "
            "rank's, a fixed --steps); sync: ms/step waiting for the other ranks"
            + (
                " (SIMULATED: the simulated device's time in the sync phase)"
                if result.device.startswith("sim:")
                else ""
            )
        )
    if result.priced:
        legend += "; cost/1k: per 1,000 samples at --price-per-hour"
    parts.append(Text(legend, style="dim"))
    parts.extend(scaling_lines(result))
    if result.knee is not None:
        parts.append(Text.assemble(("Knee: ", "bold"), result.knee.text))
    for k in result.knees:
        if k is not result.knee:
            parts.append(Text("  " + k.text, style="dim"))
    for s in result.slowdowns:
        parts.append(Text.assemble(("Slowdown ", "bold yellow"), (f"[{s.cause}] ", "cyan"), s.text))
    for r in result.rows:
        if not r.ok:
            parts.append(Text(f"{r.name} {r.status}: {r.error or 'no throughput measured'}", style="red"))
    parts.extend(Text(f"note: {n}", style="yellow") for n in result.notes)
    if out_dir is not None:
        parts.append(Text(f"table: {out_dir / 'sweep.json'}  plot: {out_dir / 'sweep.svg'}", style="dim"))
    console.print(Group(*parts))


def sweep_svg(result: SweepResult) -> str:
    """A standalone SVG file: throughput against batch size, one line per pipeline x workers."""
    chart_lines = []
    for i, ((pipeline, workers, nproc), rows) in enumerate(lines(result.rows).items()):
        chart_lines.append(
            Line(
                label=line_label(pipeline, workers, nproc),
                xs=[float(r.batch_size) for r in rows],
                ys=[r.throughput_samples_per_s for r in rows],
                color=PALETTE[i % len(PALETTE)],
                dashed=i >= len(PALETTE),
            )
        )
    chart = line_chart(
        chart_lines,
        title=f"Throughput vs batch size: {result.scenario} on {result.device}",
        chart_id="sweep-throughput",
        x_label="batch size",
        y_label="samples/s",
        width=760,
        height=360,
        standalone=True,
    )
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + chart + "\n"


def tune_header(
    scenario: str,
    *,
    pipelines: Sequence[str],
    left_out: Mapping[str, str],
    max_batch: int,
    max_workers: int,
    cores: int,
    budget_s: float,
) -> str:
    """The line printed to stderr before a tune starts (the caller adds the device and the directory)."""
    skipped = "".join(f"; {name} left out: {why}" for name, why in left_out.items())
    workers = (
        f"workers up to {max_workers}"
        if max_workers <= cores
        else f"workers up to the {cores} core{'' if cores == 1 else 's'}, past them while the workers' measured CPU "
        f"use leaves room, at most {max_workers}"
    )
    return (
        f"tuning {scenario} ({', '.join(pipelines)}{skipped}; batch up to {max_batch}; {workers}; "
        f"budget {budget_s:g} s)"
    )


def tune_table(result: TuneResult) -> Table:
    t = Table(
        title=f"Tune: {_count(len(result.trials), 'trial')} + {_count(len(result.final), 'final run')}, "
        f"{result.elapsed_s:.0f} s of a "
        f"{result.budget_s:g} s budget",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 0),
    )
    for name in ("run", "pipeline", "batch", "workers", "samples/s", "stall", "worker\ncpu", "p50\nms", "steps"):
        t.add_column(name, justify="left" if name in ("run", "pipeline") else "right", no_wrap=True)
    for r in [*result.trials, *result.final]:
        t.add_row(
            r.role or "",
            r.pipeline + r.config.knobs_suffix.replace("-", " "),
            str(r.batch_size),
            str(r.workers),
            num(r.throughput_samples_per_s),
            pct(r.stall_fraction),
            pct(r.worker_cpu_busy_fraction),
            num(r.step_time_ms.get("p50")),
            _steps(r),
            style=None if r.ok else "red",
        )
    return t


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _verdict(result: TuneResult) -> list[Text]:
    """The recommendation and its measured speedup (or why there is none)."""
    rec, d = result.recommended, result.default
    med = result.medians()
    if rec is None:
        return [Text("No recommendation: no configuration completed.", style="bold red")]
    if result.change is not None:
        return _command_verdict(result)
    if not result.compared:
        return not_compared(result, "the default")
    out = [
        Text.assemble(
            ("Recommended: ", "bold"),
            (rec.flags(), "bold green"),
        )
    ]
    if result.unconfirmed is not None:
        u = result.unconfirmed
        out.append(
            Text(
                f"Measured: the best alternative found ({u.name}) made x{num(result.unconfirmed_speedup, '{:.2f}')} "
                f"of the default's throughput (median {num(med['recommended'])} vs {num(med['default'])} samples/s, "
                f"{_basis(result)}): keep the default.",
                style="yellow",
            )
        )
    elif result.speedup is not None and not result.final and result.basis != ONE_TRIAL_EACH:
        out.append(Text("Speedup over the default: x1 (every other configuration tried failed)"))
    elif result.speedup is not None:
        out.append(
            Text(
                f"Measured speedup over the default ({d.flags()}): x{result.speedup:.2f}  (median "
                f"{num(med['recommended'])} vs {num(med['default'])} samples/s, {_basis(result)})"
            )
        )
    return out


def _basis(result: TuneResult) -> str:
    """What the speedup's medians are taken over."""
    if result.basis == WEIGHED:
        return "every run of each: the trials and the final rounds, which contested the trials' gain"
    if result.basis == ONE_TRIAL_EACH:
        return "one trial each, not re-run side by side: the budget held no final round"
    return "re-run side by side"


def not_compared(result: TuneResult, what: str) -> list[Text]:
    """A tune that measured nothing beside the setting to beat: no verdict on it, why nothing else ran (the
    budget's note), and what ``stallscope run`` on that trial advised, which the tune did not measure."""
    why = _why_alone(result) or "no other configuration was measured"
    out = [Text(f"Nothing was compared with {what}, so there is no verdict on it: {why}.", style="bold yellow")]
    out.extend(
        Text(f"Not measured by this tune, `stallscope run` on its first trial advises: {a}", style="yellow")
        for a in result.advice
    )
    return out


def _why_alone(result: TuneResult) -> str | None:
    """The note saying why nothing ran beside the setting to beat (the budget's), where there is one."""
    alone = ("budget", "nothing was compared")
    return None if result.compared else next((n for n in result.notes if any(a in n for a in alone)), None)


def change_line(result: TuneResult) -> str:
    """``train.py:57  DataLoader(..., num_workers=2, persistent_workers=True)  x1.35 measured (41.0 -> 55.3
    samples/s)``: the change a command's tune recommends, where to make it, and its measured speedup."""
    change = result.change or {}
    args = ", ".join(f"{k}={v!r}" for k, v in (change.get("args") or {}).items())
    med = result.medians()
    return (
        f"{change.get('site') or '?'}  {change.get('kind') or 'DataLoader'}(..., {args})  "
        f"x{num(result.speedup, '{:.2f}')} measured ({num(med['default'])} -> {num(med['recommended'])} samples/s"
        + (f"; {_basis(result)})" if result.basis == WEIGHED else ")")
    )


def _command_verdict(result: TuneResult) -> list[Text]:
    med = result.medians()
    site = (result.change or {}).get("site") or "?"
    if result.unconfirmed is not None:
        return [
            Text(
                f"Keep the script's setting at {site}: the best alternative found ({result.unconfirmed.name}) made "
                f"x{num(result.unconfirmed_speedup, '{:.2f}')} of its throughput (median "
                f"{num(med['recommended'])} vs {num(med['default'])} samples/s, {_basis(result)}).",
                style="yellow",
            )
        ]
    if not result.compared:
        return not_compared(result, f"the script's setting at {site}")
    if result.recommended == result.default:
        return [Text(f"Keep the script's setting at {site}: every other configuration tried failed.", style="bold")]
    if not (result.change or {}).get("args"):
        name = result.recommended.name if result.recommended else "?"
        return [Text(f"Keep the script's setting at {site}: the pick ({name}) changes no knob there.", style="bold")]
    how = (
        "measured in one trial each; not re-run side by side with the script's own setting: the budget held no "
        "final round"
        if result.basis == ONE_TRIAL_EACH
        else "re-run side by side with the script's own setting"
    )
    return [Text(f"Recommended change ({how}):", style="bold"), Text(change_line(result), style="bold green")]


def render_tune(result: TuneResult, console: Console, out_dir: Path | None = None) -> None:
    parts: list[Text | Table] = [
        tune_table(result),
        Text(
            "worker cpu: a loader worker's sampled CPU use as a share of one core (its CPU time per item / its "
            "wall time per item)",
            style="dim",
        ),
        *_verdict(result),
    ]
    for pipeline, why in result.stopped.items():
        parts.extend(Text.assemble((f"{pipeline} {knob} ", "bold"), why[knob]) for knob in KNOB_ORDER if knob in why)
    parts.extend(Text(f"{name} left out: {why}", style="yellow") for name, why in result.left_out.items())
    said = _why_alone(result)  # in the verdict already
    parts.extend(Text(f"note: {n}", style="yellow") for n in result.notes if n != said)
    if out_dir is not None:
        parts.append(Text(f"trials and final runs: {out_dir}/  summary: {out_dir / 'tune.json'}", style="dim"))
    console.print(Group(*parts))
