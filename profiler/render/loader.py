"""The loader processes' time as a table: a row per process, % of its wall time on a CPU, waiting for one, and
blocked on each kind of wait. Formats the Summary's ``loader_time``; computes nothing."""

from __future__ import annotations

import math

from rich.table import Table

from profiler.analysis.loader_time import LoaderTime, ProcessTime
from profiler.analysis.memory import LoaderMemory
from profiler.analysis.ray_view import RayView
from profiler.analysis.stages import Headspace, LoaderStages, rate_text, times_text

COLUMNS = (
    ("cpu", "CPU"),
    ("runq", "runq"),
    ("storage", "storage"),
    ("network", "network"),
    ("queue", "work"),
    ("sleep", "sleep"),
    ("lock", "lock"),
    ("other", "other"),
)
KEY = (
    "CPU: on a CPU; runq: runnable, waiting for a CPU; blocked in: storage (a read of a file, disk I/O), network "
    "(a socket), work (waiting for the next indices: the loader is ahead), sleep, lock (a lock or a thread), other"
)


def cell(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.0f}%"


def reads_line(lt: LoaderTime) -> str:
    """The loader processes' reads in words ("" where they were not measured)."""
    r = lt.reads
    if r is None:
        return ""
    per = "" if math.isnan(r.storage_bytes_per_sample) else f" ({r.storage_bytes_per_sample / 1024:.1f} KiB per sample)"
    return (
        f"Reads: {r.read_mbps:.2f} MB/s through read calls, {r.storage_mbps:.2f} MB/s from storage{per}; "
        "source: /proc/PID/io rchar and read_bytes"
    )


def _name(p: ProcessTime) -> str:
    return {"main": "main", "workers": "mean"}.get(p.label, p.label)


def loader_time_table(lt: LoaderTime) -> Table:
    t = Table(
        title="Where the loader processes' time goes (% of wall time; main: the training thread)", title_justify="left"
    )
    t.add_column("process")
    for _key, label in COLUMNS:
        t.add_column(label, justify="right")
    rows = list(lt.processes) + ([lt.workers] if lt.workers is not None and len(lt.processes) > 2 else [])
    for p in rows:
        t.add_row(_name(p), *(cell(getattr(p, key)) for key, _ in COLUMNS))
    reads = reads_line(lt)
    t.caption = (
        (lt.headline + "\n" if lt.headline else "") + (reads + "\n" if reads else "") + f"{KEY}\nsource: {lt.method}"
    )
    t.caption_justify = "left"
    return t


def _mib(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.0f}"


def memory_table(mem: LoaderMemory) -> Table:
    t = Table(
        title="Loader memory (MiB; USS private, PSS shared pages divided among their processes)", title_justify="left"
    )
    for name in ("process", "USS start", "USS end", "PSS mean", "shared mean", "growth / 1,000 items"):
        t.add_column(name, justify="left" if name == "process" else "right")
    for p in mem.processes:
        growth = "n/a" if math.isnan(p.growth_mb_per_1k_items) else f"{p.growth_mb_per_1k_items:.1f}"
        t.add_row(
            p.label,
            _mib(p.uss_start_mb),
            _mib(p.uss_end_mb),
            _mib(p.pss_mean_mb),
            _mib(p.shared_mean_mb),
            growth + (" grows" if p.grows else ""),
        )
    shm = f"/dev/shm peak {_mib(mem.shm_used_peak_mb)} of {_mib(mem.shm_size_mb)} MiB"
    host = f"host available {_mib(mem.host_available_mb)} MiB"
    lines = [f"job (sum of PSS) peak {_mib(mem.total_pss_peak_mb)} MiB; {shm}; {host}", shm_line(mem)]
    lines[:0] = [h for h in (mem.shm_headline, mem.headline) if h]
    t.caption = "\n".join([*lines, f"source: {mem.method}"])
    t.caption_justify = "left"
    return t


def shm_line(mem: LoaderMemory) -> str:
    """The loader's shared memory: its batches in flight as measured, the need as predicted, the free segment."""
    need = mem.shm_need
    predicted = (
        f"; PREDICTED need {need.need_mb:.0f} MiB ({need.batches} batches of {need.batch_mb:.1f} MiB: {need.rule})"
        if need is not None
        else ""
    )
    line = (
        f"shared memory: the job's /dev/shm files peak {_mib(mem.shm_job_peak_mb)} MiB measured{predicted}; "
        f"{_mib(mem.shm_free_start_mb)} MiB free at the start"
    )
    if not math.isnan(mem.pin_cpu_pct) or not math.isnan(mem.pinned_peak_mb):
        cpu = "n/a" if math.isnan(mem.pin_cpu_pct) else f"{mem.pin_cpu_pct:.0f}% of a core"
        line += f"\npin memory: the pin-memory thread {cpu}; pinned {_mib(mem.pinned_peak_mb)} MiB at the peak"
    return line


def rate(v: float) -> str:
    return rate_text(v)


def stages_caption(st: LoaderStages, *, headline: bool = True) -> str:
    """Capacity against demand in words, and the method (after the headline unless ``headline=False``: the HTML
    prints the headline apart)."""
    where = st.where or (f"on {st.runners}" if st.runners else f"in {st.processes} loader process(es)")
    capacity = (
        "no capacity"
        if math.isnan(st.capacity_samples_per_s)
        else f"capacity {rate(st.capacity_samples_per_s)} samples/s {where}, {st.capacity_basis}"
    )
    return (
        (f"{st.headline}\n" if headline else "")
        + (f"{st.coverage_line}\n" if st.coverage_line else "")
        + f"{capacity}; demand "
        f"{rate(st.demand_samples_per_s)} samples/s (the batch / the step time without the data wait)\n"
        f"source: {st.method}"
    )


def stages_table(st: LoaderStages) -> Table:
    t = Table(title="Loader stages (per item, where they run)", title_justify="left")
    for name in ("stage", "ms / item", "share", "capacity (samples/s)"):
        t.add_column(name, justify="left" if name == "stage" else "right")
    for stage in st.stages:
        mark = "  <- bottleneck" if stage.name == st.bottleneck else ""
        share = "n/a" if math.isnan(stage.share) else f"{stage.share:.0%}"
        t.add_row(stage.name + mark, f"{stage.ms_per_item:.2f}", share, rate(stage.capacity_samples_per_s))
    if st.handoff_ms_per_item is not None:  # the workers' move of each batch to the training process: no stage
        t.add_row("hand-off (batch to training)", f"{st.handoff_ms_per_item:.2f}", "", "")
    if st.uncovered and not math.isnan(st.untimed_ms_per_item):
        t.add_row("untimed (in no stage)", f"{st.untimed_ms_per_item:.2f}", "", "")
    t.caption = stages_caption(st)
    t.caption_justify = "left"
    return t


def headspace_text(h: Headspace) -> str:
    """``run --headspace`` in words: the headline, the three rates and the method."""
    return (
        f"Headspace: {h.headline}\nalone {rate(h.alone_samples_per_s)} samples/s ({h.batches} batches in "
        f"{h.seconds:.1f} s); the training's demand {rate(h.demand_samples_per_s)} samples/s (the batch / the step "
        f"time without the data wait); delivered beside the training {rate(h.delivered_samples_per_s)} samples/s; "
        f"headspace {times_text(h.headspace)}\nsource: {h.method}"
    )


RAY_COLUMNS = ("operator", "wall s", "CPU s", "rows", "tasks", "CPU ms / row", "backpressure s")


def _secs(v: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(v) else f"{v:.{digits}f}"


def ray_rows(view: RayView) -> list[tuple[str, ...]]:
    """The view's operator rows as text cells, in RAY_COLUMNS' order (the text and the HTML report share them);
    backpressure: the executor's launch backpressure, then its output backpressure after a slash."""
    return [
        (
            op.name,
            _secs(op.wall_s),
            _secs(op.cpu_s),
            _secs(op.rows, 0),
            str(op.tasks),
            _secs(op.cpu_ms_per_row),
            f"{_secs(op.backpressure_s)} / {_secs(op.output_backpressure_s)}",
        )
        for op in view.operators
    ]


def ray_lines(view: RayView) -> str:
    """The iteration's timers (Ray's) beside the loop's own data wait (stallscope's), and the method."""
    first = "n/a" if math.isnan(view.first_batch_s) else f"{view.first_batch_s * 1e3:.0f} ms"
    blocked = "n/a" if math.isnan(view.blocked_s) else f"{view.blocked_s:.2f} s"
    production = "n/a" if math.isnan(view.production_wait_s) else f"{view.production_wait_s:.2f} s"
    per_batch = "n/a" if math.isnan(view.blocked_ms_per_batch) else f"{view.blocked_ms_per_batch:.1f} ms"
    wait = "n/a" if math.isnan(view.loop_data_wait_ms) else f"{view.loop_data_wait_ms:.1f} ms"
    epoch = "n/a" if math.isnan(view.loop_epoch_wait_ms) else f"{view.loop_epoch_wait_ms:.1f} ms"
    return (
        f"{view.headline}\n"
        f"Ray's: the training thread blocked {blocked} in iter_batches over {view.batches} batches ({production} "
        f"of it on production; the first batch {first}), {per_batch} a batch after the first; MEASURED by "
        f"stallscope: {epoch} of data wait a step over the same batches, {wait} over the {view.steps} measured "
        "steps\n"
        f"backpressure: the executor's wall seconds launching none of the operator's tasks / reading none of its "
        f"outputs\nsource: {view.method}"
    )


def ray_table(view: RayView) -> Table:
    t = Table(title="Ray Data's own stats, per operator (Ray's figures, not stallscope's clock)", title_justify="left")
    for name in RAY_COLUMNS:
        t.add_column(name, justify="left" if name == "operator" else "right")
    for row in ray_rows(view):
        t.add_row(*row)
    t.caption = ray_lines(view)
    t.caption_justify = "left"
    return t
