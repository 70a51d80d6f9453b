"""Loader memory against the test's own reading of the workers' smaps: a data set held as a Python list of
objects (each item read touches the reference counts of its objects, so the workers copy those pages from
the parent) against the same data in a numpy array (read without writing a page).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from profiler import Session
from profiler.analysis import summarize
from profiler.analysis.memory import MIN_READINGS
from profiler.analysis.timeline import build_timeline
from profiler.core.recorders.in_thread import default_sources
from profiler.core.sources.memory import MemorySource
from profiler.core.sources.pin import PIN_TARGET, PinSource, pin_threads
from profiler.core.store.reader import load_run
from profiler.render.html import render_html

HERE, MODULE = Path(__file__).resolve().parent, Path(__file__).stem
N_ITEMS = 6000
PER_ITEM = 64  # objects each item reads: ~64 x 100 bytes, about 1.6 pages of objects per item
WORKERS = 2
pytestmark = pytest.mark.usefixtures("no_children")


class Objects(torch.utils.data.Dataset):
    def __init__(self, kind: str) -> None:
        strings = [f"item-{i:08d}-" + "x" * 48 for i in range(N_ITEMS * PER_ITEM)]
        self.kind = kind
        self.data: list[str] | np.ndarray = strings if kind == "list" else np.array(strings)

    def __len__(self) -> int:
        return N_ITEMS

    def __getitem__(self, i: int) -> torch.Tensor:
        part = self.data[i * PER_ITEM : (i + 1) * PER_ITEM]
        n = sum(len(s) for s in part) if self.kind == "list" else int(part.nbytes)
        time.sleep(0.001)  # 750 steps in ~3 s quiet: a reading every 0.25 s (below) still takes ~12 in the window
        return torch.tensor([n])


def _uss(pids: list[int]) -> list[float]:
    return [psutil.Process(p).memory_full_info().uss / 2**20 for p in pids]


def run_case(kind: str, out: str) -> None:
    """The loader under a Session, with the test's own readings of each worker's smaps at the window's start and
    end (written to ``out``/truth.json): run by the test in a fresh interpreter (below)."""
    data = Objects(kind)
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=WORKERS, persistent_workers=True)
    warmup = 5
    sources = default_sources()
    for src in sources:  # a reading every 0.25 s (default: as often as 0.5% of a core allows, ~5 s here)
        if isinstance(src, MemorySource):
            src.every_s, src.budget = 0.25, 1.0
    with Session(out, warmup=warmup, meta={"workers": WORKERS}, sources=sources) as s:
        it = s.wrap(loader)
        for i, _batch in enumerate(it):
            if i == warmup:  # the test's own reading at the window's start: each worker's smaps
                pids = [w.pid for w in loader._iterator._workers]
                t0, uss0 = time.perf_counter(), _uss(pids)
        t1, uss1 = time.perf_counter(), _uss(pids)
    loader._iterator._shutdown_workers()
    (Path(out) / "truth.json").write_text(json.dumps({"uss0": uss0, "uss1": uss1, "seconds": t1 - t0}))


# The loader runs in a fresh interpreter, as a training script's does. Forked from a pytest worker that had collected
# the whole suite, the numpy workers' private memory grew 6-8 MB over the window, steadily and slowing (a stress pass:
# 8.2 MB, named growing), where from a fresh interpreter it grows under 1 MB. Not the garbage collector (gc.freeze()
# before the fork changed nothing), nor a parent holding 1.5M objects in a freed-through heap (no growth): private
# memory from the test runner's process (which pages, not established), not the data set's copy-on-read this test
# is about (docs/metrics.md).
@pytest.mark.parametrize("kind", ["list", "numpy"])
def test_copy_on_read_is_named_only_for_python_objects_and_its_growth_matches_smaps(tmp_path: Path, kind: str) -> None:
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import {MODULE} as t; t.run_case(*sys.argv[1:])"
    res = subprocess.run(
        [sys.executable, "-c", code, kind, str(tmp_path)], check=False, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    truth_doc = json.loads((tmp_path / "truth.json").read_text())
    uss0, uss1 = truth_doc["uss0"], truth_doc["uss1"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    mem = summary["memory"]
    rows = {p["label"]: p for p in mem["processes"]}
    assert set(rows) == {"main", "w0", "w1"}, rows
    assert mem["total_pss_peak_mb"] > 0 and mem["shm_size_mb"] > 0
    codes = [r["code"] for r in summary["recommendations"]]
    if kind == "numpy":
        assert mem["growing"] == [] and "WORKER_MEMORY_GROWTH" not in codes, mem
        return
    assert sorted(mem["growing"]) == ["w0", "w1"] and "WORKER_MEMORY_GROWTH" in codes, mem
    rec = load_run(tmp_path)
    html = render_html(summarize(rec), build_timeline(rec))
    assert 'id="memory"' in html and "copy-on-read" in html
    # the truth: growth of each worker's USS between the test's two readings, per 1,000 items it delivered
    items_per_worker = (summary["steps"] * 8) / WORKERS
    truth = [(b - a) / items_per_worker * 1000 for a, b in zip(uss0, uss1, strict=True)]
    for w, true in enumerate(truth):
        got = rows[f"w{w}"]["growth_mb_per_1k_items"]
        assert abs(got - true) <= 0.2 * true, (w, got, true, truth_doc["seconds"])


class Pages(torch.utils.data.Dataset):
    """Items that each read PAGES strings of about a page each (a data set of Python objects: reading one
    writes its reference count, so a forked worker copies that page from the parent)."""

    def __init__(self, n: int) -> None:
        self.strings = [f"{i:08d}" + "x" * 4000 for i in range(n * PAGES)]

    def __len__(self) -> int:
        return len(self.strings) // PAGES

    def __getitem__(self, i: int) -> torch.Tensor:
        part = self.strings[i * PAGES : (i + 1) * PAGES]
        time.sleep(0.004)
        return torch.tensor([sum(len(x) for x in part)])


PAGES = 16  # ~64 KB copied a item: 150 steps of 8 items over 2 workers, ~37 MB a worker


def _workers() -> list[int]:
    """This process's loader workers (forked: its own command line), oldest first; not the sampler process."""
    me = psutil.Process()
    return [c.pid for c in sorted(me.children(), key=lambda c: c.create_time()) if c.cmdline() == me.cmdline()]


def run_short(out: str) -> None:
    """150 steps of a loader without persistent workers, under a Session with its default sources (a memory
    reading as often as 0.5% of a core allows: seconds apart), as a user's short run is: run in a fresh
    interpreter by the test below, with the test's own readings of each worker's smaps at its first and last batch."""
    loader = torch.utils.data.DataLoader(Pages(150 * 8), batch_size=8, num_workers=WORKERS)
    uss: list[list[float]] = []
    t0 = time.perf_counter()
    with Session(out, warmup=5, meta={"workers": WORKERS}) as s:
        for i, _batch in enumerate(s.wrap(loader)):
            if i in (5, 149):  # the window's first step and the last batch: the workers still live
                uss.append(_uss(_workers()))
    (Path(out) / "truth.json").write_text(json.dumps({"uss": uss, "seconds": time.perf_counter() - t0}))


def test_a_short_run_reads_its_workers_while_they_live_and_names_their_copy_on_read(tmp_path: Path) -> None:
    # issue #56: two workers over a list of Python objects ran 150 steps in 2.8 s, and each process had one memory
    # reading (uss_start_mb == uss_end_mb): the workers were gone before the next. The Session now asks for readings
    # through the first epoch while they live (profiler/core/sampling/worker_memory_asks.py)
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import {MODULE} as t; t.run_short(sys.argv[1])"
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], check=False, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    truth = json.loads((tmp_path / "truth.json").read_text())
    summary = json.loads((tmp_path / "summary.json").read_text())
    mem = summary["memory"]
    rows = {p["label"]: p for p in mem["processes"]}
    assert {"w0", "w1"} <= set(rows), rows
    # the truth: each worker's USS at the window's first step and at the last batch, read by the test
    (first, last), seconds = truth["uss"], truth["seconds"]
    for w in range(WORKERS):
        row, grew = rows[f"w{w}"], last[w] - first[w]
        assert grew > 8.0, (w, first, last)  # the test's own premise: each worker copied tens of MB
        assert row["uss_end_mb"] > row["uss_start_mb"], (row, seconds)  # read more than once while it lived
        # five asked, growth needs four: one may merge with a reading under way, or come after the workers ended
        assert row["readings"] >= MIN_READINGS, (row, seconds)
        # what stallscope saw grow, against what the test saw over nearly the same span (its first reading may come
        # a round after the window's first step, its last up to READ_AHEAD_S before the last batch)
        assert 0.5 * grew <= row["uss_end_mb"] - row["uss_start_mb"] <= 1.2 * grew, (row, first, last, seconds)
    codes = [r["code"] for r in summary["recommendations"]]
    assert sorted(mem["growing"]) == ["w0", "w1"] and "WORKER_MEMORY_GROWTH" in codes, (mem, seconds)


class Forever(torch.utils.data.Sampler[int]):
    """The data set's indices in order, with no length: a loader whose epoch's end is not known."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def run_break(out: str, persistent: str = "0") -> None:
    """A Session without ``steps=`` over a loader of unknown length that breaks out after 150 steps, as a user's loop
    does: run in a fresh interpreter by the test below, with the test's own reading of each worker at its last batch.
    ``persistent`` ("1"): the loader keeps its workers (``persistent_workers``), and lives past the Session's close,
    as a loader built once for many epochs does."""
    data = Pages(200 * 8)
    loader = torch.utils.data.DataLoader(
        data, batch_size=8, num_workers=WORKERS, sampler=Forever(len(data)), persistent_workers=persistent == "1"
    )
    with Session(out, warmup=5, meta={"workers": WORKERS}) as s:
        for i, _batch in enumerate(s.wrap(loader)):
            if i == 149:  # the last batch the loop takes: the workers still live; the break then drops them
                last = _uss(_workers())
                break
    (Path(out) / "truth.json").write_text(json.dumps({"last": last}))


# the loop's end drops the loader's iterator, which stops its workers at once (before Session.close): the training
# process reads them there first (profiler.core.sampling.worker_memory_asks.WorkerReads.at_end), whatever the loop's
# length. A loader with persistent workers keeps them past the break: there the break asks the sampler process to
# read them, and the training thread reads nothing (19-32 ms of its CPU at each break: docs/benchmarks.md)
@pytest.mark.parametrize("persistent", ["0", "1"])
def test_a_loop_that_breaks_out_reads_its_workers_before_they_are_stopped(tmp_path: Path, persistent: str) -> None:
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import {MODULE} as t; t.run_break(*sys.argv[1:])"
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), persistent],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    last = json.loads((tmp_path / "truth.json").read_text())["last"]
    rows = {p["label"]: p for p in json.loads((tmp_path / "summary.json").read_text())["memory"]["processes"]}
    for w in range(WORKERS):
        row = rows[f"w{w}"]
        assert row["readings"] >= 2 and row["uss_end_mb"] > row["uss_start_mb"], row
        # the truth: the test's own reading at the last batch; the loop's end reading comes just after, when each
        # worker may have read up to its prefetch (2 batches of 8 items, 16 pages each: 1 MiB) more
        assert last[w] - 0.5 <= row["uss_end_mb"] <= last[w] + 2.0, (w, row, last)


RECORDS = """
import os
import time
import numpy as np
import torch
from torch import nn
from scenarios import Scenario

N, KIND, TRUTH = 400_000, {kind!r}, {truth!r}
SEEN = [0]


def own_uss_mb():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Private_")) / 1024


class Records(torch.utils.data.Dataset):
    def __init__(self):
        if KIND == "dicts":  # each read writes the reference counts of the dict and its values: their pages are copied
            self.rows = [{{"id": i, "x": float(i % 97), "y": i % 10, "name": f"r{{i:07d}}"}} for i in range(N)]
        else:  # the same records in numpy columns: a read writes no page of the parent's
            i = np.arange(N)
            self.id, self.x, self.y = i, (i % 97).astype(np.float32), i % 10
            self.name = np.array([f"r{{k:07d}}" for k in range(N)])

    def __len__(self):
        return N

    def __getitem__(self, i):
        SEEN[0] += 1
        time.sleep(0.0003)  # 150 steps in about 2 s, as issue #65's (read in 0.6 s, the numpy run is under a second)
        if SEEN[0] == 1 or SEEN[0] % 1000 == 0:  # the worker's own USS, the test's truth
            with open(os.path.join(TRUTH, str(os.getpid())), "a") as f:
                f.write(f"{{own_uss_mb()}}\\n")
        if KIND == "dicts":
            r = self.rows[i]
            return torch.tensor([r["x"], float(r["id"] % 7)]), r["y"]
        return torch.tensor([float(self.x[i]), float(self.id[i] % 7)]), int(self.y[i])


scenario = Scenario(name=f"records-{{KIND}}", dataset=Records, model=lambda: nn.Linear(2, 10),
                    loss=nn.functional.cross_entropy, batch_size=64)
"""


# issue #65: two workers over 400,000 dicts ran 150 steps of 64 in 2.2 s, and every process had one memory reading
# (readings 1, uss_start_mb == uss_end_mb, no finding): the asks were placed at a quarter, half and three quarters of
# the epoch (6,250 steps), which the run never reached. The run's length now places them
# (profiler/core/sampling/worker_memory_asks.py)
@pytest.mark.parametrize("kind", ["dicts", "numpy"])
def test_a_150_step_run_names_the_copy_on_read_of_dicts_and_not_of_numpy_records(tmp_path: Path, kind: str) -> None:
    from conftest import stallscope

    truth_dir = tmp_path / "truth"
    truth_dir.mkdir()
    scenario = tmp_path / f"records_{kind}.py"
    scenario.write_text(RECORDS.format(kind=kind, truth=str(truth_dir)))
    res = stallscope("run", str(scenario), "--workers", "2", "--steps", "150", "--no-live", "--json",
                     "--out", str(tmp_path / "run"), fresh=True)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    mem, codes = summary["memory"], [r["code"] for r in summary["recommendations"]]
    rows = {p["label"]: p for p in mem["processes"]}
    # the truth: each worker's own USS at its first item and every 1,000th (the workers of the run: its two)
    own = [[float(x) for x in f.read_text().split()] for f in sorted(truth_dir.iterdir())]
    rec = load_run(tmp_path / "run")
    uss = [(round(t, 3), m, round(v, 1)) for t, _s, m, v in rec.samples if m.endswith(".uss_mb") and v is not None]
    measured = [s for s in rec.steps if not s.warmup]
    why = {"readings": uss, "window": (measured[0].t_start, measured[-1].t_end), "own": own}
    assert len(own) == WORKERS and all(len(o) >= 4 for o in own), own
    grew = [o[-1] - o[0] for o in own]
    for w in ("w0", "w1"):
        row = rows[w]
        # read soon after its first batch and late in the run while it lived: never one reading (start == end)
        assert row["readings"] >= MIN_READINGS and row["uss_end_mb"] != row["uss_start_mb"], (row, why)
    if kind == "numpy":
        assert max(grew) < 8.0, grew  # the premise: no page copied to speak of
        assert mem["growing"] == [] and "WORKER_MEMORY_GROWTH" not in codes, (mem, why)
        return
    assert min(grew) > 16.0, grew  # the premise: each worker copied tens of MiB
    assert sorted(mem["growing"]) == ["w0", "w1"] and "WORKER_MEMORY_GROWTH" in codes, (mem, why)
    assert "copy-on-read" in mem["headline"], mem["headline"]
    for w in ("w0", "w1"):
        seen = rows[w]["uss_end_mb"] - rows[w]["uss_start_mb"]
        # stallscope's readings span the measured window (from step 10 of 160 to the loop's end), most of the workers'
        # own span (their first item to their last 1,000th), whose pid is which label not being known here
        assert 0.5 * min(grew) <= seen <= 1.2 * max(grew), (w, seen, grew, why)


def test_the_pin_threads_cpu_matches_the_threads_own_clock() -> None:
    stop, spent = threading.Event(), []

    def loop() -> None:  # spins 5 ms, sleeps 5 ms, as a pin thread copying batches as they come would
        t0 = time.thread_time()
        while not stop.is_set():
            end = time.perf_counter() + 0.005
            while time.perf_counter() < end:
                pass
            time.sleep(0.005)
        spent.append(time.thread_time() - t0)

    thread = threading.Thread(target=loop, name=f"Thread-99 {PIN_TARGET}", daemon=True)
    src = PinSource(pinned=lambda: math.nan)
    assert src.read() == {}  # no pin thread yet
    thread.start()
    assert pin_threads() == [thread.native_id]
    src.read()  # its first reading: the CPU so far
    t0 = time.monotonic()
    time.sleep(1.0)
    got = src.read()["pin.cpu_pct"]
    stop.set()
    thread.join()
    span = time.monotonic() - t0
    # the truth: the thread's own CPU clock over its life, scaled to the reading's span; the two differ by the CPU it
    # spent between its start and the first reading and after the last (at most one 5 ms spin each: 1% of 1 s)
    truth = 100 * spent[0] / span
    assert got == pytest.approx(truth, abs=2.5), (got, truth)
    assert got > 5  # it did spin: a check that a reading of 0 cannot pass
