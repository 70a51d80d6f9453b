"""The ``ray`` pipeline: the scenario's items prepared by Ray Data ``map_batches`` tasks, fed by ``iter_torch_batches``.

Every epoch is one Ray Dataset over the epoch's batch numbers (a lazy ``ray.data.range``, ``epoch_dataset``):
``map_batches`` loads and augments batch ``k``'s items, ``k * batch_size`` onwards in the epoch's item order, in a
Ray worker (the dataset's own ``__getitem__``, so the scenario's ``AugmentSpec`` is realised exactly as ``naive``
realises it), and ``iter_torch_batches`` streams the stacked ``(x, y)`` batches to the loop with its own read-ahead
(``prefetch_batches``). The order of batches is the order of the indices (``preserve_order``), so the same seed
gives the same batches as the reference and shuffling off gives the dataset's order.

Invariants: a Ray instance the pipeline started (``ray.init`` with ``max(1, workers)`` CPUs and an object store
sized for the batches in flight) is shut down by ``close``, and a connection it made to ``RAY_ADDRESS`` is closed
(the cluster stays); an instance this process had already initialised (a test's) is left as it was. ``ray`` is
imported here only, late, so that listing pipelines imports nothing.

The first batch's wait is kept apart in ``config``: ``ray_start_ms`` (connecting to or starting the instance) and
``first_batch_ms`` (from building the epoch's dataset to its first batch: the plan, the executor's start and the
first blocks). Both fall in the run's first step, a warm-up step unless ``--warmup 0``. Ray Data's own figures
(per operator, and the user thread's blocked time) are read at each epoch's end into ``ray_stats``.

The run's start-up lasts until every Ray CPU it has has run a map task (:class:`StartUp`): Ray starts a CPU's worker
process only when Ray Data first runs a task on it, so with two CPUs the second one's start (0.5-1.5 s on this host)
falls on a step after the first batch, not in its wait. Each batch of an epoch begun in the start-up carries the
pids of the workers that made it (``PID``, dropped before the loop sees the batch); the start-up ends at the batch
that brings the last CPU's first, or at a bound (``STARTUP_BATCHES``, ``STARTUP_S``), said so. Its steps are named
in ``config`` (``startup_steps`` and the rest, :meth:`StartUp.to_config`) and held out of the measured steps by the
analysis (``profiler.analysis.apart``), never dropped: the store keeps them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import math
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pipelines.base import BuiltLoader, LoaderSpec
from pipelines.naive import move
from pipelines.ray_stats import capture_iteration, read_stats

EXTRA = "the ray pipeline needs Ray Data: pip install 'stallscope[ray]'"
PREFETCH_BATCHES = 2
CONNECT_TIMEOUT_S = 5.0
# Ray refuses an object store under 75 MiB; batches in flight are workers' outputs plus the read-ahead
MIN_STORE_BYTES = 80 * 2**20
STORE_HEADROOM = 4
USER_MODULES = "stallscope_user_scenario_"  # the prefix of a scenario file's module (scenarios._load_file)
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its task names
# an epoch's batches per Ray task past TASKS_MIN tasks (read_tasks), and a block's target size as a fraction of a
# batch's bytes (epoch_dataset)
BATCHES_PER_TASK = 16
TASKS_MIN = 64
BLOCK_FRACTION = 0.9
NO_CPU_WAIT_S = 10.0  # a busy instance's CPUs may free up (the last epoch's tasks ending): polled this long
# the worker exits that are a loss (killed, crashed, out of memory), not Ray's own idle-worker reaping
LOST_EXITS = ("SYSTEM_ERROR", "NODE_OUT_OF_MEMORY")
# datasets whose items the pipeline cannot stack into (x, y) arrays (a list of per-image targets)
UNSTACKABLE = {"detection": "its items carry per-image target lists that Ray Data cannot stack into arrays"}
PID = "pid"  # the column a start-up epoch's batches carry: the pid of the Ray worker that made each row
# the start-up's bound: it ends after this many batches or seconds from the first epoch's start even when not every
# Ray CPU has run a task (a cluster whose CPUs other jobs hold, an epoch of fewer tasks than CPUs), and says so
STARTUP_BATCHES = 64
STARTUP_S = 60.0


def unusable(data: str | None) -> str | None:
    """Why the ray pipeline cannot train a scenario whose ``Scenario.data`` is ``data`` here (REQUIREMENTS)."""
    if importlib.util.find_spec("ray") is None:
        return EXTRA
    return UNSTACKABLE.get(data or "")


class RayUnavailable(RuntimeError):
    """Ray could not be started or reached; the message is one line."""


def _items(dataset: Any, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for i in indices.tolist():
        x, y = dataset[int(i)]
        xs.append(np.asarray(x))
        ys.append(int(y))
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


class LoadItems:
    """The ``map_batches`` stage: batch numbers of the epoch (``id``) to the stacked, augmented ``x`` and labels
    ``y`` of their items, batch ``k`` being ``order[k * batch_size : (k + 1) * batch_size]``. The epoch's order
    travels inside the stage, put in Ray's object store once per epoch with the dataset (Ray Data's map operator)."""

    def __init__(self, dataset: Any, epoch: int, order: np.ndarray, batch_size: int, tag: bool = False) -> None:
        self.dataset, self.epoch, self.order, self.batch_size = dataset, epoch, order, batch_size
        self.tag = tag  # each row also gets its worker's pid (PID): the start-up counts the workers that delivered

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)  # the epoch the loop asked for, in this worker's copy
        b = self.batch_size
        indices = np.concatenate([self.order[k * b : (k + 1) * b] for k in batch["id"].tolist()])
        x, y = _items(self.dataset, indices)
        if self.tag:
            return {"x": x, "y": y, PID: np.full(len(y), os.getpid(), dtype=np.int64)}
        return {"x": x, "y": y}


def batch_pids(batch: dict[str, Any]) -> list[int]:
    """The distinct worker pids a batch's rows came from (none where it carries no ``PID``)."""
    pids = batch.get(PID)
    if pids is None:
        return []
    return [int(p) for p in np.unique(np.asarray(pids))]  # sorted and distinct


class StartUp:
    """The run's start-up: from the first epoch's start until every one of ``cpus`` Ray CPUs has run a map task,
    seen as ``cpus`` distinct worker pids in the batches delivered (``feed``), or until ``max_batches`` batches or
    ``max_s`` seconds passed (bounded: said so, and the steady state starts there all the same). Pure: the pids and
    the times are given."""

    def __init__(self, cpus: int, max_batches: int = STARTUP_BATCHES, max_s: float = STARTUP_S) -> None:
        self.cpus, self.max_batches, self.max_s = max(1, cpus), max_batches, max_s
        self.pids: set[int] = set()
        self.batches = 0  # batches delivered in the start-up so far (the run's first steps)
        self.end_s = math.nan  # from the first epoch's start to the batch that ended it
        self.bounded: str | None = None  # why it ended short of every CPU, in words

    @property
    def open(self) -> bool:
        return math.isnan(self.end_s)

    def feed(self, pids: list[int], t_s: float) -> bool:
        """One more batch, from workers ``pids``, ``t_s`` seconds after the first epoch's start; True when it ended
        the start-up (it is the start-up's last batch)."""
        if not self.open:
            return False
        self.batches += 1
        self.pids.update(pids)
        if len(self.pids) >= self.cpus:
            self.end_s = t_s
        elif self.batches >= self.max_batches or t_s >= self.max_s:
            self.end_s = t_s
            self.bounded = (
                f"{len(self.pids)} of {self.cpus} Ray CPUs had run a task after {self.batches} batches "
                f"({t_s:.1f} s; bound: {self.max_batches} batches or {self.max_s:g} s): the steady state starts "
                "there all the same"
            )
        return not self.open

    def to_config(self) -> dict[str, int | float | str]:
        """What the loader's config says of it (``meta.loader``). ``startup_steps``: the run's first steps that were
        start-up, held out of the measured ones; absent while it is open (a run that ended first holds none)."""
        out: dict[str, int | float | str] = {"startup_cpus": self.cpus, "startup_workers": len(self.pids)}
        if self.open:
            out["startup_end"] = (
                f"the run ended first: {len(self.pids)} of {self.cpus} Ray CPUs had run a task in its "
                f"{self.batches} batch(es), so its steps hold Ray's start-up"
            )
            return out
        out |= {"startup_steps": self.batches, "startup_ms": round(self.end_s * 1000, 3)}
        out["startup_end"] = self.bounded or f"every Ray CPU ({self.cpus}) had run a task"
        return out


def reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S, via: str = "RAY_ADDRESS") -> None:
    """RayUnavailable (one line) unless ``host:port`` takes a TCP connection within ``timeout_s``: Ray's own
    client retries an unreachable address for minutes, printing a warning every few seconds. ``via``: where the
    address came from (the variable or the flag), named in the line."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": left to Ray
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnavailable(
            f"cannot reach the Ray instance at {via}={address} within {timeout_s:g} s: {exc.strerror or exc}"
        ) from None


def first_line(exc: BaseException) -> str:
    text = ANSI.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def wait_for_cpu(instance: str, wait_s: float | None = None) -> None:
    """RayUnavailable (one line) unless the instance has a CPU free within ``wait_s``: with none, Ray Data's
    ``map_batches`` tasks wait for one forever and the run hangs without a word."""
    import ray

    wait_s = NO_CPU_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        free = float(ray.available_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
        if free >= 1.0 or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if free < 1.0:
        total = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
        raise RayUnavailable(
            f"the Ray instance has no CPU free for Ray Data's tasks ({instance or 'this run'}): {total:g} CPU(s), "
            f"all held by other tasks or actors for {wait_s:g} s; free one, or point --ray-address at another"
        )


def lost_workers() -> set[str] | None:
    """The instance's worker processes that ended by a loss (``LOST_EXITS``), as "pid N: detail"; None where
    the GCS's worker table cannot be read (it is Ray's internal API: any failure is no figure, never an error)."""
    try:
        from ray._private.state import state
        from ray.core.generated import common_pb2, gcs_pb2

        common: Any = common_pb2  # generated protobuf modules: no types for mypy
        table = state._connect_and_get_accessor().get_worker_table()
        lost = {common.WorkerExitType.Value(name) for name in LOST_EXITS}
        gcs: Any = gcs_pb2
        out = set()
        for raw in table:
            w = gcs.WorkerTableData.FromString(raw)
            if not w.is_alive and w.worker_type == common.WORKER and w.exit_type in lost:
                detail = w.exit_detail.splitlines()[0] if w.exit_detail else "ended"
                out.add(f"pid {w.pid}: {detail[:120]}")
        return out
    except Exception:  # noqa: BLE001 - Ray's internal table: a figure it does not give is absent
        return None


def by_value(dataset: Any) -> None:
    """Ship the modules Ray's workers cannot import by name to them by value: a scenario file loaded by path is a
    module only this process has (``scenarios._load_file`` names it ``USER_MODULES...``), and a worker unpickling
    a reference to it fails its task again and again. The dataset may be wrapped (the runner's timing): every such
    module is shipped, not only the dataset's own."""
    from ray import cloudpickle

    names = {type(dataset).__module__} | {n for n in list(sys.modules) if n.startswith(USER_MODULES)}
    for name in names:
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) is None:
            continue  # built in: every worker has it
        # sys.path alone, as a worker searches it (importlib.util.find_spec answers from sys.modules first)
        if importlib.machinery.PathFinder.find_spec(name.partition(".")[0]) is None:
            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def store_bytes(item_bytes: int, spec: LoaderSpec) -> int:
    """The object store a local instance gets: the batches in flight (one per worker plus the read-ahead), with
    headroom for Ray's own copies, and never under Ray's minimum."""
    in_flight = max(1, spec.workers) + (spec.prefetch_factor or PREFETCH_BATCHES)
    return max(MIN_STORE_BYTES, STORE_HEADROOM * in_flight * item_bytes * spec.batch_size)


def quiet_ray_data() -> None:
    """No progress bars or per-dataset INFO lines on the run's terminal (they would interleave with the live view)."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def run_cpus(config: dict[str, Any]) -> int:
    """The Ray CPUs the run has: those its instance was started or found with (``ray_cpus``), else the shared
    instance's (a test's), at least 1."""
    cpus = config.get("ray_cpus")
    if not isinstance(cpus, int | float):
        import ray

        cpus = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
    return max(1, int(cpus))


def read_tasks(count: int) -> int:
    """The Ray tasks an epoch of ``count`` batches is read and loaded by: one a batch up to ``TASKS_MIN``, else
    ``BATCHES_PER_TASK`` batches a task (at least ``TASKS_MIN``, so that a cluster's CPUs still share an epoch)."""
    return min(count, max(TASKS_MIN, -(-count // BATCHES_PER_TASK)))


def epoch_dataset(count: int, batch_bytes: int, load: LoadItems) -> Any:
    """The epoch's Ray Dataset: the batch numbers ``0..count-1``, read lazily (``ray.data.range``) by the tasks that
    load them (Read fused with the map), ``load`` called on one batch number at a time.

    Each batch is an output block of its own, so batches stream to the loop as they are made: Ray Data merges a
    task's outputs into blocks of ``target_max_block_size`` (128 MiB) and slices those over 1.5 times it, so the
    dataset's copy of the context gets ``BLOCK_FRACTION`` of a batch's bytes (over it after one batch, not 1.5 times
    it). Blocks are not one a batch, as with ``ray.data.from_numpy`` before: Ray Data puts every block (or read
    task) in its object store before the first batch, one at a time, 2-5 ms each on two cores; from_numpy ran a
    Ray task for each besides (20 s of a 39 s run of mlp-mnist at batch 16: 3,750 blocks, every epoch)."""
    import ray.data
    from ray.data import DataContext

    ctx = DataContext.get_current()
    kept = ctx.target_max_block_size
    ctx.target_max_block_size = max(1, int(batch_bytes * BLOCK_FRACTION))
    try:  # the dataset copies the current context when it is made: this one's, not the process's
        ds = ray.data.range(count, override_num_blocks=read_tasks(count))
        return ds.map_batches(load, batch_size=1, zero_copy_batch=True)
    finally:
        ctx.target_max_block_size = kept


class RayBatches:
    """An epoch per ``iter()``: a Ray Dataset of the epoch's indices, ``map_batches``-ed, streamed as torch batches."""

    def __init__(self, dataset: Any, spec: LoaderSpec, config: dict[str, Any]) -> None:
        self.dataset, self.spec, self.config = dataset, spec, config
        self.epoch = 0
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.owns_instance = False
        self.last: Any = None  # the latest epoch's DataIterator, whose stats() are Ray's own figures
        self.first_wait_s: float | None = None
        self.iterations: list[Any] = []  # the DatasetStats each epoch's iteration updated (Ray's own timers)
        self.lost_before: set[str] | None = None  # the instance's lost workers when the run began (lost_workers)
        self.item_bytes: int | None = None  # one item's bytes in a batch (batch_bytes)
        self.startup: StartUp | None = None  # made at the first epoch, which it starts with (t_startup)
        self.t_startup = 0.0

    def start(self) -> None:
        """Connect to the instance at ``RAY_ADDRESS`` or the running one, else start a local one for this run."""
        import ray

        quiet_ray_data()
        if ray.is_initialized():
            self.config["ray_instance"] = "already running (shared)"
            self.lost_before = lost_workers()
            return
        address = os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            reachable(address)
        try:
            if address is not None:
                ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
                self.config["ray_instance"] = f"connected to {address}"
                self.owns_instance = True  # the connection only: shutdown() disconnects, the cluster stays
            else:
                item_bytes = int(np.asarray(self.dataset[0][0]).nbytes)
                store = store_bytes(item_bytes, self.spec)
                ray.init(
                    num_cpus=max(1, self.spec.workers),
                    object_store_memory=store,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    # the workers unpickle the scenario's dataset: a scenario file loaded by path must import there
                    runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
                )
                self.owns_instance = True
                self.config["ray_instance"] = f"local, started for this run ({store / 2**20:.0f} MiB object store)"
        except Exception as exc:  # Ray raises a bare Exception when a local node times out starting
            ray.shutdown()  # what a failed start left (a GCS server, a raylet) must not outlive the run
            where = f"at {address}" if address else "locally"
            raise RayUnavailable(f"cannot start or reach a Ray instance {where}: {first_line(exc)}") from exc
        self.config["ray_cpus"] = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
        self.lost_before = lost_workers()
        quiet_ray_data()

    def batch_bytes(self) -> int:
        """A full batch's bytes as Ray holds it (the stacked ``x`` and int64 ``y``), read from item 0 once."""
        if self.item_bytes is None:
            self.item_bytes = int(np.asarray(self.dataset[0][0]).nbytes) + 8
        return self.item_bytes * self.spec.batch_size

    def indices(self) -> np.ndarray:
        n = len(self.dataset)
        order = torch.randperm(n, generator=self.generator) if self.spec.shuffle else torch.arange(n)
        order = order[self.spec.shard :: self.spec.num_shards]
        return order.numpy().astype(np.int64)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.config.get("ray_instance"):
            t_start = time.perf_counter()
            self.start()
            self.config["ray_start_ms"] = round((time.perf_counter() - t_start) * 1000, 3)
        spec, t0 = self.spec, time.perf_counter()
        wait_for_cpu(self.config.get("ray_instance", ""))
        order = self.indices()
        count = max(1, -(-len(order) // spec.batch_size))
        by_value(self.dataset)
        if self.startup is None:
            self.startup, self.t_startup = StartUp(min(run_cpus(self.config), read_tasks(count))), t0
        startup = self.startup
        tag = startup.open
        load = LoadItems(self.dataset, self.epoch, order, spec.batch_size, tag=tag)
        ds = epoch_dataset(count, self.batch_bytes(), load)
        self.epoch += 1
        self.last = it = ds.iterator()
        self.iterations = []
        capture_iteration(it, self.iterations)
        try:
            for batch in it.iter_torch_batches(
                batch_size=spec.batch_size,
                prefetch_batches=spec.prefetch_factor or PREFETCH_BATCHES,
                drop_last=spec.drop_last,
            ):
                if self.first_wait_s is None:
                    self.first_wait_s = time.perf_counter() - t0
                    self.config["first_batch_ms"] = round(self.first_wait_s * 1000, 3)
                if tag and startup.feed(batch_pids(batch), time.perf_counter() - self.t_startup):
                    self.config.update(startup.to_config())
                yield batch["x"], batch["y"]
        finally:
            # at the epoch's end or when the loop closes it early: Ray's figures are in config before the run ends
            self.config["ray_stats"] = self.stats()
            if startup.open:
                self.config.update(startup.to_config())
            self.note_lost()

    def stats(self) -> dict[str, Any] | None:
        """Ray Data's own figures for the latest epoch (``pipelines.ray_stats``), None before any epoch ran."""
        if self.last is None:
            return None
        base = getattr(self.last, "_base_dataset", None)
        summary = base.get_stats_summary() if base is not None else None
        return read_stats(summary, self.iterations[-1] if self.iterations else None)

    def note_lost(self) -> None:
        """The Ray workers lost (killed, crashed) since the run began, in ``config``: Ray re-runs their tasks, so
        the run goes on, and the figures hold the re-runs."""
        now = lost_workers()
        if now is None or self.lost_before is None:
            return
        lost = sorted(now - self.lost_before)
        if lost:
            self.config["ray_workers_lost"] = len(lost)
            self.config["ray_workers_lost_detail"] = lost[:5]

    def failure(self, exc: BaseException) -> str | None:
        """The ``BuiltLoader.worker_failure`` of a ray loader: one line for Ray's own errors and the pipeline's."""
        if isinstance(exc, RayUnavailable):
            return str(exc)
        if type(exc).__module__.startswith("ray."):
            # a task's error wraps its cause, whose first line says what happened (the wrapper's names the task)
            cause = getattr(exc, "cause", None)
            what = cause if isinstance(cause, BaseException) else exc
            return f"Ray Data failed: {type(what).__name__}: {first_line(what)}"
        return None

    def close(self) -> None:
        if self.owns_instance:
            import ray

            ray.shutdown()
            self.owns_instance = False


class RayPipeline:
    """Ray Data ``map_batches`` over the dataset's items, ``iter_torch_batches`` to the loop, a blocking copy."""

    name = "ray"
    accelerator_copy = "pageable"

    def build(self, dataset: Any, spec: LoaderSpec) -> BuiltLoader:
        if importlib.util.find_spec("ray") is None:
            from pipelines import PipelineError

            raise PipelineError(EXTRA)
        config: dict[str, Any] = {
            "pipeline": self.name,
            "workers": spec.workers,
            "ray_cpus_asked": max(1, spec.workers),
            "prefetch_batches": spec.prefetch_factor or PREFETCH_BATCHES,
            "pin_memory": False,
            # Ray's workers are its own processes, fed through its object store, not DataLoader workers
            "worker_processes": 0,
            "stages": ["map_batches(load+augment)", "iter_torch_batches"],
        }
        batches = RayBatches(dataset, spec, config)
        return BuiltLoader(
            batches=batches,
            to_device=lambda b: move(b, torch.device(spec.device)),
            config=config,
            worker_failure=batches.failure,
        )
