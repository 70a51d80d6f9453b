"""NVML failing mid-run, on the fake driver: a GPU lost or an unknown error after N good reads, and a call
that never returns. The host source keeps recording, the store stays sound, the report says when NVML
stopped and why, and the training loop is never held up by the hung read (issue #13)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sleep_loader
from fake_nvml import make_fake_nvml

from profiler import Session
from profiler.cli import main
from profiler.core.sampling.sampler import CALL_TIMEOUT_S
from profiler.core.sources.host import HostSource
from profiler.core.sources.nvml import NvmlSource
from profiler.core.store import integrity_ok, load_run

SCRIPT = json.loads((Path(__file__).parent / "data" / "nvml_script_h100.json").read_text())
HZ = 50.0


def _train(out: Path, nvml: NvmlSource, seconds: float) -> tuple[Session, list[float], float]:
    """A loop of ~5 ms steps for ``seconds``; returns the session, the loop's own step times, and how long
    leaving the ``with`` block (Session.__exit__: sampler, store, summary) took."""
    steps: list[float] = []
    s = Session(out, sources=[HostSource(), nvml], sample_hz=HZ)
    with s:
        deadline = time.perf_counter() + seconds
        last = time.perf_counter()
        for _ in s.wrap(sleep_loader(100_000, 0.002)):
            with s.phase("compute"):
                time.sleep(0.003)
            now = time.perf_counter()
            steps.append(now - last)
            last = now
            if now > deadline:
                break
        exit_started = time.perf_counter()
    return s, steps, time.perf_counter() - exit_started


def _report(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any]]:
    """``stallscope report RUN_DIR`` and ``--json``, in this process: (terminal text, summary)."""
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert main(["report", str(out), "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def _times(out: Path, source: str) -> list[float]:
    return sorted({t for t, src, _m, _v in load_run(out).samples if src == source})


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ({"lost_after": 8}, "NVMLError_GpuIsLost (the GPU fell off the bus or stopped responding)"),
        ({"fail_after": 8, "fail_with": "Unknown"}, "NVMLError_Unknown (Unknown Error)"),
    ],
    ids=["gpu-lost", "unknown-error"],
)
def test_nvml_error_after_n_reads_stops_nvml_only_and_the_report_says_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], script: dict[str, Any], error: str
) -> None:
    out = tmp_path / "run"
    s, _steps, _exit_s = _train(out, NvmlSource(module=make_fake_nvml({**SCRIPT, **script})), 0.8)
    summ = s.summary()
    assert summ is not None and summ.status == "complete" and summ.steps > 50
    assert integrity_ok(out)
    rec = load_run(out)
    # the probe read in open() took one read of each query, so 7 sampled reads came back before the error
    assert len([1 for _t, _s, m, _v in rec.samples if m == "gpu0.util_pct"]) == 7
    lost_at = next(t for t, kind, src, msg in rec.events if kind == "source" and src == "nvml" and "lost" in msg)
    host = _times(out, "host")
    assert max(_times(out, "nvml")) <= lost_at < host[-1] - 0.3  # host went on for the rest of the run
    assert len([t for t in host if t > lost_at]) > 10
    text, js = _report(out, capsys)
    said = f"NVML stopped at {lost_at:.1f} s: GPU 0: {error}"
    assert any(n.startswith(said) for n in js["notes"]), js["notes"]
    assert js["sampler"]["sources"]["nvml"] == f"lost: GPU 0: {error}"
    assert js["sampler"]["stopped_at"]["nvml"] == pytest.approx(lost_at)
    assert js["sampler"]["sources"]["host"] == "available" and js["status"] == "complete"
    flat = " ".join(text.split())
    assert f"NVML stopped at {lost_at:.1f} s: GPU 0: {error.partition(' (')[0]}" in flat
    assert f"source nvml: lost at {lost_at:.1f} s: GPU 0" in flat
    assert "NVML util" in flat and "Traceback" not in flat


def test_a_hung_nvml_read_holds_up_neither_training_nor_host_nor_close(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    fake = make_fake_nvml({**SCRIPT, "hang_after": 8})
    try:
        # long enough for the sampler to give the hung read up (CALL_TIMEOUT_S) and run on without NVML
        s, steps, exit_s = _train(out, NvmlSource(module=fake), CALL_TIMEOUT_S + 0.8)
        assert fake.hanging.is_set() and not fake.release.is_set()  # the read is still hung at the end
    finally:
        fake.release.set()
    summ = s.summary()
    assert summ is not None and summ.status == "complete"
    # the loop's own step times: no step waited for the hung read (a step is ~5 ms; the hang lasts the run)
    assert max(steps[1:]) < 0.5, max(steps[1:])
    assert exit_s < 1.0, exit_s
    assert integrity_ok(out)
    rec = load_run(out)
    hung_from = max(_times(out, "nvml"))
    lost_at = next(t for t, kind, src, msg in rec.events if kind == "source" and src == "nvml" and "lost" in msg)
    assert lost_at - hung_from == pytest.approx(CALL_TIMEOUT_S, abs=0.5)
    # host samples went on at the sampler's rate while the NVML read hung, not only after it was given up
    during = [t for t in _times(out, "host") if hung_from < t < lost_at]
    assert len(during) >= 0.5 * HZ * (lost_at - hung_from), (len(during), lost_at - hung_from)
    _text, js = _report(out, capsys)
    assert any(
        n.startswith(f"NVML stopped at {lost_at:.1f} s: a read did not return within {CALL_TIMEOUT_S:g} s")
        for n in js["notes"]
    ), js["notes"]


def test_close_while_an_nvml_read_hangs_returns_at_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fake = make_fake_nvml({**SCRIPT, "hang_after": 3})
    try:
        s, _steps, exit_s = _train(out, NvmlSource(module=fake), 0.4)  # ends before the read is given up
        closed_at = time.perf_counter()
        assert fake.hanging.is_set() and not fake.release.is_set()  # the read still hangs as the close returns
    finally:
        fake.release.set()
    # a close that waited for the hung read would return when the sampler gives it up (CALL_TIMEOUT_S after it
    # hung) or never (it hangs until released, after this): the close returned before that, on the same clock. A
    # bound of its own length (1 s) failed beside a loaded CI's two busy processes at 1.23 s
    hung_at = fake.state["hung_at"]
    assert closed_at < hung_at + CALL_TIMEOUT_S, (closed_at - hung_at, exit_s)
    summ = s.summary()
    assert summ is not None and summ.status == "complete"
    assert integrity_ok(out)
    assert len(_times(out, "host")) >= 0.5 * HZ * 0.4
