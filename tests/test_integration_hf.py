"""The Hugging Face integration against injected truth: a real Trainer, a tiny model built here, items that sleep.

The Trainer's loader reads one batch ahead (accelerate's DataLoaderShard), so a step's wait is the load of the
batch after its own: the figures are compared over the whole run (every step's data wait against every item's
sleep, as timed by the test). ``instrument()`` must be within 5%; the callback alone is an upper bound.
"""

from __future__ import annotations

import importlib
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Truth
from torch import nn
from torch.utils.data import Dataset

from profiler.core.store import load_run
from profiler.integrations.hf import BOUND, EXACT, StallscopeCallback, instrument

BATCH, ITEM_S, BATCHES = 8, 0.004, 24


class Items(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, truth: Truth) -> None:
        self.truth = truth

    def __len__(self) -> int:
        return BATCH * BATCHES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        time.sleep(ITEM_S)
        item = {"x": torch.full((4,), float(i % 5)), "labels": torch.tensor(i % 3)}
        self.truth.spent.setdefault("item", []).append(time.perf_counter() - t0)  # the whole item, as it ran
        return item


class Tiny(nn.Module):
    def __init__(self, fail_at: int = 0) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected failure in forward")
        logits = self.lin(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def _trainer(tmp: Path, truth: Truth, accumulate: int = 1, fail_at: int = 0) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp / "hf"),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulate,
        num_train_epochs=1,
        use_cpu=True,
        dataloader_num_workers=0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return Trainer(model=Tiny(fail_at), args=args, train_dataset=Items(truth), data_collator=TimedCollate(truth))


class TimedCollate:
    """The Trainer's default collator, timed into the truth: building the batch is data wait too (on a host three
    times slower than usual it was 7% of it, which a truth of the items alone left out)."""

    def __init__(self, truth: Truth) -> None:
        self.truth = truth

    def __call__(self, features: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        from transformers import default_data_collator

        t0 = time.perf_counter()
        batch = default_data_collator(features)
        self.truth.spent.setdefault("collate", []).append(time.perf_counter() - t0)
        return batch


def _waits(run: Path, truth: Truth) -> tuple[float, float]:
    """(data wait stallscope recorded, what the items and their collation took), whole run."""
    items = truth.spent["item"]
    assert len(items) == BATCH * BATCHES
    return sum(s.data_wait_s for s in load_run(run).steps), sum(items) + sum(truth.spent.get("collate", []))


@pytest.mark.parametrize("accumulate", [1, 3])
def test_instrument_records_the_injected_data_wait(tmp_path: Path, accumulate: int) -> None:
    truth = Truth()
    trainer = _trainer(tmp_path, truth, accumulate)
    cb = instrument(trainer, tmp_path / "run", warmup=1, sources=[], report=False)
    trainer.train()
    measured, injected = _waits(tmp_path / "run", truth)
    assert abs(measured - injected) <= 0.05 * injected, (measured, injected)
    record = load_run(tmp_path / "run")
    assert len(record.steps) == BATCHES // accumulate  # one stallscope step per optimizer step
    assert all(s.samples == BATCH * accumulate for s in record.steps)
    assert {p.name for p in record.phases} == {"compute"}
    assert record.meta["data_wait"] == EXACT and record.meta["status"] == "complete"
    assert cb.session is not None and cb.session.summary() is not None
    assert (tmp_path / "run" / "summary.json").is_file()


def test_the_callback_alone_records_an_upper_bound(tmp_path: Path) -> None:
    truth = Truth()
    trainer = _trainer(tmp_path, truth)
    trainer.add_callback(StallscopeCallback(tmp_path / "run", sources=[], report=False))
    trainer.train()
    measured, injected = _waits(tmp_path / "run", truth)
    assert measured >= 0.95 * injected, (measured, injected)  # the fetch and more: never much below the truth
    record = load_run(tmp_path / "run")
    assert len(record.steps) == BATCHES
    assert all(s.samples is None for s in record.steps)  # the callback sees no batch
    assert record.meta["data_wait"] == BOUND and record.meta["status"] == "complete"


def test_instrument_serves_prometheus_while_it_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``instrument(..., prometheus=0)``: the training's figures are served on a free port while it trains."""
    from prometheus_client.parser import text_string_to_metric_families
    from transformers import TrainerCallback

    scraped: dict[str, float] = {}

    class Scrape(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 4 and cb.session is not None and cb.session.exporter is not None:
                url = cb.session.exporter.url
                # served by the sampler process from the steps it has drained (every 0.1 s): a moment behind
                deadline = time.monotonic() + 10
                while scraped.get("stallscope_steps_total", 0) < 3 and time.monotonic() < deadline:
                    text = urllib.request.urlopen(url, timeout=10).read().decode()
                    scraped.update((s.name, s.value) for f in text_string_to_metric_families(text) for s in f.samples)
                    time.sleep(0.05)

    trainer = _trainer(tmp_path, Truth())
    cb = instrument(trainer, tmp_path / "run", warmup=1, sources=[], report=False, prometheus=0)
    trainer.add_callback(Scrape())
    trainer.train()
    assert scraped["stallscope_steps_total"] >= 3 and scraped["stallscope_data_wait_seconds_total"] > 0, scraped
    assert "stallscope: Prometheus metrics at http://127.0.0.1:" in capsys.readouterr().err
    with pytest.raises(ValueError, match="'99999'"):
        instrument(_trainer(tmp_path, Truth()), tmp_path / "bad", prometheus=99999)


def test_a_training_that_raises_keeps_its_steps_and_says_failed(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, Truth(), fail_at=6)
    instrument(trainer, tmp_path / "run", sources=[], report=False)
    with pytest.raises(RuntimeError, match="injected failure"):
        trainer.train()
    record = load_run(tmp_path / "run")
    assert record.meta["status"] == "failed" and "injected failure in forward" in record.meta["error"]
    assert len(record.steps) == 6  # five whole steps, and the one that failed


def test_without_transformers_the_import_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "profiler.integrations.hf")
    with pytest.raises(ImportError) as err:
        importlib.import_module("profiler.integrations.hf")
    assert str(err.value) == (
        "stallscope's Hugging Face integration needs transformers (and accelerate): pip install 'stallscope[hf]'"
    )
