"""Known-cost scenario for the loader's stages: each item's fetch, decode and augment sleep for known times,
timed through pipelines.stages as the built-in data sets time theirs, and the model sleeps MODEL_S a step, so that
the loader (2 workers) cannot keep up and the slowest stage is the one the case names.

STAGE_CASE=fetch: fetch 10 ms, decode 1 ms, augment 1 ms; STAGE_CASE=augment: fetch 1 ms, decode 1 ms, augment
8 ms; STAGE_CASE=cpu-augment: as augment, but the augment spins on the CPU for 8 ms of its thread's CPU time (a
transform that computes, where the other stages sleep as I/O waits); STAGE_CASE=network: the fetch receives the
item's bytes over a real socket from the local server at port STAGE_PORT (tests/conftest.py slow_server: 10 ms an
item), decode 1 ms, augment 1 ms. With STAGE_TRUTH set, each
item appends "stage seconds" lines, timed around the same work, to that file, then a line "item PID ENTER EXIT
IN_STAGES": its loader process, the perf_counter readings at the start and end of ``__getitem__`` (the clock the
run's steps are timed on) and the seconds of those inside its stages.
"""

import os
import socket
import time

import torch
from torch import nn

from pipelines import stages
from scenarios import Scenario

COSTS = {
    "fetch": {"fetch": 0.010, "decode": 0.001, "augment": 0.001},
    "augment": {"fetch": 0.001, "decode": 0.001, "augment": 0.008},
    "cpu-augment": {"fetch": 0.001, "decode": 0.001, "augment": 0.008},
    "network": {"fetch": 0.010, "decode": 0.001, "augment": 0.001},
}[os.environ.get("STAGE_CASE", "fetch")]
SPIN = {"augment"} if os.environ.get("STAGE_CASE") == "cpu-augment" else set()
PORT = int(os.environ.get("STAGE_PORT") or 0) if os.environ.get("STAGE_CASE") == "network" else 0
TRUTH = os.environ.get("STAGE_TRUTH")
MODEL_S = 0.004


def spin(cpu_s):
    """Busy CPU work until this thread has used ``cpu_s`` seconds of CPU time."""
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        enter = time.perf_counter()
        spent = []
        in_stages = 0.0
        for stage, seconds in COSTS.items():
            t0 = time.perf_counter()
            with stages.timed(stage):
                if stage == "fetch" and PORT:
                    with socket.create_connection(("127.0.0.1", PORT)) as conn:
                        while conn.recv(65536):
                            pass
                elif stage in SPIN:
                    spin(seconds)
                else:
                    time.sleep(seconds)
            took = time.perf_counter() - t0
            in_stages += took
            spent.append(f"{stage} {took}\n")
        if TRUTH:
            spent.append(f"item {os.getpid()} {enter} {time.perf_counter()} {in_stages}\n")
            with open(TRUTH, "a") as f:
                f.write("".join(spent))
        return torch.full((4,), float(i % 5)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(MODEL_S)
        return self.lin(x)


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="stage-costs",
    dataset=Items,
    model=Model,
    loss=squared_error,
    batch_size=4,
    steps=40,
    warmup=4,
    description="fetch / decode / augment sleeps of known length per item, a 4 ms model: loader-bound",
)
