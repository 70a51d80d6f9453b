"""Nothing stallscope runs inside the user's process can take that process down (issue #65; docs/reliability.md,
"What runs inside the user's process").

- A kernel window's trace is written through torch's public export (``profile.export_chrome_trace``), never by a
  foreign call into libtorch: no module calls native code through ``ctypes`` (the one ``ctypes`` import left is a
  typed view of a memory file the module made itself).
- The modules the user's process imports (``profiler``, the trainer integrations, the Prometheus exporter, the
  start-up module of ``run --``) install no signal handler, never end the process (``os._exit``), set no trace or
  profile hook, no ``faulthandler``, no ``excepthook``; only the start-up module registers exit handlers.
- The start-up module's records never raise into the script's ``next()`` when they cannot be written.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

SCANNED = ("profiler", "pipelines", "scenarios", "benchmarks")
# ctypes imported, and why it calls no native code: the attributes of ctypes each module may use
CTYPES_ALLOWED = {
    # SharedDoubles: ``(c_double * n).from_buffer(mmap)``, a bounds-checked array over a memory file it made itself
    "profiler/core/sources/stages.py": {"c_double"},
}
NATIVE_CALLS = ("CDLL", "cdll", "PyDLL", "pydll", "pythonapi", "from_address", "CFUNCTYPE", "dlopen", "cffi")
# what the user's process imports: the package, the integrations a trainer loads, the start-up module of run --
ROOTS = (
    "profiler",
    "profiler.integrations.hf",
    "profiler.integrations.lightning",
    "profiler.export.prometheus",
    "profiler.zerocode.boot.sitecustomize",
    "profiler.zerocode.boot.stallscope_instrument",
)
BANNED = {
    ("signal", "signal"): "a signal handler",
    ("signal", "set_wakeup_fd"): "a signal wake-up fd",
    ("signal", "setitimer"): "a timer signal",
    ("os", "_exit"): "an exit without clean-up",
    ("os", "abort"): "an abort",
    ("sys", "settrace"): "a trace hook",
    ("sys", "setprofile"): "a profile hook",
    ("threading", "settrace"): "a trace hook",
    ("threading", "setprofile"): "a profile hook",
    ("faulthandler", "enable"): "faulthandler",
    ("faulthandler", "register"): "faulthandler",
    ("sys", "setswitchinterval"): "the interpreter's switch interval",
}
ATEXIT_ALLOWED = {"profiler.zerocode.boot.stallscope_instrument"}  # flush its records, wait (bounded) for a window


def _sources(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _modules() -> dict[str, Path]:
    out = {}
    for path in _sources("profiler"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(tree: ast.AST) -> set[str]:
    """The project modules a module imports (also inside functions: a late import runs in the same process)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {t for a in node.names if (t := _owner(a.name))}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                target = full if full in MODULES else _owner(node.module)
                if target:
                    out.add(target)
    return out


def in_users_process() -> set[str]:
    """Every project module the user's process can import from ROOTS (with the packages above each)."""
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += _imported(ast.parse(MODULES[module].read_text()))
        if (parent := module.rpartition(".")[0]) in MODULES:
            todo.append(parent)
    return seen


def banned_calls(source: str) -> list[str]:
    """What of BANNED (and ``sys.excepthook =``, ``atexit.register``) the source does, by the names it calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            key = (node.value.id, node.attr)
            if key in BANNED or key == ("atexit", "register"):
                found.append(".".join(key))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr in ("excepthook", "unraisablehook"):
                    found.append(f"{ast.unparse(target)} =")
        elif isinstance(node, ast.ImportFrom) and node.module in {m for m, _ in BANNED}:
            found += [f"{node.module}.{a.name}" for a in node.names if (node.module, a.name) in BANNED]
    return found


def test_the_banned_call_finder_finds_planted_calls() -> None:
    planted = "import os, signal, sys\nsignal.signal(2, f)\nos._exit(1)\nsys.excepthook = h\nfrom sys import settrace\n"
    assert sorted(banned_calls(planted)) == ["os._exit", "signal.signal", "sys.excepthook =", "sys.settrace"]
    assert banned_calls("import os\nos.kill(pid, 0)\nsignal.Signals(2).name\n") == []


def test_what_the_users_process_imports_installs_nothing_that_can_end_it() -> None:
    modules = in_users_process()
    # the closure reaches the recording core and the start-up module (a finder that found nothing would pass)
    assert {
        "profiler.core.session",
        "profiler.core.kernel_windows.windows",
        "profiler.core.sampler_process.client",
    } <= modules
    assert "profiler.drivers.signals" not in modules  # the run driver's handlers: stallscope's own process
    found = {}
    for module in sorted(modules):
        calls = banned_calls(MODULES[module].read_text())
        if module in ATEXIT_ALLOWED:
            calls = [c for c in calls if c != "atexit.register"]
        if calls:
            found[module] = calls
    assert found == {}


def test_no_module_calls_native_code_through_ctypes() -> None:
    """No ``ctypes`` call into libtorch (or anything): the only import left is a typed view of its own memory."""
    importers, native = {}, []
    for path in _sources(*SCANNED):
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        tree = ast.parse(text)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if any(n.split(".")[0] in ("ctypes", "_ctypes", "cffi") for n in names):
            used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                    and n.value.id == "ctypes"}  # fmt: skip
            importers[rel] = used
        native += [f"{rel}: {word}" for word in NATIVE_CALLS if word in text]
    assert native == []
    assert importers == CTYPES_ALLOWED


def test_a_windows_trace_is_written_through_torchs_public_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's recorder hands a window over with ``profile.export_chrome_trace`` (torch's public API); the GIL it
    held for that is counted in ``read``."""
    torch = pytest.importorskip("torch")
    from profiler.core.kernel_windows.windows import TorchKernelRecorder

    calls: list[str] = []
    export = torch.profiler.profile.export_chrome_trace

    def spy(self: object, path: str, *args: object, **kwargs: object) -> object:
        calls.append(path)
        return export(self, path, *args, **kwargs)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", spy)
    rec = TorchKernelRecorder(torch, time.perf_counter, activity="cpu")
    rec.start()
    x = torch.ones(4)
    for _ in range(3000):
        x.add_(1)
    rec.stop_to(tmp_path / "w.json")
    assert calls == [str(tmp_path / "w.json")]
    events = json.loads((tmp_path / "w.json").read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "aten::add_") == 3000
    assert rec.parts["read"] >= rec.parts["export"] > 0  # the export held the GIL: counted as the window's cost


def test_the_start_up_modules_records_never_raise_into_next(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Records that cannot be written (the directory removed under the script) are lost and counted, said once."""
    from profiler.zerocode.boot.stallscope_instrument import FLUSH_EVERY, Writer

    writer = Writer(str(tmp_path / "gone"))
    for i in range(2 * FLUSH_EVERY):
        writer.put({"k": "next", "i": i, "odd": object()})  # a value JSON has not: written as its text
    writer.flush()
    assert writer.lost == 2 * FLUSH_EVERY
    assert capsys.readouterr().err.count("stallscope: instrument records not written") == 1
    ok = Writer(str(tmp_path))
    ok.put({"k": "proc", "odd": object()})
    ok.flush()
    (line,) = next(tmp_path.glob("p*.jsonl")).read_text().splitlines()
    assert json.loads(line)["odd"].startswith("<object object")


def _fake_cuda_torch(version: str | None) -> object:
    from types import SimpleNamespace

    cuda = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda=version))


@pytest.mark.parametrize(("version", "second"), [("11.8", False), ("12.4", False), ("12.6", True), ("13.0", True),
                                                 (None, True)])  # fmt: skip
def test_before_cuda_12_6_only_the_first_window_sets_cupti_up(
    version: str | None, second: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUPTI set up again after its teardown can crash a process that replays CUDA graphs before CUDA 12.6: a
    Session's recorder and the start-up module open no second window there (None: a torch without CUDA)."""
    from profiler.core.kernel_windows.windows import FOR_GOOD, TorchKernelRecorder
    from profiler.zerocode.boot import stallscope_instrument as boot

    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    rec = TorchKernelRecorder(_fake_cuda_torch(version), time.perf_counter)  # type: ignore[arg-type]
    assert rec.usable() is None  # the first window
    rec._used = True  # as after it
    why = rec.usable()
    assert (why is None) == second
    if not second:
        assert why is not None and why.startswith(FOR_GOOD) and f"CUDA {version}" in why
    assert (boot.reinit_risk(_fake_cuda_torch(version)) is None) == second
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # torch.compile's graphs: CUPTI would stay attached
    assert boot.reinit_risk(_fake_cuda_torch("13.0")) is not None
