"""Multi-rank jobs: ``stallscope run SCENARIO --nproc N`` on torch.distributed's elastic launcher (torchrun's
engine), one node at a time (docs/multi-rank.md: the job directory, signals, several nodes).

:func:`run_job` runs in the launcher: it writes ``job.json`` ("running"), records the node's sampler in
``node-K/``, launches the ranks (c10d rendezvous, no restarts) and rewrites ``job.json`` with the status and the
ranks that failed, first one first. Each rank runs :func:`rank_main`: the ordinary runner under DDP on its shard,
recording ``rank-R/``; a signal closes every store "interrupted".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from profiler.drivers.ddp import DistInfo
from profiler.drivers.runner import RunConfig
from profiler.drivers.signals import SignalStop

if TYPE_CHECKING:
    from profiler.core.recorders.in_thread import ThreadRecorder


JOB_FILE = "job.json"
PID_FILE = "rank.pid"
# How often the elastic agent looks at its ranks (seconds): how soon a rank's death stops the others.
MONITOR_S = 0.2
# What the fork server imports once for every rank it forks
PRELOAD = ["torch", "torch.distributed", "profiler.drivers.runner", "profiler.jobs.launch", "scenarios", "pipelines"]
# The elastic agent's wait for ranks to stop after SIGTERM before SIGKILL: a rank that handles SIGTERM closes its
# store in well under a second (its writer commits every 0.5 s); one blocked in a collective whose peer died does
# not run its handler at all, and waiting longer for it only delays the job's end.
SHUTDOWN_S = 5


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What every rank of the node runs, and how the node joins the job."""

    scenario: str  # a built-in name, or a scenario file's absolute path: each rank builds the scenario again
    run: RunConfig  # out: the job directory; device: as resolved in the launcher (cuda: rank r takes cuda:r)
    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT; None on one node: a free local port
    job_id: str = ""
    baseline: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return "nccl" if self.run.device.kind == "cuda" else "gloo"

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


@dataclass(frozen=True, slots=True)
class JobResult:
    job_dir: Path
    status: str  # complete | failed | interrupted
    rank_exits: list[dict[str, Any]]
    error: str | None = None


def job_id_for(endpoint: str | None, scenario: str, nnodes: int, given: str | None = None) -> str:
    """The job's id: ``given``; on several nodes one every node derives alike from what they share (the
    endpoint, scenario and node count), so their directories merge; else a fresh one."""
    if given:
        return given
    if nnodes > 1 and endpoint:
        return hashlib.sha1(f"{endpoint}|{scenario}|{nnodes}".encode()).hexdigest()[:12]
    return uuid.uuid4().hex[:12]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(job: JobSpec) -> JobResult:
    """Launch the node's ranks and record the job (see the module docstring)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from profiler.core.recorders.in_thread import ThreadRecorder
    from profiler.core.sources.ranks import RankSource
    from profiler.runs.summarize import summarize_run

    out = Path(job.run.out)
    out.mkdir(parents=True, exist_ok=True)
    endpoint = job.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    record = _job_record(job, endpoint)
    write_job(out, record)
    tree = RankSource(os.getpid(), refresh_s=0.5, announced=lambda: announced_ranks(out))
    node = ThreadRecorder(
        out / f"node-{job.node_rank}",
        meta={"job_id": job.job_id, "node_rank": job.node_rank, "role": "node sampler", "scenario": None},
        sample_hz=job.run.sample_hz,
        sources=[tree],
        summarize=summarize_run,
    )
    node.start()
    config = LaunchConfig(
        min_nodes=job.nnodes,
        max_nodes=job.nnodes,
        nproc_per_node=job.nproc,
        run_id=job.job_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        max_restarts=0,
        monitor_interval=MONITOR_S,
        start_method="forkserver",
        shutdown_timeout=SHUTDOWN_S,
    )
    # ranks fork from one server that has imported torch and stallscope once, not N fresh interpreters each
    # importing them on the same cores (a 4-rank job on 2 cores starts in 10-13 s instead of 17); the server is
    # started without the launcher's threads (the node sampler), so no rank inherits a lock held by one
    multiprocessing.set_forkserver_preload(PRELOAD)
    status, exits, error = "complete", list[dict[str, Any]](), None
    t0 = time.time()
    try:
        with _quiet_elastic(), handlers_kept():
            elastic_launch(config, rank_main)(job)
    except ChildFailedError as exc:
        exits = rank_exits(exc.failures, t0, announced_ranks(out), tree.ended())
        status, error = "failed", _failure_line(exits)
    except BaseException as exc:
        signalled = signal_behind(exc, SignalException)
        if signalled is None:
            _finish(node, out, record, "failed", exits=exits, error=f"the launcher failed: {type(exc).__name__}: {exc}")
            raise
        # Ctrl-C / SIGTERM: the agent has stopped the ranks (SIGTERM, then SIGKILL)
        status, error = "interrupted", f"stopped by {_signal_name(int(signalled.sigval)) or signalled.sigval}"
    _finish(node, out, record, status, exits=exits, error=error)
    return JobResult(out, status, exits, error)


def _finish(
    node: ThreadRecorder,
    out: Path,
    record: dict[str, Any],
    status: str,
    *,
    exits: list[dict[str, Any]],
    error: str | None,
) -> None:
    node.close("complete" if status == "complete" else status, error=error)
    record.update(
        ranks=sorted(announced_ranks(out).values()),
        status=status,
        ended_at=time.time(),
        rank_exits=exits,
        first_failure=exits[0] if exits else None,
        error=error,
    )
    write_job(out, record)


def _job_record(job: JobSpec, endpoint: str) -> dict[str, Any]:
    run = job.run
    return {
        "job_id": job.job_id,
        "nproc_per_node": job.nproc,
        "nnodes": job.nnodes,
        "node_rank": job.node_rank,
        "world_size": job.world_size,
        "backend": job.backend,
        "rdzv_endpoint": endpoint,
        # a scenario file's name is its stem, as a single run's directory names it; each rank loads the file's path
        "scenario": Path(job.scenario).stem if job.scenario.endswith(".py") else job.scenario,
        **({"scenario_source": job.scenario} if job.scenario.endswith(".py") else {}),
        "pipeline": run.pipeline,
        "device": run.device.label,
        "batch_size": run.batch_size,
        "workers": run.workers,
        # the global ranks c10d's rendezvous gives this node (in the order nodes join, not by --node-rank): known
        # once the ranks have announced themselves, so filled in at the end
        "ranks": [],
        "started_at": time.time(),
        "ended_at": None,
        "status": "running",
        "rank_exits": [],
        "first_failure": None,
        "baseline": job.baseline,
        **job.extra,
    }


def announced_ranks(out: Path) -> dict[int, int]:
    """pid -> rank of the ranks that have announced themselves in ``out`` (:func:`announce`)."""
    found: dict[int, int] = {}
    for path in out.glob(f"rank-*/{PID_FILE}"):
        with contextlib.suppress(OSError, ValueError):
            found[int(path.read_text())] = int(path.parent.name.removeprefix("rank-"))
    return found


def announce(rank_dir: Path) -> None:
    """Tell the node's sampler this process is a rank: its pid in ``rank_dir`` (the launcher's function
    entrypoints set RANK after they start, so /proc/PID/environ does not show it)."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    (rank_dir / PID_FILE).write_text(str(os.getpid()))


def write_job(out: Path, record: dict[str, Any]) -> None:
    """job.json, replaced atomically (a reader never sees half a file)."""
    tmp = out / f".{JOB_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, out / JOB_FILE)


def rank_exits(
    failures: dict[int, Any], t0: float, ranks: dict[int, int], ended: dict[int, float] | None = None
) -> list[dict[str, Any]]:
    """The ranks that ended before the job did, as job.json's ``rank_exits``, in the order they ended: the elastic
    agent's failures (with their exit code or signal), and every other rank the node sampler saw end (``ended``:
    rank -> time.time(), within one sampling period; exit code and signal null: the agent reports the first
    failure it finds, which can be a rank that only lost its peer a moment after the first one died). When a rank
    ended is the node sampler's reading where it has one, else the agent's timestamp (whole seconds). ``ranks``:
    pid -> global rank, as the ranks announced; a rank that died before announcing itself is named by its local
    rank (rank null)."""
    rows = []
    for local_rank, failure in failures.items():
        code, rank = int(failure.exitcode), ranks.get(int(failure.pid))
        seen = (ended or {}).get(rank) if rank is not None else None
        rows.append(
            {
                "rank": rank,
                "local_rank": int(local_rank),
                "pid": int(failure.pid),
                "exitcode": code,
                "signal": _signal_name(-code) if code < 0 else None,
                "t_s": max(0.0, (seen if seen is not None else float(failure.timestamp)) - t0),
                "t_from": "node sampler" if seen is not None else "elastic agent (whole seconds)",
                "message": str(failure.message)[:500],
            }
        )
    listed = {r["rank"] for r in rows}
    local = {rank: i for i, rank in enumerate(sorted(ranks.values()))}
    for rank, when in (ended or {}).items():
        if rank not in listed:
            rows.append(
                {
                    "rank": rank,
                    "local_rank": local.get(rank),
                    "pid": next((pid for pid, r in ranks.items() if r == rank), None),
                    "exitcode": None,
                    "signal": None,
                    "t_s": max(0.0, when - t0),
                    "t_from": "node sampler",
                    "message": "ended while the job ran (exit status not reported by the launcher)",
                }
            )
    return sorted(rows, key=lambda r: (r["t_s"], r["local_rank"] if r["local_rank"] is not None else -1))


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


SignalT = TypeVar("SignalT", bound=BaseException)


def signal_behind(exc: BaseException, kind: type[SignalT]) -> SignalT | None:
    """The elastic agent's signal exception (``kind``) that ``exc`` is or was raised while handling; None if none.
    torch's metrics wrapper (``elastic.metrics.api.prof``) reads ``start`` in a ``finally``: a signal landing before
    ``start`` is set turns into an UnboundLocalError there, the signal's exception its ``__context__`` (a stress
    pass: a Ctrl-C'd sweep saw its job fail that way and went on to the next configuration)."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, kind):
            return at
        seen.add(id(at))
        at = at.__context__
    return None


def _failure_line(exits: list[dict[str, Any]]) -> str:
    """What the launcher saw, in order; which rank failed first is the job report's (it reads the ranks' stores)."""
    if not exits:
        return "a rank failed"
    seen = []
    for e in exits[:4]:
        who = f"rank {e['rank']}" if e["rank"] is not None else f"local rank {e['local_rank']}"
        how = (
            f"killed by {e['signal']}"
            if e["signal"]
            else f"exited with code {e['exitcode']}"
            if e["exitcode"] is not None
            else "ended"
        )
        seen.append(f"{who} {how} at {e['t_s']:.1f} s")
    return f"{', '.join(seen)}; the launcher stopped the other ranks"


# The signals torch's elastic agent takes over while ranks run (and never gives back)
AGENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """Put back the caller's handlers of the signals the elastic agent takes over (a sweep's, the CLI's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in kept.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(s, handler)


@contextlib.contextmanager
def _quiet_elastic() -> Iterator[None]:
    """The elastic agent logs every failure with a traceback at ERROR level, and its own shutdown at WARNING; the
    job's own line says it once. torch sets levels on its modules' loggers, so each of them is quietened."""
    prefixes = ("torch.distributed.elastic", "torch.multiprocessing")
    names = [n for n in logging.root.manager.loggerDict if n.startswith(prefixes)]
    logs = [logging.getLogger(name) for name in {*prefixes, *names}]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def _stopped_now(signame: str) -> NoReturn:
    """A rank the agent (or Ctrl-C) stopped, its store closed: end the process now. Returning would leave it
    waiting for the agent to read its result while the agent waits for it to end: torch's process context then
    waits 30 s before SIGKILL (measured: a job whose rank died ended 30 s after it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + int(getattr(signal, signame, signal.SIGTERM)))


def rank_main(job: JobSpec) -> dict[str, Any] | None:
    """One rank: join the process group, train the scenario on this rank's shard, record ``rank-R/``. Runs in a
    process the elastic agent spawned; raises (a non-zero exit: the agent stops the job) when training fails."""
    import torch.distributed as dist

    import scenarios
    from profiler.core.session import Interrupted
    from profiler.core.steps.device_timers import resolve_device
    from profiler.drivers.runner import TrainingError, run_scenario

    # node_rank: the node's --node-rank (its directory's name), not c10d's order of arrival (GROUP_RANK)
    info = replace(DistInfo.from_env(backend=job.backend, job_id=job.job_id), node_rank=job.node_rank)
    device = job.run.device
    if device.kind == "cuda":
        device = resolve_device(f"cuda:{info.local_rank}")
    cfg = replace(job.run, out=Path(job.run.out) / f"rank-{info.rank}", device=device, dist=info)
    announce(cfg.out)
    # the agent's forkserver made this process, and a child of a forkserver inherits its start method: left so,
    # each epoch's DataLoader workers came from a new forkserver of this rank's, a fresh interpreter that imports
    # torch again (7 s a rank on 2 cores for 3 steps of 8 images). A rank torchrun starts forks its workers.
    multiprocessing.set_start_method("fork", force=True)
    if "OMP_NUM_THREADS" not in os.environ:  # as torchrun does: ranks share the node's cores
        import torch

        from pipelines.base import usable_cores

        torch.set_num_threads(max(1, usable_cores() // job.nproc))
    # SIGTERM (the elastic agent stopping the job) and SIGINT (Ctrl-C reaches every process of the terminal's
    # group) close the rank's store "interrupted"; the first signal stops the rank, later ones are ignored
    with SignalStop(ignore_more=True):
        try:
            dist.init_process_group(job.backend)
            try:
                session = run_scenario(scenarios.get(job.scenario), cfg)
            except TrainingError as exc:  # one line, not a traceback; the store says where; exit 1 stops the job
                sys.stderr.write(f"stallscope: rank {info.rank}: training failed: {exc.bad_input or exc.where}\n")
                raise SystemExit(1) from None
            except Exception as exc:  # noqa: BLE001 - e.g. a collective whose peer died first: its store has the error
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                sys.stderr.write(f"stallscope: rank {info.rank}: training failed: {type(exc).__name__}: {first}\n")
                raise SystemExit(1) from None
            finally:
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
        # the job is being stopped: in training (RunStopped: the store is closed "interrupted"), or while a failure
        # above was being said or the group torn down (the agent's SIGTERM as rank 0 failed on its dead peer, a
        # stress pass: multiprocessing printed the signal's traceback); either way, no traceback
        except Interrupted as exc:
            _stopped_now(exc.signame)
    summary = session.summary()
    return summary.to_dict() if summary is not None else None
