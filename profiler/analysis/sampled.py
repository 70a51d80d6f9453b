"""Figures estimated from py-spy stack samples stored with a run: main-thread phase fractions and the
loader workers' CPU attribution, as the Summary's typed parts (:mod:`profiler.analysis.parts`).

Pure: the stacks text and the facts needed to read it (rate, root pid, copy sites) come from the
RunRecord. Every fraction carries its sample count and a Wilson 95% interval, because a sampled figure is
an estimate and says how good one.
"""

from __future__ import annotations

import re

from profiler.analysis.attribution import (
    CATEGORIES,
    PHASES,
    PhaseFractions,
    Share,
    WorkerAttribution,
    attribute_workers,
    classify_main,
    classify_main_sample,
    headline,
)
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
    identify,
    parse_collapsed_stats,
    parse_speedscope_stats,
)
from profiler.store import RunRecord

WINDOW_S = 5.0
MIN_SAMPLES = 30  # below this an estimate is reported but not used for a verdict


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


def stack_estimates(rec: RunRecord) -> tuple[StackEstimate | None, LoaderAttribution | None]:
    """(main-thread phase estimate, worker attribution) from the run's py-spy stacks; (None, None) without."""
    if not rec.stacks_text:
        return None, None
    meta = rec.meta
    rate = float(meta.get("pyspy_rate") or 10)
    root = meta.get("target_pid") or meta.get("pid")
    root_pid = int(root) if isinstance(root, int) else None
    samples, stats = parse_stacks(rec.stacks_text)
    if not samples:
        return StackEstimate(stats, note="py-spy recorded no usable samples"), None
    ordered = all(s.order is not None for s in samples)
    sites = [(str(f), int(ln)) for f, ln in meta.get("h2d_sites") or []]
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
        stats,
        overall=_fractions(est.overall),
        method=f"py-spy stack samples of the main thread at {rate:g} Hz (--idle, --nonblocking); "
        "fractions with Wilson 95% intervals",
        rate_hz=rate,
        windows=windows,
        main_thread_rule=est.main_rule,
        trimmed_outside_training=trimmed,
        pin_memory_thread_samples=est.pin_memory_samples,
        notes=tuple(est.notes),
    )
    att = attribute_workers(samples, root_pid=root_pid, rate_hz=rate)
    return main, _attribution(att) if att.worker_pids else None


def _training_span(
    samples: list[StackSample], root_pid: int | None, sites: list[tuple[str, int]]
) -> tuple[list[StackSample], int]:
    """Keep the main thread's samples from its first loader sample to its last loader-or-compute sample, and
    drop its partial stacks.

    Start-up (imports, building data and model) and tear-down are not training; left in, they would dilute
    every fraction by however long the script takes to start. Training starts by fetching a batch, so the
    span starts at the first loader sample: a stray torch frame during set-up (lazy torch._dynamo
    initialisation, building modules) must not open it early. A main-thread stack whose outermost frame is
    not the program's ``<module>`` was read while it changed (py-spy runs --nonblocking): its frames cannot
    be trusted to show whether it was inside the loader, so it is left out rather than guessed.
    """
    roles = identify(samples, root_pid)
    main = [s for s in samples if s.order is not None and roles.is_main_thread(s)]
    phase = {id(s): classify_main_sample(s.frames, sites) for s in main}
    starts = [s.order for s in main if s.order is not None and phase[id(s)] == "data_wait"]
    ends = [s.order for s in main if s.order is not None and phase[id(s)] in ("data_wait", "compute")]
    if not starts:
        return samples, 0
    first, last = min(starts), max(ends)
    drop = {id(s) for s in main if not first <= (s.order or 0) <= last or not _whole(s.frames)}
    kept = [s for s in samples if id(s) not in drop]
    return kept, sum(s.count for s in samples) - sum(s.count for s in kept)


_ROOTS = frozenset({"<module>", "_run_module_as_main", "_run_code"})


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
