"""The stack estimate as read from a whole run record (profiler.analysis.sampled): the training span's ends,
a rank py-spy never sampled itself, and the notes for a py-spy that ran at normal priority or fell behind.

Each record is a hand-made speedscope document with the process and thread frames py-spy writes, so the
expected fractions are counted from the test's own samples.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from profiler.analysis.sampled import rank_stacks, stack_estimates
from profiler.core.store import RunRecord

LAUNCHER = 100
LOADER = "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py"
MODULE = ("<module>", "train.py", 90)
NEXT = [MODULE, ("main", "train.py", 78), ("_BaseDataLoaderIter.__next__", LOADER, 725), ("select", "sel.py", 41)]
FORWARD = [MODULE, ("main", "train.py", 80), ("Module._call_impl", "/torch/nn/modules/module.py", 1794)]
OTHER = [MODULE, ("main", "train.py", 86), ("broadcast", "/torch/distributed/c10d.py", 12)]
DEL = [MODULE, ("_MultiProcessingDataLoaderIter.__del__", LOADER, 1706), ("_shutdown_workers", LOADER, 1656)]
WORKER = [
    MODULE,
    ("_worker_loop", "/torch/utils/data/_utils/worker.py", 335),
    ("Queue.get", "multiprocessing/queues.py", 113),
]


def speedscope(threads: dict[tuple[tuple[int, ...], str], list[list[tuple[str, str, int]]]]) -> str:
    """{(process chain from the launcher down, thread id): its samples in order} -> py-spy's speedscope JSON."""
    frames: list[dict[str, object]] = []
    index: dict[tuple[str, str, int], int] = {}

    def at(name: str, file: str = "", line: int = 0) -> int:
        key = (name, file, line)
        if key not in index:
            index[key] = len(frames)
            frames.append({"name": name, "file": file, "line": line} if file else {"name": name})
        return index[key]

    profiles = []
    for (chain, tid), stacks in threads.items():
        heads = [at(f'process {pid}:"python train.py"') for pid in chain]
        profiles.append(
            {
                "type": "sampled",
                "name": f'Process {chain[-1]} Thread {tid} "MainThread"',
                "unit": "seconds",
                "samples": [heads + [at(*f) for f in st] for st in stacks],
                "weights": [0.01] * len(stacks),
            }
        )
    return json.dumps({"shared": {"frames": frames}, "profiles": profiles})


def record(text: str, ranks: list[tuple[int, int]] = (), **meta: object) -> RunRecord:
    meta = {"target_pid": LAUNCHER, "pyspy_rate": 100, **meta}
    if ranks:
        meta["ranks"] = [{"rank": r, "pid": p} for r, p in ranks]
    return RunRecord(meta=meta, steps=[], phases=[], samples=[], events=[], stacks_text=text)


def test_an_iterators_teardown_after_the_last_step_is_outside_the_span() -> None:
    # 30 waits, 10 forward steps, then the abandoned iterator's __del__ joins its workers for 20 samples
    main = [NEXT] * 30 + [FORWARD] * 10 + [DEL] * 20
    est, _ = stack_estimates(record(speedscope({((1,), "1"): main}), target_pid=1))
    assert est is not None and est.overall is not None
    assert est.overall.samples == 40 and est.overall.data_wait.samples == 30
    assert est.trimmed_outside_training == 20


def test_an_iterators_teardown_between_epochs_is_data_wait() -> None:
    # the next epoch's training follows the shutdown: the training waited on the loader for it (the first step,
    # 10 + 10 samples, is warm-up)
    main = [NEXT] * 10 + [FORWARD] * 10 + [NEXT] * 5 + [FORWARD] * 5 + [DEL] * 5 + [NEXT] * 10 + [FORWARD] * 5
    est, _ = stack_estimates(record(speedscope({((1,), "1"): main}), target_pid=1))
    assert est is not None and est.overall is not None
    assert est.overall.samples == 30 and est.overall.data_wait.samples == 20
    assert est.trimmed_outside_training == 20


def test_the_first_step_is_warm_up_and_a_catch_up_burst_in_its_wait_is_left_out() -> None:
    # set-up, then a first wait inflated by py-spy's making up the samples it fell behind on (60 back-to-back),
    # then 10 steps of 2 waiting and 8 computing samples: the span opens at the second step's wait
    main = [OTHER] * 5 + [NEXT] * 60 + [FORWARD] * 3 + ([NEXT] * 2 + [FORWARD] * 8) * 10
    est, _ = stack_estimates(record(speedscope({((1,), "1"): main}), target_pid=1))
    assert est is not None and est.overall is not None
    assert est.overall.samples == 100 and est.overall.data_wait.samples == 20
    assert est.trimmed_outside_training == 68
    # a run sampled in one step only keeps it
    est, _ = stack_estimates(record(speedscope({((1,), "1"): [OTHER] * 5 + [NEXT] * 6 + [FORWARD] * 4}), target_pid=1))
    assert est is not None and est.overall is not None
    assert est.overall.samples == 10 and est.overall.data_wait.samples == 6


def test_a_run_whose_only_loader_samples_are_a_teardown_has_no_span() -> None:
    # a run of a few steps sampled at a low rate: the iterator's __del__ was caught, no next() was; the span
    # cannot be placed (it was max() of nothing, and the summary failed: docs/sim.md's 2-step run, once)
    main = [OTHER] * 3 + [DEL] * 2
    est, _ = stack_estimates(record(speedscope({((1,), "1"): main}), target_pid=1))
    assert est is not None and est.trimmed_outside_training == 0  # nothing marks a span: every sample is kept
    assert est.overall is not None and est.overall.samples == 5


def test_a_rank_pyspy_never_sampled_itself_is_not_estimated_from_its_worker() -> None:
    # py-spy gave up on rank 0 (pid 200) as it started; it still sampled rank 0's worker (pid 201), whose
    # stack is all queue waits: read as rank 0's main thread it would say 100% data wait
    threads = {
        ((LAUNCHER, 200, 201), "201"): [WORKER] * 50,
        ((LAUNCHER, 300), "300"): [NEXT] * 40 + [FORWARD] * 10,
        ((LAUNCHER, 300, 301), "301"): [WORKER] * 50,
    }
    rec = record(speedscope(threads), ranks=[(0, 200), (1, 300)])
    rows = {r.rank: r for r in rank_stacks(rec)}
    assert rows[0].estimate.overall is None and rows[0].attribution is None
    assert "no sample of pid 200 itself" in (rows[0].estimate.note or "")
    assert rows[1].estimate.overall is not None and rows[1].estimate.overall.data_wait.fraction == 0.8
    pooled, _ = stack_estimates(rec)
    assert pooled is not None and pooled.overall is not None
    assert pooled.overall.samples == 50 and pooled.overall.data_wait.samples == 40  # rank 1's alone
    assert any("no sample of pid 200 itself" in n for n in pooled.notes)


def test_a_pyspy_at_normal_priority_is_said_and_a_real_time_one_is_not() -> None:
    text = speedscope({((1,), "1"): [NEXT] * 30 + [FORWARD] * 10 + [OTHER] * 5})
    normal = "normal priority (SCHED_FIFO not allowed here: Operation not permitted)"
    est, _ = stack_estimates(record(text, target_pid=1, pyspy_scheduling=normal))
    assert est is not None and any(n.startswith(f"py-spy ran at {normal}") and "SYS_NICE" in n for n in est.notes)
    for scheduling in ("SCHED_FIFO 1, each thread from 0.5 s after it starts", None):
        est, _ = stack_estimates(record(text, target_pid=1, pyspy_scheduling=scheduling))
        assert est is not None and not any("priority" in n for n in est.notes)


def test_a_run_recorded_with_nonblocking_reads_says_its_data_wait_reads_low() -> None:
    from profiler.core.sampling.pyspy import PySpyRecorder

    text = speedscope({((1,), "1"): [NEXT] * 30 + [FORWARD] * 10})
    old = ["py-spy", "record", "--pid", "1", "--idle", "--threads", "--nonblocking", "--rate", "100"]
    est, _ = stack_estimates(record(text, target_pid=1, pyspy_args=old))
    assert est is not None and "--nonblocking" in est.method
    assert any(n.startswith("recorded with py-spy --nonblocking") and "reads low" in n for n in est.notes)
    # what stallscope runs now pauses the process for each read, and its runs say so, with no such note
    rec = PySpyRecorder(1, Path("/nonexistent/out.json"), exe="/bin/false")
    with contextlib.suppress(Exception):
        rec.start(attach_timeout_s=0.1)  # /bin/false exits at once: the args are built all the same
    assert rec.args and "--nonblocking" not in rec.args and "--idle" in rec.args
    est, _ = stack_estimates(record(text, target_pid=1, pyspy_args=rec.args))
    assert est is not None and "each read with the process paused" in est.method
    assert not any("nonblocking" in n for n in est.notes)


def test_a_pyspy_that_fell_behind_says_so_once_for_a_job_and_one_on_time_does_not() -> None:
    text = speedscope(
        {
            ((LAUNCHER, 200), "200"): [FORWARD] * 5 + [NEXT] * 30 + [FORWARD] * 10,
            ((LAUNCHER, 300), "300"): [FORWARD] * 5 + [NEXT] * 10 + [FORWARD] * 30,
        }
    )
    ranks = [(0, 200), (1, 300)]
    pooled, _ = stack_estimates(record(text, ranks, pyspy_behind_s=1.05, pyspy_behind_reports=2))
    assert pooled is not None
    said = [n for n in pooled.notes if n.startswith("py-spy fell up to 1.1 s behind its 100 Hz schedule")]
    assert len(said) == 1 and "back-to-back" in said[0], pooled.notes  # once, not once per rank
    for behind in ({}, {"pyspy_behind_s": None}):  # never said (on time, or a run made before it was recorded)
        pooled, _ = stack_estimates(record(text, ranks, **behind))
        assert pooled is not None and not any("behind" in n for n in pooled.notes)


def test_the_summary_of_a_run_estimated_from_a_late_pyspy_says_so_beside_its_figures() -> None:
    from profiler.analysis import summarize

    text = speedscope({((1,), "1"): [FORWARD] * 5 + [NEXT] * 30 + [FORWARD] * 10})
    late = summarize(record(text, target_pid=1, mode="zero-code", pyspy_behind_s=2.0))
    assert sum(n.startswith("py-spy fell up to 2.0 s behind its 100 Hz") for n in late.notes) == 1, late.notes
    on_time = summarize(record(text, target_pid=1, mode="zero-code"))
    assert not any("behind its" in n for n in on_time.notes), on_time.notes
