"""Watchers: what watches a run from outside its steps, writing into its store: the sampler of its sources and,
when asked, py-spy on the training process and its workers.

Each process that samples a run builds one directly: the sampler process
(:mod:`profiler.core.sampler_process.process`, beside the store it writes) and the training process's
:class:`~profiler.core.recorders.in_thread.ThreadRecorder` (where no sampler process runs). Invariants:
- The sampler writes its rows and events to the store as they come; :meth:`close` takes one last round (a short
  run still has every source's figures), stops py-spy, and puts the sampler's health in the meta.
- py-spy is started in one place (:meth:`start_pyspy`); one that cannot attach, or that ends mid-run, is a warning
  said once, an event and the meta's ``pyspy_problem``; where its target had already exited (a command that failed
  at once), the event and the meta only: the command's own end is the news. py-spy's own output is in
  ``RUN_DIR/pyspy.log``, never on the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from profiler.core.sampling.pyspy import OUTPUT, PySpyRecorder, target_gone
from profiler.core.sampling.sampler import Sampler
from profiler.core.sources.base import Source
from profiler.core.sources.memory import LOOP_END, Taken
from profiler.core.store import STACKS_NAMES, RunStore, no_world_write


class Watchers:
    """The sampler and py-spy of the run that ``store`` records, on the run's timeline (``t0`` on ``clock``)."""

    def __init__(
        self,
        store: RunStore,
        *,
        sample_hz: float,
        sources: Sequence[Source],
        t0: float,
        warn: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.store = store
        self.out_dir = Path(store.run_dir)
        self.t0 = t0
        self._clock = clock
        self._warn = warn
        self.sampler = Sampler(
            list(sources), sample_hz, sink=store.put_samples, on_event=store.put_event, clock=clock, t0=t0
        )
        self._pyspy: PySpyRecorder | None = None
        self.pyspy_problem: str | None = None  # why py-spy recorded nothing (or stopped badly), when asked for

    def start(self) -> None:
        """Start sampling: the sources' probes, then rounds on the sampler's thread."""
        self.sampler.start()

    def now(self) -> float:
        """Seconds since the run's zero."""
        return self._clock() - self.t0

    def event(self, kind: str, message: str, source: str | None = None) -> None:
        self.store.put_event(self.now(), kind, message, source)

    def rescan_soon(self) -> None:
        """A loader has just started its workers: the process-tree sources look for them at their next read."""
        self.sampler.rescan_soon()

    def read_memory_soon(self, taken: Taken | None = None, t: float = 0.0) -> None:
        """The memory source reads the loader workers' memory at the next round, off its schedule; ``taken``: the
        readings the training process took of them at ``t`` (its loop's end), stored as the memory source's."""
        if not taken:
            self.sampler.read_workers_soon()
            return
        figures = self.sampler.labelled_memory(taken)
        if figures:
            self.store.put_samples([(t, LOOP_END, metric, value) for metric, value in figures.items()])

    def start_pyspy(self, pid: int, *, rate: int, attach_timeout_s: float, unavailable: str) -> str | None:
        """Record ``pid`` and its subprocesses with py-spy until close; None when it attached, else the
        reason, which is stored and shown as ``unavailable.format(problem=...)``."""
        recorder = PySpyRecorder(pid, self.out_dir / OUTPUT, rate=rate, now=self.now)
        # py-spy killed or failing mid-run: said once, when it happens; the run goes on with the sampler
        recorder.on_exit = lambda problem: self._pyspy_ended(
            unavailable.format(problem=problem), problem, quiet=target_gone(pid)
        )
        problem = recorder.start(attach_timeout_s=attach_timeout_s)
        self.store.put_meta(pyspy_rate=rate, pyspy_started_at=recorder.started_at, pyspy_args=recorder.args)
        if problem:
            self.pyspy_problem = problem
            self.event("warning", problem, "pyspy")
            if not recorder.gone:
                self._warn(unavailable.format(problem=problem))
            return problem
        self._pyspy = recorder
        return None

    def close(self) -> None:
        """One last round of the sampler, then py-spy stopped (its files made private to the user); both said in
        the meta."""
        self.sampler.stop(final=True)
        self._stop_pyspy()
        for name in STACKS_NAMES:  # py-spy creates its files with its own mode
            no_world_write(self.out_dir / name)
        self.store.put_meta(sampler_stats=self.sampler.stats.to_meta())

    def _pyspy_ended(self, line: str, problem: str, *, quiet: bool = False) -> None:
        self.pyspy_problem = problem
        self.event("warning", problem, "pyspy")
        self.store.put_meta(pyspy_problem=problem)
        if not quiet:  # quiet: its target had exited (py-spy failing then is no news)
            self._warn(line)

    def _stop_pyspy(self) -> None:
        recorder = self._pyspy
        if recorder is None:
            if self.pyspy_problem is not None:
                self.store.put_meta(pyspy_problem=self.pyspy_problem)
            return
        problem = recorder.stop()
        if problem and problem != self.pyspy_problem:  # not already said when py-spy ended mid-run
            self.pyspy_problem = problem
            self.event("warning", problem, "pyspy")
            if not (recorder.wrote_nothing and target_gone(recorder.pid)):  # a target gone at once: no news
                self._warn(problem)
        scheduling = recorder.on_time.scheduling if recorder.on_time is not None else None
        self.store.put_meta(
            pyspy_stopped_at=recorder.stopped_at,
            pyspy_problem=problem,
            pyspy_scheduling=scheduling,
            pyspy_behind_s=recorder.stdout.behind_s,
            pyspy_behind_reports=recorder.stdout.behind_reports,
        )
