"""The layout's rules, checked from the source: no import circle, no private name across modules, the layers'
directions, the places that may read a run store back, and the size limits.

The import graph counts every import in a module, also those inside functions (a late import still ties two
modules together: it only hides the circle from the interpreter until the call).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conftest import ROOT

PACKAGES = ("profiler", "pipelines", "scenarios")
# Reading a store back is what `report` (once, also for --html and --trace), `watch` and `compare` are for; a run
# prints the Summary its Recording built at close.
STORE_READERS = {
    "profiler.cli.report",
    "profiler.feeds",
    "profiler.jobdir",  # `report` on a job directory reads each rank's and node's store through it
    "profiler.cli.whatif",  # predicts from a measured run, and reads back a --check run it already measured
}
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


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


def test_layers_point_one_way() -> None:
    graph = _graph()
    wrong = []
    for m, targets in graph.items():
        for t in targets:
            if m.startswith("profiler.analysis") and t.startswith(("profiler.render", "profiler.cli")):
                wrong.append((m, t))
            if m.startswith(("pipelines", "scenarios")) and t.startswith(("profiler.render", "profiler.cli")):
                wrong.append((m, t))
            if t.startswith("profiler.cli") and not m.startswith("profiler.cli") and m != "profiler.__main__":
                wrong.append((m, t))
    assert wrong == []


def test_only_report_watch_and_compare_read_a_run_store_back() -> None:
    readers = set()
    for m in MODULES:
        for node in ast.walk(TREES[m]):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in {
                "load_run",
                "StoreTail",
            }:
                readers.add(m)
    assert readers - {"profiler.store"} == STORE_READERS


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
