"""Overhead of the trainer integrations: the same Trainer without and with stallscope, paired, medians.

Two figures, because one of them is noise-bound on a shared machine and the other is not:

1. **Paired trainings** (``--pairs``, alternating which side goes first so drift cancels): the same tiny model and
   in-memory data (0 workers), each step made long enough by an injected ``--step-ms`` sleep in the forward that
   a per-step cost of tens of microseconds is resolvable against it. Each side's step time is read by a clock
   hook of its own (the same hook on both sides) from step ``--skip`` to the last, so stallscope's fixed cost
   per training (store, sampler, summary and report at close) is not charged to the steps; it is reported
   apart (``fixed_s``: the difference of the whole trainings beyond the steps'). Per pair: the throughput ratio
   (with / without) and the per-step overhead in microseconds; the medians over pairs are the figures. Forms:

   - ``lightning-profiler``: ``Trainer(profiler=StallscopeProfiler(...))`` against ``profiler=None``;
   - ``lightning-callback``: ``callbacks=[StallscopeCallback(...)]`` against no callback;
   - ``hf-instrument``: ``instrument(trainer, ...)`` against the bare Trainer;
   - ``session-prometheus``: a hand-written loop in a ``Session`` with ``prometheus=0`` against the same Session
     without it, the endpoint scraped once a second by another process (as a Prometheus server would); also the
     direct cost of one scrape (the HTTP round trip, timed by the scraper).

2. **Per-step microbenchmark** (``--micro N`` steps, no training, not noise-bound): one real step's sequence of
   Lightning profiler actions (captured from a tiny fit) replayed N times through Lightning's
   ``PassThroughProfiler`` (the floor) and through ``StallscopeProfiler`` (its mapping: a step, its data wait, the
   ``h2d`` and ``compute`` phases, the batch's size), against a standalone ``Session``'s ``wrap()`` and two
   phases on the same N batches; plus what Lightning spends on a callback's hooks in one step (the profiler
   form adds one for the batch's size and a failed fit; Lightning looks up 6 step hooks on every callback and
   calls, through the profiler, those that are callable: stallscope's leaves all but one None). Minimum over
   ``--repeat`` rounds (the least disturbed).

Every paired result carries its pairs and their range (min-max): a median whose pairs spread more widely than
the effect is noise-bound on a shared machine (docs/benchmarks.md).

Run: ``.venv/bin/python benchmarks/integrations_overhead.py [--pairs 7] [--steps 400] [--step-ms 3] [--skip 20]
[--session-steps 3000] [--micro 20000] [--repeat 7] [--threads 1] [--only FORMS] [--json]``; smoke:
``--pairs 1 --steps 30 --skip 5 --session-steps 50 --micro 200 --repeat 1``.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH = 32


@dataclass
class Knobs:
    steps: int
    step_s: float  # the injected sleep in each step's forward
    skip: int  # steps before the timed ones


@dataclass
class Timed:
    step_s: float  # mean step time from step ``skip`` to the last (clock hook)
    fit_s: float  # the whole training, as the caller saw it


def _data(steps: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(steps * BATCH, 64, generator=g), torch.randint(0, 10, (steps * BATCH,), generator=g)
    )


def _mean_step(stamps: list[float], skip: int) -> float:
    timed = stamps[skip:]
    if len(timed) < 2:
        raise SystemExit(f"--skip {skip}: needs at least 2 steps after it, got {len(timed)}")
    return (timed[-1] - timed[0]) / (len(timed) - 1)


def lightning_fit(k: Knobs, form: str | None) -> Timed:
    """One Lightning fit; ``form`` None, "profiler" or "callback"."""
    from profiler.integrations.lightning import StallscopeCallback, StallscopeProfiler, pl

    stamps: list[float] = []

    class Clock(pl.Callback):  # type: ignore[misc]
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            stamps.append(time.perf_counter())

    class Net(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            time.sleep(k.step_s)
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
        callbacks=[Clock(), *([StallscopeCallback(out, **kw)] if form == "callback" else [])],
    )
    t0 = time.perf_counter()
    trainer.fit(Net(), DataLoader(_data(k.steps), batch_size=BATCH))
    return Timed(_mean_step(stamps, k.skip), time.perf_counter() - t0)


def hf_train(k: Knobs, form: str | None) -> Timed:
    """One Hugging Face train; ``form`` None or "instrument"."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from profiler.integrations.hf import instrument

    stamps: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            time.sleep(k.step_s)
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
    trainer = Trainer(model=Net(), args=args, train_dataset=Dicts(_data(k.steps)), callbacks=[Clock()])
    if form == "instrument":
        instrument(trainer, Path(out) / "run", report=False, warmup=5)
    t0 = time.perf_counter()
    trainer.train()
    return Timed(_mean_step(stamps, k.skip), time.perf_counter() - t0)


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


def session_loop(k: Knobs, form: str | None) -> Timed:
    """A hand-written loop in a Session; ``form`` None or "prometheus" (scraped at 1 Hz)."""
    from profiler import Session

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(_data(k.steps), batch_size=BATCH)
    out = Path(tempfile.mkdtemp(prefix="stallscope-bench-")) / "run"
    kw: dict[str, Any] = {"prometheus": 0} if form == "prometheus" else {}
    stamps: list[float] = []
    t_fit = time.perf_counter()
    with Session(out, device="cpu", warmup=5, **kw) as s:
        scraper = None
        if s.exporter is not None:
            cmd = [sys.executable, "-c", SCRAPER, s.exporter.url]
            scraper = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for x, y in s.wrap(loader):
            stamps.append(time.perf_counter())
            with s.phase("compute"):
                time.sleep(k.step_s)
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
        if scraper is not None:
            got, _ = scraper.communicate("", timeout=30)
            SCRAPES_MS.extend(float(v) for v in got.split())
    return Timed(_mean_step(stamps, k.skip), time.perf_counter() - t_fit)


def paired(run: Callable[[Knobs, str | None], Timed], form: str, pairs: int, k: Knobs) -> dict[str, Any]:
    run(Knobs(max(k.skip + 3, 10), k.step_s, k.skip), None)  # imports and first-call costs, outside the pairs
    ratios, over_us, fixed_s, base = [], [], [], []
    for i in range(pairs):
        order = [None, form] if i % 2 == 0 else [form, None]
        got = {f: run(k, f) for f in order}
        without, with_ = got[None], got[form]
        ratios.append(without.step_s / with_.step_s)  # throughput with / without
        over_us.append((with_.step_s - without.step_s) * 1e6)
        fixed_s.append((with_.fit_s - without.fit_s) - k.steps * (with_.step_s - without.step_s))
        base.append(without.step_s * 1e3)
    return {
        "form": form,
        "median_ratio": statistics.median(ratios),
        "range": [min(ratios), max(ratios)],
        "ratios": ratios,
        "median_overhead_us": statistics.median(over_us),
        "overhead_us": over_us,
        "median_fixed_s": statistics.median(fixed_s),
        "steps": k.steps,
        "step_ms_without": [min(base), max(base)],
    }


def one_step_actions() -> list[tuple[str, str]]:
    """The profiler actions of one training step of a tiny fit (its third: past the first step's extras),
    with one stallscope callback's hooks among them, as Lightning emits them."""
    from profiler.integrations.lightning import StallscopeCallback, pl

    class ThreadRecorder(pl.profilers.Profiler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        def start(self, action_name: str) -> None:
            self.calls.append(("start", action_name))

        def stop(self, action_name: str) -> None:
            self.calls.append(("stop", action_name))

    class Net(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.lin(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    rec = ThreadRecorder()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=rec,
        callbacks=[StallscopeCallback(tempfile.mkdtemp(prefix="stallscope-bench-"), report=False, sources=[])],
    )
    data = TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,)))
    trainer.fit(Net(), DataLoader(data, batch_size=8))
    fetch = ("start", "[_TrainingEpochLoop].train_dataloader_next")
    at = [i for i, call in enumerate(rec.calls) if call == fetch]
    return rec.calls[at[2] : at[3]]


def micro_us(n: int, repeat: int) -> dict[str, Any]:
    """Per-step cost in microseconds (minimum over ``repeat`` rounds of ``n`` steps): the module docstring's 2."""
    from profiler import Session
    from profiler.integrations.lightning import StallscopeProfiler, pl

    actions = one_step_actions()
    batch = [torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)]
    # the callback hooks Lightning looks up on every callback in each training step (those a callback leaves
    # None it skips; the others it calls through the profiler)
    hooks = [
        "on_train_batch_start",
        "on_before_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
    ]

    def session() -> Session:
        return Session(Path(tempfile.mkdtemp(prefix="stallscope-bench-")) / "run", device="cpu", sources=[]).start()

    def replay(start: Callable[[str], None], stop: Callable[[str], None], count: Any = None) -> float:
        calls = [(start if kind == "start" else stop, a) for kind, a in actions]
        t0 = time.perf_counter()
        for _ in range(n):
            for call, action in calls:
                call(action)
            if count is not None:
                count(batch)
        return (time.perf_counter() - t0) / n * 1e6

    def passthrough() -> float:
        p = pl.profilers.PassThroughProfiler()
        return replay(p.start, p.stop)

    def integration() -> float:
        p = StallscopeProfiler(tempfile.mkdtemp(prefix="stallscope-bench-"), report=False)
        p.recorder.attach(s := session())
        took = replay(p.start, p.stop, p.recorder.batch)
        s.close()
        return took

    def standalone() -> float:
        s = session()
        t0 = time.perf_counter()
        for _ in s.wrap([batch] * n):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                pass
        took = (time.perf_counter() - t0) / n * 1e6
        s.close()
        return took

    def callback_hooks() -> float:
        # what Lightning does for each callback hook (lightning.pytorch.trainer.call._call_callback_hooks): look
        # the hook up, and call it inside the profiler's profile() context; here for the stallscope callback
        from profiler.integrations.lightning import StallscopeCallback

        cb, prof = (
            StallscopeCallback(tempfile.mkdtemp(prefix="stallscope-bench-"), report=False),
            StallscopeProfiler(tempfile.mkdtemp(prefix="stallscope-bench-"), report=False),
        )
        args = {"on_train_batch_start": (batch, 0), "on_train_batch_end": (None, batch, 0)}
        t0 = time.perf_counter()
        for _ in range(n):
            for hook in hooks:
                fn = getattr(cb, hook)
                if callable(fn):
                    with prof.profile(f"[Callback]{cb.state_key}.{hook}"):
                        fn(None, None, *args.get(hook, (None,) if hook != "on_after_backward" else ()))
        return (time.perf_counter() - t0) / n * 1e6

    parts = {
        "passthrough": passthrough,
        "stallscope_profiler": integration,
        "standalone_session": standalone,
        "callback_hooks": callback_hooks,
    }
    got: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(repeat):
        for name, part in parts.items():
            got[name].append(part())
    best = {name: min(xs) for name, xs in got.items()}
    return {
        "steps": n,
        "repeat": repeat,
        "actions_per_step": len(actions) // 2,
        "callback_hooks_per_step": len(hooks),
        "callback_hooks_called": sum(1 for kind, a in actions if kind == "start" and a.startswith("[Callback]")),
        **{f"{name}_us": round(us, 2) for name, us in best.items()},
        "mapping_over_standalone_us": round(
            best["stallscope_profiler"] - best["passthrough"] - best["standalone_session"], 2
        ),
        "rounds_us": {name: [round(x, 2) for x in xs] for name, xs in got.items()},
    }


FORMS: dict[str, tuple[Callable[[Knobs, str | None], Timed], str]] = {
    "lightning-profiler": (lightning_fit, "profiler"),
    "lightning-callback": (lightning_fit, "callback"),
    "hf-instrument": (hf_train, "instrument"),
    "session-prometheus": (session_loop, "prometheus"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400, help="steps of each training")
    ap.add_argument("--step-ms", type=float, default=3.0, help="injected sleep in each step's forward (ms)")
    ap.add_argument("--skip", type=int, default=20, help="steps before the timed ones")
    ap.add_argument("--session-steps", type=int, default=3000, help="steps of the session-prometheus loop")
    ap.add_argument("--micro", type=int, default=20000, help="steps of the per-step microbenchmark (0: none)")
    ap.add_argument("--repeat", type=int, default=7, help="rounds of the microbenchmark")
    ap.add_argument("--only", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}; '' none")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    only = [f for f in a.only.split(",") if f]
    if bad := [f for f in only if f not in FORMS]:
        ap.error(f"--only {','.join(bad)}: allowed {', '.join(FORMS)}")
    if a.steps < a.skip + 2 or a.session_steps < a.skip + 2:
        ap.error(f"--steps {a.steps} / --session-steps {a.session_steps}: allowed at least --skip + 2 ({a.skip + 2})")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    # one intra-op thread: on a shared 2-core machine torch's second thread spins against other tenants and a
    # step's time swings by 10x or more with their load; the integrations' cost does not depend on it
    torch.set_num_threads(a.threads)
    results = []
    for name in only:
        run, form = FORMS[name]
        k = Knobs(a.session_steps if name == "session-prometheus" else a.steps, a.step_ms / 1e3, a.skip)
        with contextlib.redirect_stdout(sys.stderr):  # the HF Trainer prints its metrics: stdout is the result
            results.append({**paired(run, form, a.pairs, k), "form": name})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # each as it is done: a long run keeps its parts
    micro: dict[str, Any] = {}
    if a.micro:
        with contextlib.redirect_stdout(sys.stderr):
            micro = micro_us(a.micro, a.repeat)
    scrapes = {"n": len(SCRAPES_MS), "median_ms": statistics.median(SCRAPES_MS)} if SCRAPES_MS else {}
    if a.json:
        print(json.dumps({"paired": results, "micro": micro, "scrape": scrapes}, indent=2))
        return
    for r in results:
        lo, hi = r["range"]
        print(
            f"{r['form']:19s} throughput with/without: median {r['median_ratio']:.4f} (pairs {lo:.4f}-{hi:.4f}), "
            f"per step {r['median_overhead_us']:+.1f} us at {r['step_ms_without'][0]:.2f} ms, "
            f"fixed {r['median_fixed_s']:.3f} s ({len(r['ratios'])} pairs, {r['steps']} steps)"
        )
    if micro:
        print(
            f"per step ({micro['actions_per_step']} actions, min of {micro['repeat']} x {micro['steps']}): "
            f"PassThroughProfiler {micro['passthrough_us']:.1f} us, StallscopeProfiler "
            f"{micro['stallscope_profiler_us']:.1f} us, standalone Session wrap + 2 phases "
            f"{micro['standalone_session_us']:.1f} us (mapping beyond the Session: "
            f"{micro['mapping_over_standalone_us']:+.1f} us); Lightning looking up the stallscope callback's "
            f"{micro['callback_hooks_per_step']} step hooks, calling {micro['callback_hooks_called']}: "
            f"{micro['callback_hooks_us']:.1f} us"
        )
    if scrapes:
        ms, n = scrapes["median_ms"], scrapes["n"]
        print(f"scrape round trip (1 Hz, another process): median {ms:.2f} ms over {n} scrapes")


if __name__ == "__main__":
    main()
