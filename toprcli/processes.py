"""No orphans: everything a ``topr`` command starts dies with it (docs/architecture.md §6).

Some children already die with their parent (``PR_SET_PDEATHSIG``: verifier workers,
torchrun and data-parallel children), but not the processes other libraries start —
vLLM's engine core and workers survive a killed parent, reparented to init, holding
their memory. A kernel signal cannot reach them once the parent is gone, and the
parent cannot act when SIGKILL ends it, so a small **watchdog** process does it:

* :func:`start_watchdog` starts ``python -m toprcli.processes PID`` (stdlib only,
  ~10 MB); it ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C reaches the whole process group:
  the watchdog must outlive the command to clean up after it).
* Every half second it records the command's descendants (pid and start time, from
  ``/proc/*/stat``), so it still knows them after they are reparented.
* When the command's process is gone (its parent pid changes: any exit, any signal,
  SIGKILL included) it sends SIGTERM to every recorded descendant still alive (same
  pid *and* start time, so a recycled pid is never hit) and to their own children,
  waits up to :data:`GRACE_S` seconds and SIGKILLs what is left, then exits.

Linux only (``/proc``); elsewhere :func:`start_watchdog` returns None.

Nor files: vLLM makes its ZMQ sockets (7 per engine) in the temporary directory and
leaves them there after the engine closes. :func:`scratch_dir` gives them a directory
of this process's own, removed when the process exits, by the watchdog when it is
killed, and otherwise by the next topr process that finds it without its owner.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL_S = 0.5  # how often the watchdog records descendants and checks its parent
GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long
PROC = Path("/proc")
SCRATCH_PREFIX = "topr-ipc-"  # + pid-starttime: a scratch dir's owner, even after its pid is recycled
SOCKET_PATH_MAX = 107  # a Unix socket's path (sun_path) holds at most this many bytes


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime is field 22
    return int(fields[1]), int(fields[19])


def _process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of every process (one read of /proc)."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                table[int(entry.name)] = st
    return table


def descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid`` in the process tree: {pid: start time}."""
    table = _process_table()
    below: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        below.setdefault(parent, []).append(child)
    found: dict[int, int] = {}
    todo = list(below.get(pid, ()))
    while todo:
        child = todo.pop()
        if child not in found:
            found[child] = table[child][1]
            todo += below.get(child, ())
    return found


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start


def signal_all(known: dict[int, int], sig: int) -> None:
    """Send ``sig`` to every process of ``known`` (pid: start time) still alive; a pid reused since is left alone."""
    for p, s in known.items():
        if _alive(p, s):
            try:
                os.kill(p, sig)
            except OSError:
                pass


def reap(known: dict[int, int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process of ``known`` still alive (and its descendants), SIGKILL it after ``grace_s``."""
    targets = {p: s for p, s in known.items() if _alive(p, s)}
    for p in list(targets):
        targets.update(descendants(p))
    targets.pop(os.getpid(), None)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_all(targets, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline and any(_alive(p, s) for p, s in targets.items()):
            time.sleep(0.05)
    return sorted(targets)


def watch(parent: int) -> None:
    """The watchdog's loop: record ``parent``'s descendants until it is gone, then reap them.

    Its stdin is a pipe from ``parent``: end of file wakes it at once when the parent dies
    (a forked child may still hold the pipe open, so the parent pid decides).
    """
    import select

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the command's group gets them: it must outlive the command
        signal.signal(s, signal.SIG_IGN)
    owner = _stat(parent)  # its start time names its scratch dir
    known: dict[int, int] = {}
    stdin: int | None = sys.stdin.fileno()
    while os.getppid() == parent:
        known = {p: s for p, s in known.items() if _alive(p, s)}
        known.update(descendants(parent))
        known.pop(os.getpid(), None)
        if stdin is None:
            time.sleep(POLL_S)
        elif select.select([stdin], [], [], POLL_S)[0] and not os.read(stdin, 64):
            stdin = None  # end of file: check the parent now, then poll
    reap(known)
    if owner is not None:
        shutil.rmtree(_scratch_path(parent, owner[1]), ignore_errors=True)


# -- other libraries' files --------------------------------------------------------------


def _scratch_path(pid: int, start: int) -> Path:
    return Path(tempfile.gettempdir()) / f"{SCRATCH_PREFIX}{pid}-{start}"


def scratch_dir() -> Path | None:
    """This process's own temporary directory (made on the first call), for files other libraries
    would leave behind; None where it cannot be made or its paths would be too long for sockets."""
    me = _stat(os.getpid())
    if me is None:  # no /proc: no way to tell a dead owner from a live one
        return None
    path = _scratch_path(os.getpid(), me[1])
    if len(str(path)) + 40 > SOCKET_PATH_MAX:  # + "/" and vLLM's 36-character socket names
        return None
    if not path.is_dir():
        _remove_orphaned_scratch()
        try:
            path.mkdir(mode=0o700)
        except OSError:
            return None
        owner = os.getpid()  # a forked child inherits the exit hook: only the owner removes the dir
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return path


def _remove_orphaned_scratch() -> None:
    """Remove the scratch dirs whose process is gone (killed before it could remove its own)."""
    for entry in Path(tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        pid, _, start = entry.name[len(SCRATCH_PREFIX):].partition("-")
        if pid.isdigit() and start.isdigit() and not _alive(int(pid), int(start)):
            shutil.rmtree(entry, ignore_errors=True)


def start_watchdog() -> subprocess.Popen | None:
    """Start the watchdog of this process (Linux; None elsewhere or if it cannot start)."""
    if not sys.platform.startswith("linux") or not (PROC / str(os.getpid()) / "task").is_dir():
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "toprcli.processes", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
        )
    except OSError:
        return None


if __name__ == "__main__":
    watch(int(sys.argv[1]))


# -- other libraries' output ------------------------------------------------------------


def redirect_output(log: str | os.PathLike[str] | None) -> tuple[int, int] | None:
    """Point file descriptors 1 and 2 (this process's and every child's stdout and stderr) at
    ``log`` (None: stdout at stderr, so that stdout holds only what the command writes to the saved one);
    returns duplicates of the original two, or None when stdout/stderr are not 1 and 2 (e.g. replaced by a
    test runner)."""
    try:
        if sys.stdout.fileno() != 1 or sys.stderr.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    try:  # a log that cannot be made keeps the output on the terminal; the command's own output then says what is wrong
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log is not None else os.dup(2)
    except OSError:
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


def restore_output(saved: tuple[int, int]) -> None:
    """Undo :func:`redirect_output`."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
