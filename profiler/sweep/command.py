"""Tune or sweep a command (``stallscope tune -- CMD``, ``sweep -- CMD``): every trial runs the user's command for
real, its DataLoader's knobs overridden at construction by the start-up module and its process ended by it after
the trial's seconds or steps (docs/sweep-and-tune.md, "Tuning your own script").

Invariants: the first trial runs the command unchanged and its training loader's knobs are the configuration
to beat; a configuration equal to it runs the command unchanged again, any other sets ``num_workers`` and
``persistent_workers`` (True with workers), ``batch_size`` only where the user listed batch sizes, and
``prefetch_factor`` / ``pin_memory`` only where the search tries them; every trial's process group is ended with
it; a trial that fails is a row, and the search goes on.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.naive import PREFETCH_FACTOR  # the DataLoader's own, where a script with workers sets none
from profiler.core.session import Interrupted
from profiler.sweep.analysis import Config, SweepResult, SweepRow, row_from_summary, with_knobs
from profiler.sweep.climb import LoaderKnobs
from profiler.sweep.run import ConfigStopped, OnFinish, first_advice, write_json
from profiler.sweep.tuner import TuneResult, tune
from profiler.zerocode.instrument import LOCK_CALLS, WARMUP_STEPS, TrialStop
from profiler.zerocode.profile import COMMAND_LOG, CommandTrial, ZeroCodeResult, profile_external

PIPELINE = "script"  # a command's configurations: the script's own DataLoader, its knobs changed
KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size")
# the first trial (the command unchanged) must return a batch within this; later ones within
# FIRST_BATCH_FACTOR x what it took plus FIRST_BATCH_SLACK_S (more workers take longer to start)
FIRST_BATCH_S = 120.0
FIRST_BATCH_FACTOR = 3.0
FIRST_BATCH_SLACK_S = 30.0
# a trial that has returned its first batch must end within its measured seconds x this (+ the slack)
LIMIT_FACTOR = 3.0
# the batches a trial must return before its seconds may end it: enough for the training loader to be told
# apart (LOCK_CALLS) and for the warm-up and a few measured steps
MIN_CALLS = max(LOCK_CALLS, WARMUP_STEPS + 5) + 1
UNTIMED_S = 60.0  # a trial bounded by steps alone is ended after LIMIT_FACTOR x this (+ its start)


class CommandFailed(Exception):
    """The command unchanged gave no step figures: nothing to tune from (one line: why)."""


@dataclass(frozen=True, slots=True)
class CommandSpec:
    command: list[str]
    seconds: float | None  # a trial's measured seconds, from its first batch (None: ``steps`` alone)
    steps: int | None = None  # a cap on its measured steps
    batch_sizes: tuple[int, ...] | None = None  # batch sizes to try (None: the script's own only)
    sample_hz: float = 10.0
    on_start: Callable[[int, Path, dict[str, object]], None] | None = None  # (index from 1, run dir, overrides)
    on_finish: OnFinish | None = None
    stop_requested: Callable[[], str | None] | None = None


@dataclass
class CommandTrials:
    """The tuner's ``trial`` for a command: one run store per trial in ``out_dir``, ``tune.json`` rewritten
    (status "running") after each, the training loader's facts of each kept for the recommendation."""

    spec: CommandSpec
    out_dir: Path
    own: Config | None = None  # the script's own setting, once its trial ran
    knobs: LoaderKnobs | None = None  # its loader's prefetch_factor and pin_memory, and whether it trains on CUDA
    first_batch_s: float = FIRST_BATCH_S
    done: list[SweepRow] = field(default_factory=list)
    loaders: dict[Config, dict[str, Any]] = field(default_factory=dict)  # the training loader each ran with

    def overrides(self, cfg: Config) -> dict[str, object]:
        """What the start-up module changes for ``cfg`` (nothing for the script's own setting)."""
        if self.own is None or cfg == self.own:
            return {}
        out: dict[str, object] = {"num_workers": cfg.workers, "persistent_workers": cfg.workers > 0}
        if cfg.batch_size != self.own.batch_size:
            out["batch_size"] = cfg.batch_size
        if cfg.prefetch_factor is not None:
            out["prefetch_factor"] = cfg.prefetch_factor
        if cfg.pin_memory is not None:
            out["pin_memory"] = cfg.pin_memory
        return out

    def first(self, label: str = "t01-script", role: str = "trial") -> SweepRow:
        """Run the command unchanged: its row, with ``own`` set to its loader's batch size and workers. Raises
        CommandFailed when it gave no step figures (the reason: the row's error)."""
        row = self._trial(None, label, role)
        if not row.ok:
            raise CommandFailed(row.error or row.status)
        return row

    def __call__(self, cfg: Config, label: str, role: str) -> SweepRow:
        return self._trial(cfg, label, role)

    def _trial(self, cfg: Config | None, label: str, role: str) -> SweepRow:
        spec = self.spec
        signame = spec.stop_requested() if spec.stop_requested is not None else None
        if signame:
            raise Interrupted(signame)
        run_dir = self.out_dir / label
        overrides = self.overrides(cfg) if cfg is not None else {}
        if spec.on_start is not None:
            spec.on_start(len(self.done) + 1, run_dir, overrides)
        t0 = time.perf_counter()
        result = profile_external(
            run_dir,
            command=spec.command,
            sample_hz=spec.sample_hz,
            trial=CommandTrial(
                overrides=overrides,
                stop=TrialStop(
                    calls=None if spec.steps is None else WARMUP_STEPS + spec.steps,
                    seconds=spec.seconds,
                    min_calls=MIN_CALLS,
                ),
                first_batch_s=self.first_batch_s,
                limit_s=self.first_batch_s + LIMIT_FACTOR * (spec.seconds or UNTIMED_S) + FIRST_BATCH_SLACK_S,
                stop_requested=spec.stop_requested,
            ),
        )
        row = self._row(cfg, result, role, time.perf_counter() - t0)
        row = with_knobs(row, cfg) if cfg is not None else row
        if cfg is None and row.ok:
            self._learn(row, result)
        self.done.append(row)
        if spec.on_finish is not None:
            spec.on_finish(row)
        running = {"status": "running", "command": spec.command, "device": "chosen by the command"}
        write_json(self.out_dir / "tune.json", {**running, "runs": [r.to_dict() for r in self.done]})
        if result.status == "interrupted":
            raise ConfigStopped(_signame(result.error), row)
        return row

    def _row(self, cfg: Config | None, result: ZeroCodeResult, role: str, wall: float) -> SweepRow:
        lo = result.facts.get("training_loader") or {}
        args = lo.get("args") or {}
        batch = _int(args.get("batch_size"), cfg.batch_size if cfg else 0)
        workers = _int(args.get("num_workers"), cfg.workers if cfg else 0)
        self.loaders[cfg or Config(PIPELINE, batch, workers)] = lo
        s = result.summary
        status, error = _outcome(result)
        if s is None or status != "complete":
            return SweepRow(PIPELINE, batch, workers, status, str(result.run_dir), error, wall_s=wall, role=role)
        return row_from_summary(
            s, pipeline=PIPELINE, batch_size=batch, workers=workers, run_dir=str(result.run_dir),
            step_s=result.step_s, stop_reason=result.facts.get("trial_stop") or "script ended", wall_s=wall,
            status=status, error=error, role=role,
        )  # fmt: skip

    def _learn(self, row: SweepRow, result: ZeroCodeResult) -> None:
        """The script's own setting, from its first trial; later trials must reach a batch sooner."""
        self.own = row.config
        args = (result.facts.get("training_loader") or {}).get("args") or {}
        prefetch = args.get("prefetch_factor")
        self.knobs = LoaderKnobs(
            prefetch_factor=prefetch if isinstance(prefetch, int) and prefetch > 0 else PREFETCH_FACTOR,
            pin_memory=bool(args.get("pin_memory")),
            copies=(result.facts.get("device") or {}).get("kind") == "cuda",  # the start-up module saw CUDA in use
        )
        first = result.facts.get("first_batch_s")
        if isinstance(first, (int, float)) and math.isfinite(first):
            self.first_batch_s = FIRST_BATCH_FACTOR * first + FIRST_BATCH_SLACK_S


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _signame(error: str | None) -> str:
    return (error or "SIGINT").rsplit(" ", 1)[-1]


def _outcome(result: ZeroCodeResult) -> tuple[str, str | None]:
    """A trial's status and error: failed when the command failed, was ended by its limits, or measured no step."""
    if result.status == "interrupted":
        return "interrupted", result.error
    if result.status != "complete":
        return "failed", _with_log_tail(result.error or "failed", result.run_dir)
    s = result.summary
    if s is None or s.steps == 0 or not math.isfinite(s.throughput_samples_per_s):
        why = result.facts.get("instrument_note") or "the start-up module measured no step"
        return "failed", str(why)
    return "complete", None


def _with_log_tail(error: str, run_dir: Path) -> str:
    """``error`` and the last line the command printed (its traceback's last line, say)."""
    try:
        lines = [ln for ln in (run_dir / COMMAND_LOG).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return error
    return f"{error}: {lines[-1].strip()[:200]}" if lines else error


def change(own: dict[str, Any], pick: dict[str, Any]) -> dict[str, Any]:
    """The knobs stallscope set on the pick's loader (as built) that differ from the script's own loader's."""
    a, b, set_ = own.get("args") or {}, pick.get("args") or {}, pick.get("overrides") or {}
    return {k: b.get(k) for k in KNOBS if k in set_ and k in b and b.get(k) != a.get(k)}


def run_command_tune(
    spec: CommandSpec,
    out_dir: Path,
    *,
    max_workers: int,
    budget_s: float,
    cores: int,
) -> TuneResult:
    """The command unchanged, then the tuner's search over its loader's workers (and the listed batch sizes)
    and the final comparison beside the command unchanged; ``tune.json`` in ``out_dir``. Raises CommandFailed
    when the command unchanged measured no step (what ran is in ``out_dir``)."""
    trials = CommandTrials(spec, out_dir)
    try:
        first = trials.first()
    except Interrupted as exc:  # before the setting to beat was measured: nothing to compare, what ran is kept
        stopped = {"status": "interrupted", "stopped_by": exc.signame, "command": list(spec.command)}
        write_json(out_dir / "tune.json", {**stopped, "runs": [r.to_dict() for r in trials.done]})
        raise
    own = trials.own
    assert own is not None
    batches = sorted(set(spec.batch_sizes) | {own.batch_size}) if spec.batch_sizes else []
    result = tune(
        trials, pipelines=[PIPELINE], default_batch=own.batch_size, max_batch=max(batches or [own.batch_size]),
        max_workers=max_workers, budget_s=budget_s, cores=cores, default=own, first=first, batches=batches,
        knobs={PIPELINE: trials.knobs} if trials.knobs is not None else None,
    )  # fmt: skip
    result.command = list(spec.command)
    rec = result.recommended
    lo = trials.loaders.get(own) or {}
    site = {k: lo.get(k) for k in ("site", "file", "line", "kind")}
    result.change = {**site, "args": change(lo, trials.loaders.get(rec, {})) if rec is not None else {}}
    result.advice = first_advice(result)
    write_json(out_dir / "tune.json", result.to_dict())
    return result


LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed")


def usable_command(command: Sequence[str], steps: int | None = None) -> str | None:
    """Why ``command`` cannot be tuned (one line), or None. A launcher of ranks needs ``steps``: its ranks must
    stop at the same step, so the seconds rule is off in them."""
    if not command:
        return "nothing after `--`: give the command to tune, e.g. `stallscope tune -- python train.py`"
    launcher = next((a for a in command[:3] if os.path.basename(a) in LAUNCHERS), None)
    if launcher is not None and steps is None:
        return f"{launcher} starts ranks that must stop at the same step: give --steps N (measured steps a trial)"
    exe = command[0]
    if os.sep not in exe and not any(
        os.access(os.path.join(d, exe), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d
    ):
        return f"cannot start {exe!r}: not found on PATH"
    return None


def run_command_sweep(
    spec: CommandSpec, out_dir: Path, *, workers: Sequence[int], batch_sizes: Sequence[int] | None
) -> tuple[SweepResult, str | None]:
    """The command unchanged, then every workers x batch size configuration of its training loader (the
    script's own batch size unless ``batch_sizes``); the analysed table and the signal that stopped it, if any.
    ``sweep.json`` in ``out_dir`` after each. Raises CommandFailed as :func:`run_command_tune` does."""
    from profiler.sweep.analysis import analyse_sweep

    trials = CommandTrials(spec, out_dir)
    rows: list[SweepRow] = []
    stopped: str | None = None
    planned = 1

    def result() -> SweepResult:
        status = "interrupted" if stopped else "complete"
        name = " ".join(spec.command)
        return analyse_sweep(rows, scenario=name, device="chosen by the command", planned=planned, status=status)

    try:
        own = trials.first("own", "own")
        rows.append(own)
        configs = [Config(PIPELINE, b, w) for w in workers for b in (batch_sizes or [own.batch_size])]
        configs = [c for c in configs if c != trials.own]  # the command unchanged stands for its own setting
        planned = 1 + len(configs)
        for cfg in configs:
            write_json(out_dir / "sweep.json", result().to_dict())
            rows.append(trials(cfg, cfg.name, "sweep"))
    except ConfigStopped as exc:
        rows.append(exc.row)
        stopped = exc.signame
    except Interrupted as exc:
        stopped = exc.signame
    final = result()
    write_json(out_dir / "sweep.json", final.to_dict())
    return final, stopped
