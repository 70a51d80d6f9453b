"""Shared test helpers: loaders of known cost, polling instead of fixed sleeps, GPU skip marker."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# One intra-op thread in every process the suite starts, unless the caller sets another count: three tests at a time
# share two cores, and torch's default of two OpenMP threads a process spins at each barrier for a core that another
# test holds. Side by side, three at a time: test_every_pipeline and test_detection 112 -> 62 CPU-seconds, the docs
# tier 662 -> 562 (docs/testing.md). Set before torch is imported here, and before the warm servers start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode written: this machine sets PYTHONDONTWRITEBYTECODE=1, and the virtual environment is not byte-compiled at
# install (Makefile), so without a .pyc every interpreter the suite starts (each command, rank, trial and zero-code
# script) compiled torch in memory again: 8 CPU-seconds for torch and torchvision against none. Taken out here, the
# first process that imports a module writes its .pyc, for this run and the next (docs/testing.md).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import scheduling
import warm

sys.dont_write_bytecode = False

ROOT = Path(__file__).resolve().parents[1]


def runq_s() -> float | None:
    """The calling thread's run-queue wait so far (s), from /proc/thread-self/schedstat; None where there is none."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class Truth:
    """The injected ground truth as it really ran: each sleep's own elapsed time, by label.

    ``time.sleep(0.015)`` on a loaded machine returns after 15-20 ms; a test that compares a measured
    figure with the requested 15 ms flakes there, and one with a tolerance wide enough for the worst case
    checks little. A test compares with what each injected sleep actually took instead, timed by this
    clock independently of stallscope's, so its tolerance only has to cover bookkeeping (microseconds).
    """

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}
        # the thread's run-queue wait inside each span (s; None without schedstat), read just inside its clock reads
        self.runq: dict[str, list[float | None]] = {}

    def sleep(self, label: str, seconds: float) -> None:
        t0 = time.perf_counter()
        q0 = runq_s()
        if seconds:
            time.sleep(seconds)
        q1 = runq_s()
        self.add(label, time.perf_counter() - t0, None if q0 is None or q1 is None else q1 - q0)

    def add(self, label: str, seconds: float, runq: float | None = None) -> None:
        """One more span of ``label``, timed by the caller on this clock (``time.perf_counter``)."""
        self.spent.setdefault(label, []).append(seconds)
        self.runq.setdefault(label, []).append(runq)

    def outside_ms(self, label: str, measured_runq: list[float | None], skip: int = 0) -> float:
        """Mean ms a span of ``label`` the measurement timed (its run-queue waits ``measured_runq``, one per span
        from the first) waited for a CPU outside the truth's own window: the measured span holds the truth's and
        a few lines around it, where a preemption on a busy host is the measurement's time, not the sleep's."""
        pairs = list(zip(measured_runq, self.runq.get(label, []), strict=False))[skip:]
        extra = [max(0.0, m - t) for m, t in pairs if m is not None and t is not None]
        return 1e3 * sum(extra) / len(pairs) if pairs else 0.0

    def mean_ms(self, label: str, skip: int = 0) -> float:
        """Mean elapsed ms of ``label``'s sleeps after the first ``skip`` (the warm-up steps); 0 if none ran."""
        xs = self.spent.get(label, [])[skip:]
        return 1e3 * sum(xs) / len(xs) if xs else 0.0


class _SleepLoader:
    """``n`` batches, each ``next()`` blocking ``wait_s``; the whole ``next()`` is timed into ``truth``.

    Timing the whole call, not only the sleep, puts in the truth whatever else happens inside the loader's
    ``next()`` (the host preempting it, the iterator's own bookkeeping): that is data wait by definition, and a
    truth that left it out read 0.004% against a measured 1.03% on a busy CI host.
    """

    def __init__(self, n: int, wait_s: float, batch: int, truth: Truth) -> None:
        self.left, self.wait_s, self.batch, self.truth = n, wait_s, batch, truth

    def __iter__(self) -> _SleepLoader:
        return self

    def __next__(self) -> list[int]:
        t0 = time.perf_counter()
        q0 = runq_s()
        if self.left <= 0:
            raise StopIteration
        self.left -= 1
        if self.wait_s:
            time.sleep(self.wait_s)
        out = [0] * self.batch
        q1 = runq_s()
        self.truth.add("data_wait", time.perf_counter() - t0, None if q0 is None or q1 is None else q1 - q0)
        return out


def sleep_loader(n: int, wait_s: float, batch: int = 8, truth: Truth | None = None) -> Iterator[list[int]]:
    """A loader whose every next() blocks ``wait_s``: the injected data wait (each whole next() timed into
    ``truth``)."""
    return _SleepLoader(n, wait_s, batch, truth if truth is not None else Truth())


def near(measured_ms: float, truth_ms: float, rel: float = 0.03, abs_ms: float = 0.3) -> bool:
    """A measured figure agrees with its timed truth: within ``rel`` of it, or ``abs_ms`` for tiny ones."""
    return abs(measured_ms - truth_ms) <= max(rel * truth_ms, abs_ms)


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def stallscope(
    *args: str, timeout: float = 300, cwd: Path | None = None, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, capturing both streams: ``python -m profiler ARGS`` forked from a warm
    interpreter that has torch imported already (tests/warm.py; ``STALLSCOPE_TEST_COLD=1``: a fresh one).
    ``fresh``: in a fresh interpreter whatever the setting, for a truth whose threads run slower in a forked child."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        warm.fresh_argv(args) if fresh else warm.argv(args),
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )


TINY_SCENARIO = """
import atexit
import time
import torch
from torch import nn
from scenarios import Scenario

TRUTH = {truth!r}  # where each item's start and end go (one line per item, in order), when set
SPENT = []
if TRUTH:
    atexit.register(lambda: open(TRUTH, "w").write("".join(f"{{a}} {{b}}\\n" for a, b in SPENT)))

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        t0 = time.perf_counter()
        time.sleep({item_sleep})
        out = torch.full((4,), float(i % 7)), i % 3
        SPENT.append((t0, time.perf_counter()))
        return out

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        if {fail_at} and self.calls >= {fail_at}:
            raise RuntimeError("injected failure in forward")
        time.sleep({forward_sleep})
        return self.lin(x)

scenario = Scenario(name="tiny", dataset=Items, model=Model, loss=nn.functional.cross_entropy,
                    batch_size=8, steps={steps}, warmup=2, description="test scenario of known cost")
"""


@pytest.fixture
def tiny_scenario(tmp_path: Path) -> Callable[..., Path]:
    """Write a user scenario file with known per-item and per-forward cost; returns its path. With ``truth=PATH``
    the scenario writes each item's start and end (``time.perf_counter()``) there, one line per item in the order
    fetched."""

    def make(
        item_sleep: float = 0.0, forward_sleep: float = 0.0, fail_at: int = 0, steps: int = 10, truth: str = ""
    ) -> Path:
        p = tmp_path / f"tiny_{item_sleep}_{forward_sleep}_{fail_at}_{steps}.py"
        text = TINY_SCENARIO.format(
            item_sleep=item_sleep, forward_sleep=forward_sleep, fail_at=fail_at, steps=steps, truth=truth
        )
        p.write_text(text)
        return p

    return make


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a torch that cannot even ask for CUDA means: no GPU tests
        return False


# The timing tier (docs/testing.md): files whose checks compare figures measured on a real clock with a truth
# timed in the same run (injected sleeps, a script's own timing) or with a prediction checked by running it.
TIMING_FILES = {
    "test_contention.py",
    "test_device_timing.py",
    "test_instrument.py",
    "test_instrument_device.py",
    "test_integration_budget.py",
    "test_joblive.py",
    "test_kernel_windows.py",
    "test_launch.py",
    "test_headspace.py",
    "test_live.py",
    "test_loader_time_truth.py",
    "test_memory_truth.py",
    "test_pipelines_prefetch.py",
    "test_prometheus.py",
    "test_sampler.py",
    "test_session_ground_truth.py",
    "test_shm_truth.py",
    "test_stages_truth.py",
    "test_sim_device.py",
    "test_sweep.py",
    "test_sweep_nproc.py",
    "test_sync_breakdown.py",
    "test_tune.py",
    "test_tune_command.py",
    "test_tune_pipelines.py",
    "test_tune_workers.py",
    "test_whatif.py",
    "test_whatif_storage.py",
    "test_zerocode.py",
    "test_zerocode_ranks.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    timing = pytest.mark.timing
    for item in items:
        if item.path.name in TIMING_FILES:
            item.add_marker(timing)
    items[:] = scheduling.run_order(items)
    scheduling.write_kinds(config, items)
    gpu = [item for item in items if "gpu" in item.keywords]
    if not gpu or _has_cuda():  # asked only where it matters: the question imports torch (seconds of CPU)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu:
        item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    scheduling.name_the_run(config)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The work units and the order they are handed out in: tests/scheduling.py."""
    return scheduling.make_scheduler(config, log) if config.getvalue("dist") == "loadgroup" else None


# STALLSCOPE_TEST_CPU=DIR: each test's CPU seconds, written to DIR/<worker>.jsonl (benchmarks/test_times.py --cpu DIR
# sums them per file). A test's CPU is what this pytest process and its warm server (tests/warm.py) and every process
# under either used while it ran, the children they reaped included: on the 2-core machine the suite is CPU-bound
# (both cores busy most of a run), so its wall clock follows its CPU, and this says where that goes.
def _warm_server() -> Any:
    """This pytest process's warm server (tests/warm.py), or None: of the processes whose command line names its
    socket (the server and the commands it forked), the one whose parent does not."""
    import psutil

    path = warm.server_socket()
    if not path:
        return None
    named = {p.pid: p for p in psutil.process_iter(["cmdline"]) if path in (p.info["cmdline"] or [])}
    return next((p for p in named.values() if p.ppid() not in named), None)


def tree_cpu_seconds() -> float:
    import psutil

    roots = [psutil.Process()]
    server = _warm_server()
    if server is not None:
        roots.append(server)
    total = 0.0
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get("STALLSCOPE_TEST_CPU")
    if not out:
        yield
        return
    t0, c0 = time.monotonic(), tree_cpu_seconds()
    yield
    cpu, wall = tree_cpu_seconds() - c0, time.monotonic() - t0
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / f"{worker}.jsonl", "a", encoding="utf-8") as fh:
        row = {"test": item.nodeid, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "end": round(time.time(), 2)}
        row["light"] = item.get_closest_marker("light") is not None
        fh.write(json.dumps(row) + "\n")


# @pytest.mark.alone and @pytest.mark.light (tests/scheduling.py). An alone test's truth is which configuration is
# best on this host's cores (the tune of computing items against a grid). Beside the suite's other tests the best
# turned on their load from minute to minute: a CI run's grid put 2 computing workers first, its tune a minute later
# read them the slowest beside 0 (40-45 against 53-66 samples/s, the training thread waiting for a CPU half its
# compute), and the check's rounds right after read them x1.4 ahead again. The hook's name starts with pytest_:
# pytest registers no other name from a conftest, and under another name it did nothing for two CI runs (a tune's
# neighbours used 0.97 of a core; tests/test_alone.py checks it now).
@pytest.hookimpl(hookwrapper=True, specname="pytest_runtest_protocol")
def pytest_runtest_protocol_cores(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with scheduling.cores(item):
        yield


@contextlib.contextmanager
def slow_server(item_s: float, chunks: int, chunk_bytes: int = 8192) -> Iterator[int]:
    """A local server that sends each connection ``chunks`` pieces of ``chunk_bytes``, ``item_s / chunks`` apart,
    then closes it: an item fetched over a real socket at a known pace. Yields its port."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            for _ in range(chunks):
                time.sleep(item_s / chunks)
                conn.sendall(b"x" * chunk_bytes)

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        server.join()
        srv.close()


@pytest.fixture
def no_children() -> None:
    """A Session labels every child process of the training process as a loader worker: a test that counts its
    workers needs a process with none left by an earlier test on the same pytest worker (a DataLoader iterator
    not yet collected, persistent workers). Waits up to 10 s for them to end."""
    import gc

    import psutil

    gc.collect()  # a DataLoader iterator's __del__ shuts its workers down
    me = psutil.Process()
    alive = lambda: [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]  # noqa: E731
    wait_until(lambda: not alive(), timeout=10.0)
    left = alive()
    assert not left, f"child processes left by an earlier test: {[(p.pid, p.name()) for p in left]}"
