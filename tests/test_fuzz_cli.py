"""Fuzzing the command line: every command, its real flags, hostile values, random orders.

Each example calls ``profiler.cli.main`` in this process (a subprocess per example would not fit CI) from a
fresh empty directory, stdout and stderr captured. It must end with exit 0, 1 or 2, print no traceback, let no
exception other than SystemExit out, and leave that directory empty on exit 2 (bad input writes nothing: no
half-made run directory). The flags and their values come from the parsers themselves, so a new flag is
fuzzed without touching this file.

What could train or wait for long is bounded, not skipped: a run trains at most 2 measured steps on 0
workers (the flags are still parsed and checked as given), generated data sets hold at most 3 images, and what
would attach to a process, launch ranks, follow a live store or search for minutes stops with ``Bounded`` the
moment it is reached, which counts as a pass: everything before it (parsing, every check, the run directory)
ran for real.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import profiler.cli
from profiler.cli import build_parser

RUNS = Path(__file__).parent / "data" / "runs"
# per command and for scenario files: 275 cases, about 14 s of CPU (wall 20-60 s as the host is loaded);
# STALLSCOPE_FUZZ_EXAMPLES=500 runs a longer campaign by hand
EXAMPLES = int(os.environ.get("STALLSCOPE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written into the repository (.hypothesis/)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TINY = """
import torch
from torch import nn
from scenarios import Scenario

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((4,), float(i % 7)), i % 3

scenario = Scenario(name="tiny", dataset=Items, model=lambda: nn.Linear(4, 3), loss=nn.functional.cross_entropy,
                    batch_size=8, steps=3, warmup=1, description="fuzz scenario")
"""


class Bounded(Exception):
    """Raised where an example would start something long: reaching it is a pass."""


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every leaf command's parser by name (``data make`` as "data make")."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
                return
        out[prefix] = parser

    walk(build_parser(), "")
    return out


COMMANDS = subcommands()


# -- the world an example sees: fixture paths (absolute) and fresh ones (relative to its empty cwd) --------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("fuzz-world")
    (root / "tiny.py").write_text(TINY)
    (root / "t\udcffny.py").write_text(TINY)  # a file name that is not UTF-8, as a shell passes b"t\xffny.py"
    (root / "broken.py").write_text("raise RuntimeError('boom\\n<b>')\n")
    (root / "afile.txt").write_text("not a run")
    (root / "emptydir").mkdir()
    (root / "corrupt").mkdir()
    (root / "corrupt" / "run.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(600))
    for name in ("cpu-workers", "interrupted"):
        shutil.copytree(RUNS / name, root / name)
    with pytest.MonkeyPatch.context() as mp, bounded_world(mp, root):
        code = main_quiet(["run", str(root / "tiny.py"), "--steps", "2", "--warmup", "0", "--no-live",
                           "--device", "cpu", "--out", str(root / "tinyrun")])  # fmt: skip
        assert code == 0, "the fixture run failed"
    yield {
        "tiny": str(root / "tiny.py"),
        "odd": str(root / "t\udcffny.py"),
        "broken": str(root / "broken.py"),
        "file": str(root / "afile.txt"),
        "empty": str(root / "emptydir"),
        "corrupt": str(root / "corrupt"),
        "run": str(root / "cpu-workers"),
        "interrupted": str(root / "interrupted"),
        "tinyrun": str(root / "tinyrun"),
        "root": str(root),
    }


@contextlib.contextmanager
def bounded_world(mp: pytest.MonkeyPatch, root: Path) -> Iterator[None]:
    """Caps and stops on everything that could run long (see the module docstring)."""
    import profiler.drivers.runner
    import profiler.jobs.launch
    import profiler.jobs.render_live
    import profiler.live.render
    import profiler.sweep.run
    import profiler.zerocode.profile
    import scenarios.datagen
    from profiler.sweep.run import Limits

    mp.setenv("STALLSCOPE_DATA", str(root / "data-cache"))
    real_run, real_make, real_sweep = (
        profiler.drivers.runner.run_scenario,
        scenarios.datagen.make,
        profiler.sweep.run.run_sweep,
    )
    calls = {"run": 0}

    def run_scenario(scenario: Any, cfg: Any, monitor: Any = None) -> Any:
        calls["run"] += 1
        if calls["run"] > 2:
            raise Bounded("a third training run in one example")
        small = replace(
            cfg,
            steps=min(cfg.steps or 2, 2),
            warmup=min(cfg.warmup if cfg.warmup is not None else 1, 1),
            workers=0,
            attribution=False,
            batch_size=min(cfg.batch_size, 64) if cfg.batch_size else None,
        )
        return real_run(scenario, small, None)

    def make(kind: str, out: Path, count: int, **kw: Any) -> Any:
        return real_make(kind, out, min(count, 3), **{**kw, "jobs": 1})

    def run_sweep(h: Any, configs: Any, out: Path) -> Any:
        small = [replace(c, workers=0, nproc=1) for c in configs[:1]]
        return real_sweep(replace(h, limits=Limits(steps=2, seconds=None)), small, out)

    def stop(*_a: Any, **_k: Any) -> Any:
        raise Bounded("reached a long-running step")

    def profile_external(out: Path, *, command: list[str] | None, **kw: Any) -> Any:
        if command and shutil.which(command[0]) is None:
            return real_external(out, command=command, **kw)  # fails at once: not found
        raise Bounded("would profile a process")

    real_external = profiler.zerocode.profile.profile_external

    def reset() -> None:
        calls["run"] = 0

    mp.setattr(profiler.drivers.runner, "run_scenario", run_scenario)
    mp.setattr(profiler.sweep.run, "run_scenario", run_scenario, raising=False)
    mp.setattr(scenarios.datagen, "make", make)
    mp.setattr(profiler.sweep.run, "run_sweep", run_sweep)
    mp.setattr(profiler.sweep.run, "run_tune", stop)
    mp.setattr(profiler.zerocode.profile, "profile_external", profile_external)
    mp.setattr(profiler.jobs.launch, "run_job", stop)
    mp.setattr(profiler.live.render, "watch", stop)
    mp.setattr(profiler.jobs.render_live, "watch_job", stop)
    RESET.append(reset)
    yield
    RESET.remove(reset)


RESET: list[Callable[[], None]] = []


def main_quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return profiler.cli.main(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2


# -- values ------------------------------------------------------------------------------------------------------

FRESH = ("fresh", "fresh/a/b", "new.html", "trace.json", "sub/", "fr\udcffsh")
READ_ONLY = ("/proc/self/stallscope-fuzz", "/proc/1/x/y")
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "-0", "0", "1", "2", "3", "0x10", "1_000", "9" * 40, "1.5"]),
)
WORDS = st.sampled_from(
    [
        "", " ", "-", "-1", ",", "8,,16", "8,16", "0,1", "1,2,3", "sim:v100", "sim:nope", "sim:h100,precision=amp",
        "sim:v100,efficiency=-1", "cuda", "cuda:99", "cpu", "auto", "naive", "prefetch", "dali", "naive,dali",
        "fail", "skip", "measure", "off", "localhost:0", "[::1]:29500", ":", "host:99999", "imagenet-like",
        "voc-like", "mlp-mnist", "\udcff", "\u202eevil", "<script>", "a\nb", "--", "default",
    ]
)  # fmt: skip


def values(w: dict[str, str]) -> st.SearchStrategy[str]:
    paths = st.sampled_from([*FRESH, *READ_ONLY, *(w[k] for k in ("tiny", "broken", "file", "empty", "corrupt",
                                                                  "run", "interrupted", "tinyrun"))])  # fmt: skip
    return st.one_of(NUMBERS, WORDS, TEXT, paths)


def positional(dest: str, w: dict[str, str]) -> st.SearchStrategy[str]:
    """Mostly a value that gets the command going (so the flags are checked further), else a bad one."""
    good, bad = {
        "scenario": ([w["tiny"], w["tiny"], w["odd"]], [w["broken"], "nope.py", "mlp-mnist", "no", w["empty"] + ".py"]),
        "run_dir": ([w["tinyrun"], w["run"]], [w["interrupted"], w["corrupt"], w["empty"], w["file"], "fresh"]),
        "run_a": ([w["tinyrun"], w["run"]], [w["interrupted"], w["corrupt"], w["empty"], w["file"], "fresh"]),
        "run_b": ([w["tinyrun"], w["run"]], [w["interrupted"], w["corrupt"], w["empty"], w["file"], "fresh"]),
        "pid": (["1", str(os.getpid())], ["0", "-5", str(2**22 + 1), "99999999", "abc"]),
        "kind": (["imagenet-like", "voc-like"], ["mnist", ""]),
    }.get(dest, ([w["tinyrun"]], [w["corrupt"], "fresh"]))
    return st.integers(0, 3).flatmap(
        lambda k: st.sampled_from(good) if k != 2 else st.one_of(st.sampled_from(bad), values(w))
    )


PLAUSIBLE = {
    "steps": ["1", "2"], "warmup": ["0", "1"], "batch_size": ["8", "4", "8,16"], "workers": ["0", "1", "0,1"],
    "seed": ["0", "7"], "sample_hz": ["10", "50"], "device": ["cpu", "sim:v100", "auto", "sim:h100,precision=amp"],
    "out": list(FRESH), "model": ["default", "nope"], "price_per_hour": ["1.5"], "augment_epochs": ["0", "1"],
    "pyspy_rate": ["10"], "nproc": ["2", "1", "1,2"], "nnodes": ["1", "2"], "node_rank": ["0", "1"],
    "rdzv_endpoint": ["localhost:29500"], "rdzv_id": ["job1"], "duration": ["0.5"], "html": list(FRESH),
    "trace": list(FRESH), "max_stall_increase": ["5"], "max_throughput_drop": ["10"], "pipeline": ["naive"],
    "pipelines": ["naive", "naive,prefetch"], "batch_sizes": ["8,16", "8"], "seconds": ["0.5"], "budget_s": ["5"],
    "max_batch_size": ["16"], "max_workers": ["2"], "repeat": ["1", "2"], "count": ["3", "1"], "classes": ["2"],
    "jobs": ["1"], "prometheus": ["127.0.0.1:0", "0", "70000"],
}  # fmt: skip


@st.composite
def command_lines(draw: st.DrawFn, command: str, w: dict[str, str]) -> list[str]:
    """Mostly plausible flags (so that an example gets past parsing) with hostile values mixed in."""
    parser = COMMANDS[command]
    optional = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    chosen = draw(st.lists(st.sampled_from(optional), max_size=5, unique_by=id)) if optional else []
    chosen += [a for a in optional if a.required and a not in chosen and draw(st.integers(0, 9)) != 7]
    tokens: list[list[str]] = []
    for action in chosen:
        flag = draw(st.sampled_from(action.option_strings))
        plausible = list(action.choices or PLAUSIBLE.get(action.dest, [w["run"], w["tinyrun"], "fresh"]))
        if action.nargs == 0:
            tokens.append([flag])
        elif draw(st.integers(0, 3)) != 2:
            tokens.append([flag, draw(st.sampled_from(plausible))])
        else:
            tokens.append([flag, draw(values(w))])
    zero_code = command == "run" and draw(st.integers(0, 4)) == 3  # run [OPTIONS] -- CMD: no scenario
    for action in parser._actions:
        if action.option_strings or (zero_code and action.dest == "scenario"):
            continue
        if action.dest == "scenario":  # never the default: fashion-vgg trains for seconds a step
            tokens.append([draw(positional(action.dest, w))])
        elif action.nargs == "*":
            tokens += [[draw(positional(action.dest, w))] for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2])))]
        elif draw(st.integers(0, 19)) != 7:
            tokens.append([draw(positional(action.dest, w))])
    if draw(st.integers(0, 19)) == 7:
        tokens.append([draw(st.sampled_from(["--no-such-flag", "-x", "--out=", "--steps=1", "-h"]))])
    order = draw(st.permutations(range(len(tokens))))
    argv = [*command.split(), *(t for i in order for t in tokens[i])]
    if zero_code:
        argv += ["--", *draw(st.lists(st.sampled_from(["no-such-cmd-xyz", "true", "-c", "", "\u202e"]), max_size=3))]
    return argv


# -- the property ------------------------------------------------------------------------------------------------

SEEN = {"cases": 0, "bounded": 0}


def check(argv: list[str], base: Path) -> Any:
    """Run one command line; returns its exit code (None when it stopped at a Bounded point)."""
    for reset in RESET:
        reset()
    cwd = Path(tempfile.mkdtemp(dir=base))
    old = os.getcwd()
    # strict UTF-8 like a terminal's stdout under en_US.UTF-8, where a surrogate cannot be printed
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: Any = profiler.cli.main(argv)
            except SystemExit as exc:
                code = exc.code
            except Bounded:
                SEEN["bounded"] += 1
                return None
    finally:
        os.chdir(old)
        SEEN["cases"] += 1
    err.flush()
    text = err.buffer.getvalue().decode()  # type: ignore[attr-defined]
    assert code in (0, 1, 2), f"{argv!r}: exit {code!r}\n{text}"
    assert "Traceback (most recent call last)" not in text, f"{argv!r}: traceback\n{text}"
    if code == 2:
        lines = text.strip().splitlines()
        assert any("error:" in line for line in lines), f"{argv!r}: exit 2 names no error\n{text}"
        stray = [line for line in lines if not line.startswith("stallscope")]
        assert not stray, f"{argv!r}: a message spans lines: {stray}\n{text}"
        left = sorted(p.name for p in cwd.iterdir())
        assert not left, f"{argv!r}: exit 2 left {left} behind\n{text}"
    shutil.rmtree(cwd, ignore_errors=True)
    return code


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_line_fuzz(command: str, world: dict[str, str], tmp_path: Path) -> None:
    """Random flags of ``command``, hostile values, random order: exit 0/1/2, no traceback, nothing left on 2."""
    with pytest.MonkeyPatch.context() as mp, bounded_world(mp, Path(world["root"])):

        @FUZZ
        @given(argv=command_lines(command, world))
        def fuzz(argv: list[str]) -> None:
            check(argv, tmp_path)  # asserts the exit code, no traceback, one-line errors, nothing left on 2

        before = SEEN["cases"]
        fuzz()
    assert SEEN["cases"] > before, f"no {command} command line was run"  # the budget was spent on real cases


# -- scenario files with random attribute values and types ------------------------------------------------------

SCENARIO_FILE = """
import torch
from torch import nn
from scenarios import Scenario

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((4,), float(i % 7)), i % 3

def model():
    return nn.Linear(4, 3)

scenario = Scenario({fields})
"""
GOOD = {
    "name": '"fuzz"', "dataset": "Items", "model": "model", "loss": "nn.functional.cross_entropy",
    "batch_size": "8", "steps": "3", "warmup": "1",
}  # fmt: skip
# Values of the right type and range (the run may still fail on them: exit 1 or 2, never a traceback)
ODD = {
    "name": ['"<script>alert(1)</script>"', '"a\\nb"', '"\\u202eevil"', '"x" * 300'],
    "batch_size": ["64", "65", "10**30"],
    "steps": ["1", "10**30"],
    "warmup": ["0", "10**30"],
    "lr": ["1e300", "1e-300"],
    "description": ['""', '"</style>-->"'],
    "extra": ['{"a": float("nan")}', "{1: object()}"],
    "models": ['{"other": model}'],
    "model_name": ['"other"'],
    "data": ['"no-such-kind"'],
    "data_count": ["3"],
}
BAD = {
    "name": ['""', "0", "None", '["x"]'],
    "dataset": ["5", "None", '"Items"'],
    "model": ["5", "None"],
    "loss": ["None", '"mse"'],
    "batch_size": ["0", "-1", "1.5", '"8"', "True", "None", 'float("nan")'],
    "steps": ["0", "-3", "2.5", '"10"', "None"],
    "warmup": ["-1", "1.5", '"1"', "None"],
    "lr": ['float("nan")', 'float("inf")', "-0.1", "0", '"0.01"', "None"],
    "description": ["5", "None"],
    "synthetic": ['"yes"', "None"],
    "extra": ["[]", '"x"'],
    "models": ["[]", '{"a": 5}', "{5: model}"],
    "model_name": ['""', "5"],
    "targets_in_forward": ['"yes"'],
    "cost_forward": ["5"],
    "data": ["5", '""'],
    "data_count": ["-1", '"3"'],
}  # fmt: skip


@st.composite
def scenario_files(draw: st.DrawFn) -> tuple[str, bool]:
    """The source of a scenario file with some fields odd or wrong, and whether any is wrong."""
    fields = dict(GOOD)
    bad = False
    for attr in draw(st.lists(st.sampled_from(sorted({*ODD, *BAD})), max_size=3, unique=True)):
        wrong = attr in BAD and (attr not in ODD or draw(st.booleans()))
        fields[attr] = draw(st.sampled_from(BAD[attr] if wrong else ODD[attr]))
        bad = bad or wrong
    if fields.get("data_count") == "3" and "data" not in fields:
        fields["data"] = '"imagenet-like"'
    if "data" in fields and "data_count" not in fields:
        bad = True  # data set with no count
    order = draw(st.permutations(sorted(fields)))
    return SCENARIO_FILE.format(fields=", ".join(f"{k}={fields[k]}" for k in order)), bad


def test_scenario_file_fuzz(world: dict[str, str], tmp_path: Path) -> None:
    """A scenario file with random field values and types: a wrong one is exit 2 with one line naming it."""
    with pytest.MonkeyPatch.context() as mp, bounded_world(mp, Path(world["root"])):

        @FUZZ
        @given(case=scenario_files())
        def fuzz(case: tuple[str, bool]) -> None:
            source, bad = case
            path = Path(tempfile.mkdtemp(dir=tmp_path)) / "user_scenario.py"
            path.write_text(source)
            argv = ["run", str(path), "--steps", "1", "--warmup", "0", "--no-live", "--device", "cpu"]
            code = check([*argv, "--out", "fresh"], tmp_path)
            if bad:
                assert code == 2, f"a wrong field ran with exit {code}:\n{source}"

        fuzz()
