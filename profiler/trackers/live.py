"""Live logging while a run records: ``Session(..., log_to=...)`` and ``run --log-to ...`` (docs/integrations.md,
"Experiment trackers").

:class:`TrackerHook` is a Session hook that takes no rows: the training thread makes nothing for it. A thread
follows a live feed (:func:`follow`): it folds the steps each ``poll_s`` (:class:`~profiler.trackers.analysis.
LiveFold`) and every ``every_s`` hands each tracker the point covering the steps since the last, through a
:class:`~profiler.trackers.deliver.Delivery` (the tracker's own thread: one that blocks or raises costs the run
nothing). At the close it hands the last point and the run's figures so far (``stall/run/``), and waits at most
``close_wait_s`` for them.

Where it runs: TensorBoard and MLflow in the sampler process, as a view over its feed (``view.log_view``: the
rows as they are drained; docs/architecture.md, "Two processes"), else (``sampling="thread"``, or the sampler
process lost) on a thread here tailing the store. W&B here, on such a thread: its run is this process's
``wandb.run``. MLflow's run is the one active in this process (its id passed over), else ``MLFLOW_RUN_ID``'s,
else one made for the run.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from profiler.core.background import in_background
from profiler.core.rows import PhaseRow, StepRow
from profiler.core.sampler_process.views import ViewRecipe
from profiler.live.feeds import LiveFeed
from profiler.trackers.analysis import LiveFold, Point, is_cuda
from profiler.trackers.base import ALLOWED, Target, Tracker, open_tracker, parse_targets
from profiler.trackers.deliver import Delivery

if TYPE_CHECKING:
    from profiler.core.hooks import SessionView

EVERY_S = 10.0  # as MLflow's and W&B's own system metrics
POLL_S = 1.0  # the feed's fold: a sampler feed hands the newest 1,024 steps, so a fold each second takes them all
CLOSE_WAIT_S = 5.0
IN_SAMPLER = ("tensorboard", "mlflow")  # those that need nothing of the training process


class ViewHost(Protocol):
    """A recorder that may serve views from its sampler process (``profiler.core.hooks.Recorder.add_views``)."""

    def add_views(self, recipes: Sequence[ViewRecipe], fallback: Any) -> bool: ...


def _fold(feed: LiveFeed, fold: LiveFold) -> None:
    steps, samples = feed.poll()
    windows = getattr(feed, "windows", None)  # a feed of kernel windows (the sampler process's, a store's)
    if callable(windows):
        fold.add_windows(windows())
    fold.add(steps, feed.meta())
    fold.add_samples(samples)


@contextlib.contextmanager
def follow(
    feed: LiveFeed | None,
    deliveries: Sequence[Delivery],
    *,
    every_s: float = EVERY_S,
    poll_s: float = POLL_S,
    close_wait_s: float = CLOSE_WAIT_S,
    make_feed: Any = None,
) -> Iterator[LiveFold]:
    """Log ``feed``'s run to ``deliveries`` while the block runs (``make_feed``: a feed made once it can be, a
    store not yet created)."""
    poll_s = min(poll_s, every_s)
    fold = LiveFold(gpu_util=feed is not None and is_cuda(feed.meta()))
    got: list[LiveFeed] = [feed] if feed is not None else []

    def tick() -> None:
        if not got:
            try:
                got.append(make_feed())
                fold.gpu_util = is_cuda(got[0].meta())
            except Exception:  # noqa: BLE001 - the store not created yet: the next tick tries again
                return
        _fold(got[0], fold)

    def send() -> None:
        points = fold.take()
        if points:
            for d in deliveries:
                d.submit(functools.partial(log_points, points=points))

    def loop(done: threading.Event) -> None:
        last = time.monotonic()
        while not done.wait(poll_s):
            try:
                tick()
            except Exception:  # noqa: BLE001 - a feed briefly unreadable: its rows come at the next tick
                continue
            if time.monotonic() - last >= every_s:
                last = time.monotonic()
                send()

    try:
        with in_background(loop, name="stallscope-trackers", join_s=poll_s + 1.0):
            yield fold
    finally:
        with contextlib.suppress(Exception):
            tick()
        send()
        figures, step = fold.run_figures(), max(fold.last_step, 0)
        for d in deliveries:
            d.submit(lambda t: t.log_summary(figures, step))
        deadline = time.monotonic() + close_wait_s
        for d in deliveries:
            d.close(max(0.1, deadline - time.monotonic()))


def log_points(tracker: Tracker, points: list[Point]) -> None:
    tracker.log(points)


def _same(tracker: Tracker) -> Tracker:
    return tracker


def deliveries(targets: Sequence[Target], run_name: str | None) -> list[Delivery]:
    return [Delivery(str(t), functools.partial(open_tracker, t, run_name=run_name)) for t in targets]


def follow_targets(
    feed: LiveFeed, targets: list[dict[str, Any]], *, every_s: float, run_name: str | None = None
) -> contextlib.AbstractContextManager[LiveFold]:
    """The sampler process's side of :class:`TrackerHook` (through :func:`profiler.trackers.view.log_view`):
    ``targets`` (their JSON) logged from its feed."""
    parsed = [Target(str(t["kind"]), t.get("arg"), t.get("run_id")) for t in targets]
    return follow(feed, deliveries(parsed, run_name), every_s=every_s)


def mlflow_run(target: Target) -> Target:
    """The MLflow target with the run active in this process (where mlflow is imported and one is), or
    ``MLFLOW_RUN_ID``'s; its tracking URI that process's where none is given."""
    if target.kind != "mlflow" or "mlflow" not in sys.modules:  # never imported here just to ask
        return target
    from profiler.trackers.to_mlflow import active_run

    uri, run_id = active_run()
    return Target(target.kind, target.arg or uri, run_id)


class TrackerHook:
    """``Session(log_to=...)``: the run's points to each tracker every ``every_s`` seconds, off the training
    thread. ``log_to``: target strings (``tensorboard:DIR``, ``mlflow[:URI]``, ``wandb``; TargetError, a
    ValueError, when made) or Tracker objects of the caller's own (run on a thread here)."""

    wants_rows = False  # the training thread makes no row for it

    def __init__(
        self,
        log_to: object,
        out_dir: Path,
        *,
        every_s: float = EVERY_S,
        host: ViewHost | None = None,
        close_wait_s: float = CLOSE_WAIT_S,
    ) -> None:
        items: list[object] = list(log_to) if isinstance(log_to, (list, tuple)) else [log_to]
        self.targets = parse_targets([x for x in items if isinstance(x, str)])
        self.objects: list[Tracker] = []
        for x in items:
            if not isinstance(x, str):
                if not callable(getattr(x, "log", None)):
                    raise ValueError(f"log_to={x!r}: {ALLOWED}, or a tracker object (profiler.trackers.base.Tracker)")
                self.objects.append(x)  # type: ignore[arg-type]  # a Tracker by its methods
        if every_s <= 0:
            raise ValueError(f"log_every_s={every_s}: allowed a number of seconds > 0")
        self.out_dir, self.every_s, self._host, self._close_wait_s = out_dir, every_s, host, close_wait_s
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()

    def on_start(self, session: SessionView) -> None:
        run_name = str(session.meta.get("run_id") or self.out_dir.name)
        targets = [mlflow_run(t) for t in self.targets]
        there = [t for t in targets if t.kind in IN_SAMPLER]
        here = deliveries([t for t in targets if t.kind not in IN_SAMPLER], run_name)
        here += [Delivery(getattr(o, "name", type(o).__name__), functools.partial(_same, o)) for o in self.objects]
        if there:
            recipe = ViewRecipe(
                "profiler.trackers.view:log_view",
                targets=[t.to_json() for t in there],
                every_s=self.every_s,
                run_name=run_name,
            )
            if self._host is None or not self._host.add_views([recipe], lambda: self._here(there, run_name)):
                self._here(there, run_name)
        if here:
            self._follow_here(here)

    def _here(self, targets: Sequence[Target], run_name: str) -> None:
        self._follow_here(deliveries(targets, run_name))

    def _follow_here(self, sends: list[Delivery]) -> None:
        from profiler.live.feeds import StoreFeed

        with self._lock:
            self._stack.enter_context(
                follow(
                    None,
                    sends,
                    every_s=self.every_s,
                    close_wait_s=self._close_wait_s,
                    make_feed=lambda: StoreFeed(self.out_dir),
                )
            )

    def on_meta(self, items: Mapping[str, object]) -> None:
        pass

    def on_step(self, row: StepRow, phases: Sequence[PhaseRow]) -> None:
        pass  # never called: wants_rows is False

    def on_event(self, kind: str, message: str) -> None:
        pass

    def on_close(self, status: str, error: str | None) -> None:
        with self._lock:
            stack, self._stack = self._stack, contextlib.ExitStack()
        stack.close()
