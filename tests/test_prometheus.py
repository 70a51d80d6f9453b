"""The Prometheus exporter (--prometheus; docs/integrations.md): what it serves means what the run summary means.

Truth: the endpoint, scraped while a run trains, reports the stall of the steps resolved at that moment, and so
the summary's stall at the end within what per-step variation allows: a ratio of sums over any subset of the
steps lies between the smallest and the largest per-step stall fraction, and so does the run's, so
``|scraped - final| <= max - min`` of the run's per-step stall fractions (read from its store). The run-to-date
counters are compared exactly with the store's sums over the same steps.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import warm
from conftest import ROOT, Truth, sleep_loader, stallscope, wait_until

from profiler import Session
from profiler.core.steps.clock import HANDOFF_S
from profiler.core.store import PhaseRow, StepRow, load_run
from profiler.export.endpoint import Endpoint, parse_endpoint
from profiler.export.metrics import job_metrics, run_metrics
from profiler.export.prometheus import ExporterError, PrometheusExporter, scrape_text
from profiler.jobs.analysis_live import RankRecent, job_live
from profiler.live.analysis import LiveAggregator, TotalsFolder
from profiler.live.feeds import SessionFeed, StoreFeed

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

IO_WAIT = str(ROOT / "tests/data/scenarios/io_wait.py")


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """One scrape, parsed by prometheus_client's own parser: sample name -> [(labels, value)]."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("stallscope_")
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(scraped: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    (_labels, value), *rest = scraped[name]
    assert not rest, scraped[name]
    return value


def per_step_stalls(run_dir: Path) -> list[float]:
    rec = load_run(run_dir)
    h2d: dict[int, float] = {}
    for p in rec.phases:
        if p.depth == 0 and p.name == "h2d":
            h2d[p.step] = h2d.get(p.step, 0.0) + p.t_end - p.t_start
    return [(s.data_wait_s + h2d.get(s.step, 0.0)) / (s.t_end - s.t_start) for s in rec.steps if not s.warmup]


# -- the endpoint's address ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("9464", Endpoint("127.0.0.1", 9464)),
        ("0", Endpoint("127.0.0.1", 0)),
        ("0.0.0.0:9464", Endpoint("0.0.0.0", 9464)),
        ("[::1]:80", Endpoint("::1", 80)),
        ("localhost:9464", Endpoint("localhost", 9464)),
    ],
)
def test_endpoints_parse_and_default_to_localhost(text: str, want: Endpoint) -> None:
    assert parse_endpoint(text) == want


@pytest.mark.parametrize("text", ["65536", "abc", "", ":", ":9464", "a:b:c", "-1", "9464:"])
def test_bad_endpoints_are_one_line_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="allowed PORT or ADDR:PORT") as info:
        parse_endpoint(text)
    assert repr(text) in str(info.value) and "\n" not in str(info.value)


# -- the metrics, from folded steps (pure) ------------------------------------------------------------------------


def _steps(n: int, wait: float, h2d: float, step: float, warmup: int = 0) -> list[tuple[StepRow, list[PhaseRow]]]:
    out = []
    for i in range(n):
        t0 = i * step
        phases = [
            PhaseRow(i, "h2d", 0, t0 + wait, t0 + wait + h2d),
            PhaseRow(i, "compute", 0, t0 + wait + h2d, t0 + step),
        ]
        out.append((StepRow(i, t0, t0 + step, wait, samples=8, warmup=i < warmup), phases))
    return out


def test_run_metrics_use_base_units_and_label_a_simulated_device() -> None:
    rows = _steps(20, wait=0.010, h2d=0.005, step=0.050, warmup=2)
    agg, folder = LiveAggregator(), TotalsFolder()
    agg.add_steps(rows)
    folder.add_steps(rows + rows[:5])  # handed twice: taken once
    agg.add_samples(
        [
            (
                1.0,
                {
                    "gpu0.util_pct": 40.0,
                    "gpu0.mem_used_mb": 2.0,
                    "sys.cpu_pct": 50.0,
                    "proc.main.cpu_pct": 150.0,
                    "gpu0.gpm_sm_active_pct": 30.0,
                    "gpu0.gpm_tensor_pct": 5.0,
                },
            )
        ]
    )
    meta = {"run_id": "abc", "scenario": "s", "device": {"kind": "sim", "name": "A100 (simulated)"}}
    got = {m.name: m for m in run_metrics(agg.snapshot(), folder.totals(), meta, "running")}
    sim = {"simulated": "true"}
    assert got["stallscope_steps"].samples == [(sim, 20.0)]
    assert got["stallscope_measured_steps"].samples == [(sim, 18.0)]
    assert got["stallscope_step_seconds"].samples[0][1] == pytest.approx(18 * 0.050)
    assert got["stallscope_run_stall_ratio"].samples[0][1] == pytest.approx(0.3)
    assert got["stallscope_stall_ratio"].samples[0][1] == pytest.approx(0.3)
    assert got["stallscope_data_wait_per_step_seconds"].samples[0][1] == pytest.approx(0.010)
    assert got["stallscope_throughput_samples_per_second"].samples[0][1] == pytest.approx(8 / 0.050)
    assert got["stallscope_device_utilisation_ratio"].samples == [({"device": "gpu0", **sim}, 0.4)]
    assert got["stallscope_device_memory_used_bytes"].samples == [({"device": "gpu0", **sim}, 2.0 * 2**20)]
    assert got["stallscope_device_activity_ratio"].samples == [
        ({"device": "gpu0", "counter": "sm_active", **sim}, 0.3),
        ({"device": "gpu0", "counter": "tensor", **sim}, 0.05),
    ]
    assert got["stallscope_host_cpu_ratio"].samples == [({}, 0.5)]  # the host is not simulated
    assert got["stallscope_process_cpu_cores"].samples == [({"process": "main"}, 1.5)]
    assert got["stallscope_run_info"].samples[0][0]["simulated"] == "true"
    assert {lab["status"]: v for lab, v in got["stallscope_run_status"].samples}["running"] == 1.0


def test_memory_figures_are_the_newest_reading_of_each_in_bytes() -> None:
    agg = LiveAggregator()
    first = {"mem.main.uss_mb": 100.0, "mem.w0.uss_mb": 20.0, "mem.w0.pss_mb": 30.0, "mem.total.pss_mb": 250.0}
    agg.add_samples([(1.0, {**first, "mem.shm.job_mb": 40.0, "mem.shm.used_mb": 41.0, "mem.shm.size_mb": 64.0})])
    # a later tick without a smaps reading (the memory source reads every second or more seldom): kept, not lost
    agg.add_samples([(1.1, {"sys.cpu_pct": 10.0, "mem.shm.used_mb": 45.0, "mem.shm.size_mb": 64.0})])
    got = {m.name: m for m in run_metrics(agg.snapshot(), TotalsFolder().totals(), {}, "running")}
    mib = 2**20
    assert got["stallscope_process_unique_memory_bytes"].samples == [
        ({"process": "main"}, 100 * mib), ({"process": "w0"}, 20 * mib)
    ]  # fmt: skip
    assert got["stallscope_process_proportional_memory_bytes"].samples == [({"process": "w0"}, 30 * mib)]
    assert got["stallscope_job_proportional_memory_bytes"].samples == [({}, 250 * mib)]
    assert got["stallscope_shm_job_bytes"].samples == [({}, 40 * mib)]
    assert got["stallscope_shm_used_bytes"].samples == [({}, 45 * mib)]  # the newest reading
    assert got["stallscope_shm_size_bytes"].samples == [({}, 64 * mib)]
    assert got["stallscope_host_available_memory_bytes"].samples == []  # never read: left out, not NaN


def test_figures_not_known_yet_are_left_out_not_nan() -> None:
    got = {m.name: m for m in run_metrics(LiveAggregator().snapshot(), TotalsFolder().totals(), {}, "running")}
    assert got["stallscope_stall_ratio"].samples == []
    assert got["stallscope_run_stall_ratio"].samples == []
    assert got["stallscope_steps"].samples == [({}, 0.0)]
    assert all(not math.isnan(v) for m in got.values() for _, v in m.samples)


def test_job_metrics_carry_the_rank() -> None:
    ranks = [RankRecent(r, _steps(10, wait=0.002 + 0.02 * r, h2d=0.0, step=0.05)) for r in range(2)]
    folders = {r.rank: TotalsFolder() for r in ranks}
    for r in ranks:
        folders[r.rank].add_steps(r.steps)
    got = {
        m.name: m for m in job_metrics(job_live(ranks), {k: f.totals() for k, f in folders.items()}, {}, {}, "running")
    }
    stall = {lab["rank"]: v for lab, v in got["stallscope_stall_ratio"].samples}
    assert stall == {"0": pytest.approx(0.04), "1": pytest.approx(0.44)}
    assert {lab["rank"] for lab, _ in got["stallscope_input_stall_seconds"].samples} == {"0", "1"}
    assert got["stallscope_job_throughput_samples_per_second"].samples[0][1] == pytest.approx(2 * 8 / 0.05)


# -- the truth: scraped during a run == the run's summary -------------------------------------------------------


def test_scraped_stall_matches_the_summary(tmp_path: Path) -> None:
    truth = Truth()
    n, warmup, mid = 40, 3, 25
    with PrometheusExporter(Endpoint("127.0.0.1", 0)) as exporter:
        with Session(tmp_path / "run", sample_hz=20, device="cpu", warmup=warmup) as s, exporter.follow(SessionFeed(s)):
            for i, _batch in enumerate(s.wrap(sleep_loader(n, 0.012, truth=truth))):
                with s.phase("compute"):
                    truth.sleep("compute", 0.018)
                if i == mid:
                    during = scrape(exporter.url)
            after = scrape(exporter.url)  # every step resolved (CPU: no device events pending), before close
        summary = s.summary()
    stalls = per_step_stalls(tmp_path / "run")
    spread = max(stalls) - min(stalls)
    assert {lab["status"]: v for lab, v in during["stallscope_run_status"]}["running"] == 1.0
    k = int(one(during, "stallscope_measured_steps_total"))
    # the Session hands its rows on every HANDOFF_S (profiler/core/session.py): a scrape sees the steps ended up to
    # the last hand-on, so as many steps behind as end in HANDOFF_S, and one more (the tick falls at a step's
    # start). Bounded at +-1 step, a stress pass read 20 at step 25 (3 warm-up): the ticks, not the exporter
    rec = load_run(tmp_path / "run")
    shortest = min(st.t_end - st.t_start for st in rec.steps)
    behind = math.ceil(HANDOFF_S / shortest) + 1
    assert mid - warmup - behind <= k <= mid - warmup + 1, (k, behind)
    # during: exactly the store's sums over the steps resolved then, and the final figure within the spread
    first = [st for st in rec.steps if not st.warmup][:k]
    assert one(during, "stallscope_data_wait_seconds_total") == pytest.approx(
        math.fsum(st.data_wait_s for st in first), rel=1e-9
    )
    for name in ("stallscope_run_stall_ratio", "stallscope_stall_ratio"):
        assert abs(one(during, name) - summary.stall_fraction) <= spread + 1e-9, (name, spread)
    # after the last step: the summary's own figure
    assert one(after, "stallscope_measured_steps_total") == summary.steps == n - warmup
    assert one(after, "stallscope_run_stall_ratio") == pytest.approx(summary.stall_fraction, rel=1e-9)
    assert one(after, "stallscope_steps_total") == n
    assert one(after, "stallscope_run_throughput_samples_per_second") == pytest.approx(
        summary.throughput_samples_per_s, rel=1e-6
    )
    # and that is the injected cost's stall: 12 ms of each 30 ms step
    injected = truth.mean_ms("data_wait", warmup) / (
        truth.mean_ms("data_wait", warmup) + truth.mean_ms("compute", warmup)
    )
    assert one(after, "stallscope_run_stall_ratio") == pytest.approx(injected, abs=0.05)


def test_a_finished_store_is_served_with_its_final_status(tmp_path: Path) -> None:
    """The feed ``watch`` follows (a store tail), and the figures after a run ends."""
    with Session(tmp_path / "run", sample_hz=20, device="cpu") as s:
        for _ in s.wrap(sleep_loader(15, 0.004)):
            with s.phase("compute"):
                time.sleep(0.004)
    summary = s.summary()
    exporter = PrometheusExporter(Endpoint("127.0.0.1", 0)).start()
    try:
        with exporter.follow(StoreFeed(tmp_path / "run")):
            pass
        got = {f.name: f for f in text_string_to_metric_families(scrape_text(exporter))}
    finally:
        exporter.close()
    status = {s.labels["status"]: s.value for s in got["stallscope_run_status"].samples}
    assert status["complete"] == 1.0 and status["running"] == 0.0
    assert got["stallscope_run_stall_ratio"].samples[0].value == pytest.approx(summary.stall_fraction, rel=1e-9)
    assert got["stallscope_steps"].type == "counter"
    assert got["stallscope_steps"].samples[0].name == "stallscope_steps_total"


def test_a_missing_prometheus_client_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(
        ExporterError, match=r"needs the prometheus_client package: pip install 'stallscope\[prometheus\]'"
    ):
        PrometheusExporter(Endpoint("127.0.0.1", 0)).start()


# -- the CLI --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [["run"], ["watch", "nowhere"], ["attach", "1"]])
def test_a_bad_port_is_exit_2_one_line(cmd: list[str]) -> None:
    r = stallscope(*cmd, "--prometheus", "70000", timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "70000" in r.stderr and "allowed PORT or ADDR:PORT" in r.stderr


def test_a_port_in_use_is_exit_2_one_line_and_no_run(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = stallscope(
            "run", IO_WAIT, "--steps", "1", "--no-live", "--prometheus", str(port), "--out", str(tmp_path / "r")
        )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "cannot listen there" in lines[0]
    assert not (tmp_path / "r").exists()


# light (tests/scheduling.py): a sleeping training loop served; 0.17-0.19 of a core in four CI runs, 4 s
@pytest.mark.light(seconds=4)
def test_run_serves_the_summary_stall_while_it_trains(tmp_path: Path) -> None:
    """`stallscope run --prometheus 0`, scraped from outside while it trains (the docs' sample scrape)."""
    out = tmp_path / "run"
    args = [
        IO_WAIT,
        "--batch-size",
        "2",
        "--steps",
        "50",
        "--no-live",
        "--json",
        "--prometheus",
        "0",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [*warm.argv(), "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("stallscope: Prometheus metrics at http://127.0.0.1:"), line
        url = line.split(" at ", 1)[1].strip()
        scraped: list[dict[str, list[tuple[dict[str, str], float]]]] = []

        def some_steps() -> bool:
            scraped.append(scrape(url))
            return bool(scraped[-1].get("stallscope_measured_steps_total", [({}, 0)])[0][1] >= 10)

        assert wait_until(some_steps, timeout=120, every=0.2)
        during = scraped[-1]
        stdout, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0
    final = __import__("json").loads(stdout)["stall_fraction"]
    spread = max(per_step_stalls(out)) - min(per_step_stalls(out))
    assert abs(one(during, "stallscope_run_stall_ratio") - final) <= spread + 1e-9
    assert one(during, "stallscope_run_stall_ratio") > 0.5  # io_wait at batch 2: 40 ms wait to 20 ms forward
    ((labels, _),) = during["stallscope_run_info"]
    assert labels["scenario"] == "io-wait" and labels["simulated"] == "false"


def test_a_session_serves_itself_for_integrations(tmp_path: Path) -> None:
    """``Session(..., prometheus=PORT)``: what the Lightning and HF integrations pass through."""
    with pytest.raises(ValueError, match="allowed PORT or ADDR:PORT"):
        Session(tmp_path / "bad", prometheus="nope")
    with Session(tmp_path / "run", sample_hz=20, device="cpu", prometheus="127.0.0.1:0") as s:
        assert s.exporter is not None
        url = s.exporter.url
        for _ in s.wrap(sleep_loader(6, 0.003)):
            with s.phase("compute"):
                time.sleep(0.003)
        # served from the sampler process, which has the steps once it drains them (every 0.1 s)
        served = lambda: scrape(url).get("stallscope_steps_total", [({}, 0)])[0][1]  # noqa: E731
        assert wait_until(lambda: served() == 6, timeout=10, every=0.05), served()
        assert s.recording.serving_views  # and it was the sampler process that answered
    with pytest.raises(OSError):  # closed with the session: the port is free
        urllib.request.urlopen(url, timeout=2)


def _serving(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A stallscope command started with ``--prometheus 0`` and the address it printed first."""
    cut = args.index("--") if "--" in args else len(args)
    proc = subprocess.Popen(
        [*warm.argv(), *args[:cut], "--prometheus", "0", *args[cut:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("stallscope: Prometheus metrics at http://127.0.0.1:"), line
    return proc, line.split(" at ", 1)[1].strip()


# light (tests/scheduling.py): a sleeping training loop served; 0.11-0.13 of a core in four CI runs, 7 s
@pytest.mark.light(seconds=7)
def test_zero_code_serves_the_sampler(tmp_path: Path) -> None:
    script = "import time; time.sleep(6)"
    proc, url = _serving(["run", "--no-live", "--out", str(tmp_path / "z"), "--", sys.executable, "-c", script])
    try:
        got: list[dict[str, list[tuple[dict[str, str], float]]]] = []
        assert wait_until(lambda: bool(got.append(scrape(url)) or "stallscope_host_cpu_ratio" in got[-1]), 60, 0.25)
        ((labels, _),) = got[-1]["stallscope_run_info"]
        assert labels["mode"] == "zero-code"
        assert 0.0 <= one(got[-1], "stallscope_host_cpu_ratio") <= 1.0
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# light (tests/scheduling.py): a sleeping training loop served; 0.10-0.11 of a core in four CI runs, 6 s
@pytest.mark.light(seconds=6)
def test_watch_serves_the_run_it_follows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with Session(run, sample_hz=20, device="cpu") as s:
        it = s.wrap(sleep_loader(100_000, 0.005))
        next(it)  # the store exists and the run is "running"
        proc, url = _serving(["watch", str(run)])
        try:
            got: list[dict[str, list[tuple[dict[str, str], float]]]] = []

            def ten_steps() -> bool:
                next(it)  # the watched run goes on while the test scrapes
                got.append(scrape(url))
                return got[-1].get("stallscope_steps_total", [({}, 0.0)])[0][1] >= 10

            assert wait_until(ten_steps, 60, 0.02)
        finally:
            it.close()
    assert proc.wait(timeout=60) == 0  # the run ended: watch printed its report and exited
    ((labels, _),) = got[-1]["stallscope_run_info"]
    assert labels["run_id"] == s.meta["run_id"]


class _FlakyFeed:
    """A run feed whose second and later polls fail."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> tuple[list[tuple[StepRow, list[PhaseRow]]], list[tuple[float, dict[str, float]]]]:
        self.polls += 1
        if self.polls > 1:
            raise OSError("store gone")
        return _steps(5, wait=0.01, h2d=0.0, step=0.02), []

    def status(self) -> str:
        return "running"

    def meta(self) -> dict[str, object]:
        return {}


def test_a_failing_feed_keeps_the_last_figures_and_its_error() -> None:
    exporter = PrometheusExporter(Endpoint("127.0.0.1", 0), poll_s=0.01).start()
    try:
        with exporter.follow(_FlakyFeed()):
            got = {f.name: f for f in text_string_to_metric_families(scrape_text(exporter))}
    finally:
        exporter.close()
    assert got["stallscope_steps"].samples[0].value == 5
    assert isinstance(exporter.error, OSError) and "store gone" in str(exporter.error)
