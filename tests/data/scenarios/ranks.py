"""Known-cost scenario for multi-rank jobs: a straggler, and a rank that dies, injected through the environment.

Each item costs BASE_MS of sleep; on rank STALLSCOPE_TEST_STRAGGLER (default none) it costs EXTRA_MS more
(STALLSCOPE_TEST_EXTRA_MS, default 5). The model's forward sleeps FORWARD_MS, so compute is known and does
not depend on what else the CPU runs; its one Linear layer gives DDP gradients to all-reduce. Sleeps are the
costs, so two ranks on two cores do not slow each other down.

Ground truth: when STALLSCOPE_TEST_TRUTH names a directory, every rank writes there, after every 8th item, what
its loading really took so far (perf_counter around each item's whole work, and around the straggler's extra
sleep), the items, and each item's time in load order: truth-rank{R}.json (not at exit: a rank forked by the
launcher's fork server ends with os._exit, and atexit handlers do not run). The injected excess per step is the
difference of the ranks' loading time over a step's items: it includes what a busy host adds to the slower rank's
sleeps, which the extra sleep's own timing alone does not.
STALLSCOPE_TEST_KILL_RANK / STALLSCOPE_TEST_KILL_AT: that rank SIGKILLs itself when it loads item number
KILL_AT (counting its own loads), as the OOM killer would.
"""

import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

from scenarios import Scenario

BASE_MS = 1.0
FORWARD_MS = 30.0


def _env_int(name):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


class Items(torch.utils.data.Dataset):
    def __init__(self):
        self.rank = _env_int("RANK")
        straggler = _env_int("STALLSCOPE_TEST_STRAGGLER")
        # outside a job RANK is unset: None == None must not make a lone run the straggler
        on_straggler = straggler is not None and straggler == self.rank
        self.extra_s = float(os.environ.get("STALLSCOPE_TEST_EXTRA_MS", "5")) / 1e3 if on_straggler else 0.0
        self.kill_at = (
            _env_int("STALLSCOPE_TEST_KILL_AT") if _env_int("STALLSCOPE_TEST_KILL_RANK") == self.rank else None
        )
        self.loads = 0
        self.slept = 0.0
        truth = os.environ.get("STALLSCOPE_TEST_TRUTH")
        self.truth = Path(truth) if truth and self.rank is not None else None
        self.load_s = 0.0
        self.each = []  # each item's loading time, in the order this rank loaded them

    def _write_truth(self):
        self.truth.mkdir(parents=True, exist_ok=True)
        facts = json.dumps({"extra_s": self.slept, "load_s": self.load_s, "items": self.loads, "each_s": self.each})
        (self.truth / f"truth-rank{self.rank}.json").write_text(facts)

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        start = time.perf_counter()
        self.loads += 1
        if self.kill_at is not None and self.loads >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(BASE_MS / 1e3)
        if self.extra_s:
            t0 = time.perf_counter()
            time.sleep(self.extra_s)
            self.slept += time.perf_counter() - t0
        item = torch.full((4,), float(i % 7)), i % 3
        self.each.append(time.perf_counter() - start)
        self.load_s += self.each[-1]
        if self.truth is not None and self.loads % 8 == 0:
            self._write_truth()
        return item


class Timed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(FORWARD_MS / 1e3)
        return self.lin(x)


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="ranks",
    dataset=Items,
    model=Timed,
    loss=squared_error,
    batch_size=8,
    steps=20,
    warmup=3,
    description="sleep-timed items and model; a straggler rank or a dying rank injected through the environment",
)
