"""The HTML report: one self-contained file with the terminal report's figures plus three plots.

Formats figures, computes none: every number comes from a :class:`~profiler.analysis.Summary` or a
:class:`~profiler.analysis.timeline.Timeline`. docs/html-report.md describes the sections and plots.
Invariants: no script, font, image or URL of any kind (inline CSS and SVG; a Content-Security-Policy meta tag
forbids any fetch); every piece of text from the run is HTML-escaped; figures are formatted as the terminal
report formats them (``_num``/``_pct``), "n/a" with its reason when not measured, never 0; each section has a
stable ``id``.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path

from profiler.analysis import Summary
from profiler.analysis.meta import JSON
from profiler.analysis.parts import STACK_PHASES, Estimate
from profiler.analysis.timeline import Series, Timeline, build_timeline
from profiler.core.store import RunRecord
from profiler.jobs.analysis import JobSummary
from profiler.render.figures import (
    breakdown_title,
    figure_rows,
    job_lines,
    legend,
    part_label,
    rank_cells,
    rank_columns,
    simulated_line,
)
from profiler.render.figures import num as _num
from profiler.render.figures import pct as _pct
from profiler.render.loader import (
    COLUMNS,
    KEY,
    RAY_COLUMNS,
    cell,
    headspace_text,
    rate,
    ray_lines,
    ray_rows,
    reads_line,
    shm_line,
    stages_caption,
)
from profiler.render.svg import PALETTE, Band, Line, Stack, line_chart, stacked_bars
from profiler.zerocode.analysis import ZeroCodeJob, zero_code_job

_PART_COLORS = {"data_wait": "#D55E00", "h2d": "#E69F00", "compute": "#0072B2", "other": "#aaaaaa"}
_EXTRA_COLORS = ("#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_GPU_COLORS = ("#009E73", "#0072B2", "#CC79A7", "#56B4E9")
_VERDICT_CLASS = {
    "highly input-bound": "v-high",
    "moderately input-bound": "v-moderate",
    "not input-bound": "v-ok",
}
_STATUS_TEXT = {
    "interrupted": "Run interrupted: it was stopped or killed before its end. The figures cover the steps "
    "committed to the store before it stopped.",
    "failed": "Run failed: an exception escaped the training loop. The figures cover every step up to and "
    "including the failing one.",
    "running": "Run still in progress: another process is writing this store; the figures are a snapshot.",
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1d1d1d;
 max-width:1000px;margin:24px auto;padding:0 16px;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
header dl{display:grid;grid-template-columns:repeat(4,auto);gap:6px 28px;margin:10px 0 0;justify-content:start}
header dl div.wide{grid-column:span 2}header dt{color:#666;font-size:12px}header dd{margin:0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.s-complete{background:#e2f3e6;color:#1b6b2f}.s-interrupted,.s-failed,.s-running{background:#fbe3e1;color:#a4160b}
.banner{margin:16px 0;padding:10px 14px;border-left:6px solid #c62828;background:#fdecea;font-weight:600}
.banner.sim{border-left-color:#6a1b9a;background:#f3e5f5}
.verdict{font-size:20px;font-weight:700;margin:4px 0}
.v-high{color:#c62828}.v-moderate{color:#b26a00}.v-ok{color:#1b6b2f}
table{border-collapse:collapse;margin:6px 0}th,td{text-align:left;padding:3px 10px;vertical-align:top}
table.grid th,table.grid td{border-bottom:1px solid #e6e6e6}table.grid thead th{border-bottom:2px solid #ccc}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.total td,tr.total th{font-weight:700}.src,.muted{color:#666}
.share{position:relative}.share span{position:relative}
.share i{position:absolute;left:0;top:3px;bottom:3px;background:#dbe8f5;z-index:0}
table.figures th{white-space:nowrap;padding-left:0}
ol.recs li{margin:4px 0}code{background:#f2f2f2;padding:0 4px;border-radius:3px;font-size:13px}
figure{margin:14px 0 22px}figure svg{max-width:100%;height:auto;display:block}
figcaption{color:#555;font-size:13px;margin-top:2px}
p.empty{color:#666;font-style:italic}.err{color:#a4160b}
footer{margin:32px 0 8px;color:#888;font-size:12px}
"""


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{body}</section>'


def _header(s: Summary, title: str) -> str:
    dev = s.device
    status = f'<span class="badge s-{_e(s.status)}">{_e(s.status)}</span>'
    # (label, escaped value, wide): the device name is long, so it gets two grid columns
    fields = [
        ("scenario", _e(s.scenario or "run"), False),
        ("pipeline", _e(s.pipeline or "?"), False),
        ("batch", _e(s.batch_size or "?"), False),
        ("workers", _e(_num(s.workers, "{}")), False),
        ("device", _e(f"{dev.where} ({dev.name or '?'})"), True),
        ("status", status, False),
        ("run id", f"<code>{_e(s.run_id or '?')}</code>", False),
    ]
    wide_attr = ' class="wide"'
    dl = "".join(
        f'<div{wide_attr if wide else ""}><dt>{k}</dt><dd data-field="{k}">{v}</dd></div>' for k, v, wide in fields
    )
    out = f'<header id="header"><h1>{_e(title)}</h1><dl>{dl}</dl></header>'
    sim = simulated_line(s)
    if sim:
        out += f'<div id="simulated" class="banner sim" role="note">Device: {_e(sim)}</div>'
    if s.status != "complete":
        text = _STATUS_TEXT.get(s.status, f"Run status: {s.status}.")
        out += f'<div id="status-banner" class="banner" role="alert">{_e(text)}'
        if s.error:
            out += f"<br>Run stopped: {_e(s.error)}"
        out += "</div>"
    return out


def _verdict(s: Summary) -> str:
    cls = _VERDICT_CLASS.get(s.verdict, "")
    return _section(
        "verdict",
        "Verdict",
        f'<p class="verdict {cls}" data-verdict="{_e(s.verdict)}">{_e(s.verdict)}</p>'
        f"<p>stall {_e(_pct(s.stall_fraction))}: {_e(s.sources.stall_fraction)}; "
        "bands: &gt;=20% highly, &gt;=5% moderately input-bound.</p>",
    )


def _figures(s: Summary) -> str:
    body = "".join(f'<tr data-figure="{_e(k)}"><th>{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in figure_rows(s))
    terms = f'<p class="note" data-figure="terms">{_e(legend(s))}</p>'
    return _section("figures", "Figures", f'<table class="figures">{body}</table>{terms}')


def _breakdown(s: Summary) -> str:
    step = s.step_time_ms.mean
    rows = []
    for name, value in s.breakdown_ms_per_step.items():
        share = value / step if step and not math.isnan(step) and not math.isnan(value) else math.nan
        how = s.sources.part(name) or (
            "remainder: step time minus the phases above" if name == "other" else "host perf_counter"
        )
        bar = f'<i style="width:{min(100.0, share * 100):.1f}%"></i>' if math.isfinite(share) and share > 0 else ""
        rows.append(
            f'<tr data-part="{_e(name)}"><th>{_e(part_label(s, name))}</th>'
            f'<td class="num ms">{_e(_num(value, "{:.2f}"))}</td>'
            f'<td class="num share">{bar}<span>{_e(_pct(share))}</span></td><td class="src">{_e(how)}</td></tr>'
        )
    rows.append(
        f'<tr class="total" data-part="step"><th>step</th><td class="num ms">{_e(_num(step, "{:.2f}"))}</td>'
        f'<td class="num share">100%</td><td class="src">{_e(s.sources.step_time)}</td></tr>'
    )
    head = "<thead><tr><th>phase</th><th>ms/step</th><th>share</th><th>measured by</th></tr></thead>"
    return _section(
        "breakdown",
        breakdown_title(s),
        f'<table class="grid">{head}<tbody>{"".join(rows)}</tbody></table>',
    )


def _share_rows(items: Sequence[tuple[str, Estimate, str]]) -> str:
    return "".join(
        f'<tr data-part="{_e(name)}"><th>{_e(name)}</th><td class="num share">{_e(_pct(sh.fraction))}</td>'
        f'<td class="num">{_e(_pct(sh.low))}-{_e(_pct(sh.high))}</td><td class="num">{sh.samples}</td>'
        f'<td class="src">{_e(extra)}</td></tr>'
        for name, sh, extra in items
    )


def _sampled(s: Summary) -> str:
    """Figures estimated from py-spy samples: main-thread phases (zero-code runs) and the workers' CPU."""
    out = ""
    head = "<thead><tr><th>{}</th><th>share</th><th>95% interval</th><th>samples</th><th>{}</th></tr></thead>"
    est = s.stack_estimate.overall if s.stack_estimate else None
    if est and s.mode == "zero-code":
        rows = _share_rows([(p, est.phase(p), "") for p in STACK_PHASES])
        out += _section(
            "estimate",
            f"Main thread, estimated from {est.samples} py-spy samples",
            f'<table class="grid">{head.format("phase", "")}<tbody>{rows}</tbody></table>',
        )
    att = s.loader_attribution
    if att:
        rows = _share_rows(
            [
                (c, sh.share, ", ".join(f"{f.function} {f.of_category:.0%}" for f in sh.top[:3]))
                for c, sh in att.by_share()
            ]
        )
        line = f'<p class="headline">{_e(att.headline)}</p>' if att.headline else ""
        out += _section(
            "attribution",
            f"Loader workers' CPU ({att.workers} worker(s), {att.active} busy py-spy samples)",
            f'<table class="grid">{head.format("category", "top functions")}<tbody>{rows}</tbody></table>{line}',
        )
    return out


def _loader_time(s: Summary) -> str:
    """The loader processes' time (runs with workers): a row per process, % of wall time by part."""
    lt = s.loader_time
    if lt is None or lt.workers is None:
        return ""
    head = "".join(f"<th>{_e(label)}</th>" for _key, label in COLUMNS)
    rows = "".join(
        f'<tr data-process="{_e(p.label)}"><th>{_e(p.label)}</th>'
        + "".join(f"<td>{_e(cell(getattr(p, key)))}</td>" for key, _label in COLUMNS)
        + "</tr>"
        for p in (*lt.processes, lt.workers)
    )
    line = f'<p class="headline">{_e(lt.headline)}</p>' if lt.headline else ""
    line += f'<p data-figure="reads">{_e(reads_line(lt))}</p>' if lt.reads else ""
    return _section(
        "loader-time",
        "Where the loader processes' time goes (% of wall time; main: the training thread)",
        f'<table class="grid"><thead><tr><th>process</th>{head}</tr></thead><tbody>{rows}</tbody></table>{line}'
        f'<p class="note">{_e(KEY)}. Source: {_e(lt.method)}.</p>',
    )


def _stages(s: Summary) -> str:
    """The loader's stages: time per item, share, capacity; capacity against demand."""
    st = s.stages
    if st is None:
        return ""
    rows = "".join(
        f'<tr data-stage="{_e(x.name)}"><th>{_e(x.name)}{" (bottleneck)" if x.name == st.bottleneck else ""}</th>'
        f"<td>{_e(f'{x.ms_per_item:.2f}')}</td><td>{_e(_pct(x.share))}</td>"
        f"<td>{_e(rate(x.capacity_samples_per_s))}</td></tr>"
        for x in st.stages
    )
    if st.handoff_ms_per_item is not None:  # the workers' move of each batch to the training process: no stage
        rows += f'<tr data-stage="handoff"><th>hand-off (batch to training)</th><td>{st.handoff_ms_per_item:.2f}</td>'
        rows += "<td></td><td></td></tr>"
    head = "<th>stage</th><th>ms / item</th><th>share</th><th>capacity (samples/s)</th>"
    return _section(
        "stages",
        "Loader stages (per item, where they run)",
        f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
        f'<p class="headline">{_e(st.headline)}</p><p class="note">{_e(stages_caption(st, headline=False))}</p>',
    )


def _ray(s: Summary) -> str:
    """Ray Data's own stats per operator, and its iteration timers beside the loop's data wait (each labelled)."""
    if s.ray is None:
        return ""
    head = "".join(f"<th>{_e(c)}</th>" for c in RAY_COLUMNS)
    rows = "".join(
        f'<tr data-operator="{_e(r[0])}"><th>{_e(r[0])}</th>' + "".join(f"<td>{_e(c)}</td>" for c in r[1:]) + "</tr>"
        for r in ray_rows(s.ray)
    )
    headline, *rest = ray_lines(s.ray).split("\n")
    return _section(
        "ray",
        "Ray Data's own stats, per operator (Ray's figures, not stallscope's clock)",
        f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
        f'<p class="headline">{_e(headline)}</p>' + "".join(f'<p class="note">{_e(x)}</p>' for x in rest),
    )


def _headspace(s: Summary) -> str:
    """``run --headspace``: the loader alone before training against the training's demand."""
    h = s.headspace
    if h is None:
        return ""
    first, rest = headspace_text(h).split("\n", 1)
    return _section("headspace", "Headspace", f'<p class="headline">{_e(first)}</p><p class="note">{_e(rest)}</p>')


def _memory(s: Summary) -> str:
    """The loader processes' memory (runs with workers): USS, PSS, shared, growth per 1,000 items."""
    mem = s.memory
    if mem is None or len(mem.processes) < 2:
        return ""
    rows = "".join(
        f'<tr data-process="{_e(p.label)}"><th>{_e(p.label)}</th>'
        + "".join(f"<td>{_e(_num(v, '{:.0f}'))}</td>" for v in (p.uss_start_mb, p.uss_end_mb, p.pss_mean_mb))
        + f"<td>{_e(_num(p.growth_mb_per_1k_items, '{:.1f}'))}{' grows' if p.grows else ''}</td></tr>"
        for p in mem.processes
    )
    head = "<th>process</th><th>USS start</th><th>USS end</th><th>PSS mean</th><th>growth / 1,000 items</th>"
    line = "".join(f'<p class="headline">{_e(h)}</p>' for h in (mem.shm_headline, mem.headline) if h)
    return _section(
        "memory",
        "Loader memory (MiB)",
        f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{line}'
        f'<p class="note">Job (sum of PSS) peak {_e(_num(mem.total_pss_peak_mb, "{:.0f}"))} MiB; /dev/shm peak '
        f"{_e(_num(mem.shm_used_peak_mb, '{:.0f}'))} of {_e(_num(mem.shm_size_mb, '{:.0f}'))} MiB; "
        f"{_e(shm_line(mem))}. Source: {_e(mem.method)}.</p>",
    )


def _recommendations(s: Summary) -> str:
    if not s.recommendations:
        return _section("recommendations", "Recommendations", '<p class="empty">None: no measured steps.</p>')
    items = "".join(
        f'<li data-code="{_e(r.code)}"><code>{_e(r.code)}</code> {_e(r.text)}</li>' for r in s.recommendations
    )
    return _section("recommendations", "Recommendations", f'<ol class="recs">{items}</ol>')


def _sampler(s: Summary) -> str:
    sm = s.sampler
    lat = sm.lateness_ms
    missed = sm.missed_deadlines
    rows = [
        ("rate", f"{_num(sm.hz_achieved, '{:.1f}')} Hz achieved of {_num(sm.hz_requested, '{:g}')} Hz"),
        ("samples", f"{sm.samples} sampling rounds"),
        (
            "lateness",
            f"mean {_num(lat.mean, '{:.2f}')} ms  p95 {_num(lat.p95, '{:.2f}')} ms  "
            f"max {_num(lat.max, '{:.2f}')} ms after each deadline",
        ),
        ("read cost", f"{_num(sm.read_ms_mean, '{:.2f}')} ms per round (mean)"),
        ("missed deadlines", "n/a (written only at a clean close)" if missed is None else str(missed)),
    ]
    body = "".join(f'<tr data-figure="{_e(k)}"><th>{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in rows)
    src_rows = []
    errors = sm.errors
    last = sm.last_error
    for name in sorted(sm.sources):
        status = sm.status_at(name)
        n = errors.get(name, 0)
        src_rows.append(
            f'<tr data-source="{_e(name)}"><th>{_e(name)}</th><td>{_e(status)}</td><td class="num">{_e(n)}</td>'
            f'<td class="{"err" if n else "muted"}">{_e(last.get(name) or "")}</td></tr>'
        )
    sources = (
        '<table class="grid sources"><thead><tr><th>source</th><th>status</th><th>read errors</th>'
        f"<th>last error</th></tr></thead><tbody>{''.join(src_rows)}</tbody></table>"
        if src_rows
        else '<p class="empty">No metric source recorded its status.</p>'
    )
    return _section("sampler", "Sampler health", f'<table class="figures">{body}</table>{sources}')


def _notes(s: Summary) -> str:
    items = [f'<li class="err">Run stopped: {_e(s.error)}</li>'] if s.error else []
    items += [f"<li>{_e(n)}</li>" for n in s.notes]
    body = f"<ul>{''.join(items)}</ul>" if items else '<p class="empty">No errors or notes.</p>'
    return _section("notes", "Errors and notes", body)


def _rate(s: Summary) -> str:
    return f"sampled at {_num(s.sampler.hz_achieved, '{:.1f}', ' Hz')}"


def _plot_utilisation(s: Summary, tl: Timeline, warm: list[Band]) -> str:
    sim = " (simulated)" if s.device.simulated or s.nvml.simulated else ""
    lines = [
        Line(f"{g.label} utilization.gpu{sim}", g.t, g.values, _GPU_COLORS[i % len(_GPU_COLORS)])
        for i, g in enumerate(tl.gpu_util)
    ]
    stall_x = [x for b in tl.stall for x in (b.t_start, b.t_end)]
    stall_y = [y for b in tl.stall for y in (b.stall_fraction * 100,) * 2]
    if tl.stall:
        lines.append(Line(f"stall (per {tl.bucket_s:g} s)", stall_x, stall_y, _PART_COLORS["data_wait"]))
    if tl.host_cpu is not None:
        lines.append(Line("host CPU, all cores", tl.host_cpu.t, tl.host_cpu.values, "#555555", dashed=True))
    stall_how = s.sources.stall_fraction or "(data wait + h2d) / step time, host perf_counter"
    if tl.gpu_util and sim:
        gpu = (
            f"GPU utilisation: SIMULATED NVML utilization.gpu ({_rate(s)}): the simulated device's kernel-busy share "
            "of each completed sample period, as NVML defines it; no GPU was measured."
        )
    elif tl.gpu_util:
        gpu = f"GPU utilisation: NVML utilization.gpu ({_rate(s)}; the driver averages it over 1/6 s to 1 s)."
    else:
        gpu = "GPU utilisation: not shown: NVML read nothing (the sampler's sources below say why)."
    caption = (
        f"{gpu} Stall: {stall_how}, in each {tl.bucket_s:g} s bucket, from the step and phase records. "
        f"Host CPU: psutil system-wide CPU % (100% = every core busy), {_rate(s)}. Grey: warm-up steps."
    )
    return _figure(
        "plot-utilisation",
        "Utilisation and stall over time",
        lines,
        caption,
        lambda: line_chart(
            lines,
            title="Utilisation and stall over time",
            chart_id="svg-utilisation",
            x_label="time since run start (s)",
            y_label="percent (%)",
            x_range=(0.0, tl.duration_s),
            y_floor=100.0,
            bands=warm,
        ),
    )


def _plot_steps(tl: Timeline, *, simulated: bool = False) -> str:
    bars = tl.bars
    colors = iter(_EXTRA_COLORS)
    stacks = [Stack(p, [b.parts_ms[p] for b in bars], _PART_COLORS.get(p) or next(colors, "#777777")) for p in tl.parts]
    warm = [b for b in bars if b.warmup]
    bands = [Band(warm[0].first_step, warm[-1].last_step + 1, "warm-up (excluded from figures)")] if warm else []
    grouped = f" Each bar is the mean of {tl.bar_group} consecutive steps." if tl.bar_group > 1 else ""
    on = "on the simulated device, h2d host time spent under simulated compute (sim-events)"
    caption = (
        "Per-step time split, from the host perf_counter records: data_wait around next() on the loader, "
        "h2d and compute (and any own phases) around their phases"
        + (
            f"; {on if simulated else 'on CUDA, h2d host time spent under device compute (CUDA events)'} is counted "
            "as compute"
            if tl.on_cuda
            else ""
        )
        + ("; compute is the SIMULATED device's time" if simulated else "")
        + "; other is the remainder of the step. Warm-up steps are drawn pale on a grey band."
        + grouped
    )
    return _figure(
        "plot-steps",
        "Step time by part",
        bars,
        caption,
        lambda: stacked_bars(
            [float(b.first_step) for b in bars],
            [float(b.last_step + 1) for b in bars],
            stacks,
            title="Step time by part",
            chart_id="svg-steps",
            x_label="training step (index)",
            y_label="time per step (ms)",
            muted=[b.warmup for b in bars],
            bands=bands,
        ),
    )


def _plot_process_cpu(s: Summary, tl: Timeline, warm: list[Band]) -> str:
    procs: list[Series] = list(tl.process_cpu)
    lines = [Line(p.label, p.t, p.values, PALETTE[i % len(PALETTE)]) for i, p in enumerate(procs)]
    workers = [p.label for p in procs if p.label != "main"]
    who = (
        f"the training process (main) and each loader worker ({', '.join(workers)})"
        if workers
        else "the training process (main); no loader worker process was seen"
    )
    caption = f"psutil per-process CPU % of {who}, {_rate(s)}. 100% = one full core. Grey: warm-up steps."
    return _figure(
        "plot-process-cpu",
        "CPU per process over time",
        lines,
        caption,
        lambda: line_chart(
            lines,
            title="CPU per process over time",
            chart_id="svg-process-cpu",
            x_label="time since run start (s)",
            y_label="CPU (%, 100 = one core)",
            x_range=(0.0, tl.duration_s),
            y_floor=100.0,
            bands=warm,
        ),
    )


def _figure(fid: str, title: str, data: Sequence[object], caption: str, draw: Callable[[], str]) -> str:
    svg = draw() if data else '<p class="empty">No data recorded for this plot.</p>'
    return f'<figure id="{fid}"><h3>{_e(title)}</h3>{svg}<figcaption>{_e(caption)}</figcaption></figure>'


def _plots(s: Summary, tl: Timeline) -> str:
    warm = [Band(0.0, tl.warmup_end_s, "warm-up")] if tl.warmup_end_s is not None else []
    return _section(
        "plots",
        "Plots",
        _plot_utilisation(s, tl, warm) + _plot_steps(tl, simulated=s.device.simulated) + _plot_process_cpu(s, tl, warm),
    )


def _measured(measured: JSON | None, key: str) -> float:
    value = (measured or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def _ranks(job: ZeroCodeJob | None) -> str:
    """A zero-code job's ranks: each rank's estimated data wait, CPU and busiest loader frames."""
    if job is None:
        return ""
    steps = ("step_time_ms", "data_wait_ms", "throughput_samples_per_s") if job.measured else ()
    head = (
        "<thead><tr><th>rank</th><th>pid</th>"
        + ("<th>step ms</th><th>data wait ms</th><th>samples/s</th>" if steps else "")
        + "<th>data wait (estimated)</th><th>95% interval</th>"
        "<th>main-thread samples</th><th>verdict</th><th>main CPU</th><th>workers CPU</th>"
        "<th>top loader frames</th></tr></thead>"
    )
    rows = "".join(
        f'<tr data-rank="{r.rank}"><th>{r.rank}</th><td class="num">{r.pid}</td>'
        + "".join(f'<td class="num">{_e(_num(_measured(r.measured, k), "{:.1f}", ""))}</td>' for k in steps)
        + f'<td class="num">{_e(_pct(r.data_wait.fraction if r.data_wait else math.nan))}</td>'
        f'<td class="num">{_e(_pct(r.data_wait.low) + "-" + _pct(r.data_wait.high) if r.data_wait else "")}</td>'
        f'<td class="num">{r.estimate.overall.samples if r.estimate.overall else 0}</td><td>{_e(r.verdict)}</td>'
        f'<td class="num">{_e(_num(r.main_cpu_pct, "{:.0f}", "%"))}</td>'
        f'<td class="num">{_e(_num(r.workers_cpu_pct, "{:.0f}", "%"))} over {r.workers}</td>'
        f'<td class="src">{_e(", ".join(f"{f} {x:.0%}" for _c, f, x in r.top_loader_frames()))}</td></tr>'
        for r in job.ranks
    )
    evidence = job.straggler_evidence() or "No rank's data wait stands apart from the others' (intervals overlap)."
    return _section(
        "ranks",
        f"Ranks ({len(job.ranks)} of world size {job.world_size or '?'}), seen from outside",
        f'<table class="grid">{head}<tbody>{rows}</tbody></table><p>{_e(evidence)}</p>'
        f'<p class="muted">{_e(job.not_measured)}. CPU: psutil means, 100% = one core. The main-thread estimate and '
        "loader attribution above pool every rank; the host 'main' CPU is the launcher's.</p>",
    )


def render_html(
    summary: Summary, timeline: Timeline, *, title: str | None = None, job: ZeroCodeJob | None = None
) -> str:
    """The whole report as one HTML document (str); ``job``: a zero-code job's ranks (a section of their own)."""
    s = summary
    # a tab title that already says a run did not finish
    title = title or f"stallscope report: {s.scenario or 'run'}" + ("" if s.status == "complete" else f" [{s.status}]")
    body = (
        _header(s, title)
        + _verdict(s)
        + _figures(s)
        + ("" if s.mode == "zero-code" else _breakdown(s))
        + _ranks(job)
        + _sampled(s)
        + _loader_time(s)
        + _stages(s)
        + _ray(s)
        + _headspace(s)
        + _memory(s)
        + _recommendations(s)
        + _plots(s, timeline)
        + _sampler(s)
        + _notes(s)
        + "<footer>Written by stallscope from the run store alone. This file loads nothing from the network.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        # nothing may be fetched: no script, font, image or style from anywhere
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="stallscope"><title>{_e(title)}</title><style>{_CSS}</style></head>'
        f'<body class="status-{_e(s.status)}">{body}</body></html>\n'
    )


def _check_target(path: Path) -> None:
    if path.is_dir():
        raise ValueError(f"HTML report path '{path}' is a directory: give a file name such as '{path / 'report.html'}'")
    if not path.parent.is_dir():
        raise ValueError(f"cannot write HTML report '{path}': directory '{path.parent}' does not exist")


def write_html(summary: Summary, rec: RunRecord, path: str | os.PathLike[str]) -> Path:
    """Write the HTML report of ``summary`` (with the timeline of its run record ``rec``) to ``path``; returns
    ``path``.

    Raises ValueError when ``path`` is a directory or its directory is missing, OSError (message names the path)
    when it cannot be written. The file is written under a temporary name and renamed, so a failure never leaves
    half a report at ``path``.
    """
    target = Path(path)
    _check_target(target)
    return _write(render_html(summary, build_timeline(rec), job=zero_code_job(rec)), target)


def write_html_of(summary: Summary, timeline: Timeline, path: str | os.PathLike[str]) -> Path:
    """:func:`write_html` from a Timeline already built (the report cache's: profiler.runs.cache), for a run that is
    no zero-code job."""
    target = Path(path)
    _check_target(target)
    return _write(render_html(summary, timeline), target)


def _write(text: str, target: Path) -> Path:
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a report is meant to be shared like any document
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise OSError(f"cannot write HTML report '{target}': {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            # the rename did not happen; the temporary file is ours to remove, and its absence is fine
            Path(tmp).unlink(missing_ok=True)
    return target


# -- a multi-rank job ------------------------------------------------------------------------------------


def render_job_html(j: JobSummary) -> str:
    """The job report as one HTML document: header, verdict, the per-rank table (``id="ranks"``, a row per rank
    with ``data-rank``), the job figures and the notes. Same cells as the terminal report."""
    title = f"stallscope job report: {j.scenario or 'job'}" + ("" if j.status == "complete" else f" [{j.status}]")
    fields = [
        ("scenario", j.scenario or "job"),
        ("pipeline", j.pipeline or "?"),
        ("batch per rank", j.batch_size or "?"),
        ("workers per rank", _num(j.workers, "{}")),
        ("world size", f"{j.world_size} ({j.nnodes} node{'s' if j.nnodes != 1 else ''})"),
        ("job id", j.job_id or "?"),
    ]
    dl = "".join(f'<div><dt>{k}</dt><dd data-field="{k}">{_e(v)}</dd></div>' for k, v in fields)
    status = f'<span class="badge s-{_e(j.status)}">{_e(j.status)}</span>'
    head = f'<header id="header"><h1>{_e(title)}</h1><dl>{dl}<div><dt>status</dt><dd>{status}</dd></div></dl></header>'
    if j.simulated:
        head += (
            '<div id="simulated" class="banner sim" role="note">Device: SIMULATED (docs/sim.md): compute and sync '
            "are the simulated device&#x27;s times; the input pipeline and the ranks&#x27; waits ran for real</div>"
        )
    cls = "v-high" if j.verdict.startswith("input") else "v-ok"
    verdict = _section("verdict", "Verdict", f'<p class="verdict {cls}">{_e(j.verdict)}</p>')
    cols = "".join(f"<th>{_e(c)}</th>" for c in rank_columns(j))
    rows = "".join(
        f'<tr data-rank="{r.rank}">'
        + "".join(f'<td class="{"" if i == 2 else "num"}">{_e(c)}</td>' for i, c in enumerate(rank_cells(r)))
        + "</tr>"
        for r in j.ranks
    )
    table = _section(
        "ranks", "Per rank", f'<table class="grid"><thead><tr>{cols}</tr></thead><tbody>{rows}</tbody></table>'
    )
    lines = "".join(f'<tr data-figure="{_e(k)}"><th>{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in job_lines(j))
    figures = _section("figures", "Job figures", f'<table class="figures">{lines}</table>')
    notes = (
        _section("notes", "Notes", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in j.notes) + "</ul>") if j.notes else ""
    )
    body = (
        head
        + verdict
        + table
        + figures
        + notes
        + "<footer>Written by stallscope from the job&#x27;s stores alone.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="stallscope"><title>{_e(title)}</title><style>{_CSS}</style></head>'
        f'<body class="status-{_e(j.status)}">{body}</body></html>\n'
    )


def write_job_html(j: JobSummary, path: str | os.PathLike[str]) -> Path:
    """Write the job's HTML report to ``path`` (the same checks and atomic write as :func:`write_html`)."""
    target = Path(path)
    _check_target(target)
    return _write(render_job_html(j), target)
