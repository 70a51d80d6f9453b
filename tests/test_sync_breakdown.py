"""breakdown_ms_per_step.sync on a simulated device, from a fixed record: the sync phases' device time (the
simulated device's idle time until the ranks meet), compute without the nested sync, and no busy time in sync."""

from __future__ import annotations

import pytest

from profiler.analysis import summarize
from profiler.store import PhaseRow, RunRecord, StepRow

SIM = {"kind": "sim", "torch_device": "cpu", "name": "H100 (simulated)", "sim": {"accelerator": "h100"}}


def record(nested: bool, n: int = 5) -> RunRecord:
    """``n`` steps of 100 ms: 10 ms data wait, a 1 ms compute launch whose kernels run 60 ms on the device, then
    the sync: the host waits until 100 ms, the device is idle from 70 ms (the end of its compute) to 100 ms."""
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
    assert s.device_busy_fraction == pytest.approx(0.6)  # waiting for the other ranks is not device work
    assert [k for k, _ in b.items()] == ["data_wait", "h2d", "compute", "sync", "other"]
