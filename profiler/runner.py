"""The training loop stallscope drives: scenario + pipeline -> steps under a Session.

One loop for every scenario and pipeline, so differences between runs come from the loader and the
model, never from the harness. Per step it does exactly: wait for a batch (Session.wrap), copy it
(phase "h2d"), forward + loss + backward + optimizer step (phase "compute"). It never calls ``.item()``
or synchronises per step: that would add a stall the user's own loop may not have.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import LoaderSpec
from pipelines import get as get_pipeline
from profiler.devices import DeviceInfo
from profiler.pyspy import OUTPUT, PySpyRecorder
from profiler.session import Session
from scenarios import Scenario

Monitor = Callable[[Session], contextlib.AbstractContextManager[Any]]


class TrainingError(Exception):
    """The training itself failed; the partial run is kept in ``run_dir``."""

    def __init__(self, where: str, run_dir: Path) -> None:
        super().__init__(where)
        self.where = where
        self.run_dir = run_dir


@dataclass(frozen=True, slots=True)
class RunConfig:
    out: Path
    device: DeviceInfo
    pipeline: str = "naive"
    batch_size: int | None = None  # None: the scenario's default
    workers: int = 0
    steps: int | None = None
    warmup: int | None = None
    sample_hz: float = 10.0
    seed: int = 0
    attribution: bool = True  # py-spy on the loader workers when there are any (RUN_DIR/pyspy.txt)
    pyspy_rate: int = 10
    extra_meta: dict[str, Any] = field(default_factory=dict)


def run_scenario(scenario: Scenario, cfg: RunConfig, monitor: Monitor | None = None) -> Session:
    """Train ``scenario`` for ``cfg.steps`` measured steps after ``cfg.warmup``; returns the closed Session.

    Raises TrainingError when the model, loss or loader fails mid-run (the Session has recorded status
    "failed" and where); Interrupted/KeyboardInterrupt propagate after the Session recorded "interrupted".
    """
    import torch

    torch.manual_seed(cfg.seed)
    batch_size = cfg.batch_size or scenario.batch_size
    warmup = scenario.warmup if cfg.warmup is None else cfg.warmup
    steps = scenario.steps if cfg.steps is None else cfg.steps
    total = warmup + steps
    device = torch.device(cfg.device.torch_device)

    pipeline = get_pipeline(cfg.pipeline)
    # The session starts before set-up so that a dataset or model that fails to build leaves a reportable
    # run (status "failed", no steps) and so set-up's host load is on the record too.
    session = Session(
        cfg.out,
        sample_hz=cfg.sample_hz,
        device=cfg.device,
        warmup=warmup,
        scenario=scenario.name,
        pipeline=cfg.pipeline,
        batch_size=batch_size,
        meta={
            "steps_requested": steps,
            "synthetic_data": scenario.synthetic,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "argv": list(sys.argv),
            **cfg.extra_meta,
        },
    )
    done = 0
    loss = None
    built = None
    recorder = None
    try:
        with session:
            dataset = scenario.dataset()
            spec = LoaderSpec(batch_size=batch_size, workers=cfg.workers, device=cfg.device.torch_device, seed=cfg.seed)
            built = pipeline.build(dataset, spec)
            model = scenario.model().to(device)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=scenario.lr, momentum=0.9)
            session.annotate(
                workers=int(built.config.get("workers", cfg.workers)),
                pin_memory=built.config.get("pin_memory"),
                loader=built.config,
                params=sum(p.numel() for p in model.parameters()),
            )
            if cfg.attribution and int(built.config.get("workers", 0)) > 0:
                recorder = _attribute_workers(session, cfg)
            with monitor(session) if monitor else contextlib.nullcontext():
                epoch = 0
                while done < total:
                    if hasattr(dataset, "set_epoch"):
                        dataset.set_epoch(epoch)  # fresh augmentation each epoch, same for any worker count
                    epoch += 1
                    batches = session.wrap(built.batches)
                    progressed = False
                    for batch in batches:
                        progressed = True
                        with session.phase("h2d"):
                            x, y = built.to_device(batch)
                        with session.phase("compute"):
                            out = model(x)
                            loss = scenario.loss(out, y)
                            opt.zero_grad(set_to_none=True)
                            loss.backward()
                            opt.step()
                        done += 1
                        if done >= total:
                            break
                    batches.close()  # ends the step in flight now, not at garbage collection
                    if not progressed:
                        raise RuntimeError(
                            f"the {cfg.pipeline} loader produced no batch (dataset too small for batch {batch_size}?)"
                        )
            if loss is not None:
                session.annotate(final_loss=float(loss.detach()))
    except Exception as exc:
        if session.status == "failed":
            raise TrainingError(session.error or str(exc), Path(cfg.out)) from exc
        raise
    finally:
        if recorder is not None:
            recorder.stop()
        if built is not None:
            built.close()
    return session


def _attribute_workers(session: Session, cfg: RunConfig) -> PySpyRecorder | None:
    """Sample this process and its loader workers with py-spy, so the report can say where worker CPU goes."""
    recorder = PySpyRecorder(os.getpid(), Path(cfg.out) / OUTPUT, rate=cfg.pyspy_rate)
    problem = recorder.start(attach_timeout_s=0.5)
    if problem:
        session.event("warning", f"no loader attribution: {problem}")
        print(f"stallscope: no loader attribution: {problem}", file=sys.stderr)
        return None
    return recorder
