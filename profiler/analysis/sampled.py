"""Figures estimated from py-spy stack samples stored with a run: main-thread phase fractions and the
loader workers' CPU attribution, as the Summary's typed parts (:mod:`profiler.analysis.parts`).

Pure: the stacks text and the facts needed to read it (rate, root pid, copy sites) come from the
RunRecord. Every fraction carries its sample count and a Wilson 95% interval, because a sampled figure is
an estimate and says how good one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from profiler.analysis.attribution import (
    CATEGORIES,
    PHASES,
    PhaseEstimate,
    PhaseFractions,
    Share,
    WorkerAttribution,
    attribute_workers,
    classify_main,
    classify_main_sample,
    headline,
    share,
)
from profiler.analysis.meta import objects
from profiler.analysis.parts import (
    CategoryShare,
    Estimate,
    LoaderAttribution,
    PhaseShares,
    StackEstimate,
    StackParse,
    StackWindow,
    TopFunction,
)
from profiler.analysis.stacks import (
    Frame,
    StackSample,
    chunk_by_order,
    file_matches,
    identify,
    parse_collapsed_stats,
    parse_speedscope_stats,
)
from profiler.core.store import RunRecord

WINDOW_S = 5.0
MIN_SAMPLES = 30  # below this an estimate is reported but not used for a verdict
MAX_PYSPY_RATE = 1000  # the highest --pyspy-rate stallscope accepts (core.sampling.pyspy.MAX_RATE)


def _share(s: Share) -> Estimate:
    return Estimate(s.fraction, s.low, s.high, s.count)


def _fractions(p: PhaseFractions) -> PhaseShares:
    data_wait, h2d, compute, other = (_share(p.shares[k]) for k in PHASES)
    return PhaseShares(p.n, p.seconds, data_wait, h2d, compute, other)


def parse_stacks(text: str) -> tuple[list[StackSample], StackParse]:
    """Either py-spy format (speedscope JSON or raw collapsed) -> samples and parse statistics."""
    is_json = text.lstrip().startswith("{")
    samples, st = parse_speedscope_stats(text) if is_json else parse_collapsed_stats(text)
    stats = StackParse(
        format="speedscope" if is_json else "raw",
        records=st.records,
        samples=st.samples,
        bad_records=st.bad_records,
        truncated=st.truncated,
        error=st.error,
    )
    return samples, stats


@dataclass(frozen=True, slots=True)
class RankStacks:
    """One rank's figures from the stacks of its process and the processes under it (its loader workers)."""

    rank: int
    pid: int
    estimate: StackEstimate
    attribution: LoaderAttribution | None


@dataclass(frozen=True, slots=True)
class _Parsed:
    samples: list[StackSample]
    stats: StackParse
    rate: float
    root_pid: int | None
    sites: list[tuple[str, int]]
    scheduling: str | None  # what py-spy ran under (meta ``pyspy_scheduling``; None in runs made before it)
    nonblocking: bool  # py-spy read the stacks without pausing the process (runs made before 2026-11-24)
    sampling: tuple[str, ...]  # notes on how py-spy sampled (:func:`sampling_notes`)


def _parsed(rec: RunRecord) -> _Parsed:
    meta = rec.meta
    root = meta.get("target_pid") or meta.get("pid")
    samples, stats = parse_stacks(rec.stacks_text or "")
    return _Parsed(
        samples,
        stats,
        _rate(meta),
        int(root) if isinstance(root, int) else None,
        [(str(f), int(ln)) for f, ln in meta.get("h2d_sites") or []],
        str(meta["pyspy_scheduling"]) if meta.get("pyspy_scheduling") else None,
        _nonblocking(meta.get("pyspy_args")),
        tuple(sampling_notes(meta)),
    )


def _nonblocking(args: object) -> bool:
    return isinstance(args, list) and "--nonblocking" in args


def rank_pids(meta: Mapping[str, object]) -> list[tuple[int, int]]:
    """(rank, pid) of every rank process a zero-code run found under its target (meta ``ranks``), by rank."""
    out = []
    for r in objects(meta.get("ranks")):
        rank, pid = r.get("rank"), r.get("pid")
        if isinstance(rank, int) and isinstance(pid, int):
            out.append((int(rank), int(pid)))
    return sorted(out)


def of_process(samples: list[StackSample], pid: int) -> list[StackSample]:
    """The samples of process ``pid`` and of every process py-spy saw under it."""
    return [s for s in samples if s.pid == pid or pid in s.parent_pids]


def stack_estimates(rec: RunRecord) -> tuple[StackEstimate | None, LoaderAttribution | None]:
    """(main-thread phase estimate, worker attribution) from the run's py-spy stacks; (None, None) without.

    A job of several ranks (meta ``ranks``): the estimate pools every rank's main thread (each rank's own is
    :func:`rank_stacks`'), and the attribution covers every rank's workers; the launcher itself is no rank.
    """
    if not rec.stacks_text:
        return None, None
    p = _parsed(rec)
    if not p.samples:
        return StackEstimate(p.stats, note="py-spy recorded no usable samples"), None
    ranks = rank_pids(rec.meta)
    if not ranks:
        main, att, _ = _estimate(p.samples, p, p.root_pid)
        return main, att
    seen = [(rank, pid) for rank, pid in ranks if _sampled_itself(p.samples, pid)]
    if not seen:
        return StackEstimate(p.stats, note="py-spy has no sample of any rank process itself"), None
    per = [_estimate(of_process(p.samples, pid), p, pid) for _rank, pid in seen]
    mine = [s for _r, pid in seen for s in of_process(p.samples, pid)]
    workers = attribute_workers(mine, root_pid=p.root_pid, rate_hz=p.rate)
    pooled = _pooled([e for e, _a, _p in per], [f for _e, _a, f in per], [r for r, _ in seen], p)
    missed = [_missed(pid) for _rank, pid in ranks if (_rank, pid) not in seen]
    if missed:
        pooled = replace(pooled, notes=(*pooled.notes, *missed))
    return pooled, _attribution(workers) if workers.worker_pids else None


def _sampled_itself(samples: list[StackSample], pid: int) -> bool:
    """Whether py-spy sampled process ``pid`` itself: a process it gave up on can still be the parent of
    processes it sampled (a rank it missed at start-up, and that rank's loader workers)."""
    return any(s.pid == pid for s in samples)


def _missed(pid: int) -> str:
    return (
        f"py-spy has no sample of pid {pid} itself (it gave up attaching while the process started); "
        "its figures are not estimated from its workers'"
    )


def rank_stacks(rec: RunRecord) -> list[RankStacks]:
    """Each rank's estimate and worker attribution (empty unless the run found ranks, see :func:`rank_pids`)."""
    ranks = rank_pids(rec.meta)
    if not ranks or not rec.stacks_text:
        return []
    p = _parsed(rec)
    out = []
    for rank, pid in ranks:
        mine = of_process(p.samples, pid)
        if not mine:
            out.append(RankStacks(rank, pid, StackEstimate(p.stats, note=f"py-spy has no sample of pid {pid}"), None))
            continue
        if not _sampled_itself(mine, pid):
            out.append(RankStacks(rank, pid, StackEstimate(p.stats, note=_missed(pid)), None))
            continue
        est, att, _ = _estimate(mine, p, pid)
        out.append(RankStacks(rank, pid, est, att))
    return out


def _estimate(
    samples: list[StackSample], p: _Parsed, root_pid: int | None
) -> tuple[StackEstimate, LoaderAttribution | None, PhaseEstimate]:
    """The main-thread estimate and worker attribution of one process (``root_pid``) and those under it."""
    rate, sites = p.rate, p.sites
    ordered = all(s.order is not None for s in samples)
    trimmed = 0
    if ordered:
        samples, trimmed = _training_span(samples, root_pid, sites)
    chunks = chunk_by_order(samples, rate, WINDOW_S) if ordered else [samples]
    est = classify_main(chunks, rate_hz=rate, root_pid=root_pid, h2d_sites=sites)
    windows = (
        tuple(StackWindow(i * WINDOW_S, (i + 1) * WINDOW_S, _fractions(w)) for i, w in enumerate(est.windows) if w.n)
        if ordered
        else ()
    )
    main = StackEstimate(
        p.stats,
        overall=_fractions(est.overall),
        method=f"py-spy stack samples of the main thread at {rate:g} Hz ({_reads(p)}); "
        "fractions with Wilson 95% intervals",
        rate_hz=rate,
        windows=windows,
        main_thread_rule=est.main_rule,
        trimmed_outside_training=trimmed,
        pin_memory_thread_samples=est.pin_memory_samples,
        notes=(*est.notes, *_priority_note(p.scheduling), *_nonblocking_note(p), *p.sampling),
    )
    att = attribute_workers(samples, root_pid=root_pid, rate_hz=rate)
    return main, _attribution(att) if att.worker_pids else None, est


def _reads(p: _Parsed) -> str:
    return "--idle, --nonblocking" if p.nonblocking else "--idle, each read with the process paused"


def _nonblocking_note(p: _Parsed) -> tuple[str, ...]:
    if not p.nonblocking:
        return ()
    return (
        "recorded with py-spy --nonblocking (stallscope before 2026-11-24): a stack read while it changed is "
        "an error and no sample, and loading code changes its stack far more often than a model's long C "
        "calls, so data wait reads low (measured: 1 to 7 points at 0 workers)",
    )


def _rate(meta: Mapping[str, object]) -> float:
    rate = meta.get("pyspy_rate")
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else 10.0


def sampling_notes(meta: Mapping[str, object]) -> list[str]:
    """The run's notes on how py-spy sampled (its meta), said beside any figure estimated from its samples: how far
    it fell behind its schedule (meta ``pyspy_behind_s``, which py-spy reports past 1 s)."""
    behind = meta.get("pyspy_behind_s")
    if not isinstance(behind, (int, float)):
        return []
    return [
        f"py-spy fell up to {behind:.1f} s behind its {_rate(meta):g} Hz schedule (it says so past 1 s) and then took "
        "the samples it missed back-to-back, in whatever the thread was doing then: the estimated fractions can be "
        "off by more than their intervals (a host with no idle core; a lower --pyspy-rate falls behind less)"
    ]


def _priority_note(scheduling: str | None) -> tuple[str, ...]:
    if scheduling is None or scheduling.startswith("SCHED_FIFO"):  # core.sampling.pyspy.OnTime's words
        return ()
    return (
        f"py-spy ran at {scheduling}: on a host with no idle core its samples lean toward the main thread's "
        "waits (measured: +4 points at a true 85%); run stallscope with CAP_SYS_NICE (root, or "
        "`docker run --cap-add SYS_NICE`) for on-time samples",
    )


def _pool(parts: Sequence[PhaseFractions], rate: float) -> PhaseFractions:
    counts = {ph: sum(f.shares[ph].count for f in parts) for ph in PHASES}
    n = sum(counts.values())
    excluded = sum(f.excluded for f in parts)
    return PhaseFractions(n, excluded, (n + excluded) / rate, {ph: share(counts[ph], n) for ph in PHASES})


def _pooled(ests: list[StackEstimate], phases: list[PhaseEstimate], ranks: list[int], p: _Parsed) -> StackEstimate:
    """One estimate for a job: every rank's main-thread samples counted together (so about the mean over ranks
    when they ran for as long), windows pooled by index."""
    width = max((len(e.windows) for e in phases), default=0)
    pooled_windows = [_pool([e.windows[i] for e in phases if i < len(e.windows)], p.rate) for i in range(width)]
    ordered = any(e.windows for e in ests)
    notes = [n for e in ests for n in e.notes]
    notes.append(f"pooled over the main threads of ranks {', '.join(map(str, ranks))}; each rank's own is in `ranks`")
    return StackEstimate(
        p.stats,
        overall=_fractions(_pool([e.overall for e in phases], p.rate)),
        method=f"py-spy stack samples of each rank's main thread at {p.rate:g} Hz ({_reads(p)}), "
        "pooled over ranks; fractions with Wilson 95% intervals",
        rate_hz=p.rate,
        windows=tuple(
            StackWindow(i * WINDOW_S, (i + 1) * WINDOW_S, _fractions(w)) for i, w in enumerate(pooled_windows) if w.n
        )
        if ordered
        else (),
        main_thread_rule=", ".join(sorted({e.main_thread_rule for e in ests})),
        trimmed_outside_training=sum(e.trimmed_outside_training for e in ests),
        pin_memory_thread_samples=sum(e.pin_memory_thread_samples for e in ests),
        notes=tuple(dict.fromkeys(notes)),
    )


def _training_span(
    samples: list[StackSample], root_pid: int | None, sites: list[tuple[str, int]]
) -> tuple[list[StackSample], int]:
    """Keep the main thread's samples from the start of its second step to its last loader-or-compute sample,
    and drop its partial stacks.

    Start-up (imports, building data and model) and tear-down are not training; left in, they would dilute
    every fraction by however long the script takes to start. Training starts by fetching a batch: a stray
    torch frame during set-up (lazy torch._dynamo initialisation, building modules) must not open the span
    early. The first step is warm-up, as in the measured figures: its wait starts the workers, and py-spy
    makes up the samples it fell behind on during a busy start-up back-to-back (it keeps a schedule), so they
    land in the first waits (a rank's first batch read 1.37 s of samples, its whole first step 0.6 s by its clock).
    So the span opens at the first loader sample after one outside the loader; a run sampled in one step
    only keeps its first. An abandoned iterator's ``__del__`` joining its workers after the last step does
    not hold the span open (measured: up to 15 samples, 4% of a 4 s run). A main-thread stack whose outermost
    frame is not the program's ``<module>`` was read while it changed (runs recorded with py-spy
    --nonblocking; py-spy now pauses the process for each read): it is left out rather than guessed.
    """
    roles = identify(samples, root_pid)
    main = [s for s in samples if s.order is not None and roles.is_main_thread(s)]
    phase = {id(s): classify_main_sample(s.frames, sites) for s in main}
    training = sorted(
        (s for s in main if s.order is not None and not _loader_teardown(s.frames)), key=lambda s: s.order or 0
    )
    starts = [s.order for s in training if s.order is not None and phase[id(s)] == "data_wait"]
    ends = [s.order for s in training if s.order is not None and phase[id(s)] in ("data_wait", "compute")]
    if not starts:  # no batch fetched while sampled (a teardown is not a fetch): nothing marks the training
        return samples, 0
    first, last = _second_step([(s.order or 0, phase[id(s)]) for s in training], min(starts)), max(ends)
    drop = {id(s) for s in main if not first <= (s.order or 0) <= last or not _whole(s.frames)}
    kept = [s for s in samples if id(s) not in drop]
    return kept, sum(s.count for s in samples) - sum(s.count for s in kept)


def _second_step(ordered: list[tuple[int, str]], first: int) -> int:
    """The order of the first loader sample after ``first`` that follows a sample outside the loader: where
    the second step's ``next()`` began. ``first`` when there is none (one step sampled)."""
    left = False
    for order, phase in ordered:
        if order <= first:
            continue
        if phase != "data_wait":
            left = True
        elif left:
            return order
    return first


_ROOTS = frozenset({"<module>", "_run_module_as_main", "_run_code"})
_LOADER = "torch/utils/data/dataloader.py"


def _loader_teardown(frames: tuple[Frame, ...]) -> bool:
    """An iterator's ``__del__`` stopping its workers: waiting for the loader between epochs, but after the
    last step it is tear-down, so it never ends the span by itself."""
    return any(f.name.endswith("__del__") and file_matches(f.file, _LOADER) for f in frames)


def _whole(frames: tuple[Frame, ...]) -> bool:
    return bool(frames) and frames[0].name in _ROOTS


_SITE = re.compile(r"\((?:.*/(?:site-packages|dist-packages|lib/python3\.\d+)/)?(?:.*/)?([^/()]+)\)$")


def _short(function: str) -> str:
    """``qualname (/long/.../site-packages/pkg/mod.py)`` -> ``qualname (mod.py)``: speedscope gives full paths."""
    return _SITE.sub(lambda m: f"({m.group(1)})", function)


def _attribution(att: WorkerAttribution) -> LoaderAttribution:
    categories = tuple(
        (
            c,
            CategoryShare(
                _share(att.shares[c]), tuple(TopFunction(_short(t.function), t.of_category) for t in att.top.get(c, ()))
            ),
        )
        for c in CATEGORIES
    )
    return LoaderAttribution(
        method="py-spy stack samples of the DataLoader worker processes; innermost matching frame's category",
        workers=len(att.worker_pids),
        samples=att.samples,
        idle=att.idle,
        active=att.active,
        busy_seconds=att.busy_seconds,
        categories=categories,
        headline=headline(att),
        notes=tuple(att.notes),
    )
