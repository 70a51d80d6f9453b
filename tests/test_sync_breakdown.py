"""breakdown_ms_per_step.sync on a simulated device, from a fixed record: the sync phases' device time (from the
end of the queued compute until the all-reduce ends), compute without the nested sync; the all-reduce's device
time is busy time (its kernel spins while it waits, as NCCL's does)."""

from __future__ import annotations

import pytest

from profiler.analysis import summarize
from profiler.core.store import PhaseRow, RunRecord, StepRow

SIM = {"kind": "sim", "torch_device": "cpu", "name": "H100 (simulated)", "sim": {"accelerator": "h100"}}


def record(nested: bool, n: int = 5) -> RunRecord:
    """``n`` steps of 100 ms: 10 ms data wait, a 1 ms compute launch whose kernels run 60 ms on the device, then
    the sync: the host waits until 100 ms; the all-reduce runs on the device from 70 ms (the end of its compute),
    waiting for its peers, to 100 ms."""
    steps, phases = [], []
    for i in range(n):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, 0.01, 8, False))
        if nested:  # real DDP's shape: the wait sits inside compute
            phases.append(PhaseRow(i, "compute", 0, t + 0.01, t + 0.1, t + 0.01, t + 0.1))
            phases.append(PhaseRow(i, "compute/sync", 1, t + 0.011, t + 0.1, t + 0.07, t + 0.1))
        else:
            phases.append(PhaseRow(i, "compute", 0, t + 0.01, t + 0.011, t + 0.01, t + 0.07))
            phases.append(PhaseRow(i, "sync", 0, t + 0.011, t + 0.1, t + 0.07, t + 0.1))
    return RunRecord({"schema_version": 2, "device": SIM, "status": "complete"}, steps, phases, [], [])


@pytest.mark.parametrize("nested", [False, True])
def test_sim_sync_is_the_devices_idle_time_in_sync(nested: bool) -> None:
    s = summarize(record(nested))
    b = s.breakdown_ms_per_step
    assert b.compute == pytest.approx(60.0) and b.sync == pytest.approx(30.0) and b.sync_recorded
    assert b.data_wait == pytest.approx(10.0)
    parts = b.data_wait + b.h2d + b.compute + b.sync + b.other
    assert parts == pytest.approx(s.step_time_ms.mean, rel=0.02)
    assert s.device_busy_fraction == pytest.approx(0.9)  # compute 60 ms + the spinning all-reduce 30 ms
    assert [k for k, _ in b.items()] == ["data_wait", "h2d", "compute", "sync", "other"]


def test_a_copy_waiting_for_the_queued_all_reduce_is_not_input_stall() -> None:
    """A pageable copy on the compute stream waits for the previous step's all-reduce, which the host queued and
    left running: that wait is device work (moved out of h2d like a wait for queued compute), not input stall."""
    steps, phases = [], []
    for i in range(5):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, 0.0, 8, False))
        # h2d blocks 20 ms until the previous all-reduce (device 80..120 ms of the step before) has ended
        phases.append(PhaseRow(i, "h2d", 0, t, t + 0.02, t + 0.02, t + 0.021))
        phases.append(PhaseRow(i, "compute", 0, t + 0.021, t + 0.022, t + 0.021, t + 0.08))
        phases.append(PhaseRow(i, "sync", 0, t + 0.022, t + 0.1, t + 0.08, t + 0.12))
    s = summarize(RunRecord({"schema_version": 2, "device": SIM, "status": "complete"}, steps, phases, [], []))
    b = s.breakdown_ms_per_step
    # step 0 has no all-reduce before it: its 20 ms wait and its copy are stall; steps 1-4 only their 1 ms copies
    assert s.stall_ms_per_step.h2d == pytest.approx((21.0 + 4 * 1.0) / 5)
    assert b.sync == pytest.approx(40.0) and b.compute == pytest.approx(59.0)


def test_timeline_rows_split_sync_as_the_summary_does() -> None:
    """The HTML plots' per-step rows: nested sync leaves compute for a sync part, as in the breakdown (CPU)."""
    from profiler.analysis.timeline import step_rows

    rec = record(nested=True)
    cpu = RunRecord({**rec.meta, "device": {"kind": "cpu", "name": "cpu"}}, rec.steps, rec.phases, [], [])
    rows = step_rows(cpu)
    b = summarize(cpu).breakdown_ms_per_step
    assert list(rows[0].parts_ms) == ["data_wait", "h2d", "compute", "sync", "other"]
    for part in ("compute", "sync"):
        assert sum(r.parts_ms[part] for r in rows) / len(rows) == pytest.approx(b[part])
