"""What profiling costs a training loop on a GPU (issues #44 and #55, where a GPU is lent): the H100 finding's loops.

The loops of the first GPU run (docs/benchmarks.md, "The first run on a GPU"): in-memory tensors through a
DataLoader with 0 workers, pinned, a ``non_blocking`` copy, SGD:

- ``cnn``: a small CNN at batch 256 (4.5 ms a step on an H100);
- ``resnet50``: torchvision's ResNet-50 at batch 64 (41 ms a step on an H100).

Each round runs, in rotating order: bare; ``thread``, a Session sampling in threads of the training process;
``process``, the default Session (the sampler process, kernel windows ``auto`` for a loop of unknown length: a
window 5 steps in, its steps held apart); and ``known``, the same with ``Session(steps=N)`` (its window after the N
measured steps: the loop runs its steps more, after the timed ones); and ``off``, the sampler process with kernel
windows off (issue #55 item 3: the sampler process alone, target >= 0.99). Two figures a configuration, medians over
rounds: ``ratio``, its samples/s over the N timed steps (the loop's own clock, synchronized at both ends) over the
bare run's of the same round: what the user's loop pays; and ``reported``, the throughput stallscope reports for the
run over the bare run's: whether the figures carry stallscope's own cost (issue #55: within 1%). Targets: ratio >=
0.99 at 2,000 steps for the sampler process; reported within 1% at any length. Without CUDA it runs on the CPU (to
check the script; the figures are not the GPU's).

Run: ``python3 benchmarks/gpu_overhead.py [--loops cnn,resnet50] [--rounds 7] [--steps 30,200,2000] [--json]`` (on the
GPU machine from the checkout: ``PYTHONPATH=. python3 benchmarks/gpu_overhead.py``).
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

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler import Session

CONFIGS = ("bare", "thread", "process", "known", "off")
# the training thread's budget for one phase (enter + exit, its device marks and their later reading) on CUDA: the
# host side's 20 us (benchmarks/overhead.py) less what a GPU loop's step of milliseconds can spare at 1% for 3 phases
PHASE_BUDGET_US = 20.0


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )  # fmt: skip


def _resnet50() -> nn.Module:
    from torchvision.models import resnet50

    return resnet50(num_classes=10)


LOOPS: dict[str, tuple[Callable[[], nn.Module], int, tuple[int, ...]]] = {
    "cnn": (_cnn, 256, (3, 32, 32)),
    "resnet50": (_resnet50, 64, (3, 224, 224)),
}


def train(loop: str, steps: int, session: Session | None, device: torch.device, warmup: int = 20) -> float:
    """Samples/s over ``steps`` steps after ``warmup`` (synchronized at both ends of the timed window)."""
    make, batch, shape = LOOPS[loop]
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    n = batch * 8
    data = torch.utils.data.TensorDataset(torch.randn(n, *shape), torch.randint(0, 10, (n,)))
    pin = device.type == "cuda"
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, pin_memory=pin)
    done, t0, t1 = 0, 0.0, 0.0
    total = steps + warmup + (session.tail_steps if session is not None else 0)  # the known length's window after
    while done < total:
        for xb, yb in session.wrap(loader) if session is not None else loader:
            if done == warmup:
                if pin:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            if session is not None:
                with session.phase("h2d"):
                    x, y = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                with session.phase("compute"):
                    loss = loss_fn(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            else:
                x, y = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            done += 1
            if done == steps + warmup:
                if pin:
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
            if done >= total:
                break
    return steps * batch / (t1 - t0)


def measure(loop: str, rounds: int, steps: int, device: torch.device) -> dict[str, object]:
    ratios: dict[str, list[float]] = {name: [] for name in CONFIGS[1:]}
    reported: dict[str, list[float]] = {name: [] for name in CONFIGS[1:]}
    bare_ms: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            got: dict[str, float] = {}
            said: dict[str, float] = {}
            for name in CONFIGS[i % len(CONFIGS) :] + CONFIGS[: i % len(CONFIGS)]:
                if name == "bare":
                    got[name] = train(loop, steps, None, device)
                    continue
                sampling = "thread" if name == "thread" else "process"
                out = Path(tmp) / f"{loop}-{steps}-{name}{i}"
                known = steps if name == "known" else None
                windows = "off" if name == "off" else "auto"
                with Session(
                    out, sample_hz=10.0, device=str(device), sampling=sampling, warmup=20, steps=known,
                    kernel_windows=windows,
                ) as s:  # fmt: skip
                    got[name] = train(loop, steps, s, device)
                summary = s.summary()
                said[name] = summary.throughput_samples_per_s if summary is not None else float("nan")
            for key, values in ratios.items():
                values.append(got[key] / got["bare"])
                reported[key].append(said[key] / got["bare"])
            bare_ms.append(LOOPS[loop][1] / got["bare"] * 1e3)
            print(f"  {loop} {steps} steps, round {i + 1}: bare {bare_ms[-1]:.2f} ms/step | " + " | ".join(
                f"{k} {ratios[k][-1]:.4f} (reported {reported[k][-1]:.4f})" for k in ratios), flush=True)  # fmt: skip
    return {
        "loop": loop,
        "steps": steps,
        "rounds": rounds,
        "bare_step_ms_median": statistics.median(bare_ms),
        **{f"{k}_ratios": v for k, v in ratios.items()},
        **{f"median_{k}_ratio": statistics.median(v) for k, v in ratios.items()},
        **{f"median_{k}_reported": statistics.median(v) for k, v in reported.items()},
    }


def phase_cost(device: torch.device, n: int = 5000, repeats: int = 5) -> dict[str, float]:
    """The training thread's microseconds a step (``Session.wrap``) and a phase (enter + exit: on CUDA its device
    marks, events recorded on the stream, and their reading at the hand-overs), medians of ``repeats``: the same
    loop of one tiny kernel a phase bare, wrapped, and wrapped with two phases (h2d, compute), back to back."""
    x = torch.ones(16, device=device)
    per_step, per_phase = [], []

    def timed(loop: Callable[[], None]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        loop()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    tmp = tempfile.TemporaryDirectory()
    with tmp, Session(Path(tmp.name) / "phase", sources=[], device=str(device), kernel_windows="off") as s:
        items = [None] * n

        def bare() -> None:
            for _ in items:
                x.add_(1)
                x.add_(1)

        def wrapped() -> None:
            for _ in s.wrap(items, samples=1):
                x.add_(1)
                x.add_(1)

        def phased() -> None:
            for _ in s.wrap(items, samples=1):
                with s.phase("h2d"):
                    x.add_(1)
                with s.phase("compute"):
                    x.add_(1)

        for _ in range(repeats + 1):  # the first round warms the event pool and the caches: not counted
            b, w, p = timed(bare), timed(wrapped), timed(phased)
            per_step.append((w - b) / n * 1e6)
            per_phase.append((p - w) / n / 2 * 1e6)
    per_step, per_phase = per_step[1:], per_phase[1:]
    return {
        "step_us_median": statistics.median(per_step),
        "phase_us_median": statistics.median(per_phase),
        "phase_us_max": max(per_phase),
        "phase_budget_us": PHASE_BUDGET_US,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--loops", default="cnn,resnet50", help=f"comma-separated, of {', '.join(LOOPS)}")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", default="30,200,2000", help="measured steps a run, comma-separated lengths")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loops = args.loops.split(",")
    bad = [x for x in loops if x not in LOOPS]
    lengths = [int(x) for x in args.steps.split(",") if x.strip().isdigit()]
    if bad or args.rounds < 1 or not lengths or min(lengths) < 1:
        what = f"--loops {','.join(bad)}" if bad else f"--rounds {args.rounds} --steps {args.steps}"
        print(f"gpu_overhead: {what}: allowed loops {', '.join(LOOPS)}, rounds >= 1, steps N[,N...]", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (no CUDA here: not the GPU's figures)"
    print(f"device: {name}; torch {torch.__version__}", flush=True)
    cost = phase_cost(device)
    print(
        f"hot path on {device.type}: {cost['step_us_median']:.2f} us a step (Session.wrap), "
        f"{cost['phase_us_median']:.2f} us a phase (max {cost['phase_us_max']:.2f}; budget {PHASE_BUDGET_US:.0f} us)",
        flush=True,
    )
    out = []
    for loop in loops:
        for steps in lengths:
            got = measure(loop, args.rounds, steps, device)
            out.append(got)
            print(f"{loop} {steps} steps (bare {got['bare_step_ms_median']:.2f} ms/step): " + "; ".join(
                f"{k} {got[f'median_{k}_ratio']:.4f}, reported {got[f'median_{k}_reported']:.4f}"
                for k in CONFIGS[1:]), flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"device": name, "hot_path": cost, "loops": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
