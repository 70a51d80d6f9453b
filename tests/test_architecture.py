"""The layout's rules, checked from the source: no import circle, no private name across modules, the layers'
directions, the places that may read a run store back, and the size limits.

The import graph counts every import in a module, also those inside functions (a late import still ties two
modules together: it only hides the circle from the interpreter until the call).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from conftest import ROOT

PACKAGES = ("profiler", "pipelines", "scenarios")
# Reading a store back is what `report` (once, also for --html and --trace), `watch` and `compare` are for; a run
# prints the Summary its ThreadRecorder built at close.
STORE_READERS = {
    "profiler.runs.read",  # report, compare: a run and its Summary, or its own summary.json
    "profiler.live.feeds",
    "profiler.jobs.jobdir",  # `report` on a job directory reads each rank's and node's store through it
    "profiler.whatif.source",  # predicts from a measured run, and reads back a --check run it already measured
    "profiler.core.sampler_process.client",  # the Summary at close, from the store the sampler process wrote
}
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _owner(name: str) -> str | None:
    """The project module that ``name`` (a module or ``module.attr``) lives in, or None outside the project."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[tuple[str, str | None]]:
    """(imported project module, imported name or None) for every import in ``module``."""
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _owner(alias.name)
                if target:
                    yield target, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                target = full if full in MODULES else _owner(node.module)
                if target:
                    yield target, None if full in MODULES else alias.name


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in _imports(m) if t != m} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root, edges in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(edges)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_anywhere() -> None:
    assert _cycles(_graph()) == []


def test_no_private_name_crosses_a_module_boundary() -> None:
    crossings = [
        f"{m} imports {name} from {target}"
        for m in MODULES
        for target, name in _imports(m)
        if name is not None and name.startswith("_") and target != m
    ]
    assert crossings == []


def _is_rendering(m: str) -> bool:
    """profiler/render/ and a feature package's own ``render*`` modules."""
    return m.startswith("profiler.render") or (m.startswith("profiler.") and m.rpartition(".")[2].startswith("render"))


def _is_analysis(m: str) -> bool:
    """profiler/analysis/ and a feature package's own ``analysis*`` modules."""
    return m.startswith("profiler.analysis") or (
        m.startswith("profiler.") and m.rpartition(".")[2].startswith("analysis")
    )


# What a pure analysis may import besides other analyses and the store's record types: no clock, no file, no
# process, no thread (the figures are a function of the record).
PURE_STDLIB = {
    "__future__",
    "ast",
    "bisect",
    "collections",
    "dataclasses",
    "itertools",
    "json",
    "math",
    "numpy",  # arrays of a store read in bulk (analysis.bulk, timeline.timeline_of_columns): no file, no clock
    "re",
    "statistics",
    "typing",
}


def test_layers_point_one_way() -> None:
    graph = _graph()
    wrong = []
    for m, targets in graph.items():
        for t in targets:
            if _is_analysis(m) and (_is_rendering(t) or t.startswith("profiler.cli")):
                wrong.append((m, t))
            if m.startswith(("pipelines", "scenarios")) and (_is_rendering(t) or t.startswith("profiler.cli")):
                wrong.append((m, t))
            if t.startswith("profiler.cli") and not m.startswith("profiler.cli") and m != "profiler.__main__":
                wrong.append((m, t))
    assert wrong == []


def _runtime_imports(module: str) -> set[str]:
    """The project modules ``module`` imports when it runs: all but those under ``if TYPE_CHECKING:``."""
    typing_only = {
        id(n)
        for node in ast.walk(TREES[module])
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in node.body
        for n in ast.walk(child)
    }
    out = set()
    for node in ast.walk(TREES[module]):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {t for a in node.names if (t := _owner(a.name))}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                target = full if full in MODULES else _owner(node.module)
                if target:
                    out.add(target)
    return out


def test_the_core_imports_nothing_above_it() -> None:
    """profiler.core is the bottom layer (issue #58): what it needs from above (Session's sinks, the Summary's
    builder, sim: devices) is installed by profiler.runs.sinks. Typing: the test after the next."""
    upward = sorted(
        (m, t)
        for m in MODULES
        if m.startswith("profiler.core")
        for t in _runtime_imports(m)
        if t.startswith("profiler.") and not t.startswith("profiler.core")
    )
    assert upward == []


def test_the_layer_rule_sees_an_upward_import() -> None:
    TREES["profiler.core.planted"] = ast.parse("from profiler.analysis import summarize\n")
    MODULES["profiler.core.planted"] = ROOT / "planted.py"
    try:
        assert _runtime_imports("profiler.core.planted") == {"profiler.analysis"}
    finally:
        del TREES["profiler.core.planted"], MODULES["profiler.core.planted"]


def test_analysis_is_pure() -> None:
    impure = []
    for m in filter(_is_analysis, MODULES):
        for node in ast.walk(TREES[m]):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.partition(".")[0]
                project = _owner(name)
                if project:
                    if not (_is_analysis(project) or project.startswith(("profiler.core.store", "profiler.core.rows"))):
                        impure.append(f"{m} imports {name}")
                elif top not in PURE_STDLIB:
                    impure.append(f"{m} imports {name}")
    assert impure == []


def test_only_rendering_modules_import_rich() -> None:
    importers = {
        m
        for m in MODULES
        for node in ast.walk(TREES[m])
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "rich" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rich")
    }
    assert {m for m in importers if not _is_rendering(m)} == set()


def test_the_top_level_is_a_table_of_contents() -> None:
    top = ROOT / "profiler"
    loose = sorted(p.name for p in top.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert loose == []
    packages = sorted(p.name for p in top.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert {"core", "drivers", "analysis", "render", "cli"} <= set(packages)


def test_session_imports_no_sink() -> None:
    """Session drives hooks; the store's ThreadRecorder, the exporter and the live feed plug in from outside."""
    sinks = ("profiler.core.recorders.in_thread", "profiler.core.store", "profiler.export", "profiler.live")
    assert {t for t in _graph()["profiler.core.session"] if t.startswith(sinks)} == set()


def test_only_report_watch_and_compare_read_a_run_store_back() -> None:
    readers = set()
    for m in MODULES:
        for node in ast.walk(TREES[m]):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in {
                "load_run",
                "StoreTail",
            }:
                readers.add(m)
    assert {r for r in readers if not r.startswith("profiler.core.store")} == STORE_READERS


def test_modules_and_functions_stay_small() -> None:
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    long = [
        f"{m}:{node.lineno} {node.name} ({n} lines)"
        for m, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert big == {}
    assert long == []


CORE = ROOT / "profiler" / "core"


def _listed_top_level(init_source: str) -> set[str]:
    """The top-level modules of profiler/core that its __init__.py's docstring lists, each with a reason."""
    doc = ast.get_docstring(ast.parse(init_source)) or ""
    return set(re.findall(r"^- ``(\w+\.py)``: \S", doc, re.MULTILINE))


def _unlisted_core_modules(files: set[str], init_source: str) -> set[str]:
    return files - {"__init__.py"} - _listed_top_level(init_source)


def test_the_core_is_packages_and_a_few_listed_modules() -> None:
    """Issue #69: profiler/core/ holds packages, and besides __init__.py at most five modules, each listed with the
    reason in its __init__.py's docstring; every package says what it holds in a docstring."""
    init = (CORE / "__init__.py").read_text()
    files = {p.name for p in CORE.glob("*.py")}
    assert 0 < len(_listed_top_level(init)) <= 5
    assert _unlisted_core_modules(files, init) == set()
    undocumented = [
        p.name
        for p in sorted(CORE.iterdir())
        if p.is_dir() and any(p.glob("*.py"))
        if not ((p / "__init__.py").exists() and ast.get_docstring(ast.parse((p / "__init__.py").read_text())))
    ]
    assert undocumented == []


def test_the_core_rule_sees_an_unlisted_module() -> None:
    init = '"""Core.\n\n- ``session.py``: the entry point.\n"""\n'
    assert _unlisted_core_modules({"__init__.py", "session.py", "stepclock.py"}, init) == {"stepclock.py"}
    assert _unlisted_core_modules({"__init__.py", "session.py"}, init) == set()


def _upward_names(module: str) -> set[str]:
    """The modules above the core that ``module`` names in any import, under TYPE_CHECKING included."""
    return {t for t, _ in _imports(module) if t.startswith("profiler.") and not t.startswith("profiler.core")}


def test_the_core_names_nothing_above_it_even_for_typing() -> None:
    """Issue #69: not even a type annotation under TYPE_CHECKING (the Summary is profiler.core.hooks.RunSummary)."""
    assert sorted((m, t) for m in MODULES if m.startswith("profiler.core") for t in _upward_names(m)) == []


def test_the_typing_rule_sees_an_upward_typing_import() -> None:
    planted = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from profiler.analysis.summary import Summary\n"
    TREES["profiler.core.planted"] = ast.parse(planted)
    MODULES["profiler.core.planted"] = ROOT / "planted.py"
    try:
        assert _upward_names("profiler.core.planted") == {"profiler.analysis.summary"}
        assert _runtime_imports("profiler.core.planted") == set()
    finally:
        del TREES["profiler.core.planted"], MODULES["profiler.core.planted"]
