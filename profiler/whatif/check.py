"""``whatif --check``: each predicted configuration trained for real on its simulated device, through
``drivers.runner.run_scenario`` as ``stallscope run`` does, into ``RUN_DIR/whatif/<label>/``; a configuration
already measured there is read back, not rerun."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.whatif.model import Checked, Prediction
from profiler.whatif.source import Note, Source, read_summary, short_label

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.steps.device_timers import DeviceInfo


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """How each configuration is checked: runs per configuration, and each run's steps and warm-up (None: the
    measured run's)."""

    repeat: int = 1
    steps: int | None = None
    warmup: int | None = None


class CheckStopped(Exception):
    """A signal stopped a check run (its store is closed "interrupted"); ``signame`` names it."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame}")
        self.signame = signame


# (the Summary of a configuration's run or None, its status or error)
_Run = tuple["Summary | None", str]


def check_label(p: Prediction, steps: int | None = None, warmup: int | None = None, rep: int = 1) -> str:
    """A configuration's directory name under RUN_DIR/whatif/: sim-v100-amp-naive-b8-w2, with
    ``-steps30-warmup5`` when the check's window is not the run's and ``-r2`` for its second run."""
    t = p.target
    device = re.sub(r"[^A-Za-z0-9.]+", "-", t.device.replace("precision=", "").replace("efficiency=", "e"))
    out = f"{device.strip('-')}-{t.pipeline}-b{t.batch_size}-w{t.workers}"
    if t.storage.label:
        out += "-" + re.sub(r"[^A-Za-z0-9.]+", "", t.storage.label.replace(" MB/s", "mbps"))
    if steps is not None or warmup is not None:
        out += f"-steps{'' if steps is None else steps}-warmup{'' if warmup is None else warmup}"
    return out + (f"-r{rep}" if rep > 1 else "")


def check_all(
    src: Source,
    predictions: Sequence[Prediction],
    devices: Sequence[DeviceInfo],
    plan: CheckPlan,
    note: Note,
) -> tuple[list[Checked], bool]:
    """Each prediction beside ``plan.repeat`` runs of its configuration, the repetitions interleaved (every
    configuration once, then again) so that a burst of load on the host does not fall on one configuration's
    runs alone (the base's own configuration too, where it was added: each speedup's denominator is a median of
    as many runs as its numerator); and whether a check failed unexpectedly (not an OOM the prediction foresaw).
    CheckStopped when a signal stopped a run."""
    by_label = {short_label(d.sim): d for d in devices}
    results: list[list[_Run]] = [[] for _ in predictions]
    total = len(predictions) * plan.repeat
    n = 0
    for rep in range(1, plan.repeat + 1):
        for i, p in enumerate(predictions):
            out = src.run_dir / "whatif" / check_label(p, plan.steps, plan.warmup, rep)
            n += 1
            note(f"check [{n}/{total}] {p.target.label} -> {out}")
            if rep > 1 and results[i] and results[i][0][0] is None:
                continue  # the first run failed: the others would fail the same way
            results[i].append(_measure(src, p, by_label[p.target.device], out, plan, note=note))
    checked, failed = [], False
    for p, runs in zip(predictions, results, strict=True):
        first = str(src.run_dir / "whatif" / check_label(p, plan.steps, plan.warmup))
        one, unexpected = _checked(p, runs, first)
        checked.append(one)
        failed = failed or unexpected
    return checked, failed


def _checked(p: Prediction, runs: list[_Run], first: str) -> tuple[Checked, bool]:
    """One prediction beside its runs; True when one of them failed and the prediction did not foresee it."""
    good = [s for s, _ in runs if s is not None and s.steps >= 1]
    if len(good) < len(runs) or not good:
        status = next(st for s, st in runs if s is None or s.steps < 1)
        oom = p.status == "OOM" and "out of memory" in status
        return Checked(p, math.nan, math.nan, first, "OOM as predicted" if oom else status), not oom
    throughputs = [s.throughput_samples_per_s for s in good]
    return Checked.of_runs(p, throughputs, [s.stall_fraction for s in good], first, good[0].status), False


def _measure(src: Source, p: Prediction, device: DeviceInfo, out: Path, plan: CheckPlan, *, note: Note) -> _Run:
    """(the Summary of the configuration's run, its status or error): read back when already measured."""
    from profiler.core.store import DB_NAME, StoreError
    from profiler.drivers.runner import RunConfig, RunStopped, TrainingError, run_scenario
    from profiler.drivers.signals import SignalStop

    if (out / DB_NAME).exists():
        try:
            summary = read_summary(out)
        except StoreError as exc:
            return None, str(exc)
        if summary.status == "complete":
            note(f"  already measured: {out}")
            return summary, summary.status
        return None, f"{out} holds an {summary.status} run: remove it to measure again"
    meta, t = src.meta, p.target
    cfg = RunConfig(
        out=out,
        device=device,
        pipeline=t.pipeline,
        batch_size=t.batch_size,
        workers=t.workers,
        steps=plan.steps if plan.steps is not None else src.summary.steps,
        warmup=plan.warmup if plan.warmup is not None else src.summary.warmup_steps,
        seed=int(meta.get("seed", 0) or 0),
        data=src.data_root,
        model=meta.get("model"),
        attribution=False,
        on_bad_sample=str(meta.get("on_bad_sample", "fail")),
        # a changed storage is checked on a warm page cache, so that the disk under it adds nothing; else the
        # run's own conditions (its emulated store, its page cache) are the check's
        store_mbps=t.storage.mbps if t.storage.label else meta.get("store_mbps"),
        page_cache="warm" if t.storage.label else (meta.get("page_cache") or {}).get("state"),
        extra_meta={"whatif_of": str(src.run_dir)} | _source_meta(meta),
    )
    try:
        with SignalStop():
            session = run_scenario(src.scenario, cfg)
    except TrainingError as exc:
        return None, exc.where
    except RunStopped as exc:
        raise CheckStopped(exc.signame) from None
    return session.summary(), "complete"


def _source_meta(meta: dict[str, object]) -> dict[str, object]:
    return {"scenario_source": meta["scenario_source"]} if meta.get("scenario_source") else {}
