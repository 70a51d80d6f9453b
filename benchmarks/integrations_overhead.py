"""Overhead of the trainer integrations: the same Trainer without and with stallscope, paired, medians.

For each pair, one fit/train without stallscope and one with it (the order alternating between pairs so drift
cancels), on the same tiny model and in-memory data (0 workers: the loop's own cost is all there is). The figure
is the median over pairs of the per-pair ratio of training throughput (with / without), over the whole
fit: stallscope's fixed cost (store, sampler, summary at close, about 0.1-0.2 s) is in it, so use enough steps
to see the per-step cost. Forms:

- ``lightning-profiler``: ``Trainer(profiler=StallscopeProfiler(...))`` against ``profiler=None``;
- ``lightning-callback``: ``callbacks=[StallscopeCallback(...)]`` against no callback;
- ``hf-instrument``: ``instrument(trainer, ...)`` against the bare Trainer.

- ``session-prometheus``: a hand-written loop in a ``Session`` with ``prometheus=0`` against the same Session
  without it, the endpoint scraped once a second by another process (as a Prometheus server would) while the
  loop runs; the figure is the loop's throughput (start and close of the Session, the same on both sides, are
  outside it). Also the direct cost of one scrape (the HTTP round trip, timed by the scraper).

Also the per-call cost of an action stallscope does not map (Lightning profiles every hook call) against
Lightning's ``PassThroughProfiler``.

Every result carries its pairs and their range (min-max): a median whose pairs spread more widely than the
effect is noise-bound on a shared machine (docs/benchmarks.md).

Run: ``.venv/bin/python benchmarks/integrations_overhead.py [--pairs 5] [--steps 300] [--session-steps 8000]
[--threads 1] [--only lightning-profiler,lightning-callback,hf-instrument,session-prometheus] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import subprocess
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


# The scraper: another process reading the endpoint once a second, as a Prometheus server does; it prints
# each scrape's round trip in ms and stops when its stdin closes.
SCRAPER = """
import sys, threading, time, urllib.request
url, done = sys.argv[1], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.wait(1.0):
    t0 = time.perf_counter()
    body = urllib.request.urlopen(url, timeout=10).read()
    assert b"stallscope_steps_total" in body
    print(f"{(time.perf_counter() - t0) * 1e3:.3f}", flush=True)
"""

SCRAPES_MS: list[float] = []


def session_loop(steps: int, form: str | None) -> float:
    """Samples/s of a hand-written loop in a Session; ``form`` None or "prometheus" (scraped at 1 Hz)."""
    from profiler import Session

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(_data(steps), batch_size=BATCH)
    out = Path(tempfile.mkdtemp(prefix="stallscope-bench-")) / "run"
    kw: dict[str, Any] = {"prometheus": 0} if form == "prometheus" else {}
    with Session(out, device="cpu", warmup=5, **kw) as s:
        scraper = None
        if s.exporter is not None:
            cmd = [sys.executable, "-c", SCRAPER, s.exporter.url]
            scraper = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        t0 = time.perf_counter()
        for x, y in s.wrap(loader):
            with s.phase("compute"):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
        took = time.perf_counter() - t0
        if scraper is not None:
            got, _ = scraper.communicate("", timeout=30)
            SCRAPES_MS.extend(float(v) for v in got.split())
    return steps * BATCH / took


def paired(run: Callable[[int, str | None], float], form: str, pairs: int, steps: int) -> dict[str, Any]:
    run(steps, None)  # imports and first-call costs, outside the pairs
    ratios, base = [], []
    for i in range(pairs):
        order = [None, form] if i % 2 == 0 else [form, None]
        got = {f: run(steps, f) for f in order}
        ratios.append(got[form] / got[None])
        base.append(got[None])
    return {
        "form": form,
        "median_ratio": statistics.median(ratios),
        "range": [min(ratios), max(ratios)],
        "ratios": ratios,
        "steps": steps,
        "without_samples_per_s": [min(base), max(base)],
    }


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


FORMS: dict[str, tuple[Callable[[int, str | None], float], str]] = {
    "lightning-profiler": (lightning_fit, "profiler"),
    "lightning-callback": (lightning_fit, "callback"),
    "hf-instrument": (hf_train, "instrument"),
    "session-prometheus": (session_loop, "prometheus"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--session-steps", type=int, default=8000, help="steps of the session-prometheus loop")
    ap.add_argument("--only", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    only = [f for f in a.only.split(",") if f]
    if bad := [f for f in only if f not in FORMS]:
        ap.error(f"--only {','.join(bad)}: allowed {', '.join(FORMS)}")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    # one intra-op thread: on a shared 2-core machine torch's second thread spins against other tenants and a
    # step's time swings by 10x or more with their load; the integrations' cost does not depend on it
    torch.set_num_threads(a.threads)
    results = []
    for name in only:
        run, form = FORMS[name]
        steps = a.session_steps if name == "session-prometheus" else a.steps
        with contextlib.redirect_stdout(sys.stderr):  # the HF Trainer prints its metrics: stdout is the result
            results.append({**paired(run, form, a.pairs, steps), "form": name})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # each as it is done: a long run keeps its parts
    calls = unmapped_call_us() if any(n.startswith("lightning") for n in only) else {}
    scrapes = {"n": len(SCRAPES_MS), "median_ms": statistics.median(SCRAPES_MS)} if SCRAPES_MS else {}
    if a.json:
        print(json.dumps({"paired": results, "unmapped_call_us": calls, "scrape": scrapes}, indent=2))
        return
    for r in results:
        lo, hi = r["range"]
        print(
            f"{r['form']:19s} throughput with/without: median {r['median_ratio']:.3f}  pairs {lo:.3f}-{hi:.3f} "
            f"({len(r['ratios'])} pairs, {r['steps']} steps)"
        )
    if calls:
        us, base = calls["stallscope"], calls["passthrough"]
        print(f"unmapped action start+stop: {us:.2f} us (PassThroughProfiler {base:.2f} us)")
    if scrapes:
        ms, n = scrapes["median_ms"], scrapes["n"]
        print(f"scrape round trip (1 Hz, another process): median {ms:.2f} ms over {n} scrapes")


if __name__ == "__main__":
    main()
