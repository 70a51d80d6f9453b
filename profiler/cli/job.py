"""``stallscope run SCENARIO --nproc N``: a multi-rank job (profiler.jobs.launch); its flags and handler."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.cli.common import (
    DEFAULT_PYSPY_RATE,
    EXIT_FAILED,
    EXIT_OK,
    MAX_NPROC,
    BadInput,
    Training,
    base_run_config,
    bounded,
    exit_signal,
    follow_store,
    load_job_summary,
    loader_knobs,
    prepare_out,
    print_job,
    say,
    stem,
)

if TYPE_CHECKING:
    from profiler.export.prometheus import PrometheusExporter
    from profiler.jobs.launch import JobResult

MAX_NODES = 1024


def add_job_options(p: argparse.ArgumentParser) -> None:
    """The flags of a multi-rank run (torchrun's names)."""
    p.add_argument(
        "--nproc",
        type=bounded(int, 1, MAX_NPROC, "an integer"),
        metavar="N",
        help="ranks on this node, launched with torch.distributed's elastic launcher (DDP; docs/multi-rank.md)",
    )
    p.add_argument("--nnodes", type=bounded(int, 1, MAX_NODES, "an integer"), default=1, metavar="M")
    p.add_argument("--node-rank", type=bounded(int, 0, MAX_NODES - 1, "an integer"), default=0, metavar="K")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous of a job on several nodes")
    p.add_argument("--rdzv-id", metavar="ID", help="the job's id on every node (default: derived from the endpoint)")
    p.add_argument("--baseline", metavar="DIR", help="a run of this scenario on one rank: scaling efficiency")


def check_job_options(args: argparse.Namespace) -> None:
    """BadInput for multi-rank flags that do not go together."""
    multi = args.nnodes != 1 or args.node_rank != 0 or args.rdzv_endpoint or args.rdzv_id or args.baseline
    if args.nproc is None:
        if multi:
            raise BadInput("--nnodes, --node-rank, --rdzv-endpoint, --rdzv-id and --baseline need --nproc N")
        return
    if args.node_rank >= args.nnodes:
        raise BadInput(f"--node-rank {args.node_rank}: allowed 0 to {args.nnodes - 1} for --nnodes {args.nnodes}")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise BadInput(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")
    if args.rdzv_endpoint:
        from profiler.export.endpoint import parse_endpoint

        try:
            parse_endpoint(args.rdzv_endpoint, default_host=None, min_port=1)
        except ValueError as exc:
            raise BadInput(f"--rdzv-endpoint {exc}") from None
    if args.baseline and not Path(args.baseline, "run.sqlite").exists():
        raise BadInput(f"--baseline {args.baseline!r} holds no run: allowed a run directory (a run on one rank)")


def cmd_job(args: argparse.Namespace, t: Training, exporter: PrometheusExporter | None = None) -> int:
    """A multi-rank job of the training ``t`` resolved from ``args``; ``exporter`` serves its ranks' figures."""
    from profiler.jobs.launch import JobSpec, job_id_for, run_job

    if t.device.kind == "cuda":
        import torch

        if args.nproc > torch.cuda.device_count():
            raise BadInput(f"--nproc {args.nproc}: this node has {torch.cuda.device_count()} CUDA device(s)")
    out = prepare_out(args.out, f"{stem(args.scenario)}-{args.pipeline}-x{args.nproc * args.nnodes}")
    cfg = replace(
        base_run_config(args, t, out),
        pipeline=args.pipeline,
        batch_size=args.batch_size,
        workers=args.workers,
        **loader_knobs(args),
        steps=args.steps or t.scenario.steps,
        attribution=not args.no_attribution,
        pyspy_rate=args.pyspy_rate or DEFAULT_PYSPY_RATE,
        loader_only=args.loader_only,
        augment_epochs=args.augment_epochs,
        headspace=args.headspace,
    )
    scenario = str(Path(args.scenario).resolve()) if args.scenario.endswith(".py") else args.scenario
    job = JobSpec(
        scenario=scenario,
        run=cfg,
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        job_id=job_id_for(args.rdzv_endpoint, scenario, args.nnodes, args.rdzv_id),
        baseline=str(Path(args.baseline).resolve()) if args.baseline else None,
    )
    if not args.json:
        say(
            f"training {t.scenario.name} on {job.world_size} ranks ({args.nproc} here, node {args.node_rank} of "
            f"{args.nnodes}; {args.pipeline}, device {t.device.label}, {job.backend}) -> {out}"
        )
    with _live(args, out, (cfg.steps or 0) + t.warmup), follow_store(exporter, out, job=True), _log_to(args, out):
        result = run_job(job)
    return _report(result, args)


def _log_to(args: argparse.Namespace, out: Path) -> contextlib.AbstractContextManager[object]:
    """``--log-to``: one logger here follows the rank stores (the ranks log nothing; profiler.trackers.joblive)."""
    from profiler.cli.totrackers import checked_log_to

    targets = checked_log_to(args)
    if not targets:
        return contextlib.nullcontext()
    from profiler.trackers.base import parse_targets
    from profiler.trackers.joblive import follow_job

    return follow_job(out, parse_targets(list(targets)), ranks=args.nproc, every_s=args.log_every)


def _live(args: argparse.Namespace, out: Path, total_steps: int) -> contextlib.AbstractContextManager[object]:
    """The job's live view beside the launcher, read from the rank stores (docs/live.md); none with --no-live."""
    if args.no_live:
        return contextlib.nullcontext()
    from profiler.jobs.render_live import job_monitor_for
    from profiler.live.feeds import JobFeed

    return job_monitor_for(JobFeed(out), total_steps=total_steps)


def _report(result: JobResult, args: argparse.Namespace) -> int:
    if result.error:
        say(f"job {result.status}: {result.error}; every rank's store is kept: stallscope report {result.job_dir}")
    print_job(load_job_summary([str(result.job_dir)], args.baseline)[0], args.json)
    if result.status == "interrupted":
        return exit_signal(result.error.rsplit(" ", 1)[-1] if result.error else None)
    return EXIT_OK if result.status == "complete" else EXIT_FAILED
