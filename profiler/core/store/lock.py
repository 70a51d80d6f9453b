"""One writer per run directory: the ``.stallscope.lock`` claim, and files created never world-writable."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from pathlib import Path

from profiler.core.store.schema import LOCK_NAME


class RunDirBusy(Exception):
    """Another live process writes this run directory; ``pid`` is its process id (None: unknown)."""

    def __init__(self, run_dir: Path, pid: int | None) -> None:
        who = f"a live run (pid {pid})" if pid is not None else "another live run"
        super().__init__(f"'{run_dir}' is in use by {who}")
        self.run_dir = run_dir
        self.pid = pid


def make_dir(path: Path) -> None:
    """``mkdir -p`` with the umask respected, except that a directory it creates is never world-writable."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for d in missing:
        no_world_write(d)


def no_world_write(path: Path) -> None:
    """Clear the world-write bit of a file or directory stallscope created (umask 000 would leave it set)."""
    with contextlib.suppress(OSError):
        mode = path.lstat().st_mode
        if mode & stat.S_IWOTH and not stat.S_ISLNK(mode):
            path.chmod(stat.S_IMODE(mode) & ~stat.S_IWOTH)


_LOCKS: dict[str, list[int]] = {}  # resolved run directory -> [lock fd, stores using it]
_LOCKS_GUARD = threading.Lock()
_CLI_CLAIMS: set[str] = set()  # directories the CLI holds until the process exits


def _lock_pid(lock: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(lock.read_text().split()[0])
    return None


def lock_run_dir(run_dir: Path, *, store: bool = False) -> bool:
    """Claim ``run_dir`` for this process (RunDirBusy when another live process holds it); True when this
    call took the lock. ``store``: a RunStore's claim, refused when another store of this process has it."""
    key = os.path.realpath(run_dir)
    with _LOCKS_GUARD:
        held = _LOCKS.get(key)
        if held is not None:
            if store and held[1]:
                raise RunDirBusy(run_dir, os.getpid())
            held[1] += store
            return False
        lock = Path(key) / LOCK_NAME
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)  # our own lock on this file is not held: closing releases nothing of ours
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise RunDirBusy(run_dir, _lock_pid(lock)) from None
            raise
        no_world_write(lock)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _LOCKS[key] = [fd, int(store)]
        return True


def unlock_run_dir(run_dir: Path) -> None:
    """A RunStore's release of :func:`lock_run_dir`; the lock itself goes when no store of this process uses it
    (a CLI's claim, ``store=False``, lasts until the process exits)."""
    key = os.path.realpath(run_dir)
    with _LOCKS_GUARD:
        held = _LOCKS.get(key)
        if held is None:
            return
        held[1] = max(0, held[1] - 1)
        if held[1] == 0 and key not in _CLI_CLAIMS:
            os.close(held[0])
            del _LOCKS[key]


def claim_run_dir(run_dir: Path) -> None:
    """The CLI's claim on a run (sweep, tune) directory for the rest of the process: RunDirBusy naming the pid
    of the live run that holds it."""
    lock_run_dir(run_dir)
    _CLI_CLAIMS.add(os.path.realpath(run_dir))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a writer's liveness, a target to attach to)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True
