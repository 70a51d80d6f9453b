"""The HTML report: recorded runs rendered and parsed section by section; timeline series from known records.

Recorded stores are copied to tmp_path before reading: opening a WAL store may checkpoint it, which would
modify the checked-in files.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from profiler.analysis import Summary, summarize
from profiler.analysis.timeline import (
    Timeline,
    auto_bucket_s,
    build_timeline,
    group_steps,
    nice_ceil,
    process_cpu_series,
    rolling_stall,
    sample_series,
    step_rows,
)
from profiler.core.store import PhaseRow, RunRecord, StepRow, load_run
from profiler.render.html import render_html, write_html
from profiler.render.svg import Line, Stack, line_chart, nice_ticks, stacked_bars

RUNS = Path(__file__).parent / "data" / "runs"
RUN_NAMES = ("cpu-workers", "nvml-fake", "interrupted")
SECTION_IDS = ("header", "verdict", "figures", "breakdown", "recommendations", "plots", "sampler", "notes")
PLOT_IDS = ("plot-utilisation", "plot-steps", "plot-process-cpu")
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}


# -- a small DOM from html.parser --------------------------------------------------------------------


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # own text and children's text, in document order

    def text(self) -> str:
        # fragments joined by a space: adjacent cells and headings must not run together
        return " ".join(" ".join(self.texts).split())

    def iter(self) -> list[Node]:
        out = [self]
        for c in self.children:
            out += c.iter()
        return out

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        return [
            n
            for n in self.iter()
            if (tag is None or n.tag == tag) and all(n.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def find(self, tag: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, **attrs)
        assert found, f"no <{tag}> with {attrs}"
        return found[0]


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        for n in self.stack:
            n.texts.append(data)


def parse(doc: str) -> Node:
    b = _TreeBuilder()
    b.feed(doc)
    b.close()
    assert b.stack == [b.root], "unclosed elements: " + ", ".join(n.tag for n in b.stack[1:])
    return b.root


# -- recorded runs -------------------------------------------------------------------------------------


def copy_run(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(RUNS / name, dst)
    return dst


def rendered(tmp_path: Path, name: str) -> tuple[Summary, Timeline, str, Node]:
    rec = load_run(copy_run(tmp_path, name))
    # a fixed clock far after the recording: the killed run's stale heartbeat makes it "interrupted" on any host
    s = summarize(rec, now=float(rec.meta["heartbeat"]) + 3600)
    tl = build_timeline(rec)
    doc = render_html(s, tl)
    return s, tl, doc, parse(doc)


@pytest.mark.parametrize("name", RUN_NAMES)
def test_sections_and_plots_present(tmp_path: Path, name: str) -> None:
    _s, _tl, _doc, root = rendered(tmp_path, name)
    for sid in SECTION_IDS:
        assert root.find_all(id=sid), f"section #{sid} missing"
    plots = root.find(id="plots")
    for pid in PLOT_IDS:
        fig = plots.find("figure", id=pid)
        assert fig.find_all("svg"), f"{pid} has no chart"
        assert "sampled" in fig.find("figcaption").text() or "perf_counter" in fig.find("figcaption").text()
        labels = [t.text() for t in fig.find_all("text") if t.attrs.get("class") in ("x-label", "y-label")]
        assert len(labels) == 2 and all(re.search(r"\((s|ms|index|%.*)\)$", lab) for lab in labels), labels


@pytest.mark.parametrize("name", RUN_NAMES)
def test_header_and_verdict_match_summary(tmp_path: Path, name: str) -> None:
    s, _tl, _doc, root = rendered(tmp_path, name)
    header = root.find(id="header")
    field_text = {dd.attrs["data-field"]: dd.text() for dd in header.find_all("dd")}
    assert field_text["scenario"] == s.scenario
    assert field_text["pipeline"] == (s.pipeline or "?")
    assert field_text["status"] == s.status
    assert field_text["run id"] == s.run_id
    assert field_text["workers"] == ("n/a" if s.workers is None else str(s.workers))
    assert field_text["batch"] == str(s.batch_size)
    assert s.device.name in field_text["device"]
    verdict = next(p for p in root.find(id="verdict").find_all("p") if "data-verdict" in p.attrs)
    assert verdict.text() == verdict.attrs["data-verdict"] == s.verdict
    assert f"stall {s.stall_fraction * 100:.1f}%" in root.find(id="verdict").text()


@pytest.mark.parametrize("name", RUN_NAMES)
def test_figures_and_breakdown_numbers_are_the_summarys(tmp_path: Path, name: str) -> None:
    s, _tl, _doc, root = rendered(tmp_path, name)
    figures = {tr.attrs["data-figure"]: tr.find("td").text() for tr in root.find(id="figures").find_all("tr")}
    st = s.step_time_ms
    assert figures["step time"] == f"mean {st.mean:.1f} ms p50 {st.p50:.1f} ms p90 {st.p90:.1f} ms"
    assert figures["throughput"].startswith(f"{s.throughput_samples_per_s:.1f} samples/s")
    assert figures["stall fraction"].startswith(f"{s.stall_fraction * 100:.1f}%")
    assert figures["device busy"].startswith(f"{s.device_busy_fraction * 100:.1f}%")
    assert f"{s.host.total_rss_mb_max:.0f} MiB" in figures["host RSS"]

    rows = root.find(id="breakdown").find_all("tr")
    by_part = {tr.attrs["data-part"]: tr for tr in rows if "data-part" in tr.attrs}
    assert list(by_part) == [*(k for k, _ in s.breakdown_ms_per_step.items()), "step"]  # same parts, same order
    for part, value in s.breakdown_ms_per_step.items():
        tr = by_part[part]
        assert tr.find("td", **{"class": "num ms"}).text() == f"{value:.2f}"
        assert tr.find("td", **{"class": "num share"}).text() == f"{value / st.mean * 100:.1f}%"
        assert tr.find("td", **{"class": "src"}).text()  # every row names its instrument
    assert by_part["step"].find("td", **{"class": "num ms"}).text() == f"{st.mean:.2f}"


@pytest.mark.parametrize("name", RUN_NAMES)
def test_recommendations_and_sampler(tmp_path: Path, name: str) -> None:
    s, _tl, _doc, root = rendered(tmp_path, name)
    codes = [li.attrs["data-code"] for li in root.find(id="recommendations").find_all("li")]
    assert codes == [r.code for r in s.recommendations] and codes
    recs = root.find(id="recommendations").text()
    assert all(" ".join(r.text.split()) in recs for r in s.recommendations)

    sampler = root.find(id="sampler")
    assert f"{s.sampler.hz_achieved:.1f} Hz achieved of {s.sampler.hz_requested:g} Hz" in sampler.text()
    assert f"p95 {s.sampler.lateness_ms.p95:.2f} ms" in sampler.text()
    assert f"{s.sampler.read_ms_mean:.2f} ms per round" in sampler.text()
    sources = {
        tr.attrs["data-source"]: tr.find_all("td")[0].text() for tr in sampler.iter() if "data-source" in tr.attrs
    }
    assert sources == {k: " ".join(v.split()) for k, v in s.sampler.sources.items()}


def test_interrupted_run_is_marked(tmp_path: Path) -> None:
    s, _tl, _doc, root = rendered(tmp_path, "interrupted")
    assert s.status == "interrupted"
    banner = root.find(id="status-banner")
    assert banner.text().startswith("Run interrupted")
    assert root.find(id="header").find("span").text() == "interrupted"
    assert root.find("body").attrs["class"] == "status-interrupted"
    assert root.find("title").text().endswith("[interrupted]")  # visible in the browser tab too
    assert "missed deadlines n/a" in root.find(id="sampler").text()  # written only at a clean close


@pytest.mark.parametrize("name", ["cpu-workers", "nvml-fake"])
def test_complete_run_has_no_banner(tmp_path: Path, name: str) -> None:
    s, _tl, _doc, root = rendered(tmp_path, name)
    assert s.status == "complete"
    assert not root.find_all(id="status-banner")


def _series_labels(root: Node, plot_id: str) -> list[str]:
    return [g.attrs["data-label"] for g in root.find(id=plot_id).find_all("g", **{"class": "series"})]


def test_nvml_run_plots_gpu_utilisation(tmp_path: Path) -> None:
    s, tl, _doc, root = rendered(tmp_path, "nvml-fake")
    assert [g.metric for g in tl.gpu_util] == ["gpu0.util_pct"]
    assert len(tl.gpu_util[0].t) == s.sampler.samples
    labels = _series_labels(root, "plot-utilisation")
    assert labels[0] == "gpu0 utilization.gpu" and any(lab.startswith("stall") for lab in labels)
    gpu = root.find(id="plot-utilisation").find("g", data_label="gpu0 utilization.gpu")
    assert sum(len(p.attrs["points"].split()) for p in gpu.find_all("polyline")) == len(tl.gpu_util[0].t)
    assert "NVML utilization.gpu" in root.find(id="plot-utilisation").find("figcaption").text()
    assert f"gpu0 {s.nvml.util_pct['gpu0']:.0f}%" in root.find(id="figures").text()


@pytest.mark.parametrize("name", ["cpu-workers", "interrupted"])
def test_no_nvml_says_why(tmp_path: Path, name: str) -> None:
    s, tl, _doc, root = rendered(tmp_path, name)
    assert tl.gpu_util == ()
    reason = " ".join(s.device.nvml.split())
    assert reason.startswith("unavailable")
    # said once, where every source's status is (issue #66): the caption and the figures point there
    assert "the sampler's sources below say why" in root.find(id="plot-utilisation").find("figcaption").text()
    assert not any("utilization.gpu" in lab for lab in _series_labels(root, "plot-utilisation"))
    assert reason.removeprefix("unavailable: ") in " ".join(root.find(id="sampler").text().split())
    assert " ".join(root.text().split()).count(reason.removeprefix("unavailable: ")) == 1


def test_worker_run_plots_each_process(tmp_path: Path) -> None:
    _s, tl, _doc, root = rendered(tmp_path, "cpu-workers")
    assert [p.label for p in tl.process_cpu] == ["main", "w0", "w1"]
    assert _series_labels(root, "plot-process-cpu") == ["main", "w0", "w1"]
    assert "(w0, w1)" in root.find(id="plot-process-cpu").find("figcaption").text()


@pytest.mark.parametrize("name", RUN_NAMES)
def test_step_bars_mark_warmup(tmp_path: Path, name: str) -> None:
    s, _tl, _doc, root = rendered(tmp_path, name)
    steps = root.find(id="plot-steps")
    rects = steps.find_all("rect")
    assert {r.attrs.get("data-part") for r in rects} >= {"data_wait", "compute"}
    pale = [r for r in rects if r.attrs.get("fill-opacity") == "0.45"]
    assert pale and len({r.attrs["x"] for r in pale}) == s.warmup_steps  # one pale bar per warm-up step
    assert steps.find_all("rect", **{"class": "band"})


@pytest.mark.parametrize("name", RUN_NAMES)
def test_self_contained_no_urls(tmp_path: Path, name: str) -> None:
    _s, _tl, doc, root = rendered(tmp_path, name)
    assert "http://" not in doc and "https://" not in doc
    assert "@import" not in doc and "url(" not in doc
    assert not root.find_all("script") and not root.find_all("link") and not root.find_all("img")
    for n in root.iter():
        for attr in ("src", "href", "xlink:href", "srcset"):
            assert attr not in n.attrs, f"<{n.tag} {attr}=...> fetches or links out"
    assert len(root.find_all("style")) == 1


@pytest.mark.parametrize("name", RUN_NAMES)
def test_svgs_are_well_formed_with_finite_coordinates(tmp_path: Path, name: str) -> None:
    _s, _tl, doc, _root = rendered(tmp_path, name)
    svgs = re.findall(r"<svg\b.*?</svg>", doc, flags=re.S)
    assert len(svgs) == 3
    for svg in svgs:
        tree = ET.fromstring(svg)  # raises on anything not well-formed XML
        assert tree.find("title") is not None
        for el in tree.iter():
            for key in ("x", "y", "width", "height", "x1", "y1", "x2", "y2", "cx", "cy"):
                if key in el.attrib:
                    assert math.isfinite(float(el.attrib[key])), (el.tag, key, el.attrib[key])
            if el.tag == "rect":
                assert float(el.attrib["width"]) >= 0 and float(el.attrib["height"]) >= 0
            if el.tag == "polyline":
                pts = [float(v) for p in el.attrib["points"].split() for v in p.split(",")]
                assert pts and all(math.isfinite(v) for v in pts)


def test_text_is_escaped() -> None:
    rec = known_record(status="failed", error="RuntimeError: <b>boom</b> & more (at x.py:1 in f)")
    rec.meta["scenario"] = "<script>alert(1)</script>"
    doc = render_html(summarize(rec), build_timeline(rec))
    assert "<script" not in doc and "<b>" not in doc
    root = parse(doc)
    assert root.find(id="header").find("dd", data_field="scenario").text() == "<script>alert(1)</script>"
    assert "Run failed" in root.find(id="status-banner").text()
    assert "<b>boom</b> & more" in root.find(id="notes").text()


def test_empty_record_renders() -> None:
    rec = RunRecord({"schema_version": 1, "status": "interrupted"}, [], [], [], [])
    s = summarize(rec)
    doc = render_html(s, build_timeline(rec), title="nothing yet")
    root = parse(doc)
    assert root.find("title").text() == "nothing yet"
    assert "No data recorded for this plot." in root.find(id="plots").text()
    assert root.find(id="verdict").find("p").text() == s.verdict == "unknown: no measured steps"


# -- write_html ------------------------------------------------------------------------------------------


def test_write_html_writes_the_rendered_report(tmp_path: Path) -> None:
    rec = load_run(copy_run(tmp_path, "nvml-fake"))
    out = write_html(summarize(rec), rec, tmp_path / "r.html")
    assert out == tmp_path / "r.html"
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    parse(text)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_write_html_rejects_bad_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = load_run(copy_run(tmp_path, "cpu-workers"))
    with pytest.raises(ValueError, match="is a directory"):
        write_html(summarize(rec), rec, tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        write_html(summarize(rec), rec, tmp_path / "no" / "such" / "r.html")

    def refuse(src: str, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match=r"cannot write HTML report '.*r\.html': Permission denied"):
        write_html(summarize(rec), rec, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- timeline: pure, against hand-built records ------------------------------------------------------


def known_record(
    n: int = 10,
    *,
    wait: float = 0.03,
    h2d: float = 0.0,
    compute: float = 0.06,
    warmup: int = 1,
    status: str = "complete",
    error: str | None = None,
) -> RunRecord:
    """``n`` back-to-back 100 ms steps from t=0: wait, then h2d (if any), then compute; the rest unaccounted."""
    steps, phases = [], []
    for i in range(n):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, wait, 8, i < warmup))
        if h2d:
            phases.append(PhaseRow(i, "h2d", 0, t + wait, t + wait + h2d))
        phases.append(PhaseRow(i, "compute", 0, t + wait + h2d, t + wait + h2d + compute))
    samples: list[tuple[float, str, str, float | None]] = []
    for k in range(n + 1):
        t = k * 0.1
        samples += [
            (t, "sampler", "sampler.lateness_ms", 0.5),
            (t, "host", "proc.main.cpu_pct", 90.0),
            (t, "host", "sys.cpu_pct", 50.0),
            (t, "host", "proc.total.rss_mb", 100.0),
        ]
    meta = {
        "schema_version": 1,
        "run_id": "r1",
        "scenario": "known",
        "pipeline": "naive",
        "batch_size": 8,
        "workers": 0,
        "sample_hz": 10.0,
        "device": {"kind": "cpu", "torch_device": "cpu", "name": "Test CPU"},
        "status": status,
        "error": error,
    }
    return RunRecord(meta, steps, phases, samples, [(0.0, "source", "host", "available")])


def test_rolling_stall_of_30ms_wait_in_100ms_steps_is_30_percent() -> None:
    buckets = rolling_stall(known_record(), 0.5)
    assert [(b.t_start, b.t_end) for b in buckets] == [(0.0, 0.5), (0.5, 1.0)]
    for b in buckets:
        assert b.stall_fraction == pytest.approx(0.30)
        assert b.step_s == pytest.approx(0.5)


def test_rolling_stall_counts_h2d_and_is_time_weighted() -> None:
    assert all(b.stall_fraction == pytest.approx(0.40) for b in rolling_stall(known_record(h2d=0.01), 0.5))
    # 0.25 s buckets cut step 2 in half: [0, 0.25) holds waits of steps 0, 1 and 2 (3 x 30 ms) in 250 ms
    first = rolling_stall(known_record(), 0.25)[0]
    assert first.stall_s == pytest.approx(0.09)
    assert first.stall_fraction == pytest.approx(0.36)


def test_rolling_stall_gap_is_nan_not_zero() -> None:
    rec = known_record()
    late = [StepRow(s.step, s.t_start + 1.5 * (s.step >= 5), s.t_end + 1.5 * (s.step >= 5), 0.03, 8, False)
            for s in rec.steps]  # fmt: skip
    buckets = rolling_stall(RunRecord(rec.meta, late, [], [], []), 0.5)
    fractions = [b.stall_fraction for b in buckets]
    assert fractions[0] == pytest.approx(0.3) and fractions[-1] == pytest.approx(0.3)
    assert math.isnan(fractions[1]) and math.isnan(fractions[2])
    assert buckets[1].step_s == 0.0


def test_step_rows_parts_and_means_match_summary() -> None:
    rec = known_record(h2d=0.01)
    rows = step_rows(rec)
    assert len(rows) == 10 and rows[0].warmup and not any(r.warmup for r in rows[1:])
    r = rows[3]
    assert list(r.parts_ms) == ["data_wait", "h2d", "compute", "other"]
    assert r.parts_ms["data_wait"] == pytest.approx(30.0)
    assert r.parts_ms["h2d"] == pytest.approx(10.0)
    assert r.parts_ms["compute"] == pytest.approx(60.0)
    assert r.parts_ms["other"] == pytest.approx(0.0, abs=1e-9)
    assert r.stall_fraction == pytest.approx(0.4)
    s = summarize(rec)
    measured = [x for x in rows if not x.warmup]
    for part, value in s.breakdown_ms_per_step.items():
        assert math.fsum(x.parts_ms[part] for x in measured) / len(measured) == pytest.approx(value, abs=1e-9)


def test_user_phases_sorted_between_compute_and_other() -> None:
    rec = known_record()
    rec.phases.append(PhaseRow(2, "zlog", 0, 0.29, 0.295))
    rec.phases.append(PhaseRow(2, "augment", 0, 0.295, 0.3))
    rec.phases.append(PhaseRow(2, "compute/forward", 1, 0.24, 0.25))  # nested: never a part of its own
    tl = build_timeline(rec)
    assert tl.parts == ("data_wait", "h2d", "compute", "augment", "zlog", "other")
    assert tl.steps[2].parts_ms["augment"] == pytest.approx(5.0)
    assert tl.steps[1].parts_ms["augment"] == 0.0


def cuda_record() -> RunRecord:
    """10 CUDA steps of 100 ms: 30 ms wait, 1 ms host copy, then the device copies for 10 ms; compute runs on the
    device from +51 ms until 30.5 ms into the next step, hiding its data wait and 0.5 ms of its host copy."""
    rec = known_record(h2d=0.001, warmup=0)
    rec.meta["device"] = {"kind": "cuda", "torch_device": "cuda:0", "name": "Fake GPU"}
    phases = []
    for p in rec.phases:
        t = rec.steps[p.step].t_start
        dev = (p.t_end, p.t_end + 0.01) if p.name == "h2d" else (t + 0.051, t + 0.1305)
        phases.append(PhaseRow(p.step, p.name, 0, p.t_start, p.t_end, *dev))
    return RunRecord(rec.meta, rec.steps, phases, rec.samples, rec.events)


def test_cuda_stall_and_breakdown_follow_the_summary() -> None:
    rec = cuda_record()
    tl = build_timeline(rec, bucket_s=0.5)
    assert tl.on_cuda
    first, later = tl.steps[0], tl.steps[4]
    assert first.stall_ms == pytest.approx(41.0)  # wait + host copy + device copy, nothing computing yet
    assert first.parts_ms["h2d"] == pytest.approx(1.0)
    assert later.stall_ms == pytest.approx(10.5)  # the previous step's compute hides the wait and 0.5 ms of copy
    assert later.parts_ms["h2d"] == pytest.approx(0.5)
    assert later.parts_ms["compute"] == pytest.approx(60.5)  # the copy drained queued compute: that is compute
    s = summarize(rec)
    for part in ("data_wait", "h2d", "compute"):
        mean_ms = math.fsum(x.parts_ms[part] for x in tl.steps) / len(tl.steps)
        assert mean_ms == pytest.approx(s.breakdown_ms_per_step[part])
    stall = math.fsum(x.stall_ms for x in tl.steps) / math.fsum(x.step_ms for x in tl.steps)
    assert stall == pytest.approx(s.stall_fraction) and stall == pytest.approx((41 + 9 * 10.5) / 1000)
    assert tl.stall[1].stall_fraction == pytest.approx(0.105)


def test_group_steps_never_mixes_warmup() -> None:
    rows = step_rows(known_record(warmup=1))
    groups = group_steps(rows, 3)
    assert [(g.first_step, g.last_step, g.count, g.warmup) for g in groups] == [
        (0, 0, 1, True),
        (1, 3, 3, False),
        (4, 6, 3, False),
        (7, 9, 3, False),
    ]
    assert groups[1].step_ms == pytest.approx(100.0)
    assert groups[1].parts_ms["data_wait"] == pytest.approx(30.0)
    assert groups[1].stall_fraction == pytest.approx(0.3)
    tl = build_timeline(known_record(warmup=1), max_bars=4)
    assert tl.bar_group == 3 and len(tl.bars) == 4 and len(tl.steps) == 10
    tl = build_timeline(known_record(n=12, warmup=1), max_bars=4)  # 12/4 = 3 a group would give 5 bars
    assert len(tl.bars) == 4 and tl.bar_group == 4
    with pytest.raises(ValueError):
        group_steps(rows, 0)


def test_sample_series_units_gaps_and_process_order() -> None:
    samples: list[tuple[float, str, str, float | None]] = [
        (0.0, "host", "proc.w10.cpu_pct", 1.0),
        (0.0, "host", "proc.w2.cpu_pct", 2.0),
        (0.0, "host", "proc.main.cpu_pct", 3.0),
        (0.0, "host", "proc.children.cpu_pct", 3.0),
        (0.0, "host", "proc.total.cpu_pct", 6.0),
        (0.0, "host", "proc.main.rss_mb", 6.0),
        (0.0, "nvml", "gpu1.util_pct", 5.0),
        (0.0, "nvml", "gpu0.util_pct", 50.0),
        (0.1, "nvml", "gpu0.util_pct", None),
        (0.2, "nvml", "gpu0.util_pct", 70.0),
        (0.0, "nvml", "gpu0.pcie_rx_mbps", 7.0),
        (0.0, "nvml", "gpu0.mem_util_pct", 9.0),
    ]
    rec = RunRecord({"schema_version": 1}, [], [], samples, [])
    series = sample_series(rec)
    g0 = series["gpu0.util_pct"]
    assert g0.t == (0.0, 0.1, 0.2) and g0.values[0] == 50.0 and math.isnan(g0.values[1])
    assert (g0.label, g0.source, g0.unit) == ("gpu0", "nvml", "%")
    assert series["gpu0.pcie_rx_mbps"].unit == "MB/s" and series["proc.main.rss_mb"].unit == "MiB"
    assert [s.label for s in process_cpu_series(series)] == ["main", "w2", "w10"]
    tl = build_timeline(rec)
    assert [s.metric for s in tl.gpu_util] == ["gpu0.util_pct", "gpu1.util_pct"]
    assert tl.host_cpu is None and tl.steps == () and tl.stall == () and tl.duration_s == 0.2


def test_bucket_width_choice() -> None:
    assert auto_bucket_s(known_record()) == 0.5  # 5 x 100 ms median step
    assert auto_bucket_s(RunRecord({}, [], [], [], [])) == 1.0
    assert [nice_ceil(x) for x in (0.3, 1.0, 0.11, 2.0000001, 7, 0.001)] == [0.5, 1.0, 0.2, 5.0, 10.0, 0.001]
    with pytest.raises(ValueError):
        build_timeline(known_record(), bucket_s=0.0)


# -- svg helpers --------------------------------------------------------------------------------------


def test_nice_ticks() -> None:
    assert nice_ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0, 4.03, 8) == [0, 1, 2, 3, 4]
    assert nice_ticks(0, 3.5, 8) == [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5]
    assert nice_ticks(0, math.nan) == []


def test_line_chart_breaks_at_nan_and_stays_finite() -> None:
    svg = line_chart(
        [Line("a", [0, 1, 2, 3, 4], [1, 2, math.nan, 3, 4], "#000"), Line("b", [0, 1], [math.inf, 5], "#111")],
        title="t & <x>",
        chart_id="c",
        x_label="time (s)",
        y_label="percent (%)",
    )
    tree = ET.fromstring(svg)
    assert len(tree.findall(".//polyline")) == 2  # a: two runs around the NaN
    assert len(tree.findall(".//circle")) == 1  # b: one finite point left, drawn as a dot
    assert tree.find("title").text == "t & <x>"  # type: ignore[union-attr]


def test_stacked_bars_checks_lengths() -> None:
    with pytest.raises(ValueError):
        stacked_bars([0, 1], [1, 2], [Stack("a", [1.0], "#000")], title="t", chart_id="c", x_label="x", y_label="y")
