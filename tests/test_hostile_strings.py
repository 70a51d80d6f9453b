"""Hostile strings in a run store: the HTML report escapes every one and the trace keeps them, as valid JSON.

A run recorded through the Session API puts markup, quotes, line breaks, ``</style>``, ``-->`` and bidi or
non-Latin characters where a user's data can reach the report: the scenario and pipeline names, the run
directory's own name, the data and scenario paths, phase names, events and the error of a failed run. The HTML
is parsed (html.parser): it holds no element, attribute or comment that came from the data, only text; the
trace is parsed by json.loads and still holds every string. ``report --html`` and ``--trace`` are also run
through the CLI on such a store.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import profiler.cli
from profiler.analysis import summarize
from profiler.analysis.timeline import build_timeline
from profiler.core.session import Session
from profiler.core.store import load_run
from profiler.render.html import render_html
from profiler.render.trace import trace_events

HOSTILE = (
    "<script>alert(1)</script>",
    "\"'><img src=http://127.0.0.1:9/x.png onerror=alert(1)>",
    "line one\nline two\r\nthree",
    "</style><script>document.title='x'</script>",
    "--><!-- <b>",
    "\u202eevil\u202c \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
    "</title></head><body onload=alert(1)>",
    "&amp; &lt;tag&gt; &#x3c;",
    "\U0001f4a5 \u00fcn\u00efc\u00f8d\u00e9 \u2028sep",
    "]]><![CDATA[x]]>",
)
# The report's own markup: anything else (a <script>, an <img>, an on* attribute) came from the data.
REPORT_TAGS = {
    "html", "head", "meta", "title", "style", "body", "header", "section", "h1", "h2", "h3", "p", "div", "span",
    "table", "thead", "tbody", "tr", "th", "td", "ul", "ol", "li", "figure", "figcaption", "footer", "small", "b",
    "strong", "em", "code", "svg", "g", "rect", "line", "path", "polyline", "text", "tspan", "circle",
    "dl", "dt", "dd", "br", "details", "summary", "abbr", "sup", "sub", "i", "nav", "a", "pre", "kbd", "caption",
    "colgroup", "col", "hr",
}  # fmt: skip


class Doc(HTMLParser):
    """What html.parser makes of a document: tags, attributes, text, comments and raw style/script content."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.comments: list[str] = []
        self.raw: list[tuple[str, str]] = []  # (style|script, content)
        self._open: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._open and self._open[-1] in ("style", "script"):
            self.raw.append((self._open[-1], data))
        else:
            self.text.append(data)

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)

    def handle_decl(self, decl: str) -> None:
        if decl.lower() != "doctype html":
            self.comments.append(decl)

    def unknown_decl(self, data: str) -> None:
        self.comments.append(data)

    def handle_pi(self, data: str) -> None:
        self.comments.append(data)


def folded(text: str) -> str:
    return " ".join(text.split())


FIELDS = ("run_dir", "scenario", "data_root", "model", "pipeline", "phase", "error", "event", "scenario_source")


def record(out: Path, hostile: dict[str, str]) -> Path:
    """A failed run whose names, paths, phase, event and error are ``hostile[FIELD]``; returns its directory."""
    run_dir = out / hostile["run_dir"].replace("/", "_")
    meta = {k: hostile[k] for k in ("data_root", "scenario_source", "model")}
    labels = {"scenario": hostile["scenario"], "pipeline": hostile["pipeline"]}
    s = Session(run_dir, sample_hz=50, device="cpu", sources=[], meta={**labels, **meta})
    s.start()
    for _batch in s.wrap(iter([[0] * 4] * 3)):
        with s.phase(hostile["phase"].replace("/", "_")):
            pass
    s.event("warning", hostile["event"])
    s.close(status="failed", error=hostile["error"])
    return run_dir


def strings(x: Any) -> Iterator[str]:
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from strings(v)


def check_html(doc: str, hostile: list[str]) -> None:
    d = Doc(doc)
    assert not [t for t, _ in d.tags if t not in REPORT_TAGS], [t for t, _ in d.tags if t not in REPORT_TAGS]
    assert not [t for t, _ in d.tags if t == "script"], "a <script> element"
    for tag, attrs in d.tags:
        bad = [k for k in attrs if k.startswith("on") or k in ("src", "href", "srcset", "action", "background")]
        assert not bad, f"<{tag}> has {bad}"
    text = folded(" ".join(d.text))
    for h in hostile:
        fragments = [f for f in folded(h).split(" ") if len(f) > 2]
        for f in fragments:
            for where, content in d.raw:
                assert f not in content, f"{f!r} inside <{where}>"
            assert not any(f in c for c in d.comments), f"{f!r} inside a comment"
    for h in (x for x in hostile if folded(x)):
        assert folded(h) in text or any(folded(h) in folded(t) for t in d.text), f"{h!r} is not shown as text"
    assert len([1 for t, _ in d.tags if t == "style"]) == 1, "the data opened or closed a <style>"
    assert not d.comments, f"a comment or declaration: {d.comments[:1]}"  # the report writes none
    assert [t for t, _ in d.tags][-1:] == ["footer"] or "footer" in [t for t, _ in d.tags], "the document was cut"
    assert "loads nothing from the network" in text, "the footer is no longer text: the data swallowed it"


def check_trace(doc: dict[str, Any], hostile: list[str]) -> None:
    text = json.dumps(doc, allow_nan=False)
    back = json.loads(text)
    found = " ".join(strings(back))
    for h in hostile:
        assert h.replace("/", "_") in found or h in found, f"{h!r} is missing from the trace"


def test_hostile_strings_fixed(tmp_path: Path) -> None:
    """Every fixed hostile string, through the store, the HTML report and the trace; and the CLI's --html/--trace."""
    hostile = dict(zip(FIELDS, HOSTILE, strict=False))
    hostile["error"] += " " + HOSTILE[-1]
    run_dir = record(tmp_path, hostile)
    rec = load_run(run_dir)
    summary = summarize(rec)
    doc = render_html(summary, build_timeline(rec))
    shown = [h for h in hostile.values() if folded(h) in folded(" ".join(Doc(doc).text))]
    assert {hostile["scenario"], hostile["error"]} <= set(shown), "the report no longer shows the name or the error"
    check_html(doc, shown)
    check_trace(trace_events(rec), [hostile["scenario"], hostile["pipeline"], hostile["phase"]])
    html, trace = tmp_path / "report.html", tmp_path / "trace.json"
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = profiler.cli.main(["report", str(run_dir), "--html", str(html), "--trace", str(trace)])
    assert code == 0, err.getvalue()
    check_html(html.read_text(encoding="utf-8"), shown)
    check_trace(json.loads(trace.read_text(encoding="utf-8")), [hostile["scenario"], hostile["pipeline"]])


PIECES = st.sampled_from(["<", ">", "&", '"', "'", "/", "\n", "-->", "<!--", "</style>", "<script>", "\u202e", "\\"])
HOSTILE_TEXT = st.lists(
    st.one_of(PIECES, st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=4)),
    min_size=1,
    max_size=8,
).map("".join)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(names=st.lists(HOSTILE_TEXT.filter(lambda s: folded(s) != "" and s.strip(" .") != ""), min_size=3, max_size=3))
def test_hostile_strings_fuzz(names: list[str], tmp_path_factory: Any) -> None:
    """Random strings built from markup pieces, as the scenario name, pipeline and error of a run."""
    out = tmp_path_factory.mktemp("hostile")
    scenario, pipeline, error = names
    s = Session(out / "run", sample_hz=50, device="cpu", sources=[], meta={"scenario": scenario, "pipeline": pipeline})
    s.start()
    for _batch in s.wrap(iter([[0] * 4] * 2)):
        pass
    s.close(status="failed", error=error)
    rec = load_run(out / "run")
    summary = summarize(rec)
    assert (summary.status, summary.error) == ("failed", error)  # the hostile strings reached the store intact
    check_html(render_html(summary, build_timeline(rec)), [scenario, error])
    check_trace(trace_events(rec), [scenario, pipeline])
