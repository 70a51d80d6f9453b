"""Run-store faults (issue #13): a store that cannot be written mid-run (file size limit, directory removed or
read-only), `--out` that cannot be a run directory, damaged or locked stores given to the readers, two runs on
one directory, and the modes run directories are created with.

Each checks what the user sees (one line), the exit code, and that what was committed is kept: the store
passes ``PRAGMA integrity_check`` and ``stallscope report`` reads it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, stallscope, wait_until

from profiler.cli import main
from profiler.core import store as store_mod
from profiler.core.session import Session
from profiler.core.store import LOCK_NAME, RunDirBusy, integrity_ok, load_run, lock_run_dir, unlock_run_dir
from profiler.core.store import reader as store_reader

# bytes: over the store's first commits (a CLI run's set-up included), reached within seconds of steps
FSIZE_LIMIT = {"cli": 150_000, "session": 120_000}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# a user's own loop of short steps: until the store stops writing, then 100 more (argv[2] == "fail"), or
# argv[2] steps (doing AT_50 after the 50th); prints how many steps it trained
LOOP = textwrap.dedent("""
    import sys, time
    from profiler import Session
    n, until = 0, None
    with Session(sys.argv[1], sample_hz=1, meta={"scenario": "own-loop"}) as s:
        for _ in s.wrap(iter(lambda: [0] * 4, None)):
            with s.phase("compute"):
                time.sleep(0.001)
            n += 1
            if n == 50:
                AT_50
            if until is None and sys.argv[2] == "fail" and s.recording.failure is not None:
                until = n + 100
            if n == (until if sys.argv[2] == "fail" else int(sys.argv[2])):
                break
    print("trained", n, until)
""")

# never ends: only a signal stops it
FOREVER = textwrap.dedent("""
    import sys, time
    from profiler import Session
    with Session(sys.argv[1], meta={"scenario": "forever"}) as s:
        for _ in s.wrap(iter(lambda: [0] * 4, None)):
            with s.phase("compute"):
                time.sleep(0.005)
""")


def _limit_fsize(limit: int) -> Callable[[], None]:
    def limit_child() -> None:
        # Python ignores SIGXFSZ (so write() returns EFBIG rather than the signal killing the process); say it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_child


def _failure_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "could not write the run store" in line]


def _reportable(run_dir: Path) -> int:
    """The store is sound and `report` reads it; its steps are 0..N without a gap. Returns N + 1."""
    assert integrity_ok(run_dir)
    steps = [s.step for s in load_run(run_dir).steps]
    assert steps == list(range(len(steps)))
    assert main(["report", str(run_dir), "--json"]) == 0
    return len(steps)


def test_cli_run_over_the_file_size_limit_stops_with_one_line(tmp_path: Path, tiny_scenario, capsys) -> None:
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "profiler", "run", str(tiny_scenario(steps=1_000_000)), "--no-live", "--out", str(out),
         "--sample-hz", "1"],  # steps, not samples, fill the store: it trips soon after training starts
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV, preexec_fn=_limit_fsize(FSIZE_LIMIT["cli"]),
        check=False,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 90  # it stopped; it did not train on for a million steps
    assert "Traceback" not in res.stderr and res.stdout == ""
    (line,) = _failure_lines(res.stderr)
    assert f"{out / 'run.sqlite'}" in line and "file size limit" in line and "stopped at step" in line
    kept = _reportable(out)
    assert f"steps up to {kept - 1} kept" in line
    meta = load_run(out).meta  # in meta, or (the store full) in store-error.txt beside it
    assert meta["status"] == "failed" and "file size limit" in meta["error"]
    capsys.readouterr()


def test_session_api_over_the_file_size_limit_trains_on_and_says_so_once(tmp_path: Path, capsys) -> None:
    out = tmp_path / "own"
    res = subprocess.run(
        [sys.executable, "-c", LOOP.replace("AT_50", "pass"), str(out), "fail"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV,
        preexec_fn=_limit_fsize(FSIZE_LIMIT["session"]), check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    _, trained, until = res.stdout.split()
    assert trained == until  # the user's training went on past the failure
    assert "Traceback" not in res.stderr
    (line,) = _failure_lines(res.stderr)
    assert "recording stopped, training goes on" in line
    assert 0 < _reportable(out) < int(trained) - 100
    assert load_run(out).meta["status"] == "failed"
    assert not (out / "summary.json").exists()  # it would claim steps the store does not hold
    capsys.readouterr()


def _steps(run_dir: Path) -> int:
    try:
        return len(load_run(run_dir).steps)
    except store_mod.StoreError:
        return 0


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a disk that really fills (ENOSPC). Mounting needs root; skipped where it cannot."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    made = os.geteuid() == 0 and shutil.which("mount") is not None
    if made:
        made = (
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=False).returncode == 0
        )
    if not made:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_session_api_on_a_full_disk_trains_on_and_says_so_once(small_fs: Path) -> None:
    out = small_fs / "own"
    res = subprocess.run(
        [sys.executable, "-c", LOOP.replace("AT_50", "pass"), str(out), "fail"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    _, trained, until = res.stdout.split()
    assert trained == until and "Traceback" not in res.stderr
    (line,) = _failure_lines(res.stderr)
    assert "the disk is full" in line and "training goes on" in line
    assert _reportable(out) > 0


def test_session_whose_directory_is_removed_warns_once_and_trains_on(tmp_path: Path, caplog) -> None:
    out = tmp_path / "own"
    with Session(out, sample_hz=20, meta={"scenario": "removed"}) as s:
        for n, _ in enumerate(s.wrap(iter(lambda: [0] * 4, None))):
            if n == 20:
                assert wait_until(lambda: len(load_run(out).steps) > 0, timeout=10)
                shutil.rmtree(out)
            if n > 20 and (s.recording.failure is not None or n > 5000):
                break
            time.sleep(0.001)
    lines = [r.getMessage() for r in caplog.records if "could not write the run store" in r.getMessage()]
    assert len(lines) == 1 and "the run directory was removed" in lines[0]
    assert s.summary() is not None  # the user's loop still gets its in-memory summary


def _unprivileged(cmd: list[str]) -> list[str]:
    """Tests run as root, whom file modes do not stop: the child runs without the capabilities that override
    them (root still owns its files, so its own mode bits apply). As a user: the command itself."""
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]


NO_SETPRIV = os.geteuid() == 0 and shutil.which("setpriv") is None
WHY = "as root a file mode stops no write, and setpriv (util-linux) is not here to drop that privilege"


@pytest.mark.skipif(NO_SETPRIV, reason=WHY)
def test_run_directory_made_read_only_mid_run_keeps_the_whole_store(tmp_path: Path) -> None:
    """A directory made read-only mid-run: SQLite's files are already open, so the store goes on; only
    summary.json cannot be created, which is said once."""
    out = tmp_path / "own"
    code = LOOP.replace("AT_50", "import os; os.chmod(sys.argv[1], 0o555)")
    res = subprocess.run(
        _unprivileged([sys.executable, "-c", code, str(out), "300"]),
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["trained", "300", "None"] and "Traceback" not in res.stderr
    warned = [line for line in res.stderr.splitlines() if "summary.json" in line]
    assert len(warned) == 1 and "the run store holds the run" in warned[0]
    out.chmod(0o755)
    assert _reportable(out) == 300


@pytest.mark.skipif(NO_SETPRIV, reason=WHY)
def test_out_that_is_unreadable_is_one_line_exit_2(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    locked.chmod(0o000)
    res = subprocess.run(
        _unprivileged([sys.executable, "-m", "profiler", "run", "mlp-mnist", "--steps", "1", "--no-live", "--out",
                       str(locked)]),
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV, check=False,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert f"--out '{locked}'" in line and "not readable and writable" in line


@pytest.mark.parametrize("kind", ["file", "dangling-symlink", "under-a-file"])
def test_out_that_cannot_be_a_run_directory_is_one_line_exit_2(tmp_path: Path, kind: str, capsys) -> None:
    target = tmp_path / "out"
    if kind == "file":
        target.write_text("x")
        needle = "is a file"
    elif kind == "dangling-symlink":
        target.symlink_to(tmp_path / "gone")
        needle = "dangling symlink"
    else:
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "sub"
        needle = "not writable"
    assert main(["run", "mlp-mnist", "--steps", "1", "--no-live", "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out '{target}'" in err[0] and needle in err[0]
    assert not (tmp_path / "gone").exists()  # nothing made through the link


# -- damaged and locked stores given to the readers --------------------------------------------------

RUN = ROOT / "tests" / "data" / "runs" / "cpu-workers"
HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("PRAGMA locking_mode=EXCLUSIVE")
    con.execute("BEGIN EXCLUSIVE")
    con.execute("INSERT OR REPLACE INTO meta VALUES ('holder', '1')")
    print("held", flush=True)
    time.sleep(120)
""")


def _damage(run_dir: Path, kind: str) -> None:
    db = run_dir / "run.sqlite"
    data = bytearray(db.read_bytes())
    if kind == "truncated":
        db.write_bytes(bytes(data[: len(data) // 2]))
    elif kind == "garbage-header":
        db.write_bytes(b"\x00garbage" * 12 + bytes(data[96:]))
    elif kind == "garbage-pages":
        for i in range(8192, len(data), 4096):  # every page after the first two: the tables' b-trees
            data[i : i + 64] = b"\xff" * 64
        db.write_bytes(bytes(data))
    elif kind == "empty":
        db.write_bytes(b"")
    elif kind == "newer-schema":
        con = sqlite3.connect(db)
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(store_mod.SCHEMA_VERSION + 1),))
        con.commit()
        con.close()


def _reader_args(command: str, run_dir: Path) -> list[str]:
    if command == "compare":
        return ["compare", str(RUN), str(run_dir)]
    return [command, str(run_dir)]


DAMAGE = {
    "truncated": "corrupt or truncated",
    "garbage-header": "corrupt or truncated",
    "garbage-pages": "corrupt or truncated",
    "empty": "not a readable stallscope run store",
    "newer-schema": "newer stallscope",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_stores_are_one_line_exit_2_for_every_reader(tmp_path: Path, kind: str, capsys) -> None:
    run_dir = tmp_path / kind
    shutil.copytree(RUN, run_dir)
    _damage(run_dir, kind)
    for command in ("report", "watch", "compare", "whatif"):
        assert main(_reader_args(command, run_dir)) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, (command, err)
        assert str(run_dir / "run.sqlite") in err[0] and DAMAGE[kind] in err[0], (command, err)


@pytest.fixture
def held_store(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """A copy of a run whose file another process holds with a write transaction (``held_store(mode)``)."""
    procs: list[subprocess.Popen[str]] = []

    def hold(mode: str) -> Path:
        run_dir = tmp_path / mode
        shutil.copytree(RUN, run_dir)
        code = HOLDER if mode == "exclusive" else HOLDER.replace('con.execute("PRAGMA locking_mode=EXCLUSIVE")', "")
        p = subprocess.Popen(
            [sys.executable, "-c", code, str(run_dir / "run.sqlite")], stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        return run_dir

    yield hold
    for p in procs:
        p.kill()
        p.wait()


def test_a_store_locked_exclusively_is_one_line_exit_2(held_store, monkeypatch, capsys) -> None:
    # where the reader reads it (a patch of the package's re-export would leave each command waiting the full 3 s)
    monkeypatch.setattr(store_reader, "READ_TIMEOUT_S", 0.3)
    run_dir = held_store("exclusive")
    for command in ("report", "watch", "compare", "whatif"):
        assert main(_reader_args(command, run_dir)) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is locked by another process" in err[0] and str(run_dir) in err[0], err
        assert "for over 0.3 s" in err[0], err


def test_a_live_writers_store_reads_while_it_writes(held_store, capsys) -> None:
    """WAL: a writer's open transaction does not block readers; they see what it last committed."""
    run_dir = held_store("wal-writer")
    assert main(["report", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] > 0


def test_watch_of_a_run_whose_writer_is_sigkilled_ends_interrupted(tmp_path: Path) -> None:
    run, err = tmp_path / "run", tmp_path / "watch.err"
    writer = subprocess.Popen([sys.executable, "-c", FOREVER, str(run)], cwd=ROOT, env=ENV)
    try:
        assert wait_until(lambda: _steps(run) > 0, timeout=30)
        with err.open("w") as err_file:
            watcher = subprocess.Popen(
                [sys.executable, "-m", "profiler", "watch", str(run), "--json"],
                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=err_file, text=True,
            )  # fmt: skip
            assert wait_until(lambda: "watching" in err.read_text(), timeout=60)
            writer.kill()
            writer.wait()  # reaped: its pid is gone, as a killed writer's is
            stdout, _ = watcher.communicate(timeout=60)
    finally:
        writer.kill()
    assert watcher.returncode == 0, err.read_text()
    assert json.loads(stdout)["status"] == "interrupted"
    assert _reportable(run) > 0


# -- one run per directory ---------------------------------------------------------------------------


def test_a_live_run_refuses_a_second_on_its_out_and_stops_when_its_directory_is_removed(
    tmp_path: Path, tiny_scenario
) -> None:
    out, scenario = tmp_path / "run", str(tiny_scenario(steps=1_000_000))
    first = subprocess.Popen(
        [sys.executable, "-m", "profiler", "run", scenario, "--no-live", "--out", str(out)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: _steps(out) > 5, timeout=90)
        second = stallscope("run", scenario, "--no-live", "--out", str(out), timeout=120)
        assert _reportable(out) > 5  # the live run is undisturbed, and its store reads while it writes
        shutil.rmtree(out)
        stdout, stderr = first.communicate(timeout=60)
    finally:
        first.kill()
    assert second.returncode == 2
    (line,) = second.stderr.strip().splitlines()
    assert f"--out '{out}' is in use by a live run (pid {first.pid})" in line
    assert first.returncode == 1, stderr
    (line,) = _failure_lines(stderr)
    assert "the run directory was removed" in line and "stopped at step" in line
    assert "Traceback" not in stderr and stdout == ""


def test_a_stale_lock_from_a_dead_process_does_not_block(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    code = "import sys, time; from profiler.core.store import lock_run_dir as lock; lock(sys.argv[1])"
    code += "; print('ok', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ok"
    with pytest.raises(RunDirBusy) as busy:
        lock_run_dir(out)
    assert busy.value.pid == p.pid
    p.kill()
    p.wait()
    assert (out / LOCK_NAME).exists()  # left behind by the killed process
    with Session(out, meta={"scenario": "after-a-stale-lock"}) as s:
        for n, _ in enumerate(s.wrap(range(5))):
            assert n < 5
    assert load_run(out).meta["status"] == "complete"
    assert lock_run_dir(out) and not unlock_run_dir(out)


def test_two_sessions_of_one_process_on_one_directory(tmp_path: Path) -> None:
    with Session(tmp_path / "run", meta={"scenario": "first"}), pytest.raises(RunDirBusy):
        Session(tmp_path / "run", meta={"scenario": "second"}).start()


# -- modes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_run_directories_respect_the_umask_and_are_never_world_writable(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        from profiler.cli.common import prepare_out

        cli_out = prepare_out(str(tmp_path / "cli" / "nested" / "run"), "x")
        run = tmp_path / "api" / "nested" / "run"
        with Session(run, meta={"scenario": "modes"}) as s:
            for _ in s.wrap(range(3)):
                pass
            open_files = [p for p in (run / "run.sqlite-wal", run / "run.sqlite-shm") if p.exists()]
            open_modes = [stat.S_IMODE(p.stat().st_mode) for p in open_files]
    finally:
        os.umask(old)
    dirs = [tmp_path / "cli", tmp_path / "cli" / "nested", cli_out, tmp_path / "api", tmp_path / "api" / "nested", run]
    files = {  # what each file is created with before the umask
        run / "run.sqlite": 0o644,  # SQLite's default (its -wal and -shm take the same)
        run / "summary.json": 0o666,
        run / LOCK_NAME: 0o644,
        cli_out / LOCK_NAME: 0o644,
    }
    for path in dirs + list(files):
        mode = stat.S_IMODE(path.stat().st_mode)
        want = files.get(path, 0o777) & ~umask & ~stat.S_IWOTH
        assert mode == want, (path, oct(mode), oct(want))
    assert open_files and all(m == 0o644 & ~umask for m in open_modes), open_modes


def test_store_errors_takes_warn_or_raise_only(tmp_path: Path) -> None:
    from profiler import Session

    with pytest.raises(ValueError, match="allowed 'warn' or 'raise'"):
        Session(tmp_path / "run", store_errors="ignore")
