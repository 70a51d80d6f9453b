"""Overhead of the trainer integrations: the same Trainer without and with stallscope, paired, medians.

For each pair, one fit/train without stallscope and one with it (the order alternating between pairs so drift
cancels), on the same tiny model and in-memory data (0 workers: the loop's own cost is all there is). The figure
is the median over pairs of the per-pair ratio of training throughput (with / without), over the whole
fit: stallscope's fixed cost (store, sampler, summary at close, about 0.1-0.2 s) is in it, so use enough steps
to see the per-step cost. Forms:

- ``lightning-profiler``: ``Trainer(profiler=StallscopeProfiler(...))`` against ``profiler=None``;
- ``lightning-callback``: ``callbacks=[StallscopeCallback(...)]`` against no callback;
- ``hf-instrument``: ``instrument(trainer, ...)`` against the bare Trainer.

Also the per-call cost of an action stallscope does not map (Lightning profiles every hook call) against
Lightning's ``PassThroughProfiler``.

Run: ``.venv/bin/python benchmarks/integrations_overhead.py [--pairs 5] [--steps 200] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH = 32


def _data(steps: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(steps * BATCH, 64, generator=g), torch.randint(0, 10, (steps * BATCH,), generator=g)
    )


def lightning_fit(steps: int, form: str | None) -> float:
    """Samples/s of one Lightning fit of ``steps`` steps; ``form`` None, "profiler" or "callback"."""
    from profiler.integrations.lightning import StallscopeCallback, StallscopeProfiler, pl

    class Net(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    out = tempfile.mkdtemp(prefix="stallscope-bench-")
    kw: dict[str, Any] = {"report": False, "warmup": 5}
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=StallscopeProfiler(out, **kw) if form == "profiler" else None,
        callbacks=[StallscopeCallback(out, **kw)] if form == "callback" else [],
    )
    t0 = time.perf_counter()
    trainer.fit(Net(), DataLoader(_data(steps), batch_size=BATCH))
    return steps * BATCH / (time.perf_counter() - t0)


def hf_train(steps: int, form: str | None) -> float:
    """Samples/s of one Hugging Face train of ``steps`` steps; ``form`` None or "instrument"."""
    from transformers import Trainer, TrainingArguments

    from profiler.integrations.hf import instrument

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    class Dicts(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self, data: TensorDataset) -> None:
            self.data = data

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            x, y = self.data[i]
            return {"x": x, "labels": y}

    out = tempfile.mkdtemp(prefix="stallscope-bench-")
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=Net(), args=args, train_dataset=Dicts(_data(steps)))
    if form == "instrument":
        instrument(trainer, Path(out) / "run", report=False, warmup=5)
    t0 = time.perf_counter()
    trainer.train()
    return steps * BATCH / (time.perf_counter() - t0)


def paired(run: Callable[[int, str | None], float], form: str, pairs: int, steps: int) -> dict[str, Any]:
    run(steps, None)  # imports and first-call costs, outside the pairs
    ratios = []
    for i in range(pairs):
        order = [None, form] if i % 2 == 0 else [form, None]
        got = {f: run(steps, f) for f in order}
        ratios.append(got[form] / got[None])
    return {"form": form, "median_ratio": statistics.median(ratios), "ratios": ratios, "steps": steps}


def unmapped_call_us(n: int = 100_000) -> dict[str, float]:
    from profiler.integrations.lightning import StallscopeProfiler, pl

    out: dict[str, float] = {}
    for name, prof in (
        ("passthrough", pl.profilers.PassThroughProfiler()),
        ("stallscope", StallscopeProfiler(tempfile.mkdtemp(), report=False, sources=[])),
    ):
        t0 = time.perf_counter()
        for _ in range(n):
            prof.start("[LightningModule]Net.on_train_batch_start")
            prof.stop("[LightningModule]Net.on_train_batch_start")
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    results = [
        paired(lightning_fit, "profiler", a.pairs, a.steps),
        paired(lightning_fit, "callback", a.pairs, a.steps),
        paired(hf_train, "instrument", a.pairs, a.steps),
    ]
    calls = unmapped_call_us()
    if a.json:
        print(json.dumps({"paired": results, "unmapped_call_us": calls}, indent=2))
        return
    for r in results:
        print(f"{r['form']:12s} throughput with/without: median {r['median_ratio']:.3f}  pairs {r['ratios']}")
    print(
        f"unmapped action start+stop: {calls['stallscope']:.2f} us (PassThroughProfiler {calls['passthrough']:.2f} us)"
    )


if __name__ == "__main__":
    main()
