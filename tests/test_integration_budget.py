"""The integrations' data wait against the standalone Session's, on the same injected-cost loop (issue #14's truth:
"within the phase budget of the standalone Session").

Each side runs the same loader of items that sleep a known time (0 workers), a batch transfer and a forward that
sleep too, and records its steps. The truth of a step's fetch is the loader's whole ``next()``, timed by a shim
right around it (items, sampler, collate and the host's preemptions are all in it). Per measured step, the
*excess* is the recorded data wait minus that truth: what the recording and the loop between it and the loader
add. The integration's median excess may exceed the standalone Session's by the Session's per-phase budget
(20 us, docs/benchmarks.md) and no more. A wrong mapping fails by far: the transfer (1 ms) or the forward (1 ms)
counted as data wait is 50 times the budget.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from conftest import Truth
from torch import nn
from torch.utils.data import DataLoader, Dataset

from profiler import Session
from profiler.core.store import load_run
from profiler.integrations.lightning import StallscopeProfiler, pl

BATCH, ITEM_S, TRANSFER_S, FORWARD_S, STEPS, WARMUP = 2, 0.003, 0.001, 0.001, 30, 3
BUDGET_S = 20e-6  # the standalone Session's per-phase budget (docs/benchmarks.md)
ROUNDS = 2


class Items(Dataset[int]):
    """Items that sleep ``ITEM_S``; batches are lists (Lightning, the Session) or two small tensors (:func:`collate`,
    Hugging Face), so the loader's own work is small and both sides' spread stays under the budget."""

    def __len__(self) -> int:
        return BATCH * STEPS

    def __getitem__(self, i: int) -> int:
        time.sleep(ITEM_S)
        return i


def collate(items: list[int]) -> dict[str, torch.Tensor]:
    """The Hugging Face side's batch: the model's inputs, built from the items' count."""
    return {"x": torch.ones(len(items), 4), "labels": torch.zeros(len(items), dtype=torch.long)}


class TimedNext:
    """An iterator: each ``next()`` of ``it``, the whole call, timed into ``truth`` (label "next"), in order."""

    def __init__(self, it: Iterator[Any], truth: Truth) -> None:
        self.it, self.spent = it, truth.spent.setdefault("next", [])

    def __iter__(self) -> TimedNext:
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            return next(self.it)
        finally:
            self.spent.append(time.perf_counter() - t0)


class TimedLoader:
    """A sized loader whose iterators are :class:`TimedNext`."""

    def __init__(self, loader: DataLoader[Any], truth: Truth) -> None:
        self.loader, self.truth = loader, truth

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> TimedNext:
        return TimedNext(iter(self.loader), self.truth)


def _excesses(run: Path, truth: Truth) -> list[float]:
    """Per measured step, the recorded data wait - the truth of that step's fetch (the k-th ``next()``)."""
    fetches = truth.spent["next"]
    steps = [s for s in load_run(run).steps if not s.warmup]
    assert len(steps) == STEPS - WARMUP and len(fetches) >= STEPS, (len(steps), len(fetches))
    return [s.data_wait_s - fetches[s.step] for s in steps]


def _interleaved(
    tmp: Path, standalone: Callable[[Path, Truth], None], integration: Callable[[Path, Truth], None]
) -> str | None:
    """The two sides run alternately, ROUNDS times each, and their median excesses over every measured step of
    their rounds compared (:func:`_over_budget`): a burst of load on a shared host falls on both sides' rounds,
    not on one side's only (beside busy processes, one side run once after the other read 52.6 us against
    28.9 us, where quiet runs read 28-32 us against 31-56 us)."""
    alone: list[float] = []
    inside: list[float] = []
    for k in range(ROUNDS):
        base, truth = Truth(), Truth()
        standalone(tmp / f"alone{k}", base)
        integration(tmp / f"run{k}", truth)
        alone += _excesses(tmp / f"alone{k}", base)
        inside += _excesses(tmp / f"run{k}", truth)
    return _over_budget(statistics.median(inside), statistics.median(alone))


def _standalone(run: Path, loader: Iterable[Any]) -> None:
    """The same loop by hand: ``wrap()`` and two phases, with the same injected transfer and forward."""
    with Session(run, device="cpu", warmup=WARMUP, sources=[]) as s:
        for _batch in s.wrap(loader):
            with s.phase("h2d"):
                time.sleep(TRANSFER_S)
            with s.phase("compute"):
                time.sleep(FORWARD_S)


def _over_budget(integration: float, standalone: float) -> str | None:
    """Why the integration's median excess is not within the Session's phase budget of the standalone Session's
    (or a data wait reads below its own fetch's truth); None when it is."""
    us = f"integration {integration * 1e6:.1f} us, standalone Session {standalone * 1e6:.1f} us"
    if integration - standalone > BUDGET_S:
        return f"the integration's data wait exceeds the Session's: {us}"
    if integration < -BUDGET_S or standalone < -BUDGET_S:
        return f"a data wait below its items' truth: {us}"
    return None


class Net(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        time.sleep(TRANSFER_S)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(FORWARD_S)
        return nn.functional.cross_entropy(
            self.lin(torch.ones(len(batch), 4)), torch.zeros(len(batch), dtype=torch.long)
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FetchSpans(pl.profilers.Profiler):  # type: ignore[misc]
    """Lightning with no stallscope: the span of each of its fetch actions (``[...].train_dataloader_next``, the
    action Lightning times the loader's ``next()`` under), on the same clock as the shim. Its excess over the shim
    is Lightning's own fetch path (its data fetcher and combined loader), which any profiler's span holds."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[float] = []
        self.t0: float | None = None

    def start(self, action_name: str) -> None:
        if action_name.endswith("].train_dataloader_next"):
            self.t0 = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if action_name.endswith("].train_dataloader_next") and self.t0 is not None:
            self.spans.append(time.perf_counter() - self.t0)
            self.t0 = None

    def summary(self) -> str:
        return ""


def _lightning(profiler: Any, truth: Truth) -> None:
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(), TimedLoader(DataLoader(Items(), batch_size=BATCH, collate_fn=list), truth))


def test_lightning_data_wait_is_within_the_sessions_phase_budget(tmp_path: Path) -> None:
    """Lightning's own fetch path is in any profiler's span of its fetch action, and on a loaded host it alone
    grew from ~28 to ~50 us: the integration's excess is taken net of it, measured the same way in the same
    rounds with a profiler that only records the spans (:class:`FetchSpans`)."""
    alone: list[float] = []
    inside: list[float] = []
    framework: list[float] = []
    for k in range(ROUNDS):
        base, truth, bare = Truth(), Truth(), Truth()
        _standalone(tmp_path / f"alone{k}", TimedLoader(DataLoader(Items(), batch_size=BATCH, collate_fn=list), base))
        spans = FetchSpans()
        _lightning(spans, bare)
        _lightning(StallscopeProfiler(tmp_path / f"run{k}", warmup=WARMUP, sources=[], report=False), truth)
        alone += _excesses(tmp_path / f"alone{k}", base)
        inside += _excesses(tmp_path / f"run{k}", truth)
        fetches = bare.spent["next"]
        assert len(spans.spans) == len(fetches) >= STEPS, (len(spans.spans), len(fetches))
        framework += [span - fetch for span, fetch in zip(spans.spans[WARMUP:], fetches[WARMUP:], strict=True)]
    own = statistics.median(inside) - statistics.median(framework)
    problem = _over_budget(own, statistics.median(alone))
    assert problem is None, (problem, f"Lightning's own fetch path {statistics.median(framework) * 1e6:.1f} us")


class HFNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(FORWARD_S)
        return {"loss": nn.functional.cross_entropy(self.lin(x), labels)}


def _hf_trainer(tmp: Path) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp / "hf"),
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        use_cpu=True,
        dataloader_num_workers=0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return Trainer(model=HFNet(), args=args, train_dataset=Items(), data_collator=collate)


def test_hf_instrument_data_wait_is_within_the_sessions_phase_budget(tmp_path: Path) -> None:
    """The shim goes around the Trainer's epoch iterator (accelerate's loader), inside instrument()'s timing."""
    from profiler.integrations.hf import instrument

    def standalone(run: Path, truth: Truth) -> None:
        _standalone(run, TimedLoader(DataLoader(Items(), batch_size=BATCH, collate_fn=collate), truth))

    def hf(run: Path, truth: Truth) -> None:
        trainer = _hf_trainer(run.with_name(run.name + "-hf"))
        instrument(trainer, run, warmup=WARMUP, sources=[], report=False)
        timed = trainer.get_batch_samples  # instrument()'s: it times the iterator it is given

        def truth_inside(epoch_iterator: Iterator[Any], num_batches: int, device: Any) -> Any:
            return timed(TimedNext(epoch_iterator, truth), num_batches, device)

        trainer.get_batch_samples = truth_inside
        trainer.train()

    problem = _interleaved(tmp_path, standalone, hf)
    assert problem is None, problem
