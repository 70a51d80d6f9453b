"""PyTorch Lightning: ``Trainer(profiler=StallscopeProfiler("runs/x"))``, or ``callbacks=[StallscopeCallback(...)]``.

Five of Lightning's profiler actions become a step's data wait and its ``h2d``, ``compute`` and ``validation``
phases (the map: docs/integrations.md, "What is measured, and how"). Invariants:
- Every other action costs one dict lookup in ``start``/``stop``; the callback leaves the step hooks it does not
  use ``None``, so Lightning skips them (a subclass's own override stays).
- Only ``fit`` is recorded: opened at its setup, closed at its teardown (``complete``) or from ``on_exception``
  (``failed``, ``interrupted`` for Ctrl-C), every step so far kept; rank R of a larger world in ``rank-R/``.
- The Callback form tees the Trainer's own profiler for the fit (every call reaches it unchanged) and puts it
  back at teardown. The framework is whichever of ``lightning.pytorch`` and ``pytorch_lightning`` the program
  imported first: a Trainer only takes a profiler and callbacks of its own package.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, cast

from profiler.core.steps.batch_facts import batch_len
from profiler.integrations import missing
from profiler.integrations.base import (
    dist_meta,
    print_report,
    rank_dir,
    session_options,
    start_session,
    torch_device,
)
from profiler.integrations.loggers import StepPoints, run_figures, with_separator
from profiler.runs.session import Session


def _import_lightning() -> ModuleType:
    first = "pytorch_lightning" if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules else None
    for name in (first, "lightning.pytorch", "pytorch_lightning"):
        if name is None:
            continue
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise missing("PyTorch Lightning", "lightning or pytorch-lightning", "lightning")


pl = _import_lightning()
if TYPE_CHECKING:  # checked against lightning.pytorch; pytorch_lightning's classes are the same
    from lightning.pytorch import Callback as _Callback
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.profilers import Profiler as _Profiler
else:
    _Profiler = pl.profilers.Profiler
    _Callback = pl.Callback

# what an action is to stallscope
_OTHER, _FETCH, _H2D, _COMPUTE, _EPOCH, _VAL_START, _VAL_END = range(7)


def _classify(action: str) -> int:
    if action.startswith("[") and action.endswith("].train_dataloader_next"):
        return _FETCH
    if action.startswith("[Strategy]"):
        for end, kind in ((".batch_to_device", _H2D), (".on_validation_start", _VAL_START)):
            if action.endswith(end):
                return kind
        return _VAL_END if action.endswith(".on_validation_end") else _OTHER
    return {"run_training_batch": _COMPUTE, "run_training_epoch": _EPOCH}.get(action, _OTHER)


class _Slots(Protocol):
    """What Lightning's connectors set on a Trainer (its class does not declare them)."""

    profiler: _Profiler
    callbacks: list[_Callback]


def _slots(trainer: Trainer) -> _Slots:
    return cast("_Slots", trainer)


class _Recorder:
    """Lightning's actions -> one Session's steps and phases; shared by both forms."""

    def __init__(self, out_dir: str | os.PathLike[str], report: bool, options: dict[str, object]) -> None:
        self.out_dir = Path(out_dir)
        self.report = report
        self.options = options
        self.session: Session | None = None
        self._live: Session | None = None  # the session while it records: the hot path's one check
        self._clock: Callable[[], float] = time.perf_counter
        self._kinds: dict[str, int] = {}
        self._open: dict[str, AbstractContextManager[object]] = {}  # the open phase of each action
        self._fetch_t0 = 0.0
        self._fetched = False  # a training batch was fetched and has not reached run_training_batch yet
        self._rank = 0
        self._runs = 0  # fits recorded so far
        self.points: StepPoints | None = None  # the stall/ figures for the Trainer's loggers

    def open(self, trainer: Trainer, form: str) -> None:
        if self.session is not None and self.session.status is None:
            return
        world, rank = int(trainer.world_size), int(trainer.global_rank)
        self._rank = rank
        module = trainer.lightning_module
        facts = {
            "device": torch_device(trainer.strategy.root_device),
            "scenario": type(module).__name__ if module is not None else None,
            "pipeline": "lightning",
            "meta": {
                "integration": f"lightning-{form}",
                "framework": f"{pl.__name__} {pl.__version__}",
                **dist_meta(
                    rank=rank,
                    world_size=world,
                    local_rank=int(trainer.local_rank),
                    node_rank=int(trainer.node_rank),
                    nnodes=int(trainer.num_nodes),
                ),
            },
        }
        self._runs += 1
        self.attach(start_session(rank_dir(self.out_dir, rank, world, self._runs), self.options, facts))

    def attach(self, session: Session) -> None:
        """Record into ``session`` (started) from now on: what ``open`` does once it has made it."""
        self._open.clear()
        self._fetched = False
        self.session = self._live = session
        self._clock = session.clock
        self.points = StepPoints(session.run_dir)

    def start(self, action_name: str) -> None:
        kind = self._kinds.get(action_name)
        if kind is None:
            kind = self._kinds[action_name] = _classify(action_name)
        if kind == _OTHER or (s := self._live) is None:
            return
        if kind == _FETCH:
            s.open_step(self._clock())
            # the fetch is timed from here: ending the previous step (its row, queued to the writer) is the step's
            # own bookkeeping, not time the loop waited for data
            self._fetch_t0 = self._clock()
        elif (kind == _H2D and self._fetched) or (kind in (_COMPUTE, _VAL_START) and s.in_step):
            self._fetched = False
            name = "h2d" if kind == _H2D else "compute" if kind == _COMPUTE else "validation"
            phase = s.phase(name)
            phase.__enter__()
            self._open[name if kind == _VAL_START else action_name] = phase

    def stop(self, action_name: str) -> None:
        kind = self._kinds.get(action_name, _OTHER)
        if kind == _OTHER or (s := self._live) is None:
            return
        if kind == _FETCH:
            s.add_wait(self._clock() - self._fetch_t0)
            self._fetched = True
        elif kind == _EPOCH:
            s.close_step()
        elif (phase := self._open.pop("validation" if kind == _VAL_END else action_name, None)) is not None:
            phase.__exit__(None, None, None)

    def batch(self, batch: object) -> None:
        if self._live is not None:
            self._live.add_samples(batch_len(batch))

    def loader(self, trainer: Trainer) -> None:
        if self.session is not None:
            self.session.note_loader(trainer.train_dataloader)

    def log_point(self, trainer: Trainer) -> None:
        """At the Trainer's logging steps (``log_every_n_steps``, as DeviceStatsMonitor): the steps since the last
        point, to every logger."""
        if self.points is None or not getattr(trainer, "loggers", None):
            return
        if trainer._logger_connector.should_update_logs:
            self._log(trainer, self.points.take())

    def log_end(self, trainer: Trainer) -> None:
        """After the fit's close: its last steps' point and the run's own figures, to every logger."""
        points, self.points = self.points, None
        if points is not None and getattr(trainer, "loggers", None) and self.session is not None:
            self._log(trainer, {**points.take(), **run_figures(self.session.summary())})

    @staticmethod
    def _log(trainer: Trainer, figures: dict[str, float]) -> None:
        if not figures:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped  # the loggers' own step axis
        for logger in trainer.loggers:
            logger.log_metrics(with_separator(figures, getattr(logger, "group_separator", "/")), step=step)

    def close(self, exc: BaseException | None = None) -> None:
        s, self._live = self._live, None
        if s is None or s.status is not None:
            return
        self._open.clear()
        s.__exit__(None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__)
        if self.report and self._rank == 0:
            print_report(s.summary(), s.run_dir)


# Hooks Lightning calls several times a step on every callback, each through the profiler (~2 us a call), and
# skips when the attribute is not callable (lightning.pytorch.trainer.call._call_callback_hooks, Lightning >= 2.0)
_STEP_HOOKS = (
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
)


class _Hooks(_Callback):
    """The batch and exception hooks both forms need: the batch's size, the loader's facts, a failed fit."""

    def __init__(self, recorder: _Recorder, loggers: bool = True) -> None:
        self.recorder = recorder
        for name in _STEP_HOOKS:  # not used here: None, so Lightning does not call them (a subclass's stay)
            if getattr(type(self), name) is getattr(_Callback, name) or (name == "on_train_batch_end" and not loggers):
                setattr(self, name, None)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        self.recorder.log_point(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """The profiler form's fit ends here, before the Trainer finalizes its loggers (its teardown comes later)."""
        if stage == "fit":
            self.recorder.close()
            self.recorder.log_end(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.recorder.loader(trainer)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int) -> None:
        self.recorder.batch(batch)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.recorder.close(exception)


class StallscopeProfiler(_Profiler):
    """A Lightning profiler that records fit as a stallscope run in ``out_dir``: ``Trainer(profiler=...)``.

    ``report`` prints the run's report at the end of fit (rank 0). ``prometheus`` (``[ADDR:]PORT``, 0: a free
    port) serves the live figures while fit runs (rank R of a machine on PORT + R). ``loggers``: the stall/
    figures to the Trainer's loggers at its logging steps, and the run's at the end of fit (docs/integrations.md,
    "Experiment trackers"). The other keyword arguments are the Session's (``warmup``, ``sample_hz``, ...)."""

    _lightning_module: LightningModule | None  # the Trainer sets it before setup (Profiler does not declare it)

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        report: bool = True,
        prometheus: str | int | None = None,
        loggers: bool = True,
        **session: object,
    ) -> None:
        super().__init__()
        self.recorder = _Recorder(out_dir, report, session_options(prometheus, session))
        self._hooks = _Hooks(self.recorder, loggers)
        # Lightning calls these dozens of times a step: the recorder's own, one call each, not through a method here
        self.start = self.recorder.start  # type: ignore[method-assign]
        self.stop = self.recorder.stop  # type: ignore[method-assign]

    @property
    def session(self) -> Session | None:
        """The Session of the current (or last) fit; None before fit."""
        return self.recorder.session

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        if stage != "fit":
            return
        module = self._lightning_module
        assert module is not None, "Lightning gives its profiler the module before setup"
        trainer = module.trainer
        callbacks = _slots(trainer).callbacks
        if self._hooks not in callbacks:
            callbacks.append(self._hooks)
        self.recorder.open(trainer, "profiler")

    def start(self, action_name: str) -> None:
        self.recorder.start(action_name)

    def stop(self, action_name: str) -> None:
        self.recorder.stop(action_name)

    def teardown(self, stage: str | None) -> None:
        if stage == "fit":
            self.recorder.close()
        super().teardown(stage)

    def __del__(self) -> None:
        """Lightning's base closes its files here; a stallscope run is closed by teardown or on_exception."""


class _Tee(_Profiler):
    """The Trainer's own profiler, with stallscope's map behind it (the Callback form)."""

    def __init__(self, inner: _Profiler, recorder: _Recorder) -> None:
        super().__init__()
        self.inner = inner
        self.recorder = recorder

    def start(self, action_name: str) -> None:
        self.inner.start(action_name)
        self.recorder.start(action_name)

    def stop(self, action_name: str) -> None:
        self.recorder.stop(action_name)
        self.inner.stop(action_name)

    def summary(self) -> str:
        return str(self.inner.summary())

    def describe(self) -> None:
        self.inner.describe()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self.inner.setup(stage, local_rank, log_dir)

    def teardown(self, stage: str | None) -> None:
        self.inner.teardown(stage)

    def __del__(self) -> None:
        """The user's profiler is theirs to close."""


class StallscopeCallback(_Hooks):
    """The Callback form, for a Trainer whose ``profiler=`` is taken: ``Trainer(callbacks=[StallscopeCallback(...)])``.

    Same arguments and same figures as :class:`StallscopeProfiler`."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        report: bool = True,
        prometheus: str | int | None = None,
        loggers: bool = True,
        **session: object,
    ) -> None:
        super().__init__(_Recorder(out_dir, report, session_options(prometheus, session)), loggers)
        self._inner: _Profiler | None = None

    @property
    def session(self) -> Session | None:
        """The Session of the current (or last) fit; None before fit."""
        return self.recorder.session

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._inner = _slots(trainer).profiler
        _slots(trainer).profiler = _Tee(self._inner, self.recorder)
        self.recorder.open(trainer, "callback")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self._inner is not None:
            _slots(trainer).profiler = self._inner
            self._inner = None
        self.recorder.close()
        self.recorder.log_end(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._inner is not None:
            _slots(trainer).profiler = self._inner
            self._inner = None
        self.recorder.close(exception)


__all__ = ["StallscopeCallback", "StallscopeProfiler"]
