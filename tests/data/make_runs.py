"""Regenerate the recorded run stores in tests/data/runs/ (run by hand; the stores are checked in).

    .venv/bin/python tests/data/make_runs.py

- ``cpu-workers``: a CPU run through a DataLoader with 2 workers of known per-item cost (5 ms) and a 20 ms
  compute phase; real host sampling, real NVML (unavailable on the machine that recorded it).
- ``nvml-fake``: the same loop, workers=0, with the NVML source on the synthetic H100 script
  (tests/data/nvml_script_h100.json), so GPU utilisation, memory and PCIe series exist.
- ``interrupted``: a run SIGKILLed mid-way: its status is still "running" and its pid is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE.parent)]

import torch  # noqa: E402

from profiler import Session  # noqa: E402
from profiler.core.sources.host import HostSource  # noqa: E402
from profiler.core.sources.nvml import NvmlSource  # noqa: E402


class Slow(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        time.sleep(0.005)
        return torch.zeros(4), i % 3


def loop(s: Session, loader, seconds: float) -> None:
    end = time.perf_counter() + seconds
    for x, _y in s.wrap(loader):
        with s.phase("h2d"):
            x.to("cpu")
        with s.phase("compute"):
            time.sleep(0.020)
        if time.perf_counter() > end:
            break


def fresh(name: str) -> Path:
    d = HERE / "runs" / name
    shutil.rmtree(d, ignore_errors=True)
    return d


def main() -> None:
    dl = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=2)
    with Session(
        fresh("cpu-workers"), warmup=3, meta={"scenario": "recorded-cpu", "pipeline": "naive", "batch_size": 8}
    ) as s:
        loop(s, dl, 4.0)

    from fake_nvml import make_fake_nvml

    script = json.loads((HERE / "nvml_script_h100.json").read_text())
    sources = [HostSource(), NvmlSource(module=make_fake_nvml(script))]
    dl0 = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=0)
    with Session(
        fresh("nvml-fake"),
        warmup=3,
        sources=sources,
        meta={"scenario": "recorded-nvml", "pipeline": "naive", "batch_size": 8},
    ) as s:
        loop(s, dl0, 4.0)

    d = fresh("interrupted")
    child = (
        "import sys, time\n"
        "from profiler import Session\n"
        "with Session(sys.argv[1], warmup=2, meta={'scenario': 'recorded-killed', 'batch_size': 4}) as s:\n"
        "    for _ in s.wrap(iter(lambda: [0] * 4, None)):\n"
        "        with s.phase('compute'):\n"
        "            time.sleep(0.01)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(d)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    time.sleep(4.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for name in ("cpu-workers", "nvml-fake", "interrupted"):
        for extra in ("run.sqlite-wal", "run.sqlite-shm"):
            p = HERE / "runs" / name / extra
            if p.exists() and name != "interrupted":
                p.unlink()
        print(name, sorted(f.name for f in (HERE / "runs" / name).iterdir()))


if __name__ == "__main__":
    main()
