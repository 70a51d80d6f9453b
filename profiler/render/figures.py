"""The summary's headline figures as (label, text) rows, formatted once for every renderer.

The terminal report and the HTML report print the same digits and the same source labels because both take
their rows from here. No rich, no HTML: plain strings. A simulated accelerator's figures (device busy, device
time, NVML) say "simulated" in their row, and :func:`simulated_line` is the line both put near the top.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from pathlib import Path

from profiler.analysis import Summary
from profiler.analysis.apart import WindowsApart
from profiler.analysis.parts import BadSamples, Cost, HostFigures, nvml_source
from profiler.jobs.analysis import JobSummary, RankRow


def num(x: object, fmt: str = "{:.1f}", unit: str = "") -> str:
    """A figure, or "n/a" when it was not measured (None or NaN): never a made-up zero."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return fmt.format(x) + unit


def pct(x: float | None) -> str:
    return num(None if x is None else x * 100, "{:.1f}", "%")


def simulated_line(s: Summary) -> str | None:
    """``NAME (SIMULATED: sim:..., ...)`` for a run on a simulated accelerator; None for a real device."""
    dev = s.device
    if not dev.simulated:
        return None
    name = dev.sim.get("full_name") or dev.name or dev.where
    return (
        f"{name} (SIMULATED: {dev.sim_label} — device times are predicted by the model in docs/sim.md, "
        "the input pipeline ran for real)"
    )


def _startup_words(s: Summary) -> str:
    """The loader's start-up steps held out beyond the warm-up (analysis.apart), in words ("" where none)."""
    more = (s.ray.startup_steps if s.ray is not None else 0) - s.warmup_steps
    return f" and {more} more of Ray's start-up" if more > 0 else ""


def breakdown_title(s: Summary) -> str:
    sim = "; compute runs on the SIMULATED device" if s.device.simulated else ""
    return f"Per-step breakdown (measured steps, mean{sim})"


def part_label(s: Summary, part: str) -> str:
    """A breakdown part's name as shown: a simulated device's compute says so."""
    return f"{part} (simulated)" if part == "compute" and s.device.simulated else part


def figure_rows(s: Summary) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    timed = s.mode != "zero-code"  # a run seen from outside has no steps to time
    if timed:
        st = s.step_time_ms
        rows.append(
            (
                "prep rate" if s.loader_only else "throughput",
                num(s.throughput_samples_per_s, "{:.1f}", " samples/s")
                + f"  ({s.samples_measured} samples in {num(s.measured_s, '{:.1f}', ' s')}, "
                f"{s.steps} steps after {s.warmup_steps} warm-up{_startup_words(s)})",
            )
        )
        rows.append(
            (
                "step time",
                f"mean {num(st.mean, '{:.1f}')} ms  p50 {num(st.p50, '{:.1f}')} ms  p90 {num(st.p90, '{:.1f}')} ms",
            )
        )
    if s.cost:
        rows.append(_cost_row(s.cost))
    if s.model and s.model != "default":
        rows.append(("model", s.model + ("  (not run: --loader-only)" if s.loader_only else "")))
    if s.synthetic_input:
        rows.append(("input", "SYNTHETIC: the loader's first batch, on the device, every step (--synthetic-input)"))
    if s.augment:
        rows.append(("augment", s.augment))
    if s.precision:
        rows.append(("precision", precision_text(s.precision)))
    if s.bad_samples and (s.bad_samples.skipped or s.bad_samples.policy == "skip"):
        rows.append(_bad_samples_row(s.bad_samples))
    rows.append(("stall fraction", f"{pct(s.stall_fraction)}  {s.sources.stall_fraction}"))
    sim = s.device.simulated
    if timed:
        label = "  (simulated, sim-events)" if sim and s.gpu is None else ""
        rows.append(("device busy", f"{pct(s.device_busy_fraction)}{label}  {s.sources.device_busy_fraction}"))
    if s.gpu is not None:
        rows.extend(gpu_rows(s))
    if s.gpu_coarse is not None:
        d = s.gpu_coarse.to_dict()
        fr = d["fractions"]
        assert isinstance(fr, dict)
        parts = "  ".join(f"{k.replace('_', ' ')} {pct(v)}" for k, v in fr.items())
        rows.append(("GPU time (coarse)", f"{parts}  ({d['source']}; no kernel window measured a step)"))
    if s.mfu is not None:
        rows.append(mfu_row(s))
    if s.device_ms_per_step:
        times = "  ".join(f"{k} {num(v, '{:.2f}')} ms" for k, v in s.device_ms_per_step.items())
        rows.append(("device time", times + ("  (simulated, sim-events)" if sim else "  (CUDA events)")))
    if s.command_exit_code is not None:
        rows.append(("command", command_end(s.command_exit_code)))
    if s.loader is not None:
        rows.append(("DataLoader", loader_text(s.loader)))
    rows.extend(_nvml_rows(s))
    rows.extend(_host_rows(s.host))
    if s.contention is not None:
        rows.append(("CPU contention", contention_text(s)))
    return rows


TERMS = {
    "pNN": "p50 / p90 / p95: the value half / 90% / 95% of the steps (or samples) stay under",
    "USS/PSS": "USS: memory only that process holds; PSS: USS plus its share of the pages it shares with others",
    "headroom": "headroom: what the loader could deliver / what the training takes (above 1: it keeps up)",
    "schedstat": "schedstat: the kernel's count of the time a thread was runnable but not on a CPU",
}
METRICS_DOC = "docs/metrics.md"


def legend(s: Summary) -> str:
    """One line naming the report's terms that are not plain words, with the page that defines every figure."""
    terms = [TERMS["pNN"]]
    if s.memory is not None and len(s.memory.processes) > 1:
        terms.append(TERMS["USS/PSS"])
    if s.stages is not None:
        terms.append(TERMS["headroom"])
    if s.contention is not None and s.contention.available:
        terms.append(TERMS["schedstat"])
    return f"Terms: {'; '.join(terms)}. Every term and figure is defined in {METRICS_DOC}#terms"


def sampler_text(s: Summary) -> str:
    """The sampler's own health in plain words: its rate, how late its samples were, what reading cost."""
    sm = s.sampler
    lat = sm.lateness_ms
    return (
        f"{num(sm.hz_achieved, '{:.1f}')} Hz achieved of {num(sm.hz_requested, '{:g}')} asked, {sm.samples} samples; "
        f"a sample came {num(lat.p95, '{:.2f}')} ms late or less (p95), {num(lat.max, '{:.2f}')} ms at most; "
        f"reading the sources took {num(sm.read_ms_mean, '{:.2f}')} ms a sample; "
        f"deadlines missed: {num(sm.missed_deadlines, '{}')}"
    )


def loader_text(loader: Mapping[str, object]) -> str:
    """``train.py:86  DataLoader(batch_size=32, num_workers=0, ...)``: the call as the script made it."""
    args = loader.get("args")
    knobs = ", ".join(f"{k}={v}" for k, v in args.items()) if isinstance(args, dict) else ""
    return f"{loader.get('site')}  {loader.get('kind') or 'DataLoader'}({knobs})  (timed by the start-up module)"


def _nvml_rows(s: Summary) -> list[tuple[str, str]]:
    utils = s.nvml.util_pct
    sim = s.device.simulated or s.nvml.simulated
    if not utils:
        if sim:
            return [("NVML util", f"n/a (simulated NVML: {s.device.nvml})")]
        if s.device.kind not in ("cuda", "sim"):
            return []  # no GPU in the run: why NVML read nothing is said once, in the sampler's sources
        return [("NVML util", f"n/a (the {nvml_source(s.device.kind)} source read nothing: see Sampler below)")]
    line = "  ".join(f"{gpu} {num(v, '{:.0f}')}%" for gpu, v in utils.items())
    if s.device.nvml.startswith("lost"):
        # the figures above it cover the run until then; say when NVML stopped and why
        stopped = [("NVML stopped", s.sampler.status_at(nvml_source(s.device.kind)).removeprefix("lost "))]
    else:
        stopped = []
    if not sim:
        rows = [("NVML util", line + "  (utilization.gpu, driver-averaged: hides sub-second stalls)"), *stopped]
        return rows + _activity_rows(s)
    how = "  (simulated; utilization.gpu as NVML defines it, over each sample period)"
    rows = [("NVML util", line + how), *stopped]
    by = s.nvml.by_metric
    for gpu in utils:
        used, total = by.get(f"{gpu}.mem_used_mb", math.nan), by.get(f"{gpu}.mem_total_mb", math.nan)
        power = by.get(f"{gpu}.power_w", math.nan)
        rows.append(
            (
                f"NVML {gpu}",
                f"memory max {num(used, '{:.0f}')} of {num(total, '{:.0f}', ' MiB')}  power mean "
                f"{num(power, '{:.0f}', ' W')}  (simulated; power is an estimate, linear in utilisation)",
            )
        )
    return rows


_ACTIVITY = {"graphics": "graphics", "sm_active": "SM active", "sm_occupancy": "SM occupancy", "tensor": "tensor",
             "dram_bw": "DRAM bandwidth", "util_samples": "busy (the driver's samples)"}  # fmt: skip


def _activity_rows(s: Summary) -> list[tuple[str, str]]:
    """The GPU's own counters (NVML GPM, or the driver's samples), means over the measured window."""
    rows = []
    for gpu, figures in s.nvml.activity().items():
        parts = "  ".join(f"{label} {num(figures[k], '{:.0f}')}%" for k, label in _ACTIVITY.items() if k in figures)
        how = "NVML GPM, over intervals of 100 ms or more" if "graphics" in figures else "nvmlDeviceGetSamples"
        rows.append((f"GPU {gpu}", f"{parts}  ({how}, read from outside the process)"))
    return rows


def contention_text(s: Summary) -> str:
    """The training thread's run-queue wait in compute, then the sampled process and worker figures."""
    c = s.contention
    if c is None:
        return "not measured (no figures)"
    if c.available:
        text = (
            f"training thread waited for a CPU {pct(c.compute_runq_fraction)} of compute time "
            f"({num(c.runq_ms_per_step.get('compute'), '{:.1f}')} ms/step; schedstat at each phase's start and end)"
        )
    else:
        text = f"not measured ({c.reason})"
    sampled = []
    if not math.isnan(c.process_runq_pct):
        sampled.append(f"process {num(c.process_runq_pct, '{:.0f}')}%")
    if not math.isnan(c.workers_runq_pct):
        sampled.append(f"workers {num(c.workers_runq_pct, '{:.0f}')}% over {len(c.per_worker_runq_pct)}")
    if sampled:
        text += "  waiting: " + ", ".join(sampled) + " (sampled; 100% = one core)"
    return text


def _cost_row(c: Cost) -> tuple[str, str]:
    epoch = f", {num(c.per_epoch, '{:.4f}')} per epoch of {c.epoch_samples} samples" if c.epoch_samples else ""
    return (
        "cost",
        f"{num(c.per_1k_samples, '{:.4f}')} per 1,000 samples{epoch}  "
        f"(at {c.price_per_hour:g}/hour and the measured throughput)",
    )


def _bad_samples_row(b: BadSamples) -> tuple[str, str]:
    shown = b.files[:5]
    # class directory and file name: enough to find it under --data, short enough not to be cut
    listed = "; ".join(f"{'/'.join(Path(f.path).parts[-2:])} ({f.reason})" for f in shown)
    more = f" and {b.skipped - len(shown)} more" if b.skipped > len(shown) else ""
    return "bad samples", f"{b.skipped} skipped (--on-bad-sample {b.policy})" + (f": {listed}{more}" if listed else "")


def _host_rows(h: HostFigures) -> list[tuple[str, str]]:
    if not h.measured:
        return [("host CPU", "n/a (no host samples)")]
    workers = h.worker_cpu_pct
    line = f"main {num(h.main_cpu_pct, '{:.0f}')}%"
    if workers:
        line += f"  workers {num(h.children_cpu_pct, '{:.0f}')}% over {len(workers)}"
    line += f"  (psutil; 100% = one core)  system {num(h.sys_cpu_pct, '{:.0f}')}% of all cores"
    return [("host CPU", line), ("host RSS", f"max {num(h.total_rss_mb_max, '{:.0f}', ' MiB')} (main + workers)")]


# -- a multi-rank job (terminal and HTML print the same cells) ----------------------------------------


def rank_cells(r: RankRow) -> list[str]:
    """The table row of one rank, as text (shared with the HTML report)."""
    return [
        str(r.rank),
        num(r.node_rank, "{}"),
        r.status,
        num(r.figure("throughput"), "{:.1f}"),
        pct(r.figure("stall")),
        num(r.data_wait_ms[0], "{:.1f}"),
        num(r.data_wait_ms[1], "{:.1f}"),
        num(r.figure("sync"), "{:.1f}"),
        num(r.cpu_pct, "{:.0f}", "%"),
    ]


def rank_columns(j: JobSummary) -> list[str]:
    sim = " (simulated)" if j.simulated else ""
    return [
        "rank",
        "node",
        "status",
        "samples/s",
        "stall",
        "data wait p50 ms",
        "p90 ms",
        f"sync ms/step{sim}",
        "CPU (rank + workers)",
    ]


def job_lines(j: JobSummary) -> list[tuple[str, str]]:
    """(label, text) lines under the table: throughput, step, scaling, straggler, verdict, first failure."""
    measured = len(j.measured_ranks)
    st = j.step_time_ms
    out = [
        (
            "job throughput",
            f"{num(j.throughput_samples_per_s, '{:.1f}', ' samples/s')}  (sum over {measured} measured rank"
            f"{'s' if measured != 1 else ''})",
        ),
        (
            "step time",
            f"mean {num(st.mean, '{:.1f}')} ms  p50 {num(st.p50, '{:.1f}')} ms  p90 {num(st.p90, '{:.1f}')} ms"
            + (f"  (slowest rank: {j.slowest_rank})" if j.slowest_rank is not None else ""),
        ),
    ]
    sc = j.scaling
    if sc is not None:
        out.append(
            (
                "scaling efficiency",
                f"{pct(sc.ratio)}  ({sc.job_throughput:.1f} samples/s / ({sc.world_size} x "
                f"{sc.baseline_throughput:.1f} samples/s of the baseline {sc.baseline_run}))",
            )
        )
    else:
        out.append(("scaling efficiency", "n/a (no baseline: give --baseline RUN_DIR, e.g. a --nproc 1 run)"))
    s = j.straggler
    out.append(("straggler", s.evidence if s else f"none named ({j.straggler_rule})"))
    f = j.first_failure
    if f is not None:
        node = f" on node {f.node_rank}" if f.node_rank is not None else ""
        out.append(("first failure", f"rank {f.rank}{node} {f.describe()} after the job started"))
    return out


def precision_text(p: Mapping[str, object]) -> str:
    """What the training computed in, as the run recorded it (profiler.drivers.precision)."""
    parts = [str(p.get("precision"))]
    if p.get("autocast"):
        parts.append(f"autocast {p['autocast']}" + (" with a GradScaler" if p.get("grad_scaler") else ""))
    if "cudnn_tf32" in p:
        on = {True: "on", False: "off"}
        parts.append(f"TF32 convolutions {on[bool(p['cudnn_tf32'])]}, matmuls {on[bool(p.get('matmul_tf32'))]}")
    if p.get("channels_last"):
        parts.append("channels_last")
    if p.get("sim_precision"):
        parts.append(f"on the simulated device: {p['sim_precision']}")
    if p.get("channels_last_note"):
        parts.append(f"({p['channels_last_note']})")
    return "  ".join(parts) + "  (run --precision)"


def mfu_row(s: Summary) -> tuple[str, str]:
    """MFU and the achieved TFLOP/s (analysis.mfu), with where the FLOPs and the peak come from."""
    m = s.mfu
    assert m is not None
    d = m.to_dict()
    kernel = d["achieved_tflops_over_kernel_time"]
    text = (
        f"{pct(m.mfu)}  ({num(m.tflops_step, '{:.2f}')} TFLOP/s over step time"
        + (f", {num(m.tflops_kernel, '{:.2f}')} over kernel time" if kernel is not None else "")
        + f", of {num(m.peak_tflops, '{:.1f}')} peak: {m.peak_of}; {m.flops_per_step / 1e9:.2f} GFLOP a step "
        f"{m.flops_source})"
    )
    return ("MFU" + (" (simulated)" if m.simulated else ""), text)


def gpu_rows(s: Summary) -> list[tuple[str, str]]:
    """The kernel windows' split of the device's time (analysis.gpu), and the steps they held, recorded apart
    (analysis.apart): the figures as computed, in words."""
    g, held = s.gpu, s.kernel_windows
    apart = [] if held is None else [("held apart", _held_text(held))]
    if g is None:
        return apart
    d = g.to_dict()
    fr, ms = d["fractions"], d["ms_per_step"]
    assert isinstance(fr, dict) and isinstance(ms, dict)
    parts = "  ".join(
        f"{k} {pct(fr[k])} ({num(ms[k], '{:.1f}')} ms)" for k in ("busy", "input", "host", "sync", "short")
    )
    how = "SIMULATED kernels of the simulated device" if g.simulated else "CUPTI kernel activity (torch.profiler)"
    cost = (
        f"{len(g.steps)} steps in {g.windows} window(s), {num(g.kernels_per_step, '{:.0f}')} launches a step; the "
        f"windows cost the training thread {g.window_cost_s * 1e3:.1f} ms; a window step took "
        f"{num(g.window_step_ms, '{:.1f}')} ms (median) against {num(g.other_step_ms, '{:.1f}')} ms outside"
    )
    return [("GPU time", f"{parts}  ({how}: per step, by why the device idled)"), ("kernel windows", cost), *apart]


def _held_text(w: WindowsApart) -> str:
    return (
        f"{w.steps} step(s) in or beside {w.windows} kernel window(s) recorded apart, left out of every figure "
        f"above: {w.wall_s:.2f} s of wall time ({w.cost_s * 1e3:.0f} ms of it opening and closing the windows), "
        f"{num(w.added_s, '{:.2f}')} s more than as many measured steps; a held step took "
        f"{num(w.step_ms, '{:.1f}')} ms (median) against {num(w.other_step_ms, '{:.1f}')} ms measured"
    )


def command_end(code: int | None) -> str:
    """How a profiled command ended, as a shell shows it: ``exited with code 2``, or for a process ended by a
    signal (Python's -2) ``was ended by SIGINT (exit status 130)``."""
    if code is None or code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was ended by {name} (exit status {128 - code})"
