"""Hugging Face's Trainer: ``instrument(trainer, "runs/x")``, or ``Trainer(callbacks=[StallscopeCallback("runs/x")])``.

A stallscope step is one optimizer step (``state.global_step``): compute runs from ``on_step_begin`` to
``on_step_end``; the data wait is exact under :func:`instrument` (each ``next()`` on the epoch iterator timed)
and an upper bound with the callback alone (meta ``data_wait`` says which). docs/integrations.md, "What is
measured: exact figures and bounds", has the table and the Trainer's read-ahead.

Invariants:
- The Session opens at ``on_train_begin`` (rank R of a world > 1 in ``RUN_DIR/rank-R/``) and closes at
  ``on_train_end`` as ``complete``; under :func:`instrument` a training that raises closes it ``failed``
  (``interrupted`` for Ctrl-C), every step kept; with the callback alone such a run is left ``running``.
- The hot path per micro-batch is one clock read and two additions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from profiler.core.steps.batch_facts import batch_len, loader_facts
from profiler.integrations import missing
from profiler.integrations.base import (
    dist_meta,
    print_report,
    rank_dir,
    session_options,
    start_session,
    torch_device,
)
from profiler.integrations.loggers import StepPoints, run_figures
from profiler.runs.session import Session

try:
    import transformers
    from transformers import TrainerCallback
except ImportError:
    raise missing("Hugging Face", "transformers (and accelerate)", "hf") from None

if TYPE_CHECKING:
    import torch
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("stallscope")
_P = ParamSpec("_P")
_R = TypeVar("_R")

EXACT = "exact: time blocked in next() on the Trainer's epoch iterator (stallscope instrument())"
BOUND = (
    "upper bound: host time from the previous on_step_end to on_step_begin (the fetch plus the previous "
    "step's logging, evaluation and saving)"
)


class StallscopeCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that records training as a stallscope run in ``out_dir``.

    Alone it records step time and an upper bound on the data wait (module docstring); give it to
    :func:`instrument` instead for the exact data wait and a ``failed`` status on an exception. ``report``
    prints the run's report at the end (process 0). ``prometheus`` (``[ADDR:]PORT``, 0: a free port) serves the
    live figures while training runs (process R of a machine on PORT + R). The other keyword arguments are the
    Session's."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        report: bool = True,
        prometheus: str | int | None = None,
        **session: object,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.report = report
        self.options = session_options(prometheus, session)
        self.session: Session | None = None
        self.timed_fetch = False  # instrument() times the fetch: the data wait is exact
        self._t_prev = 0.0  # the previous step's end (or the epoch's start): the next step starts there
        self._compute: AbstractContextManager[object] | None = None
        self._rank = 0
        self._runs = 0  # trainings recorded so far
        self.points: StepPoints | None = None  # the stall/ figures added to the Trainer's logs
        self.trainer: Trainer | None = None  # instrument()'s: the run's own figures logged through it at the end
        self._logging_end = False

    # -- the Trainer's events ---------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self.session is not None and self.session.status is None:
            return
        world, rank = int(args.world_size), int(args.process_index)
        self._rank = rank
        model, loader = kwargs.get("model"), kwargs.get("train_dataloader")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        facts = {
            "device": torch_device(args.device),
            "scenario": type(model).__name__ if model is not None else None,
            "pipeline": "hf-trainer",
            "meta": {
                "integration": "hf-callback",
                "framework": f"transformers {transformers.__version__}",
                "data_wait": EXACT if self.timed_fetch else BOUND,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                **dist_meta(
                    rank=rank,
                    world_size=world,
                    local_rank=int(args.local_process_index),
                    node_rank=int(os.environ.get("GROUP_RANK", "0")),
                    nnodes=max(1, world // max(1, local_world)),
                ),
            },
            "workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
            "batch_size": args.per_device_train_batch_size,
            **(loader_facts(loader) if loader is not None else {}),
        }
        self._runs += 1
        self.session = start_session(rank_dir(self.out_dir, rank, world, self._runs), self.options, facts)
        self.points = StepPoints(self.session.run_dir)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        """The stall/ figures of the steps since the last logging step, added to ``logs`` for the callbacks
        after this one (``report_to``'s trackers: :func:`instrument` puts this callback first)."""
        if logs is not None and self.points is not None and not self._logging_end:
            logs.update(self.points.take())

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        s = self.session
        if s is not None and s.status is None:
            s.close_step()
            self._t_prev = s.clock()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        s = self.session
        if s is None or s.status is not None:
            return
        if not s.in_step:  # no timed fetch opened it: the callback alone
            t = s.clock()
            s.open_step(self._t_prev)
            s.add_wait(t - self._t_prev)
            s.add_samples(None)
        self._compute = s.phase("compute")
        self._compute.__enter__()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        s = self.session
        if s is None or s.status is not None:
            return
        if self._compute is not None:
            self._compute.__exit__(None, None, None)
            self._compute = None
        self._t_prev = t = s.clock()
        s.close_step(t)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.close()

    # -- instrument()'s ---------------------------------------------------------------------------
    def fetched(self, t0: float, t1: float, batch: object) -> None:
        """A micro-batch fetched between clock readings ``t0`` and ``t1`` (``batch`` None: the iterator ended)."""
        s = self.session
        if s is None or s.status is not None:
            return
        if not s.in_step:
            s.open_step(self._t_prev)
        s.add_wait(t1 - t0)
        if batch is not None:
            s.add_samples(batch_len(batch))

    def close(self, exc: BaseException | None = None) -> None:
        """End the run: ``complete``, or from ``exc`` ``failed`` (``interrupted`` for Ctrl-C)."""
        s = self.session
        if s is None or s.status is not None:
            return
        self._compute = None
        s.__exit__(None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__)
        points, self.points = self.points, None
        if exc is None and self.trainer is not None and points is not None:
            self._logging_end = True  # the last steps' point and the run's figures, through report_to's trackers
            try:
                self.trainer.log({**points.take(), **run_figures(s.summary())})
            finally:
                self._logging_end = False
        if self.report and self._rank == 0:
            print_report(s.summary(), s.run_dir)
            if not self.timed_fetch:
                log.warning(
                    "stallscope: the data wait above is an %s; instrument(trainer, ...) times it exactly", BOUND
                )


class _TimedIterator:
    """The Trainer's epoch iterator, each ``next()`` timed into the callback."""

    __slots__ = ("_cb", "_clock", "_it")

    def __init__(self, it: Iterator[object], cb: StallscopeCallback, clock: Callable[[], float]) -> None:
        self._it, self._cb, self._clock = it, cb, clock

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> object:
        t0 = self._clock()
        try:
            batch = next(self._it)
        except StopIteration:
            self._cb.fetched(t0, self._clock(), None)
            raise
        self._cb.fetched(t0, self._clock(), batch)
        return batch


def _timing(
    get_batch_samples: Callable[[Iterator[object], int, torch.device], _R], cb: StallscopeCallback
) -> Callable[[Iterator[object], int, torch.device], _R]:
    """The Trainer's ``get_batch_samples``, each ``next()`` it makes on the epoch iterator timed into ``cb``."""

    def timed_batch_samples(epoch_iterator: Iterator[object], num_batches: int, device: torch.device) -> _R:
        clock = cb.session.clock if cb.session is not None else None
        it = _TimedIterator(epoch_iterator, cb, clock) if clock is not None else epoch_iterator
        return get_batch_samples(it, num_batches, device)

    return timed_batch_samples


def _closing(train: Callable[_P, _R], cb: StallscopeCallback) -> Callable[_P, _R]:
    """The Trainer's ``train``, closing ``cb``'s run ``failed`` (``interrupted``) when it raises."""

    def closing_train(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return train(*args, **kwargs)
        except BaseException as exc:
            cb.close(exc)
            raise

    return closing_train


def instrument(
    trainer: Trainer,
    out_dir: str | os.PathLike[str],
    *,
    report: bool = True,
    prometheus: str | int | None = None,
    **session: object,
) -> StallscopeCallback:
    """Record ``trainer``'s training in ``out_dir`` with the exact data wait: adds a :class:`StallscopeCallback`,
    times each ``next()`` the Trainer's ``get_batch_samples`` makes, and closes the run ``failed`` when
    ``trainer.train`` raises. Returns the callback (its ``session`` is the run's)."""
    cb = StallscopeCallback(out_dir, report=report, prometheus=prometheus, **session)
    cb.timed_fetch = True
    cb.trainer = trainer
    trainer.add_callback(cb)
    # first: its on_log adds the stall/ figures to the logs before report_to's callbacks read them
    callbacks = trainer.callback_handler.callbacks
    callbacks.insert(0, callbacks.pop(callbacks.index(cb)))
    trainer.get_batch_samples = _timing(trainer.get_batch_samples, cb)
    trainer.train = _closing(trainer.train, cb)
    return cb


__all__ = ["StallscopeCallback", "instrument"]
