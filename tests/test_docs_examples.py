"""Every shell command shown in README.md and docs/*.md runs, and exits as the docs say.

The convention (the docs follow it; ``test_docs_follow_the_convention`` enforces it):

- A command is a line starting with ``$ `` in a fenced block tagged ``console``. The lines after it, up to
  the next ``$ `` line, are what it printed. A command ending in ``\\`` continues on the next line.
- Synopses (``stallscope sweep [SCENARIO] [--pipelines P,...]``) and printed output live in ``text`` blocks,
  which are never run. A ``text`` line that starts like a command (``stallscope run ...``) must read as a
  synopsis: a ``[``, ``|``, ``...`` or an upper-case placeholder (``RUN_DIR``, ``N``). Every fenced block has a
  language tag, and there are no ``sh``/``bash``/``shell`` blocks: a ``$`` prompt outside ``console`` fails.
- One HTML comment right above a block, invisible when rendered, carries directives for every command in it:
  ``<!-- check: exit=2 ci-args="--steps 2" -->``. A key written ``KEY:SEL`` applies only to the commands whose
  selector is ``SEL``: the subcommand of ``stallscope SUB ...``, else the program's name (``skip:xdg-open``).

  ``exit=N`` or ``exit=0|1``  the exit code (default 0).
  ``stderr=all``   the lines shown under each command are its whole stderr (the default with ``exit=2``: bad
                   input is one line on stderr, and the doc shows that line).
  ``stderr=last``  the last line shown under each command is the last line of its stderr.
  ``stdout=all``   the lines shown under each command are its whole stdout.
  ``ci-args="..."`` flags for the run here, so that long examples run small: a flag already in the command
                   gets the value given here, wherever it is (also after ``--``), any other flag is added
                   (before a ``--``). ``{imagenet-like}`` stands for a small generated image folder,
                   ``{voc-like}`` for a small generated detection set (ssd's default data is 256 images).
  ``skip="reason"`` not run, for the few commands that cannot run here (counted and listed at the end).
  ``needs=no-cuda`` skipped on a machine with CUDA (the example shows what happens without it).
  ``timeout=S``    seconds (default 300).
  ``write=NAME``   the block is a file, written as NAME into the directory every command runs in.

Commands run in document order with bash, in one fresh directory per doc file, in which ``examples/``, the
recorded runs, scenarios, HTA traces and real GPU traces of ``tests/data/`` and every ``write=`` file are present.
``stallscope`` is this checkout's ``python -m profiler`` (forked from a warm interpreter that has torch imported:
tests/warm.py), ``python`` this interpreter and ``torchrun`` its ``-m torch.distributed.run``.
``$STALLSCOPE_DATA`` is one directory for the session, so a default data set is generated once. A command
selected alone (``-k``) first runs the commands above it in its doc, since they make what it reads
(``report runs/x`` after ``run --out runs/x``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import warm
from conftest import ROOT
from scheduling import work_unit

pytestmark = pytest.mark.docs

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KEYS = {"exit", "stderr", "stdout", "ci-args", "skip", "needs", "timeout", "write"}
# placeholder -> (datagen kind, images, classes): a few batches' worth, made once per session
PLACEHOLDERS = {"{imagenet-like}": ("imagenet-like", 48, 4), "{voc-like}": ("voc-like", 32, 20)}
SHELL_TAGS = {"sh", "bash", "shell", "zsh", "shell-session", "shellsession", "powershell", "ps"}
DEFAULT_TIMEOUT_S = 300.0

# Documented commands that fail because of the code, not the docs: strict, so each one is noticed (and
# removed from here) once the code is fixed.
XFAIL: dict[str, str] = {}

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
DIRECTIVE = re.compile(r"^\s*<!--\s*check:(.*?)-->\s*$")
SUBCOMMAND_LINE = re.compile(r"^stallscope (run|attach|report|watch|compare|scenarios|data|sweep|tune)(\s|$)")
PLACEHOLDER_WORD = re.compile(r"(?<![\w-])[A-Z][A-Z0-9_]*(?![\w-])")


@dataclass(frozen=True, slots=True)
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    lang: str
    body: list[tuple[int, str]]
    directives: dict[str, str]


@dataclass(frozen=True, slots=True)
class Command:
    doc: str
    line: int
    text: str  # without the prompt, continuation lines joined
    shown: list[str]  # the lines printed under it in the doc
    directives: dict[str, str]
    index: int = 0  # position among its doc's commands

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def selector(self) -> str:
        words = self.text.split()
        if words and words[0] == "stallscope":
            return next((w for w in words[1:] if not w.startswith("-")), "")
        return words[0] if words else ""

    def get(self, key: str) -> str | None:
        return self.directives.get(f"{key}:{self.selector}", self.directives.get(key))


@dataclass
class Docs:
    blocks: list[Block] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    files: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (text, where)
    problems: list[str] = field(default_factory=list)


def _parse_directives(text: str, where: str, problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        words = shlex.split(text)
    except ValueError as exc:
        problems.append(f"{where}: unreadable check directive ({exc}): {text.strip()}")
        return out
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key.partition(":")[0] not in KEYS:
            problems.append(f"{where}: unknown check directive {word!r}: allowed {', '.join(sorted(KEYS))}")
            continue
        out[key] = value
    return out


def _blocks(path: Path, docs: Docs) -> None:
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    pending: dict[str, str] = {}
    pending_at = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := DIRECTIVE.match(line):
            pending.update(_parse_directives(m.group(1), f"{rel}:{i + 1}", docs.problems))
            pending_at = i
            i += 1
            continue
        if "<!--" in line and "check:" in line:
            docs.problems.append(f"{rel}:{i + 1}: a check directive must be one line: <!-- check: ... -->")
        fence = FENCE.match(line)
        if pending and not fence:
            docs.problems.append(f"{rel}:{pending_at + 1}: a check directive must be right above a fenced block")
            pending = {}
        if not fence:
            i += 1
            continue
        indent, marker, start, body = len(fence.group(1)), fence.group(2), i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            line = lines[i]  # a block inside a list item is indented: its lines are read without that
            body.append((i + 1, line[min(indent, len(line) - len(line.lstrip())) :]))
            i += 1
        docs.blocks.append(Block(rel, start + 1, fence.group(3).lower(), body, pending))
        pending = {}
        i += 1
    if pending:
        docs.problems.append(f"{rel}:{pending_at + 1}: a check directive must be right above a fenced block")


def _commands(block: Block) -> list[Command]:
    out: list[Command] = []
    body = iter(block.body)
    for no, line in body:
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\"):
                nxt = next(body, None)
                if nxt is None:
                    break
                text = text[:-1] + " " + nxt[1].strip()
            out.append(Command(block.doc, no, text.strip(), [], block.directives))
        elif out:
            out[-1].shown.append(line)
        elif line.strip():
            out.append(Command(block.doc, no, "", [line], block.directives))  # output before any command
    return out


def _check_block(block: Block, docs: Docs) -> None:
    where = f"{block.doc}:{block.line}"
    if not block.lang:
        docs.problems.append(f"{where}: a fenced block needs a language tag (console for commands, text otherwise)")
    if block.lang in SHELL_TAGS:
        docs.problems.append(f"{where}: ```{block.lang} block: commands go in ```console blocks as `$ command` lines")
    if block.lang != "console":
        for no, line in block.body:
            if line.lstrip().startswith("$ "):
                docs.problems.append(f"{block.doc}:{no}: `$ ` prompt outside a ```console block: {line.strip()}")
            elif block.lang in ("text", "") and SUBCOMMAND_LINE.match(line) and not _is_synopsis(line):
                docs.problems.append(
                    f"{block.doc}:{no}: a stallscope command outside a ```console block (a synopsis needs "
                    f"[...], | or an UPPER-CASE placeholder): {line.strip()}"
                )
    if block.lang == "console":
        cmds = _commands(block)
        if not cmds:
            docs.problems.append(f"{where}: a ```console block without a `$ ` command")
        for cmd in cmds:
            if not cmd.text:
                docs.problems.append(f"{block.doc}:{cmd.line}: output before the first `$ ` command")
                continue
            _check_command(cmd, docs)
        if "write" in block.directives:
            docs.problems.append(f"{where}: write= is for a file's block, not a ```console block")
    elif set(block.directives) - {"write"}:
        docs.problems.append(f"{where}: check directives other than write= are for ```console blocks")


def _is_synopsis(line: str) -> bool:
    words = line.split("#", 1)[0].split()
    if len(words) == 2:  # `stallscope scenarios`: a subcommand that takes nothing
        return True
    return any(ch in line for ch in "[|") or "..." in line or bool(PLACEHOLDER_WORD.search(line))


def _check_command(cmd: Command, docs: Docs) -> None:
    where = cmd.id
    for key in ("exit", "stderr", "stdout", "needs", "timeout"):
        value = cmd.get(key)
        if value is None:
            continue
        ok = {
            "exit": re.fullmatch(r"\d+(\|\d+)*", value),
            "stderr": value in ("all", "last"),
            "stdout": value == "all",
            "needs": value == "no-cuda",
            "timeout": re.fullmatch(r"\d+(\.\d+)?", value),
        }[key]
        if not ok:
            docs.problems.append(f"{where}: bad value {key}={value!r}")
    if cmd.get("skip") == "":
        docs.problems.append(f'{where}: skip needs a reason: skip="..."')
    if cmd.get("skip") is None and not any(line.strip() for line in cmd.shown):
        if cmd.get("stderr"):
            docs.problems.append(f"{where}: stderr={cmd.get('stderr')} but no output is shown under the command")
        elif cmd.get("exit") == "2":
            docs.problems.append(f"{where}: an exit=2 example shows the line it prints on stderr")
    if _ci_args(cmd) and _is_compound(cmd.text):
        docs.problems.append(f"{where}: ci-args on a compound shell command")
    for ph in re.findall(r"\{[^}]*\}", " ".join(_ci_args(cmd))):
        if ph not in PLACEHOLDERS:
            docs.problems.append(f"{where}: unknown placeholder {ph}: allowed {', '.join(sorted(PLACEHOLDERS))}")


def parse_docs() -> Docs:
    docs = Docs()
    for path in DOCS:
        _blocks(path, docs)
    per_doc: Counter[str] = Counter()
    for block in docs.blocks:
        _check_block(block, docs)
        if name := block.directives.get("write"):
            if name in docs.files:
                docs.problems.append(f"{block.doc}:{block.line}: write={name} is also written at {docs.files[name][1]}")
            docs.files[name] = ("".join(f"{line}\n" for _, line in block.body), f"{block.doc}:{block.line}")
        if block.lang == "console":
            for cmd in _commands(block):
                if cmd.text:
                    docs.commands.append(replace(cmd, index=per_doc[cmd.doc]))
                    per_doc[cmd.doc] += 1
    return docs


def _is_compound(text: str) -> bool:
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    return any(tok and set(tok) <= set(";&|<>()") for tok in lex)


def _ci_args(cmd: Command) -> list[str]:
    out: list[str] = []
    for key in ("ci-args", f"ci-args:{cmd.selector}"):
        if value := cmd.directives.get(key):
            out += shlex.split(value)
    return out


def ci_command(cmd: Command, placeholders: dict[str, str]) -> str:
    """The command as run here: ``cmd.text`` with its ``ci-args`` applied."""
    extra = _ci_args(cmd)
    if not extra:
        return cmd.text
    tokens = shlex.split(cmd.text, comments=True)
    j = 0
    while j < len(extra):
        flag = extra[j]
        value = extra[j + 1] if j + 1 < len(extra) and not extra[j + 1].startswith("--") else None
        j += 2 if value is not None else 1
        if value is not None:
            for ph, path in placeholders.items():
                value = value.replace(ph, path)
        if flag in tokens:
            if value is not None:
                tokens[tokens.index(flag) + 1] = value
            continue
        at = tokens.index("--") if "--" in tokens else len(tokens)
        tokens[at:at] = [flag] if value is None else [flag, value]
    return shlex.join(tokens)


DOCS_PARSED = parse_docs()


def _param(cmd: Command) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[cmd.text])] if cmd.text in XFAIL else []
    # a doc's commands run in order in one directory: under xdist (make test) on one worker (tests/conftest.py
    # pytest_xdist_make_scheduler), or a command that lands elsewhere reruns the ones above it
    return pytest.param(cmd, id=cmd.id, marks=marks)


class Tally:
    """Counts what ran and what was skipped, and says so at the end of the session."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.skipped: list[tuple[str, str]] = []

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not (self.ran or self.skipped):
            return
        write = terminalreporter.write_line
        write(f"docs examples: {len(self.ran)} commands ran, {len(self.skipped)} skipped")
        for where, reason in self.skipped:
            write(f"  skipped {where}: {reason}")


@dataclass
class Workspace:
    root: Path
    env: dict[str, str]
    tally: Tally
    done: dict[str, int] = field(default_factory=dict)  # doc -> commands run so far (in order)
    placeholders: dict[str, str] = field(default_factory=dict)

    def dir_for(self, doc: str) -> Path:
        d = self.root / doc.replace("/", "_").removesuffix(".md")
        if not d.exists():
            d.mkdir(parents=True)
            shutil.copytree(ROOT / "examples", d / "examples", ignore=shutil.ignore_patterns("__pycache__"))
            for sub in ("runs", "scenarios", "hta", "traces"):
                shutil.copytree(ROOT / "tests" / "data" / sub, d / "tests" / "data" / sub)
            for name, (text, _) in DOCS_PARSED.files.items():
                (d / name).parent.mkdir(parents=True, exist_ok=True)
                (d / name).write_text(text, encoding="utf-8")
        return d

    def placeholder_paths(self, command: str) -> dict[str, str]:
        for ph, (kind, count, classes) in PLACEHOLDERS.items():
            if ph in command and ph not in self.placeholders:
                from scenarios.datagen import make

                target = self.root / "data" / f"{kind}-{count}"
                make(kind, target, count, classes=classes, seed=0, jobs=1, progress=None)
                self.placeholders[ph] = str(target)
        return self.placeholders

    def run(self, cmd: Command) -> tuple[str, subprocess.CompletedProcess[str]]:
        # what this command reads may be made by the commands above it in its doc
        for earlier in DOCS_PARSED.commands[: DOCS_PARSED.commands.index(cmd)]:
            if earlier.doc == cmd.doc and earlier.index >= self.done.get(cmd.doc, 0) and skip_reason(earlier) is None:
                self._exec(earlier)
        return self._exec(cmd)

    def _exec(self, cmd: Command) -> tuple[str, subprocess.CompletedProcess[str]]:
        command = ci_command(cmd, self.placeholder_paths(" ".join(_ci_args(cmd))))
        self.done[cmd.doc] = cmd.index + 1
        timeout = float(cmd.get("timeout") or DEFAULT_TIMEOUT_S)
        return command, run_bash(command, self.dir_for(cmd.doc), self.env, timeout)


def run_bash(command: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a timeout ends the command's whole process group, background jobs too
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[test: killed after {timeout:g} s]"
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Workspace:
    root = tmp_path_factory.mktemp("docs-examples")
    shims = root / "bin"
    shims.mkdir()
    shimmed = (
        ("stallscope", shlex.join(warm.argv())),
        ("python", f'"{sys.executable}"'),
        ("torchrun", f'"{sys.executable}" -m torch.distributed.run'),
    )
    for name, argv in shimmed:
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "STALLSCOPE_DATA": str(root / "stallscope-data"),
    }
    tally = Tally()
    request.config.pluginmanager.register(tally, "docs-examples-tally")
    return Workspace(root / "work", env, tally)


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def skip_reason(cmd: Command) -> str | None:
    if (reason := cmd.get("skip")) is not None:
        return reason
    if cmd.get("needs") == "no-cuda" and _has_cuda():
        return "shows what happens on a machine without CUDA"
    return None


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.splitlines()[-n:])


@pytest.mark.parametrize("cmd", [_param(c) for c in DOCS_PARSED.commands])
def test_documented_command(cmd: Command, workspace: Workspace) -> None:
    if (reason := skip_reason(cmd)) is not None:
        workspace.tally.skipped.append((cmd.id, reason))
        pytest.skip(reason)
    workspace.tally.ran.append(cmd.id)
    command, res = workspace.run(cmd)
    context = (
        f"\n{cmd.id}: $ {cmd.text}\nran: $ {command}\nexit {res.returncode}\n"
        f"--- stderr (end) ---\n{_tail(res.stderr)}\n--- stdout (end) ---\n{_tail(res.stdout)}"
    )
    exits = {int(x) for x in (cmd.get("exit") or "0").split("|")}
    assert res.returncode in exits, f"exit {res.returncode}, the doc says {cmd.get('exit') or 0}{context}"

    shown = [ln for ln in cmd.shown if ln.strip()]
    stderr = [ln for ln in res.stderr.splitlines() if ln.strip()]
    mode = cmd.get("stderr") or ("all" if exits == {2} and shown else None)
    if mode == "all":
        assert stderr == shown, f"stderr differs from the doc{context}"
    elif mode == "last":
        assert stderr and stderr[-1] == shown[-1], f"the last stderr line differs from the doc's{context}"
    if cmd.get("stdout") == "all":
        stdout = [ln.rstrip() for ln in res.stdout.splitlines() if ln.strip()]
        assert stdout == [ln.rstrip() for ln in shown], f"stdout differs from the doc{context}"


def test_docs_follow_the_convention() -> None:
    """Every command shown in the docs is in a ```console block, so none escapes the test above."""
    docs = parse_docs()
    problems = list(docs.problems)
    texts = {c.text for c in docs.commands}
    problems += [f"XFAIL names a command no doc shows: {text}" for text in XFAIL if text not in texts]
    assert not problems, "\n".join(problems)
    assert len(docs.commands) >= 40, len(docs.commands)


def test_each_docs_commands_are_one_work_unit_under_xdist() -> None:
    """make test runs two at a time: a doc's commands must stay on one worker, in order (tests/conftest.py)."""
    ids = [f"tests/test_docs_examples.py::test_documented_command[{c.id}]" for c in DOCS_PARSED.commands]
    units = [work_unit(i) for i in ids]
    assert units == [c.doc for c in DOCS_PARSED.commands]
    assert work_unit("tests/test_cli.py::test_x[a:1]") == "tests/test_cli.py::test_x[a:1]"  # others: their own
    # a file whose tests share a module-scoped fixture (one torchrun job) is one unit: the job runs once
    assert work_unit("tests/test_zerocode_ranks.py::test_a") == work_unit("tests/test_zerocode_ranks.py::test_b")
    assert work_unit("tests/test_zerocode_ranks.py::test_a") == "tests/test_zerocode_ranks.py"
