"""Device (CUDA event) figures of an unmodified script: the start-up module's events at every ``next()`` boundary.

The truth is the device's own record of when it worked: tests/data/device_train.py queues each step's work on
an asynchronous device (a model of one without a GPU, installed as ``torch.cuda``; CUDA itself under the gpu
mark) and writes the device's busy intervals and when each batch arrived, on the clock stallscope reads. Where
the script hides its data wait under the device's queued work, host timing alone would call the wait a stall;
the events must see the device busy and the stall only where the device idled.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, stallscope

from profiler.analysis.apart import measured_steps
from profiler.core.store import load_run
from profiler.zerocode.boot.stallscope_instrument import DeviceClock

sys.path.insert(0, str(ROOT / "tests" / "data"))
from device_train import ModelDevice

SCRIPT = str(ROOT / "tests" / "data" / "device_train.py")
BOUND_MS = 1.0


class Records:
    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []

    def put(self, rec: dict[str, Any]) -> None:
        self.got.append(rec)


def test_no_event_before_the_script_initialises_cuda_and_each_event_when_the_device_reaches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = ModelDevice()
    monkeypatch.setattr(torch, "cuda", device)
    out = Records()
    clock = DeviceClock(out)  # type: ignore[arg-type] - a writer is anything with put()
    assert clock.mark() is None and out.got == []  # CUDA not initialised by the script: nothing recorded
    device.init()
    first = clock.mark()
    start = out.got[0]
    assert first == 1 and start["k"] == "devclock" and start["name"] == "modelled device"
    device.run(0.05)  # 50 ms of queued work: the next event is reached when it is done
    assert clock.mark() == 2
    clock.close()  # waits for the device
    dev = [r["t"] for r in out.got if r["k"] == "dev"]
    truth = device.reached[DeviceClock.REF_TRIES :]  # the first events recorded are the tries at the reference
    # each time is off by the reference's error at most: the half-width of the clock reads around it
    assert len(dev) == 2 and truth[1] - truth[0] > 0.049
    assert all(abs(d - t) <= start["err"] for d, t in zip(dev, truth, strict=True)), (dev, truth, start["err"])


def test_the_reference_is_the_try_whose_clock_reads_are_closest(monkeypatch: pytest.MonkeyPatch) -> None:
    device = ModelDevice()
    device.init()
    monkeypatch.setattr(torch, "cuda", device)
    made = device.Event
    count = [0]

    def slow_first(enable_timing: bool = False) -> Any:
        ev = made(enable_timing)
        count[0] += 1
        if count[0] == 1:  # the first try is preempted 20 ms between its record and its second clock read
            done = ev.synchronize
            ev.synchronize = lambda: (done(), time.sleep(0.020))  # type: ignore[method-assign]
        return ev

    monkeypatch.setattr(device, "Event", slow_first)
    out = Records()
    clock = DeviceClock(out)  # type: ignore[arg-type]
    assert clock.mark() == 1
    ref = out.got[0]
    assert ref["k"] == "devclock" and ref["err"] < 0.005, ref  # one try alone: 10 ms off
    assert min(abs(ref["t"] - t) for t in device.reached[1 : DeviceClock.REF_TRIES]) <= ref["err"]


def test_a_cuda_error_turns_the_clock_off_with_one_record(monkeypatch: pytest.MonkeyPatch) -> None:
    device = ModelDevice()
    device.init()
    monkeypatch.setattr(torch, "cuda", device)
    out = Records()
    clock = DeviceClock(out)  # type: ignore[arg-type]
    assert clock.mark() == 1

    def broken(enable_timing: bool = False) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(device, "Event", broken)
    clock.pool.clear()
    assert clock.mark() is None and clock.mark() is None
    offs = [r for r in out.got if r["k"] == "dev_off"]
    assert len(offs) == 1 and "illegal memory access" in offs[0]["why"]


def run_script(tmp_path: Path, *args: str) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    out, truth = tmp_path / "run", tmp_path / "truth.json"
    res = stallscope(
        "run", "--json", "--no-live", "--out", str(out), "--", sys.executable, SCRIPT, "--truth", str(truth), *args
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), out, json.loads(truth.read_text())


def overlap(a: float, b: float, spans: list[list[float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans)


def device_truth(out: Path, truth: dict[str, Any]) -> tuple[float, float]:
    """(stall, device compute) in ms per measured step, from the device's own record: the stall is the time the
    device idled while the script was in ``next()``, the rest of the step is the device's (its work, and any idle
    the host caused there).

    Where the device is modelled it also recorded when it reached each event: after the reference's tries and the one at
    ``iter()``, the start-up module's two events of each ``next()`` call, in order (checked: two a call, none before
    the script's clock read ahead of the call), and the stall is the device's idle between them. The script's reads
    around the call bracket them by the host's own time between a clock read and the call (the loop, the module's
    bookkeeping, a preemption: 1.6 ms a step beside two busy processes), which the device idles through too but
    which is the step's, not the wait's. On CUDA the window is the script's reads."""
    # the steps the figures are of: not warm-up, nor held apart by a kernel window (its steps, and its opening and
    # closing, are reported apart: profiler/analysis/apart.py)
    steps = [s.step for s in measured_steps(load_run(out))]
    assert len(steps) >= 20
    arrived, ended, busy = truth["arrived"], truth["ended"], truth["busy"]
    # before the calls': the tries at the clock's reference, and the event at iter(loader)
    reached = truth["reached"][DeviceClock.REF_TRIES + 1 :]
    assert not reached or len(reached) == 2 * len(arrived), (len(reached), len(arrived))
    stall = 0.0
    for k in steps:
        a, b = ended[k], arrived[k]
        if reached:
            assert a <= reached[2 * k] <= reached[2 * k + 1], (k, a, reached[2 * k : 2 * k + 2])
            a, b = reached[2 * k], reached[2 * k + 1]
        stall += (b - a) - overlap(a, b, busy)
    wall = sum(ended[k + 1] - ended[k] for k in steps)
    return stall / len(steps) * 1e3, (wall - stall) / len(steps) * 1e3


# item 5 ms x 4 a batch: the data wait is about 20 ms a step; the device's work 30 ms a step
@pytest.mark.parametrize(
    ("sync", "item_ms"),
    [("step", "5"), ("overlap", "5"), ("overlap", "10")],
    ids=["waits-each-step", "wait-hidden", "wait-half-hidden"],
)
def test_the_stall_is_the_time_the_device_idled_for_input(tmp_path: Path, sync: str, item_ms: str) -> None:
    summary, out, truth = run_script(tmp_path, "--sync", sync, "--item-ms", item_ms, "--gpu-ms", "30")
    meta = load_run(out).meta
    assert meta["device"]["kind"] == "cuda" and meta["device_timer"] == "cuda-events"
    truth_stall, truth_compute = device_truth(out, truth)
    stall_ms = sum(summary["stall_ms_per_step"].values())  # data wait and copies the device was not busy under
    compute_ms = summary["device_ms_per_step"]["compute"]
    print(f"{sync} {item_ms}: stall {stall_ms:.3f} / {truth_stall:.3f}, compute {compute_ms:.3f} / {truth_compute:.3f}")
    assert abs(stall_ms - truth_stall) <= BOUND_MS, (stall_ms, truth_stall)
    assert abs(compute_ms - truth_compute) <= BOUND_MS, (compute_ms, truth_compute)
    if sync == "overlap" and item_ms == "5":
        # the host waited ~20 ms a step for data, under the device's queued work: host-time accounting would call
        # the step mostly data wait, the device idled little of it. Little, not none: on a busy host the loop fell
        # behind the device's 30 ms now and then (a fresh-clone CI run: 26.7 ms of wait a step, the device idle
        # 2.54 ms of it by the truth, 2.53 measured), so the premise is the truth's share, and the figure the truth
        wait = summary["breakdown_ms_per_step"]["data_wait"]
        assert wait > 15 and truth_stall < 0.2 * wait and stall_ms < 0.2 * wait, (wait, truth_stall, stall_ms)


def test_a_kernel_window_that_costs_what_a_real_one_did_leaves_the_stall_the_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue #57: on an H200 the real-CUDA test below read a stall of 39.8 ms a step against the device's own 67.1; the
    # modelled device had no kernel window of a real one's cost. This one opens CUPTI-like windows in the script's
    # process (tests/cupti_like.py: 50 ms to start, 600 ms to stop after waiting for the device, work 20% slower
    # inside), as CUDA's did there
    monkeypatch.setenv("STALLSCOPE_KERNEL_RECORDER", "tests.cupti_like:CuptiLike")
    monkeypatch.setenv("STALLSCOPE_FAKE_CUPTI", "sync=1")
    # 60 steps: the window (steps 5-24 of a run of unknown length) is held apart, and 20 or more are measured
    summary, out, truth = run_script(
        tmp_path, "--sync", "overlap", "--item-ms", "10", "--gpu-ms", "30", "--steps", "60"
    )
    assert summary["kernel_windows"]["windows"] >= 1, summary.get("kernel_windows")
    truth_stall, truth_compute = device_truth(out, truth)
    stall_ms = sum(summary["stall_ms_per_step"].values())
    print(f"windowed: stall {stall_ms:.3f} / {truth_stall:.3f}, compute {summary['device_ms_per_step']['compute']:.3f}"
          f" / {truth_compute:.3f}")  # fmt: skip
    assert abs(stall_ms - truth_stall) <= BOUND_MS, (stall_ms, truth_stall)
    assert abs(summary["device_ms_per_step"]["compute"] - truth_compute) <= BOUND_MS


@pytest.mark.gpu
def test_real_cuda_events_match_the_scripts_own(tmp_path: Path) -> None:
    summary, out, truth = run_script(tmp_path, "--real", "--sync", "overlap", "--item-ms", "10", "--gpu-ms", "30")
    truth_stall, truth_compute = device_truth(out, truth)
    stall_ms = sum(summary["stall_ms_per_step"].values())
    assert abs(stall_ms - truth_stall) <= BOUND_MS, (stall_ms, truth_stall)
    assert abs(summary["device_ms_per_step"]["compute"] - truth_compute) <= BOUND_MS
