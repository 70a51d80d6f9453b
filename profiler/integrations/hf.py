"""Hugging Face's Trainer: ``instrument(trainer, "runs/x")``, or ``Trainer(callbacks=[StallscopeCallback("runs/x")])``.

A stallscope step here is one optimizer step of the Trainer (``state.global_step``): with gradient
accumulation, ``gradient_accumulation_steps`` micro-batches. Before each optimizer step the Trainer fetches
all of that step's micro-batches at once (``Trainer.get_batch_samples``), then calls ``on_step_begin``, runs
forward and backward on each, steps the optimizer and calls ``on_step_end``; logging, evaluation and saving
follow ``on_step_end``. So, per step:

- **data wait**: with :func:`instrument`, the time blocked in ``next()`` on the Trainer's epoch iterator,
  summed over the step's micro-batches: exact. With the callback alone, the host time from the previous
  ``on_step_end`` (or ``on_epoch_begin``) to ``on_step_begin``: the fetch plus the previous step's logging,
  evaluation and saving, an upper bound on the data wait (meta ``data_wait`` says which).
- **compute**: ``on_step_begin`` to ``on_step_end``: forward, backward and the optimizer step of every
  micro-batch. The Trainer moves each micro-batch to the device inside it, so the copy is in compute (no h2d
  phase of its own).
- the step runs from the previous ``on_step_end`` to its own: the rest (logging, evaluation, saving) is "other"
  under :func:`instrument`.

The Trainer's loader (accelerate's ``DataLoaderShard``) reads one batch ahead inside ``next()``: the first
``next()`` of an epoch loads two batches, the last none, and a batch's copy to the device happens in the
``next()`` that hands it over. The data wait is still exactly the time the loop was blocked fetching, but a
step's wait is the load of the batch after its own; over an epoch the sums are the same.

Invariants:
- The Session opens at ``on_train_begin`` (rank R of a world > 1 in ``RUN_DIR/rank-R/``) and closes at
  ``on_train_end`` as ``complete``. A callback is not told of an exception: :func:`instrument` also wraps
  ``trainer.train`` so that a training that raises closes the run ``failed`` (``interrupted`` for Ctrl-C), every
  step so far kept; with the callback alone such a run is left ``running`` (``stallscope report`` reads it).
- The hot path per micro-batch is one clock read and two additions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from profiler.core.session import Session, batch_len, loader_facts
from profiler.integrations import missing
from profiler.integrations.base import (
    dist_meta,
    print_report,
    rank_dir,
    session_options,
    start_session,
    torch_device,
)

try:
    import transformers
    from transformers import TrainerCallback
except ImportError:
    raise missing("Hugging Face", "transformers (and accelerate)", "hf") from None

_Base: Any = TrainerCallback
log = logging.getLogger("stallscope")

EXACT = "exact: time blocked in next() on the Trainer's epoch iterator (stallscope instrument())"
BOUND = (
    "upper bound: host time from the previous on_step_end to on_step_begin (the fetch plus the previous "
    "step's logging, evaluation and saving)"
)


class StallscopeCallback(_Base):  # type: ignore[misc]
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
        **session: Any,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.report = report
        self.options = session_options(prometheus, session)
        self.session: Session | None = None
        self.timed_fetch = False  # instrument() times the fetch: the data wait is exact
        self._t_prev = 0.0  # the previous step's end (or the epoch's start): the next step starts there
        self._compute: Any = None
        self._rank = 0
        self._runs = 0  # trainings recorded so far

    # -- the Trainer's events ---------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
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

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self.session
        if s is not None and s.status is None:
            s.close_step()
            self._t_prev = s.clock()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
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

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self.session
        if s is None or s.status is not None:
            return
        if self._compute is not None:
            self._compute.__exit__(None, None, None)
            self._compute = None
        self._t_prev = t = s.clock()
        s.close_step(t)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    # -- instrument()'s ---------------------------------------------------------------------------
    def fetched(self, t0: float, t1: float, batch: Any) -> None:
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
        if self.report and self._rank == 0:
            print_report(s.summary(), s.run_dir)
            if not self.timed_fetch:
                log.warning(
                    "stallscope: the data wait above is an %s; instrument(trainer, ...) times it exactly", BOUND
                )


class _TimedIterator:
    """The Trainer's epoch iterator, each ``next()`` timed into the callback."""

    __slots__ = ("_cb", "_clock", "_it")

    def __init__(self, it: Iterator[Any], cb: StallscopeCallback, clock: Callable[[], float]) -> None:
        self._it, self._cb, self._clock = it, cb, clock

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        t0 = self._clock()
        try:
            batch = next(self._it)
        except StopIteration:
            self._cb.fetched(t0, self._clock(), None)
            raise
        self._cb.fetched(t0, self._clock(), batch)
        return batch


def instrument(
    trainer: Any,
    out_dir: str | os.PathLike[str],
    *,
    report: bool = True,
    prometheus: str | int | None = None,
    **session: Any,
) -> StallscopeCallback:
    """Record ``trainer``'s training in ``out_dir`` with the exact data wait: adds a :class:`StallscopeCallback`,
    times each ``next()`` the Trainer's ``get_batch_samples`` makes, and closes the run ``failed`` when
    ``trainer.train`` raises. Returns the callback (its ``session`` is the run's)."""
    cb = StallscopeCallback(out_dir, report=report, prometheus=prometheus, **session)
    cb.timed_fetch = True
    trainer.add_callback(cb)
    get_batch_samples, train = trainer.get_batch_samples, trainer.train

    def timed_batch_samples(epoch_iterator: Iterator[Any], num_batches: int, device: Any) -> Any:
        clock = cb.session.clock if cb.session is not None else None
        it = _TimedIterator(epoch_iterator, cb, clock) if clock is not None else epoch_iterator
        return get_batch_samples(it, num_batches, device)

    def closing_train(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException as exc:
            cb.close(exc)
            raise

    trainer.get_batch_samples = timed_batch_samples
    trainer.train = closing_train
    return cb


__all__ = ["StallscopeCallback", "instrument"]
