"""Run checks in worker processes with a hard per-check wall-clock limit.

Model text is untrusted: a completion can make sympy compute for hours
(``\\boxed{9^{9^9}}``), hold the GIL inside one C call, eat all memory, or
crash the interpreter. So every check runs in a worker process, and the limit
is enforced from outside: the parent SIGKILLs a worker whose current check has
run past ``timeout`` seconds, gives that row ``timeout``, starts a replacement
and goes on. A worker that dies (segfault, OOM kill) gives its current row
``error``. No threads are involved and no library timeout is relied on.

How a limit applies per check while rows travel in chunks (one pipe round trip
per chunk keeps microsecond checks like gsm8k fast): each worker owns two
shared doubles, ``[checks started, start time of the current check]``
(``time.monotonic``, one system-wide clock on Linux). It writes them before
every check — two stores, no system call. The parent sleeps in
``multiprocessing.connection.wait`` until a result arrives or the earliest
deadline (start of a worker's current check + ``timeout``) passes; the counter
also names the row to blame. The rows of a killed worker's chunk other than
the culprit are queued again (those before it ran fine once and re-run: a
plugin's check may run more than once for a row, so it must not count on
running once, e.g. for side effects).

Workers come from a ``forkserver`` (never ``fork``: forking a parent that runs
torch or vLLM threads is unsafe), preload the verifier's modules, set
``OMP_NUM_THREADS=1``, ignore SIGINT (the parent cleans up), die with their
parent (``PR_SET_PDEATHSIG``), run in a process group of their own (a worker
killed at its deadline takes what its check started), cap their address space
(``memory_limit_mb`` each, so a runaway allocation is a ``MemoryError`` →
``error``, not the OOM killer; the machine needs workers × cap), and warm up
before they say ready, so import and first-call costs are never charged to a
row's time limit.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toprcli.errors import UserError
from toprcli.processes import descendants, signal_all
from toprcli.verifiers.base import ERROR, TIMEOUT, Verdict, Verifier
from toprcli.verifiers.registry import resolve_verifier
from toprcli.verifiers.worker import CHECK, EQUIVALENT, _worker_main

DEFAULT_TIMEOUT = 5.0
DEFAULT_MEMORY_LIMIT_MB = 4096
STARTUP_TIMEOUT = 120.0  # a worker that is not ready by then is treated as failing to start
MAX_START_FAILURES = 3  # consecutive workers dying before they are ready → give up
_MAX_WAIT = 1.0  # the parent wakes at least this often (keeps Ctrl-C responsive)

_STARTING, _IDLE, _BUSY = "starting", "idle", "busy"


def default_workers() -> int:
    """One worker per usable core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# -- the parent -------------------------------------------------------------------


class _Worker:
    __slots__ = ("proc", "conn", "progress", "state", "chunk", "base", "dispatched", "started")

    def __init__(self, proc: Any, conn: Any, progress: Any) -> None:
        self.proc = proc
        self.conn = conn
        self.progress = progress
        self.state = _STARTING
        self.chunk: tuple[int, int] | None = None  # global row range [start, end)
        self.base = 0  # checks this worker finished before the current chunk
        self.dispatched = 0.0
        self.started = time.monotonic()

    def current(self) -> tuple[int, float]:
        """(index in the chunk of the running check, its start time); index 0 at dispatch time if none started."""
        while True:  # the worker writes time then counter; re-read if the counter moved meanwhile
            seq = self.progress[0]
            t = self.progress[1]
            if self.progress[0] == seq:
                break
        started = int(seq) - self.base
        if started <= 0:
            return 0, self.dispatched
        return started - 1, max(t, self.dispatched)

    def kill(self) -> None:
        escaped = descendants(self.proc.pid)  # a check's processes in sessions of their own (a sandbox's) left its group
        with contextlib.suppress(OSError):  # its group (worker._harden): processes a check started die with it
            os.killpg(self.proc.pid, signal.SIGKILL)
        signal_all(escaped, signal.SIGKILL)
        try:
            self.proc.kill()
            self.proc.join(5)
        except Exception:
            pass
        try:
            self.conn.close()
        except Exception:
            pass


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()


@dataclass
class _Job:
    """One :meth:`VerifierPool._run`: the chunks (start, end) still to send, the verdicts so far."""

    op: str
    items: list[tuple]
    pending: collections.deque[tuple[int, int]]
    results: list[Verdict | None]
    report: Callable[[int], None]  # items done


class VerifierPool:
    """Worker processes that run one verifier's checks under a hard time limit.

    >>> with VerifierPool("gsm8k", workers=2, timeout=5) as pool:
    ...     verdicts = pool.map(completions, answers)

    ``map`` returns one :class:`Verdict` per row, in order; ``progress(k)`` is
    called as rows finish. ``equivalent`` compares pairs of extracted answers
    (majority voting) the same way. ``stats`` counts timeouts, crashes and restarts.
    """

    def __init__(
        self,
        verifier: Verifier | str,
        *,
        workers: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        chunk_size: int | None = None,
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        start_method: str = "forkserver",
        strict: bool = False,
    ) -> None:
        if isinstance(verifier, str):
            verifier = resolve_verifier(verifier, strict=strict)
        if timeout <= 0:
            raise UserError(f"--timeout must be > 0 seconds, got {timeout}")
        self.verifier = verifier
        self.workers = workers or default_workers()
        self.timeout = float(timeout)
        self.chunk_size = chunk_size or verifier.chunk_size
        self.memory_limit_mb = memory_limit_mb
        self.stats: collections.Counter[str] = collections.Counter()
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # Only takes effect if this process has not started its forkserver yet.
            self._ctx.set_forkserver_preload(["toprcli.verifiers.worker", *verifier.preload])
        self._workers: list[_Worker] = []
        self._start_failures = 0
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    # -- lifecycle

    def __enter__(self) -> VerifierPool:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        progress = self._ctx.RawArray("d", 2)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self.verifier.spec, dict(self.verifier.options), child_conn, progress, self.memory_limit_mb),
            name=f"toprcli-verifier-{self.verifier.name}",
            daemon=True,
        )
        _start_without_main(proc)
        child_conn.close()  # only the worker holds its end: its death reads as EOF here
        w = _Worker(proc, parent_conn, progress)
        self._workers.append(w)
        return w

    def start(self) -> None:
        """Start the workers and wait until all are ready (raises if they cannot start)."""
        if self._closed:
            raise RuntimeError("pool is closed")
        while len(self._workers) < self.workers:
            self._spawn()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while any(w.state == _STARTING for w in self._workers):
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise self._not_ready()
            starting = [w.conn for w in self._workers if w.state == _STARTING]
            for conn in mpc.wait(starting, timeout=min(left, _MAX_WAIT)):
                w = next(w for w in self._workers if w.conn is conn)
                self._on_startup_message(w)

    def _on_startup_message(self, w: _Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(5)  # its exit code, once it is gone
            msg = ("init_error", f"worker exited with code {w.proc.exitcode} before it was ready", False)
        if msg[0] == "ready":
            w.state = _IDLE
            self._start_failures = 0
            return
        self._workers.remove(w)
        w.kill()
        self._start_failures += 1
        _, detail, user = msg
        if user or self._start_failures >= MAX_START_FAILURES or not self._workers:
            self.close()
            if user:
                raise UserError(detail.split(": ", 1)[-1])
            if self.memory_limit_mb:  # the likeliest cause a user can change
                raise UserError(f"verifier workers failed to start ({detail}) — if {self.memory_limit_mb} MiB a worker "
                                "(worker_memory_mb) is too little for this verifier, raise it (0: no cap)")
            raise RuntimeError(f"verifier worker failed to start: {detail}")
        self._spawn()

    def close(self) -> None:
        """Stop the workers (idle ones exit cleanly, busy ones are killed)."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            if w.state == _IDLE:
                try:
                    w.conn.send(None)
                except Exception:
                    pass
        for w in self._workers:
            if w.state == _IDLE:
                w.proc.join(2)
            w.kill()
        self._workers.clear()

    # -- work

    def check(self, completion: str, answer: str | None, row: dict | None = None) -> Verdict:
        """One row (convenience; ``map`` is the fast path)."""
        return self.map([completion], [answer], None if row is None else [row])[0]

    def map(
        self,
        completions: Sequence[str],
        answers: Sequence[str | None],
        rows: Sequence[dict] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[Verdict]:
        """Verdicts for every (completion, answer[, row]), in order."""
        n = len(completions)
        if len(answers) != n or (rows is not None and len(rows) != n):
            raise ValueError("completions, answers and rows must have the same length")
        if not self.verifier.needs_row:
            return self._run(CHECK, list(zip(completions, answers)), progress)
        if rows is None:
            rows = [{"completion": c, "answer": a} for c, a in zip(completions, answers)]
        return self._run(CHECK, list(zip(completions, answers, rows)), progress)

    def equivalent(self, pairs: Sequence[tuple[str, str]], progress: Callable[[int], None] | None = None) -> list[bool]:
        """For every pair of extracted answers: do they say the same thing (the verifier's ``equivalent``)?

        Each comparison runs under the same per-check limit as a check; one
        that times out or fails counts as not equivalent.
        """
        if self.verifier.equivalent is None:
            raise ValueError(f"verifier {self.verifier.name!r} has no equivalence check")
        return [v.correct for v in self._run(EQUIVALENT, [(str(a), str(b)) for a, b in pairs], progress)]

    def _run(self, op: str, items: list[tuple], progress: Callable[[int], None] | None) -> list[Verdict]:
        """Run ``op`` on every item in the workers, under the per-check limit; verdicts in order."""
        n = len(items)
        if n == 0:
            return []
        if self._closed:
            raise RuntimeError("pool is closed")
        if not self._workers:
            self.start()
        # Chunks: big enough to amortise the pipe, small enough to keep every worker busy.
        size = max(1, min(self.chunk_size, -(-n // (self.workers * 4))))
        job = _Job(op, items, collections.deque((s, min(s + size, n)) for s in range(0, n, size)), [None] * n, progress or (lambda k: None))
        try:
            while True:
                self._dispatch(job)
                busy = [w for w in self._workers if w.state == _BUSY]
                if not busy and not job.pending:
                    break
                now = time.monotonic()
                deadline = min((w.current()[1] + self.timeout for w in busy), default=now + _MAX_WAIT)
                waiting = [w.conn for w in self._workers if w.state in (_BUSY, _STARTING)]
                for conn in mpc.wait(waiting, timeout=max(0.0, min(deadline - now, _MAX_WAIT))):
                    self._receive(job, conn)
                self._enforce_limits(job)
        except BaseException:
            self.close()  # Ctrl-C or a bug: leave no stuck workers behind
            raise
        return job.results  # type: ignore[return-value]

    def _dispatch(self, job: _Job) -> None:
        """Send the next pending chunk to every idle worker."""
        for w in list(self._workers):  # _replace edits the list
            if w.state == _IDLE and job.pending:
                start, end = job.pending.popleft()
                w.chunk, w.dispatched, w.state = (start, end), time.monotonic(), _BUSY
                try:
                    w.conn.send((job.op, job.items[start:end]))
                except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                    job.pending.appendleft((start, end))  # never started: nobody to blame
                    self.stats["crashes"] += 1
                    self._replace(w)

    def _receive(self, job: _Job, conn: Any) -> None:
        """What a worker sent: its startup message, a chunk's verdicts, or (it died) the end of its pipe."""
        w = next((w for w in self._workers if w.conn is conn), None)
        if w is None:
            return
        if w.state == _STARTING:
            self._on_startup_message(w)
            return
        try:
            out = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(5)  # it is exiting; its exit status says why
            self.stats["crashes"] += 1
            self._fail(job, w, ERROR, f"verifier worker died ({_exit_reason(w.proc.exitcode)})")
            return
        start, end = w.chunk  # type: ignore[misc]
        for i, (verdict, extracted, score, detail) in zip(range(start, end), out):
            job.results[i] = Verdict(verdict, extracted, score, detail)
        w.base += end - start
        w.chunk, w.state = None, _IDLE
        job.report(end - start)

    def _enforce_limits(self, job: _Job) -> None:
        """Kill a check past the per-check limit (its verdict: timeout); a worker not ready in time is an error."""
        now = time.monotonic()
        for w in [w for w in self._workers if w.state == _BUSY]:
            idx, began = w.current()
            if now - began >= self.timeout:
                self._fail(job, w, TIMEOUT, f"check ran past {self.timeout:g} s; worker killed")
        for w in [w for w in self._workers if w.state == _STARTING]:
            if now - w.started > STARTUP_TIMEOUT:
                self._workers.remove(w)
                w.kill()
                raise self._not_ready()

    def _not_ready(self) -> UserError:
        return UserError(f"verifier {self.verifier.spec}: its workers were not ready after {STARTUP_TIMEOUT:.0f} s — each worker "
                         "imports it: a model that takes longer to load can load on the check's first call instead, with --timeout "
                         "raised to cover that call")

    def _fail(self, job: _Job, w: _Worker, verdict: str, detail: str) -> None:
        """The item ``w`` was checking gets ``verdict``; the rest of its chunk goes back to the queue; ``w`` is replaced."""
        start, end = w.chunk  # type: ignore[misc]
        idx, _ = w.current()
        culprit = start + min(idx, end - start - 1)
        job.results[culprit] = Verdict(verdict, detail=detail)
        self.stats[verdict + "s"] += 1
        job.report(1)
        if culprit + 1 < end:
            job.pending.appendleft((culprit + 1, end))
        if start < culprit:
            job.pending.appendleft((start, culprit))
        self._replace(w)

    def _replace(self, w: _Worker) -> None:
        self._workers.remove(w)
        w.kill()
        self.stats["restarts"] += 1
        self._spawn()


_BLANK_MAIN = types.ModuleType("__main__")


def _start_without_main(proc: Any) -> None:
    """Start ``proc`` without making the child re-import the parent's ``__main__``.

    forkserver/spawn children normally re-run the main script (as
    ``__mp_main__``) to find pickled functions. Our target lives in this
    module, so that buys nothing and costs a lot: an unguarded script would run
    again in every worker, and the ``topr`` script would re-import the whole CLI
    on every worker restart. Hiding ``__main__`` while the child's preparation
    data is built avoids both (main thread, a few milliseconds).
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = _BLANK_MAIN
    try:
        proc.start()
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
