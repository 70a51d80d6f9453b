"""A warm interpreter for the tests' ``stallscope`` commands: torch and the other heavy libraries imported once.

A fresh ``python -m profiler`` spends ~5 s of its ~7 s on a one-step training run importing torch and
torchvision (torchvision pulls in ``torch._dynamo``), and the suite runs ~200 such commands. Here one server per
pytest worker imports the third-party libraries once; each command is a small client (``python -S -E warm.py
call SOCK ARGS``) whose server forks a child that runs ``python -m profiler ARGS`` with the client's argv,
working directory, environment and stdin/stdout/stderr (passed over the socket). stallscope's own modules are
imported fresh in each child: only third-party code is shared, so an import-order bug of ours still shows.

The child is the command in every way a test can see through the client: exit code, a death by signal (the
client dies of the same signal), the signals sent to the client (INT, TERM, HUP, QUIT, USR1, USR2 are forwarded),
and a client killed outright (its child's process group is killed). A command whose environment would change how
the shared libraries were set up (a different ``PYTHONPATH``, thread counts, CUDA's variables) runs in a fresh
interpreter instead; so does every command when ``STALLSCOPE_TEST_COLD=1``, or when the server cannot be reached.

Roles (``python warm.py serve SOCK PARENT_PID`` / ``call SOCK ARGS...``): the server accepts and forks one
*minder* per command; the minder forks the command's child, reports its pid to the client, forwards the
client's signals, and sends the child's exit status. The server ends with the pytest worker that started it.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ("numpy", "torch", "torchvision", "torchvision.transforms.v2", "torchvision.models",
           "torchvision.models.detection", "PIL.Image", "psutil", "rich.console", "rich.live", "pynvml")  # fmt: skip
# environment variables read when those libraries are imported or first used: a command that sets any of them
# differently from the server needs an interpreter of its own
SENSITIVE_PREFIXES = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "TORCH", "NVIDIA_", "LD_", "KMP_")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HEADER = struct.Struct("!I")
STATUS = struct.Struct("!i")


def sensitive(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that must match the server's (PYTHONPATH must name this checkout alone)."""
    return {k: v for k, v in env.items() if k.startswith(SENSITIVE_PREFIXES) and k != "PYTHONDONTWRITEBYTECODE"}


# --- client ---------------------------------------------------------------------------------------------------


def fresh_argv(args: list[str] | tuple[str, ...]) -> list[str]:
    """``python -m profiler ARGS`` in a fresh interpreter, as a user runs it."""
    return [sys.executable, "-m", "profiler", *args]


def fresh(args: list[str]) -> None:
    """Run the command in a fresh interpreter (replaces this process)."""
    os.execv(sys.executable, fresh_argv(args))


def call(sock_path: str, args: list[str]) -> None:
    if os.environ.get("STALLSCOPE_TEST_COLD") == "1":
        fresh(args)
    deadline = time.monotonic() + 60  # the server appears once its imports are done (5-10 s)
    while not os.path.exists(sock_path) and os.path.isdir(os.path.dirname(sock_path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
    except OSError:
        fresh(args)
    msg = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    fds = array.array("i", [0, 1, 2])
    conn.sendmsg([HEADER.pack(len(msg)) + msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    reply = _recv_exact(conn, STATUS.size)
    if reply is None or STATUS.unpack(reply)[0] == 0:  # 0: the server says this command needs its own interpreter
        conn.close()
        fresh(args)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(bytes([signum]))

    for sig in FORWARDED:
        signal.signal(sig, forward)
    status = _recv_exact(conn, STATUS.size)
    code = STATUS.unpack(status)[0] if status is not None else -int(signal.SIGKILL)
    if code < 0:  # the child died of a signal: so does this process
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    sys.exit(code)


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --- server ---------------------------------------------------------------------------------------------------


def serve(sock_path: str, parent: int) -> None:
    before = dict(os.environ)
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # a library missing here is imported by the child if it needs it
            __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{sock_path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(16)
    os.rename(tmp, sock_path)  # the socket appears only once the server accepts
    # what the imports set (torch sets TORCHINDUCTOR_CACHE_DIR): a fresh interpreter's command would have it too
    added = {k: v for k, v in os.environ.items() if k not in before}
    listener.settimeout(1.0)
    while _alive(parent):
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        if conn is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                listener.close()
                _mind(conn, sensitive(before), added)  # never returns
            conn.close()
        _reap()
    with contextlib.suppress(OSError):  # the socket and the directory socket_path() made for it
        os.unlink(sock_path)
        os.rmdir(os.path.dirname(sock_path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _mind(conn: socket.socket, server_env: dict[str, str], added: dict[str, str]) -> None:
    """The minder: runs one command in a forked child and reports its status to the client."""
    conn.settimeout(None)
    head, fds, _, _ = conn.recvmsg(HEADER.size, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    fd_list = array.array("i")
    for level, kind, data in fds:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fd_list.frombytes(data[: len(data) - len(data) % fd_list.itemsize])
    size = HEADER.unpack(head)[0]
    request = json.loads(_recv_exact(conn, size) or b"{}")
    env = request["env"]
    wanted = sensitive(env)
    wanted.pop("PYTHONPATH", None)
    same = dict(server_env)
    same.pop("PYTHONPATH", None)
    if env.get("PYTHONPATH", ROOT) != ROOT or wanted != same or len(fd_list) != 3:
        conn.sendall(STATUS.pack(0))
        os._exit(0)
    request["env"] = {**added, **env}
    child = os.fork()
    if child == 0:
        conn.close()
        _child(request, list(fd_list))  # never returns
    for fd in fd_list:
        os.close(fd)
    conn.sendall(STATUS.pack(child))
    os._exit(_watch(conn, child))


def _watch(conn: socket.socket, child: int) -> int:
    pidfd = os.pidfd_open(child)
    while True:
        ready, _, _ = select.select([conn, pidfd], [], [])
        if pidfd in ready:
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                conn.sendall(STATUS.pack(code))
            return 0
        data = conn.recv(16)
        if not data:  # the client is gone (killed): so is its command
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return 0
        for signum in data:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)


def _child(request: dict[str, object], fds: list[int]) -> None:
    os.setpgrp()  # its own group, so that a client killed outright takes the command's whole tree with it
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    cwd = str(request["cwd"])
    os.chdir(cwd)
    _fresh_streams()
    _reseed()
    argv = request["argv"]
    assert isinstance(argv, list)
    sys.argv = ["stallscope", *argv]
    sys.path[:] = [cwd, ROOT, *(p for p in sys.path if p and p not in (ROOT, os.path.dirname(__file__)))]
    import runpy

    code: object = 0
    try:
        runpy.run_module("profiler", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    _exit(code)


def _exit(code: object) -> None:
    """Exit as the interpreter would, less the teardown of every module (torch's takes ~1 s, and a fresh
    command that never imports torch does not pay it): wait for the threads, run the atexit functions, flush."""
    import atexit
    import threading

    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _fresh_streams() -> None:
    """stdin/stdout/stderr as a fresh interpreter would open them on the client's descriptors."""
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    streams = []
    for fd, mode in ((0, "rb"), (1, "wb"), (2, "wb")):
        raw = open(fd, mode, buffering=0 if unbuffered and fd else -1, closefd=False)  # noqa: SIM115 - the streams
        tty = os.isatty(fd)
        line = tty or fd == 2
        streams.append(io.TextIOWrapper(raw, encoding="utf-8", errors="strict" if fd < 2 else "backslashreplace",
                                        line_buffering=line, write_through=unbuffered))  # fmt: skip
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def _reseed() -> None:
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


# --- the tests' side ------------------------------------------------------------------------------------------

_SERVER: dict[str, str] = {}


def socket_path() -> str | None:
    """The socket of this pytest process's server, started the first time it is asked for (None: cold)."""
    if os.environ.get("STALLSCOPE_TEST_COLD") == "1":
        return None
    if "path" not in _SERVER:
        import subprocess
        import tempfile

        path = os.path.join(tempfile.mkdtemp(prefix="stallscope-warm-"), "sock")
        env = {**os.environ, "PYTHONPATH": ROOT}
        # double fork (the launcher exits): the server is not a child of the test process, which counts its
        # children (conftest.no_children)
        launcher = subprocess.Popen(
            [sys.executable, __file__, "daemon", path, str(os.getpid())],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        launcher.wait()
        _SERVER["path"] = path
    return _SERVER["path"]


def server_socket() -> str | None:
    """The socket of this pytest process's server, None before it is started (or when cold)."""
    return _SERVER.get("path")


def argv(args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The argv that runs ``stallscope ARGS`` for a test: through the warm server, or fresh when cold."""
    path = socket_path()
    if path is None:
        return fresh_argv(args)
    return [sys.executable, "-S", "-E", __file__, "call", path, *args]


def _daemon(sock_path: str, parent: int) -> None:
    if os.fork() != 0:
        os._exit(0)
    # a process group of its own (a Ctrl-C at the terminal is not sent to it), in the test's session: a session of
    # its own (setsid) is a scheduling group of its own where the kernel groups by session (sched_autogroup, on
    # here), and its commands then had as much CPU as every other process of the run together; a tune measured
    # that way against a grid run inside the test read computing workers as useless beside two busy processes
    os.setpgid(0, 0)
    serve(sock_path, parent)


if __name__ == "__main__":
    role, where, *rest = sys.argv[1:]
    if role == "call":
        call(where, rest)
    elif role == "daemon":
        _daemon(where, int(rest[0]))
    else:
        serve(where, int(rest[0]))
