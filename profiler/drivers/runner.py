"""The training loop stallscope drives: scenario + pipeline -> steps under a Session.

One loop for every scenario and pipeline, so differences between runs come from the loader and the
model, never from the harness. Per step it does exactly: wait for a batch (Session.wrap), copy it
(phase "h2d"), forward + loss + backward + optimizer step (phase "compute"). It never calls ``.item()``
or synchronises per step: that would add a stall the user's own loop may not have.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Sized
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pipelines import BuiltLoader, LoaderSpec, Pipeline, PipelineError
from pipelines import get as get_pipeline
from pipelines import stages as pipeline_stages
from pipelines import store as pipeline_store
from pipelines.imagefolder import BadSampleError, DataSourceError
from pipelines.naive import tensor_bytes
from profiler.analysis.memory import SHM_FIX, ShmNeed, shm_exhausted, shm_headline, shm_need
from profiler.core.recorders.in_thread import log_warning
from profiler.core.sampler_process.client import default_local_sources, default_recipe
from profiler.core.sampler_process.views import SamplerViews
from profiler.core.session import Interrupted
from profiler.core.sources.base import Source, SourceRecipe
from profiler.core.sources.memory import SHM
from profiler.core.sources.stages import StageSource
from profiler.core.steps.device_timers import DeviceInfo
from profiler.drivers.ddp import DistInfo, SyncTimer, sim_sync, wrap_ddp
from profiler.drivers.headspace import loader_alone
from profiler.drivers.precision import Precision
from profiler.drivers.shmwatch import ShmWatch, segment_mb
from profiler.live.feeds import Monitor, SessionFeed
from profiler.runs.session import Session
from profiler.sim.cost import CostModelError
from scenarios import DataOptions, Scenario

if TYPE_CHECKING:
    import torch
    from torch import nn

    from profiler.sim.device import SimDevice

StopWhen = Callable[[Session], bool]  # the session after a measured step -> stop now


class AugmentEpochsError(ValueError):
    """--augment-epochs given for a scenario whose dataset cannot switch its augmentation off."""


class TrainingError(Exception):
    """The training itself failed; the partial run is kept in ``run_dir`` and ``session`` (closed) holds its
    Summary.

    ``bad_input`` is set (one line) when the cause was the user's input: a missing or empty data directory,
    a bad file under ``--on-bad-sample fail``, or a pipeline that does not apply to the scenario (dali on a
    dataset that is not an image folder) or is not installed. The CLI exits 2 for those, 1 otherwise.
    """

    def __init__(self, where: str, run_dir: Path, bad_input: str | None = None, session: Session | None = None) -> None:
        super().__init__(where)
        self.where = where
        self.run_dir = run_dir
        self.bad_input = bad_input
        self.session = session


class LoaderFailure(RuntimeError):
    """A loader worker died or failed mid-run (a DataLoader worker process killed, DALI's threads stopped by an
    operator's error): says which worker, how, and at which step, in one line."""


class RunStopped(Interrupted):
    """A signal (the CLI's :class:`Interrupted`) stopped the run; ``session`` (closed, status "interrupted")
    holds what it measured."""

    def __init__(self, signame: str, session: Session) -> None:
        super().__init__(signame)
        self.session = session


@dataclass(frozen=True, slots=True)
class RunConfig:
    out: Path
    device: DeviceInfo
    pipeline: str = "naive"
    batch_size: int | None = None  # None: the scenario's default
    workers: int = 0
    # DataLoader knobs (naive, prefetch): batches each worker loads ahead, page-locked batches (None: the pipeline's)
    prefetch_factor: int | None = None
    pin_memory: bool | None = None
    steps: int | None = None
    warmup: int | None = None
    sample_hz: float = 10.0
    seed: int = 0
    attribution: bool = True  # py-spy on the loader workers when there are any (RUN_DIR/pyspy.txt)
    pyspy_rate: int = 10
    data: Path | None = None  # file-backed scenarios: None = the scenario's default set, generated once
    on_bad_sample: str = "fail"
    model: str | None = None  # None: the scenario's default model
    loader_only: bool = False  # iterate the pipeline and the copy, no model: the loader's prep rate
    stop_when: StopWhen | None = None  # checked after every measured step (sweeps stop once stable)
    augment_epochs: int | None = None  # augment the first N epochs only (scenarios whose dataset supports it)
    dist: DistInfo | None = None  # a rank of a data-parallel job (profiler.jobs.launch): DDP, a shard of the data
    # the loader's first batch, copied to the device once and trained on every step (NVIDIA's and tf_cnn_benchmarks'
    # "synthetic data"): the device's and the ranks' own rate, with the input pipeline out of the measurement
    synthetic_input: bool = False
    # the data set's reads paced as a store of this many MB/s would serve them (pipelines/store.py; torch pipelines)
    store_mbps: float | None = None
    page_cache: str | None = None  # "warm": the data set's files read once before the run; "cold": evicted
    dali_stages: bool = False  # dali: time the graph's prefixes alone before training (pipelines.dali.time_stages)
    headspace: bool = False  # iterate a second loader alone before training (profiler.drivers.headspace)
    kernel_windows: str = "auto"  # when the device's own activity is recorded (profiler.core.kernel_windows.windows)
    log_to: tuple[str, ...] = ()  # experiment trackers logged to while the run records (profiler.trackers.live)
    log_every_s: float = 10.0
    # the arithmetic of a real device's training (profiler.drivers.precision)
    precision: Precision = field(default_factory=Precision)
    extra_meta: dict[str, object] = field(default_factory=dict)


def run_scenario(scenario: Scenario, cfg: RunConfig, monitor: Monitor | None = None) -> Session:
    """Train ``scenario`` for ``cfg.steps`` measured steps after ``cfg.warmup``; returns the closed Session,
    whose ``summary()`` is the run's Summary.

    Raises TrainingError when the model, loss or loader fails mid-run (the Session has recorded status
    "failed" and where) and RunStopped when the CLI's signal handler stopped it (status "interrupted"); a
    KeyboardInterrupt propagates after the Session recorded "interrupted".
    """
    import torch

    torch.manual_seed(cfg.seed)
    plan = _plan(scenario, cfg)
    sim = _sim_device(cfg)
    session = _session(scenario, cfg, plan, sim)
    loop = _Loop(session, scenario, cfg, plan, sim)
    shown = contextlib.ExitStack()  # the views this process shows: all of them without a sampler process to
    handed = _hand_views(session, monitor, shown)  # serve them, or those it no longer can
    try:
        with session, shown:
            loop.set_up()
            try:
                with monitor(SessionFeed(session)) if monitor and not handed else contextlib.nullcontext():
                    loop.train()
            except LoaderFailure as exc:  # recorded as said, without the "(at file:line)" of a bare exception
                session.close("failed", error=str(exc))
                raise
            loop.finish()
    except Interrupted as exc:
        if session.status is None:  # the signal landed while the session was starting: close what it recorded
            session.close("interrupted", error=str(exc))
        raise RunStopped(exc.signame, session) from exc
    except Exception as exc:
        if session.status == "failed":
            # the failure said (a LoaderFailure) stays the cause when closing raised again on top of it: torch's
            # SIGCHLD handler can raise a killed worker's death in any later call (a CI run's cause read that)
            cause = said_failure(exc)
            raise TrainingError(session.error or str(exc), Path(cfg.out), _bad_input(cause), session) from cause
        raise
    finally:
        loop.close()
    return session


def said_failure(exc: BaseException) -> BaseException:
    """The LoaderFailure ``exc`` was raised while handling (its ``__context__`` chain), else ``exc``."""
    seen: BaseException | None = exc
    for _ in range(32):  # a chain's links, at most (Python breaks cycles; a bound all the same)
        if seen is None:
            break
        if isinstance(seen, LoaderFailure):
            return seen
        seen = seen.__context__
    return exc


def _hand_views(session: Session, monitor: Monitor | None, shown: contextlib.ExitStack) -> bool:
    """``monitor``'s views given to the session's sampler process (True), where it runs one and they can go
    there; should it not start, or be lost, they are shown from here instead (entered into ``shown``)."""
    if not isinstance(monitor, SamplerViews):
        return False
    views = monitor
    return session.recording.add_views(views.recipes(), lambda: shown.enter_context(views(SessionFeed(session))))


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a run resolved from the scenario's defaults and the config, once."""

    batch_size: int
    warmup: int
    steps: int
    data: DataOptions | None
    pipeline: Pipeline
    model_factory: Callable[[], nn.Module]

    @property
    def total(self) -> int:
        return self.warmup + self.steps


def _plan(scenario: Scenario, cfg: RunConfig) -> _Plan:
    return _Plan(
        batch_size=cfg.batch_size or scenario.batch_size,
        warmup=scenario.warmup if cfg.warmup is None else cfg.warmup,
        steps=scenario.steps if cfg.steps is None else cfg.steps,
        data=_data_options(scenario, cfg),
        # an unknown pipeline or model fails here, before a run directory is written
        pipeline=get_pipeline(cfg.pipeline),
        model_factory=scenario.model_factory(cfg.model),
    )


def _sim_device(cfg: RunConfig) -> SimDevice | None:
    """The simulated accelerator of a ``sim:`` device, else None."""
    if cfg.device.kind != "sim":
        return None
    from profiler.sim.device import SimDevice

    return SimDevice(cfg.device.sim)


def _sim_sources(sim: SimDevice) -> list[Source | SourceRecipe]:
    """What a run on the simulated device samples: the host as always (in the sampler process), and the simulated
    NVML in place of NVML (in this process, where the simulated device is)."""
    from profiler.sim.nvml import SimNvmlSource

    return [default_recipe(nvml=False), SimNvmlSource(sim)]


def _rank_sources(cfg: RunConfig, sim: SimDevice | None) -> list[Source | SourceRecipe]:
    """A rank of a job samples its own device only (its simulated NVML, or NVML of its CUDA device): the node's
    sampler (profiler.jobs.launch) covers the host and every rank's process tree once."""
    if sim is not None:
        from profiler.sim.nvml import SimNvmlSource

        return [SimNvmlSource(sim)]
    if cfg.device.kind == "cuda":
        return [SourceRecipe("profiler.core.sources.nvml:NvmlSource", device_indices=[cfg.device.index or 0])]
    return []


def _sources(cfg: RunConfig, sim: SimDevice | None) -> list[Source | SourceRecipe]:
    """What the run samples: a rank its own device, a simulated run the host and its twin, else the defaults; and
    the loader's stage times (the clock is made here, before the loader's workers fork and inherit it)."""
    pipeline_stages.install()
    if cfg.store_mbps is not None:
        pipeline_store.install(cfg.store_mbps)
    else:
        pipeline_store.uninstall()
    base = (
        _rank_sources(cfg, sim)
        if cfg.dist is not None
        else _sim_sources(sim)
        if sim is not None
        else [default_recipe(), *default_local_sources()]
    )
    shared = pipeline_stages.counters()
    assert shared is not None  # installed above
    # read in the sampler process, from the counters' memory files
    return [*base, StageSource.recipe(shared, pipeline_stages.COUNTED, pipeline_store.counters())]


def _session(scenario: Scenario, cfg: RunConfig, plan: _Plan, sim: SimDevice | None = None) -> Session:
    """The Session starts before set-up, so that a dataset or model that fails to build leaves a reportable
    run (status "failed", no steps) and set-up's host load is on the record too."""
    import torch

    data = plan.data
    return Session(
        cfg.out,
        sample_hz=cfg.sample_hz,
        device=cfg.device,
        timer=sim.timer() if sim is not None else None,
        kernel_windows=cfg.kernel_windows,
        log_to=list(cfg.log_to) or None,
        log_every_s=cfg.log_every_s,
        steps=plan.steps,  # auto: the kernel window after the measured steps (Session.tail_steps)
        sources=_sources(cfg, sim),
        warmup=plan.warmup,
        store_errors="raise",  # a store that stops writing stops the run: training on would record nothing
        meta={
            "scenario": scenario.name,
            "pipeline": cfg.pipeline,
            "batch_size": plan.batch_size,
            "steps_requested": plan.steps,
            "synthetic_data": scenario.synthetic,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "argv": list(sys.argv),
            "model": cfg.model or scenario.model_name,
            "loader_only": cfg.loader_only,
            **({"data_root": str(data.root), "on_bad_sample": cfg.on_bad_sample} if data else {}),
            **_storage_meta(cfg, data.root if data else None),
            **(cfg.dist.to_meta() if cfg.dist is not None else {}),
            **cfg.extra_meta,
        },
    )


def _storage_meta(cfg: RunConfig, root: Path | None) -> dict[str, object]:
    """The run's storage conditions, set up here (the page cache before the loader starts): its meta."""
    out: dict[str, object] = {}
    if cfg.store_mbps is not None:
        out["store_mbps"] = cfg.store_mbps
    if cfg.page_cache is not None and root is not None:
        files, nbytes = pipeline_store.set_page_cache(root, cfg.page_cache)
        out["page_cache"] = {"state": cfg.page_cache, "files": files, "bytes": nbytes}
    return out


_PLAIN = contextlib.nullcontext()


def _backward(loss: torch.Tensor) -> None:
    loss.backward()  # type: ignore[no-untyped-call]


def _opt_step(opt: torch.optim.Optimizer) -> None:
    opt.step()


class _Loop:
    """One run's set-up, training loop and tear-down, in the order ``run_scenario`` calls them."""

    def __init__(
        self, session: Session, scenario: Scenario, cfg: RunConfig, plan: _Plan, sim: SimDevice | None = None
    ) -> None:
        self.session, self.scenario, self.cfg, self.plan, self.sim = session, scenario, cfg, plan, sim
        self.dataset: Any = None
        self.built: BuiltLoader | None = None
        self.model: nn.Module | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.loss: torch.Tensor | None = None
        self._step: Callable[[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], object] = self._train_step
        self.copy = "pageable"  # on a simulated device: how the pipeline copies (its CUDA behaviour)
        self.batch_bytes: int | None = None
        self.shm_free_mb = self.shm_size_mb = math.nan  # /dev/shm at set-up, before the workers started
        self.sync: SyncTimer | None = None  # a rank under DDP: times the all-reduce wait after backward
        self.done = 0  # steps finished (warm-up included): the index of the step in flight
        self.measuring = True  # until the stop rule fires (the tail window's steps may follow)
        self.item_batch_bytes: int | None = None  # one item's bytes x the batch, read once when needed

    def set_up(self) -> None:
        """Dataset, loader and model; py-spy on the loader workers when asked for and there are any."""
        import torch

        session, scenario, cfg = self.session, self.scenario, self.cfg
        if (seg := segment_mb()) is not None:  # the segment before the loader's workers put batches in it
            self.shm_free_mb, self.shm_size_mb = seg
        self.dataset = dataset = scenario.build_dataset(self.plan.data)
        if cfg.augment_epochs is not None:
            if not hasattr(dataset, "augment_epochs"):
                raise AugmentEpochsError(
                    f"--augment-epochs: scenario {scenario.name!r} has no switchable augmentation "
                    "(a dataset with an augment_epochs attribute, as scenarios.common.AugmentedItems has)"
                )
            dataset.augment_epochs = cfg.augment_epochs
            session.annotate(augment_epochs=cfg.augment_epochs)
        shard = (cfg.dist.rank, cfg.dist.world_size) if cfg.dist is not None else (0, 1)
        spec = LoaderSpec(
            batch_size=self.plan.batch_size,
            workers=cfg.workers,
            device=cfg.device.torch_device,
            seed=cfg.seed,
            shard=shard[0],
            num_shards=shard[1],
            prefetch_factor=cfg.prefetch_factor,
            pin_memory=cfg.pin_memory,
        )
        self.built = built = self.plan.pipeline.build(dataset, spec)
        if cfg.dali_stages and built.config.get("pipeline") == "dali":
            session.annotate(dali_stages=_dali_stages(dataset, spec))
        if cfg.headspace:
            pipeline, clock = self.plan.pipeline, session.clock
            run_time = lambda: clock() - session.t0  # noqa: E731 - the run's timeline, as its samples and steps
            session.annotate(loader_alone=loader_alone(lambda: pipeline.build(dataset, spec), clock=run_time))
        augment: Any = getattr(dataset, "augment", None)
        session.annotate(
            workers=int(built.config.get("workers", cfg.workers)),
            pin_memory=built.config.get("pin_memory"),
            loader=built.config,
            epoch_samples=_epoch_samples(dataset),
            **({"augment": augment.describe()} if hasattr(augment, "describe") else {}),
        )
        if self.sim is not None:
            self._load_sim(self.sim)
        elif not cfg.loader_only:
            self.model = self.plan.model_factory().to(torch.device(cfg.device.torch_device))
            self.model.train()
            session.annotate(params=sum(p.numel() for p in self.model.parameters()))
            self._set_precision(torch)
            if cfg.device.kind == "cuda":
                self._count_flops()
            if cfg.dist is not None:
                self.model, self.sync = wrap_ddp(self.model, cfg.dist, cfg.device.torch_device, session.clock)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=scenario.lr, momentum=0.9)
        # py-spy attribution samples worker *processes*; DALI's workers are C++ threads with no Python stacks
        rec = session.recording
        if cfg.attribution and self.worker_processes > 0:
            rec.start_pyspy(
                os.getpid(), rate=cfg.pyspy_rate, attach_timeout_s=0.5, unavailable="no loader attribution: {problem}"
            )

    def _set_precision(self, torch: ModuleType) -> None:
        """--precision / --channels-last: the switches set, the model's memory format, the step that casts; what
        ran goes to the store's meta (``precision``)."""
        p, kind = self.cfg.precision, self.cfg.device.kind
        self.session.annotate(precision=p.apply(torch, kind))
        if p.channels_last and self.model is not None:
            self.model = self.model.to(memory_format=torch.channels_last)
        if not p.plain:
            self._step = p.step(torch, "cuda" if kind == "cuda" else "cpu", self._train_step)

    def _count_flops(self) -> None:
        """A CUDA run's FLOPs per step, counted once on the meta device (the simulator's count: the same model,
        batch and loss), for MFU (profiler.analysis.mfu)."""
        from profiler.sim.cost import CostModelError, measure_step
        from profiler.sim.specs import datasheet_peak

        scenario, plan = self.scenario, self.plan
        try:
            cost = measure_step(
                plan.model_factory,
                self.dataset[0],
                plan.batch_size,
                loss=scenario.loss,
                cost_forward=scenario.cost_forward,
                targets_in_forward=scenario.targets_in_forward,
            )
        except CostModelError as exc:
            self.session.annotate(step_flops={"flops": None, "source": f"not counted: {exc}"})
            return
        facts: dict[str, object] = {"flops": cost.flops, "source": "counted on the meta device (FlopCounterMode)"}
        self.session.annotate(step_flops=facts | datasheet_peak(self.cfg.device.name))

    def _load_sim(self, sim: SimDevice) -> None:
        """The simulated device gets the step's cost, counted on the meta device from one item of the dataset;
        the host holds no model (its arithmetic is what the simulator replaces)."""
        from profiler.sim.cost import measure_step

        scenario, plan = self.scenario, self.plan
        self.session.annotate(precision=self.cfg.precision.sim_facts(sim.config.precision))  # --precision on sim:
        self.copy = getattr(plan.pipeline, "accelerator_copy", "pageable")
        if self.copy == "pageable" and self.built is not None and self.built.config.get("pin_memory"):
            self.copy = "pinned"  # a DataLoader's pin_memory=True: a blocking copy from page-locked memory
        self.session.annotate(sim_copy=self.copy)
        if self.cfg.loader_only:
            return
        cost = measure_step(
            plan.model_factory,
            self.dataset[0],
            plan.batch_size,
            precision=sim.config.precision,
            loss=scenario.loss,
            cost_forward=scenario.cost_forward,
            targets_in_forward=scenario.targets_in_forward,
        )
        self.session.annotate(sim_cost=cost.to_dict())
        sim.load(cost)  # SimOutOfMemory: the configuration fails, as on the device
        self.session.annotate(
            sim_step_ms=sim.step_s() * 1e3, sim_launch_ms=sim.launch_total_s() * 1e3, params=cost.param_bytes // 4
        )

    def train(self) -> None:
        """Epochs of the loader until the planned steps ran (or the stop rule fired).

        A loader worker's death or error becomes a :class:`LoaderFailure` naming the worker and the step (torch
        raises a death from a SIGCHLD handler as well as from ``next()``, so anywhere in the step, hence caught
        here), unless the error is the user's data (a bad sample: ``_bad_input``)."""
        assert self.built is not None
        total, epoch, done = self.plan.total + self.session.tail_steps, 0, 0
        watch = None
        if self.worker_processes > 0:
            session = self.session
            watch = ShmWatch(lambda: session.waiting_since, session.clock, self._watched_batch_mb).start()
        try:
            try:
                while done < total:
                    if hasattr(self.dataset, "set_epoch"):
                        self.dataset.set_epoch(epoch)  # fresh augmentation each epoch, same for any worker count
                    epoch += 1
                    done, total, progressed = self._epoch(done, total)
                    if not progressed:
                        raise RuntimeError(
                            f"the {self.cfg.pipeline} loader produced no batch (dataset too small for batch "
                            f"{self.plan.batch_size}?)"
                        )
            finally:
                # closed inside the handler's reach: torch's SIGCHLD handler can raise a worker's death here too,
                # after a lost connection to the same worker ended the loop (a CI run said "training failed")
                if watch is not None:
                    watch.close()
        except Exception as exc:
            explain = self.built.worker_failure
            failure = explain(exc) if explain is not None else None
            stuck = watch.finding if watch is not None else None
            if stuck is None and (failure is None or _bad_input(exc) is not None):  # bad data: the user's (exit 2)
                raise
            step, kept = self.done, f"steps 0-{self.done - 1} are kept" if self.done else "no step had finished"
            if stuck is not None:  # the watch stopped the workers: its finding, not their deaths, is the cause
                failure = f"{stuck}; {self._shm_words()}"
            elif failure is not None and (shm_exhausted(failure) or shm_exhausted(str(exc))):
                failure += f"; {self._shm_words()}"
            raise LoaderFailure(f"the loader failed at step {step} of {total} ({kept}): {failure}") from exc

    @property
    def worker_processes(self) -> int:
        """The loader's worker processes (DALI's workers are threads: 0)."""
        assert self.built is not None
        return int(self.built.config.get("worker_processes", self.built.config.get("workers", 0)))

    def _item_batch_bytes(self) -> int | None:
        """One item's bytes x the batch size: a batch's size before the first batch came (read once; None where the
        item cannot be read)."""
        if self.item_batch_bytes is None:
            with contextlib.suppress(Exception):
                self.item_batch_bytes = tensor_bytes(self.dataset[0]) * self.plan.batch_size
        return self.item_batch_bytes

    def _watched_batch_mb(self) -> float | None:
        """A batch's MiB for the shared-memory watch: the first batch's; before it came, one item's x the batch,
        read only once the segment is half used (one item more through the dataset: never on a roomy segment)."""
        if self.batch_bytes is not None:
            return self.batch_bytes / 2**20
        if self.item_batch_bytes is None and not ((seg := segment_mb()) is not None and seg[0] < seg[1] / 2):
            return None
        nbytes = self._item_batch_bytes()
        return None if nbytes is None else nbytes / 2**20

    def _shm_need(self, batch_bytes: int | None) -> ShmNeed | None:
        """The loader's predicted /dev/shm need (profiler.analysis.memory.shm_need) at ``batch_bytes`` a batch."""
        assert self.built is not None
        meta = {"loader": self.built.config, "batch_bytes": batch_bytes, "device": {"kind": self.cfg.device.kind}}
        return shm_need(meta)

    def _warn_shm(self) -> None:
        """Said once, at the first batch, when the batches in flight will not fit the shared-memory segment."""
        said = shm_headline(self._shm_need(self.batch_bytes), self.shm_free_mb, self.shm_size_mb, math.nan)
        if said is not None:
            log_warning(said)
            self.session.event("warning", said)

    def _shm_words(self) -> str:
        """Shared memory ran out: what the loader needed (predicted from its knobs and a batch's bytes), what the
        segment has, and the fix."""
        batch_bytes, sized = self.batch_bytes, "a batch"
        if batch_bytes is None:  # it failed before the first batch arrived: one item's bytes x the batch size
            batch_bytes, sized = self._item_batch_bytes(), "one item x the batch size"
        need = self._shm_need(batch_bytes)
        seg = segment_mb()
        has = f"it has {seg[1]:.0f} MiB ({seg[0]:.0f} free now)" if seg is not None else "its size could not be read"
        needs = (
            f"the loader needs about {need.need_mb:.0f} MiB (predicted: {need.batches} batches of "
            f"{need.batch_mb:.1f} MiB ({sized}), {need.rule})"
            if need is not None
            else "what the loader needs could not be sized"
        )
        return f"shared memory ({SHM}) ran out: {needs}; {has}. {SHM_FIX}"

    def _epoch(self, done: int, total: int) -> tuple[int, int, bool]:
        """One pass over the loader: h2d then compute per batch; (steps done, total, any batch seen)."""
        assert self.built is not None
        session, built, cfg = self.session, self.built, self.cfg
        model, opt, sim = self.model, self.opt, self.sim
        resident = self._resident(total - done) if cfg.synthetic_input else None
        batches = session.wrap(resident if resident is not None else built.batches)
        progressed = False
        for batch in batches:
            if self.batch_bytes is None:  # what one batch moves to the device, recorded once
                self.batch_bytes = tensor_bytes(batch)
                session.annotate(batch_bytes=self.batch_bytes)
                self._warn_shm()
            progressed = True
            if resident is not None:  # already on the device: no copy
                x, y = batch
            else:
                with session.phase("h2d"):
                    x, y = built.to_device(batch)
                    if sim is not None:
                        nbytes = tensor_bytes(batch)
                        sim.h2d(nbytes, pinned=self.copy != "pageable", side_stream=self.copy == "pinned-async")
            if sim is not None and sim.cost is not None:
                with session.phase("compute"):
                    sim.step()
                if cfg.dist is not None:
                    sim_sync(session, sim, cfg.dist.world_size)
            elif model is not None and opt is not None:
                with session.phase("compute"):
                    self._step(model, opt, x, y)
            done += 1
            self.done = done
            if done >= total:
                break
            if cfg.stop_when is not None and self.measuring and done > self.plan.warmup and cfg.stop_when(session):
                self.measuring = False
                total = done + session.tail_now()  # the kernel window's steps, after the measured ones
                if done >= total:
                    break
        batches.close()  # ends the step in flight now, not at garbage collection
        return done, total, progressed

    def _resident(self, steps: int) -> list[Any]:
        """--synthetic-input: the loader's first batch, on the device, ``steps`` times (loaded and copied once,
        before the steps: its time is no step's data wait)."""
        assert self.built is not None
        built = self.built
        first = next(iter(built.batches))
        on_device = built.to_device(first)
        if self.sim is not None:
            self.sim.h2d(tensor_bytes(first), pinned=self.copy != "pageable", side_stream=False)
        self.session.annotate(synthetic_input="the loader's first batch, copied to the device once, every step")
        return [on_device] * steps

    def _train_step(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        cast: AbstractContextManager[object] = _PLAIN,
        backward: Callable[[torch.Tensor], None] = _backward,
        opt_step: Callable[[torch.optim.Optimizer], None] = _opt_step,
    ) -> None:
        """Forward and loss (under ``cast``: autocast for --precision bf16/fp16), backward, optimizer step; under
        DDP the all-reduce wait after backward is the nested phase "compute/sync" (profiler.drivers.ddp)."""
        session, sync = self.session, self.sync
        with cast:
            out = model(x, y) if self.scenario.targets_in_forward else model(x)
            self.loss = loss = self.scenario.loss(out, y)
        opt.zero_grad(set_to_none=True)
        if sync is not None:
            sync.start_step()
        backward(loss)
        if sync is not None and (ready := sync.last_ready) is not None:
            session.span("sync", ready, session.clock())
        opt_step(opt)

    def finish(self) -> None:
        if self.built is not None:  # a loader that learns its facts while running (ray: first batch, Ray's stats)
            self.session.annotate(loader=self.built.config)
        if self.loss is not None:
            self.session.annotate(final_loss=float(self.loss.detach()))
        if self.built is not None and self.built.skips is not None:
            self.session.annotate(bad_samples=self.built.skips.to_meta())

    def close(self) -> None:
        if self.built is not None:
            self.built.close()


def _dali_stages(dataset: Any, spec: LoaderSpec) -> dict[str, object]:
    """DALI's prefixes timed alone before training (``--dali-stages``), each round net of this thread's wait for a
    CPU where schedstat gives it (the thread that queues the graph's batches is not the graph)."""
    from pipelines.dali import time_stages
    from profiler.core.sources.sched import ThreadSched, probe

    if probe() is not None:
        return time_stages(dataset, spec)
    own = ThreadSched()
    try:
        return time_stages(dataset, spec, waited=own.run_delay_s)
    finally:
        own.close()


def _data_options(scenario: Scenario, cfg: RunConfig) -> DataOptions | None:
    """Where a file-backed scenario reads from; its default set is generated on first use."""
    if scenario.data is None:
        return None
    if cfg.data is not None:
        root = cfg.data
    else:  # the Python API's default; the CLI generates it before the run, behind a progress bar
        from scenarios.datagen import ensure_default

        root = ensure_default(scenario.data, scenario.data_count, seed=0)
    # a simulated accelerator gets the scenario's accelerator settings (imagenet's 224 px crop, not the CPU's 112)
    device_type = "cuda" if cfg.device.accelerator else "cpu"
    return DataOptions(root=Path(root), on_bad_sample=cfg.on_bad_sample, device_type=device_type)


def _bad_input(exc: BaseException) -> str | None:
    """The one-line message when ``exc`` is the user's data at fault (also when re-raised by a worker)."""
    # PipelineError: dali on a scenario without image files, or DALI not installed
    if isinstance(exc, (DataSourceError, PipelineError, AugmentEpochsError, CostModelError)):
        return str(exc)
    if isinstance(exc, BadSampleError):
        # a DataLoader worker re-raises with the worker's traceback in the message: keep the error's own line
        lines = [ln.strip() for ln in str(exc).splitlines() if "bad sample " in ln]
        return lines[-1].split("BadSampleError: ", 1)[-1] if lines else str(exc)
    return None


def _epoch_samples(dataset: object) -> int | None:
    if not isinstance(dataset, Sized):  # an iterable-style data set has no length
        return None
    try:
        return len(dataset)
    except TypeError:  # torch's IterableDataset defines __len__ only to raise
        return None
