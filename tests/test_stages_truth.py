"""The loader's stages against the data set's own timing: items whose fetch, decode and augment sleep for known
times (tests/data/scenarios/stage_costs.py, timed through pipelines.stages as the built-in data sets time theirs
and, around the same work, by the data set itself into a truth file), 2 workers, a 4 ms model: the loader cannot
keep up. Each stage's time per item and share against the data set's own, the slowest stage named the bottleneck
(fetch; augment, sleeping and spinning on the CPU; fetch again where the bytes come over a real socket from a
slow local server), each batch's hand-off from a worker to the training process against the data set's gaps between
its items, the stages and the hand-off covering the workers' busy time (80% or more: else no capacity), the capacity
derived from both, and the stages' own bound against the throughput the loader-bound run really had, as far as the
workers spent their time in the stages (the data set's own timing again).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, slow_server, stallscope

from profiler.analysis.stages import COVERED, STORE_SATURATED, per_item
from profiler.core.store import load_run

SCENARIO = str(ROOT / "tests" / "data" / "scenarios" / "stage_costs.py")
RATIO_TOLERANCE = 0.10  # throughput / capacity against the workers' share of time in their stages (measured below)
GAP_REL, GAP_ABS_MS = 0.30, 0.3  # the collate and the hand-off per item against the data set's gaps between items


@pytest.mark.parametrize("case", ["fetch", "augment", "cpu-augment", "network"])
def test_stage_times_bottleneck_and_capacity_match_the_data_sets_own_timing(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth_file = tmp_path / "truth.txt"
    monkeypatch.setenv("STAGE_CASE", case)
    monkeypatch.setenv("STAGE_TRUTH", str(truth_file))
    # network: each item's bytes come over a real socket from a local server that sends them in 4 pieces 2.5 ms apart
    with slow_server(0.010, 4) if case == "network" else contextlib.nullcontext(0) as port:
        monkeypatch.setenv("STAGE_PORT", str(port))
        res = stallscope(
            "run", SCENARIO, "--workers", "2", "--no-attribution", "--out", str(tmp_path / "run"), "--no-live", "--json"
        )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    st = summary["stages"]
    spent: dict[str, list[float]] = defaultdict(list)
    items: list[tuple[int, float, float, float]] = []  # (loader process, enter, exit, seconds in its stages)
    for line in truth_file.read_text().splitlines():
        if line.startswith("item "):
            pid, enter, leave, inside = line.split()[1:]
            items.append((int(pid), float(enter), float(leave), float(inside)))
        else:
            stage, seconds = line.split()
            spent[stage].append(float(seconds))
    got = {s["name"]: s for s in st["stages"]}
    assert set(got) == {"fetch", "decode", "augment", "collate"}
    counted = _counted_in_window(tmp_path / "run")
    for stage, times in spent.items():
        # the items the run's measured window counted against the same items as the data set timed them: the n-th
        # item of a stage the loader processes finished is the n-th line of the truth file (each item appends its
        # lines when done: two workers in flight shift an edge by an item or two). All the items, warm-up included,
        # read 1.80 ms for the 1 ms stages on a busy CI host where the window's read 1.17: its start was the slowest
        lo, hi = counted[stage]
        truth_ms = 1e3 * statistics.mean(times[lo:hi])
        assert got[stage]["ms_per_item"] == pytest.approx(truth_ms, rel=0.10, abs=0.3), (stage, lo, hi)
    # each stage's share of an item's time against the data set's own: within 10 percentage points (the bound)
    truth_total = math.fsum(statistics.mean(t) for t in spent.values())
    for stage, times in spent.items():
        assert abs(got[stage]["share"] - statistics.mean(times) / truth_total) <= 0.10, (stage, got[stage], truth_total)
    # the workers' busy time is covered: the stages and the hand-off (its gaps less the wait for work) hold 80% or
    # more of it, wall time on both sides (the workers' rows in the message: cpu, runq, queue %)
    checked = {k: st[k] for k in ("coverage", "loader_ms_per_item", "loader_runq_ms_per_item", "handoff_ms_per_item")}
    rows = {
        p["label"]: (round(p["cpu"]), round(p["runq"]), round(p["queue"])) for p in summary["loader_time"]["processes"]
    }
    assert st["coverage"] is not None and st["coverage"] >= COVERED, (checked, rows, st["stages"])
    assert st["bottleneck"] == {"network": "fetch", "cpu-augment": "augment"}.get(case, case), st
    codes = {r["code"]: r["text"] for r in summary["recommendations"]}
    assert "LOADER_STAGE" in codes
    if case == "cpu-augment":  # the workers compute: more workers only where the cores have room for them
        advice = codes["LOADER_TOO_SLOW"]
        cpu = summary["host"]["sys_cpu_pct_mean"]
        # quoting the host's CPU use, from the workers' own time ("the workers computed 70% of their time and the
        # cores were 86% busy") or, where that names no part (a CI run: the cores 100% busy), the host's alone
        assert "RAISE_WORKERS" not in codes and re.search(rf"\b{cpu:.0f}% busy|averaged {cpu:.0f}%:", advice), advice
        full = cpu >= 85  # 86% here, the two workers computing 70-82% of their time; 100% beside other tests
        assert "make per-item work cheaper" in advice and ("add workers" in advice) is not full, advice
    # between a batch's collate and the next batch's first stage a worker hands the batch over (the queue put, the
    # pickling) and waits for the next indices: the stage clock's gaps there and the collate, per item, against the
    # data set's own gaps between its items (which also hold the fetcher's steps between the items of a batch, each
    # of which a loaded host can preempt), over the items of the measured window (the truth file's item lines are in
    # the order the stages counted; the window's edges differ by an item or two). Measured 0.79-1.13 of the truth in
    # 13 runs of the augment cases at load averages 4-29; a gap that took in an item's own work would read far more
    share = _handoff_checked(tmp_path / "run", st, items[slice(*counted["augment"])])
    # the stages alone give an upper bound (2 workers / the stages' time per item), which the run's throughput
    # reaches only as far as the workers spend their time inside the stages. Outside them a worker collates, pickles
    # and queues each batch, writes the truth file, and waits for a core: 134 against 144 samples/s (-7%) on a quiet
    # host, further off on a busy one (a CI run's augment case fell outside 0.85-1.15 of its capacity, 133.8). So the
    # throughput over that bound is held to the workers' own share of time in their stages over the measured
    # window, by the data set's clock in the same run. Measured: within 0.016 of it in 12 runs on a quiet host, 0.031
    # in 12 beside two busy loops, and 0.028 in 8 beside four busy loops with the four cases at once (the share
    # 0.93-0.99 throughout). The bound is over the stages the data set times (fetch, decode, augment: its share's
    # "inside"), not the collate, which runs outside ``__getitem__`` and so counts outside on the share's side: a
    # loaded fresh-clone CI read the collate at 1.43 ms an item (beside 2.14 + 1.95 + 8.60 ms of stages, each within
    # 0.03 ms of the data set's own), and with it in the bound 0.952 against a share of 0.843; without it, 0.855.
    # Without it, the four cases read within 0.000-0.033 of the share in 3 runs beside two busy loops (with it, the
    # augment case 0.059-0.076 off in the same runs), and within 0.018 in 2 quiet runs
    bound = 2e3 / math.fsum(s["ms_per_item"] for s in st["stages"] if s["name"] in spent)
    ratio = summary["throughput_samples_per_s"] / bound
    story = f"throughput {summary['throughput_samples_per_s']:.1f} / the data set's stages' bound {bound:.1f}"
    assert abs(ratio - share) <= RATIO_TOLERANCE, (f"{story} = {ratio:.3f}, in the stages {share:.3f}", st)
    assert st["demand_samples_per_s"] > 2 * st["capacity_samples_per_s"]  # a 4 ms model would take far more
    assert os.path.exists(tmp_path / "run" / "run.sqlite")


def _handoff_checked(run: Path, st: dict[str, Any], window_items: list[tuple[int, float, float, float]]) -> float:
    """The hand-off against the data set's gaps between items, and in the capacity; the workers' share of their time
    inside the stages over ``window_items`` by the data set's clock."""
    truth_gap_ms, inside, span = _between_items(window_items)
    timed = per_item(load_run(run).samples, _window(run), with_handoff=True)
    gap_ms = 1e3 * (timed["collate"] + timed["handoff"])
    assert gap_ms == pytest.approx(truth_gap_ms, rel=GAP_REL, abs=GAP_ABS_MS), (gap_ms, truth_gap_ms, st)
    # the capacity counts the hand-off: 2 workers / (the stages' + the hand-off's time per item)
    work_ms = math.fsum(s["ms_per_item"] for s in st["stages"]) + st["handoff_ms_per_item"]
    assert st["capacity_samples_per_s"] == pytest.approx(2e3 / work_ms, rel=1e-9), st
    return inside / span


def _between_items(items: list[tuple[int, float, float, float]]) -> tuple[float, float, float]:
    """Over ``items``, by the data set's clock: the loader processes' gaps between one item's end and their next
    one's start, ms per item; their seconds inside the stages; and their spans (each process's first item's start
    to its last one's end), summed over the processes."""
    gaps = inside = span = 0.0
    for pid in {it[0] for it in items}:
        mine = [it for it in items if it[0] == pid]
        if len(mine) >= 2:
            gaps += math.fsum(b[1] - a[2] for a, b in itertools.pairwise(mine))
            inside += math.fsum(it[3] for it in mine)
            span += mine[-1][2] - mine[0][1]
    assert span > 0, f"no loader process finished two of the {len(items)} items in the measured window"
    return 1e3 * gaps / len(items), inside, span


def _window(run: Path) -> tuple[float, float]:
    """The analysis's window: the first measured step's start to the last one's end."""
    measured = [s for s in load_run(run).steps if not s.warmup]
    return measured[0].t_start, measured[-1].t_end


def _counted_in_window(run: Path) -> dict[str, tuple[int, int]]:
    """Per stage, the items counted between its first and last reading in the measured window (the analysis's
    window: the first measured step's start to the last one's end), as cumulative counts (first, last)."""
    rec = load_run(run)
    measured = [s for s in rec.steps if not s.warmup]
    lo, hi = measured[0].t_start, measured[-1].t_end
    counts: dict[str, list[int]] = defaultdict(list)
    for t, _source, metric, value in rec.samples:
        if metric.startswith("stage.") and metric.endswith(".n") and value is not None and lo <= t <= hi:
            counts[metric.split(".")[1]].append(int(value))
    return {stage: (n[0], n[-1]) for stage, n in counts.items()}


STORE = str(ROOT / "tests" / "data" / "scenarios" / "store_costs.py")
STORE_BYTES = int(re.search(r"^BYTES = ([\d_]+)$", Path(STORE).read_text(), re.M).group(1))
STORE_MBPS = 4  # the emulated store's rate in the advice test: it serves STORE_MBPS * 1e6 / STORE_BYTES items a second


def _run(tmp: Path, name: str, *args: str) -> dict:
    res = stallscope("run", STORE, "--no-attribution", "--no-live", "--json", "--out", str(tmp / name), *args)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


# light (tests/scheduling.py): its four runs' items sleep (store_costs.py); 3.4-3.6 CPU-seconds (the warm server's
# start left out) against 16.1 s in a fresh-clone CI run: 0.21-0.22 of a core (0.12-0.13 over 24-28 s here, load 4-5)
@pytest.mark.light(seconds=16)
def test_more_workers_are_advised_only_where_running_them_helps(tmp_path: Path) -> None:
    """The advice checked by running it: 100 kB an item from a store of 4 MB/s serving one read at a time, 2
    workers: the store is saturated, no advice adds workers, and 4 workers indeed deliver no more. The same items
    with no store at 0 workers (10 ms of work an item): workers are advised, and 2 deliver far more."""
    saturated = _run(tmp_path, "w2", "--workers", "2", "--store-mbps", str(STORE_MBPS))
    codes = [r["code"] for r in saturated["recommendations"]]
    assert saturated["stages"]["store_busy"] >= 0.9 and "RAISE_WORKERS" not in codes and "LOADER_TOO_SLOW" not in codes
    stage = next(r["text"] for r in saturated["recommendations"] if r["code"] == "LOADER_STAGE")
    assert "saturated: more workers would only queue more reads behind it" in stage
    more = _run(tmp_path, "w4", "--workers", "4", "--store-mbps", str(STORE_MBPS))
    # the advice is that the store is the limit: 4 workers deliver no more than the store serves, 4 MB/s of
    # 100 kB reads one at a time, 40 items a second (pipelines.store paces each read exactly), nor more than the
    # idle share a "saturated" store (busy 90% or more) leaves 2 workers. Measured 40.0 and 40.0 quiet; beside two
    # busy loops and two other tests, 2 workers read 36.0 (the CPU scarcer than the store's reads) and 4 read 40.3,
    # x1.12: the store's last 10%, not a gain past it. Over the measured span the loader also hands over what its
    # workers had read before it began: each worker at most one batch's items (the store interleaves the workers'
    # reads, so all four hold part of a batch). 41.95 a second was measured in a stress pass, 6.7 items over the
    # store's 137.3 in the span: within those 16 (a fixed 3% allowance, 4.3 items, failed it)
    capacity = STORE_MBPS * 1e6 / STORE_BYTES
    span = more["steps"] * more["batch_size"] / more["throughput_samples_per_s"]
    read_before = 4 * more["batch_size"]
    most = min(capacity, saturated["throughput_samples_per_s"] / STORE_SATURATED) + read_before / span
    assert more["throughput_samples_per_s"] <= most, (more, saturated, capacity, span)
    alone = _run(tmp_path, "w0", "--workers", "0")
    advice = next(r["text"] for r in alone["recommendations"] if r["code"] == "RAISE_WORKERS")
    assert "num_workers=2" in advice
    helped = _run(tmp_path, "w0-2", "--workers", "2")
    # 0 workers: 4 x 10 ms of items and a 2 ms model a step (95 samples/s); 2 workers load two batches at once
    # (measured 86.2 and 191.4 samples/s)
    assert helped["throughput_samples_per_s"] >= 1.5 * alone["throughput_samples_per_s"], (helped, alone)


DALI_IMAGES, DALI_BATCH = 64, 8  # an epoch: 8 batches, as a prefix's round is
DALI_EPOCHS = 6  # the first holds the warm-up step: five whole epochs are judged


# alone (tests/scheduling.py): the capacity is measured before training and the loader's steps after it, and beside the
# suite's other tests the two saw different loads: x1.71 in a CI run (873 against 511 samples/s), x0.62 in a stress
# pass (469 against 761), x1.85 in another (868 against 470). Rounds of 2 batches (~20 ms) read x0.96-x1.43 beside
# two busy loops (5 runs) and x2.15 in a stress pass; of 8 batches, x0.86-x1.24 (5 runs), x1.04-x1.09 quiet (3)
@pytest.mark.alone
def test_dali_stages_from_its_prefixes_bound_the_loader_it_measured(tmp_path: Path) -> None:
    """DALI gives no per-operator times: ``--dali-stages`` runs the graph's prefixes alone before training. The
    whole graph's rate is the capacity: an upper bound of the same loader measured by a ``--loader-only`` run (the
    iterator's hand-over to torch and the copy are outside the graph). Measured here on 64 JPEGs, batch 8, 2
    threads, the loader's rate over whole epochs: x1.07-x1.48 (median x1.15, 6 runs) on a quiet host, x0.94-x1.36
    (median x1.04, 6 runs) beside two busy processes; over 14 s each, the graph alone 870 and the loader 765
    samples/s (x1.14): what the hand-over costs DALI's threads on two cores."""
    pytest.importorskip("nvidia.dali")
    from scenarios.datagen import make

    data = tmp_path / "images"
    make("imagenet-like", data, DALI_IMAGES, classes=4, seed=0, jobs=1, progress=None)
    # a fresh interpreter, as a user's run is: forked from the warm server (tests/warm.py), the loader's steps ran
    # slower (the capacity over the loader x1.05-x1.57, median x1.40, in 5 runs; x1.03-x1.40, median x1.11, in 5
    # fresh ones in turn with them; p50 step 11.6-12.2 ms in 4 of the 5 against 8.0-11.8) and the graph alone not
    res = stallscope(*_dali_stages_command(data, tmp_path / "run"), fresh=True)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    st = summary["stages"]
    got = {s["name"]: s["ms_per_item"] for s in st["stages"]}
    assert list(got) == ["fetch", "decode", "augment"] and all(v >= 0 for v in got.values()), got
    # decoding a JPEG costs more than reading its cached bytes: 6-20x quiet, 2.3x in a CI run three tests at a time.
    # The fetch prefix also holds what running any graph costs a batch (the Python call, the threads' hand-off),
    # which the differences giving decode and augment cancel and a loaded host inflates (docs/metrics.md)
    assert got["decode"] > got["fetch"], got
    assert st["processes"] == 2 and st["runners"] == "DALI's 2 threads"
    # The graph runs alone first, then the loader trains: a burst on the host in one of the two spans decides a
    # single run. When one run disagrees, two more are run and the median of the three is judged: a burst falls
    # on one of them, a bias in the measure on all (the prefixes' rounds once left their queued batches running
    # behind the clock: x1.47-x2.23 in a CI run, docs/testing.md).
    ratios = [_capacity_over_loader(summary, tmp_path / "run")]
    if not 0.8 <= ratios[0] <= 1.7:
        for k in (1, 2):
            again = stallscope(*_dali_stages_command(data, tmp_path / f"again{k}"), fresh=True)
            assert again.returncode == 0, again.stderr[-2000:]
            ratios.append(_capacity_over_loader(json.loads(again.stdout), tmp_path / f"again{k}"))
    assert 0.8 <= statistics.median(ratios) <= 1.7, ratios
    assert "no per-operator times" in st["method"]
    meta = load_run(tmp_path / "run").meta["dali_stages"]
    assert set(meta["prefix_s_per_sample"]) == {"fetch", "decode", "augment"} and meta["threads"] == 2


def _dali_stages_command(data: Path, out: Path) -> list[str]:
    return [
        "run", "imagenet", "--data", str(data), "--pipeline", "dali", "--workers", "2", "--batch-size",
        str(DALI_BATCH), "--steps", str(DALI_EPOCHS * DALI_IMAGES // DALI_BATCH), "--loader-only", "--dali-stages",
        "--no-live", "--json", "--out", str(out),
    ]  # fmt: skip


def _capacity_over_loader(summary: dict[str, Any], run: Path) -> float:
    """DALI's measured capacity over the rate of the loader the same run measured.

    The loader's rate over whole epochs, as a prefix's round is one (8 batches of 8 of the 64 JPEGs): the images
    run from 10k to 250k pixels, so one batch costs 3-16 ms, and the median step (the measure before) was a
    cheaper batch than the epoch's mean one. The median of the epochs' rates: a burst on the host that slows one
    epoch is not the loader's. Wall-clock steps: taking out the training thread's wait for a CPU (schedstat) read
    the loader x1.18 faster beside two busy processes (x0.82-x0.93 in 5 of 6 runs), since DALI's threads fill its
    queue while that thread waits."""
    steps = {s.step: s.t_end - s.t_start for s in load_run(run).steps}
    per = DALI_IMAGES // DALI_BATCH
    assert set(range(per, DALI_EPOCHS * per)) <= set(steps), sorted(steps)
    rate = statistics.median(DALI_IMAGES / sum(steps[e * per + i] for i in range(per)) for e in range(1, DALI_EPOCHS))
    return float(summary["stages"]["capacity_samples_per_s"]) / rate


def test_dali_stages_is_refused_for_other_pipelines() -> None:
    res = stallscope("run", "imagenet", "--pipeline", "naive", "--dali-stages", "--steps", "1")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "--dali-stages times a DALI graph's stages: allowed with --pipeline dali, not naive"
    ), res.stderr
