"""The integrations' stall/ figures in the frameworks' own loggers, read back with each logger's reader:
Lightning's TensorBoardLogger and CSVLogger (both at once, at the Trainer's logging steps, and the run's figures at
the end of fit), and the Hugging Face Trainer's ``report_to="tensorboard"`` event file.

Truth: each item sleeps ``ITEM_S`` in the loader (0 workers), so each step's data wait holds ``BATCH * ITEM_S``;
the run figures logged at the end are the closed run's Summary's.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ITEM_S, BATCH, STEPS = 0.002, 2, 24


class Items(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return BATCH * STEPS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(ITEM_S)
        return torch.ones(4), torch.tensor(i % 3)


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {p.parent for p in logdir.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_lightning_fit_logs_to_every_logger(tmp_path: Path) -> None:
    from profiler.integrations.lightning import StallscopeCallback, pl

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.lin(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    tb = pl.loggers.TensorBoardLogger(str(tmp_path / "tb"), name="", version="")
    csv_logger = pl.loggers.CSVLogger(str(tmp_path / "csv"), name="", version="")
    cb = StallscopeCallback(tmp_path / "run", report=False, sources=[])
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=[tb, csv_logger], callbacks=[cb], log_every_n_steps=4,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), DataLoader(Items(), batch_size=BATCH, num_workers=0))
    assert cb.session is not None
    summary = cb.session.summary()
    assert summary is not None and summary.steps == STEPS
    want = summary.breakdown_ms_per_step.data_wait

    got_tb = scalars(tmp_path / "tb")
    assert got_tb["stall/run/data_wait_ms"][-1][1] == pytest.approx(want, rel=1e-5)
    assert got_tb["stall/run/steps"][-1][1] == STEPS
    waits = got_tb["stall/data_wait_ms"]
    assert waits and all(v >= BATCH * ITEM_S * 1e3 * 0.999 for _, v in waits)
    assert all(step <= STEPS for step, _ in waits)  # the Trainer's own step axis

    with open(tmp_path / "csv" / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    run_rows = [r for r in rows if r.get("stall/run/data_wait_ms")]
    assert float(run_rows[-1]["stall/run/data_wait_ms"]) == pytest.approx(want, rel=1e-5)
    csv_waits = [float(r["stall/data_wait_ms"]) for r in rows if r.get("stall/data_wait_ms")]
    assert csv_waits == pytest.approx([v for _, v in waits], rel=1e-5)  # the same points in both loggers


def test_hf_trainer_report_to_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import Trainer, TrainingArguments

    from profiler.integrations.hf import StallscopeCallback, instrument

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.cross_entropy(self.lin(x), labels)}

    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {"x": torch.stack([x for x, _ in items]), "labels": torch.stack([y for _, y in items])}

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, max_steps=STEPS, logging_steps=4,
        report_to="tensorboard", use_cpu=True, save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=Model(), args=args, train_dataset=Items(), data_collator=collate)
    cb = instrument(trainer, tmp_path / "run", report=False, sources=[])
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    # its keys go into the logs before the trackers' callbacks read them: it comes first
    assert names.index("StallscopeCallback") < names.index("TensorBoardCallback")
    assert isinstance(trainer.callback_handler.callbacks[0], StallscopeCallback)
    trainer.train()
    assert cb.session is not None
    summary = cb.session.summary()
    assert summary is not None and summary.steps == STEPS
    got = scalars(tmp_path / "tb")
    assert got["train/stall/run/data_wait_ms"][-1][1] == pytest.approx(
        summary.breakdown_ms_per_step.data_wait, rel=1e-5
    )
    waits = got["train/stall/data_wait_ms"]
    assert waits and all(v >= BATCH * ITEM_S * 1e3 * 0.999 for _, v in waits)
    assert all(step % 4 == 0 for step, _ in waits)  # at the Trainer's own logging steps (logging_steps=4)
