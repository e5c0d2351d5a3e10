"""The verifier worker process: checks chunks of rows in isolation (see :mod:`toprcli.verifiers.pool`).

It hardens itself (one thread, no SIGINT, dies with its parent, capped address
space), builds and warms up the verifier, says ready, then runs chunks and
records, before each check, the check's number and start time in shared memory
so the parent can enforce the per-check deadline from outside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from toprcli.errors import UserError
from toprcli.verifiers.base import ERROR
from toprcli.verifiers.registry import resolve_verifier

CHECK, EQUIVALENT = "check", "equivalent"  # what a worker runs on a chunk: Verifier.check or Verifier.equivalent


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out[:300]


def _harden(memory_limit_mb: int | None) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # a group of its own: a worker killed at a deadline takes what its check started with it
        os.setpgrp()
    try:  # die with the parent (the forkserver, which exits with our main process)
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if memory_limit_mb:
        try:
            import resource

            limit = int(memory_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass


def _worker_main(spec: str, options: dict, conn: Any, progress: Any, memory_limit_mb: int | None) -> None:
    _harden(memory_limit_mb)
    try:
        verifier = resolve_verifier(spec, **options)
        if verifier.warmup is not None:
            verifier.warmup()
    except BaseException as e:  # report anything, then exit
        with contextlib.suppress(Exception):
            conn.send(("init_error", _describe(e), isinstance(e, UserError)))
        return
    conn.send(("ready", os.getpid()))
    ops = {CHECK: verifier.check, EQUIVALENT: verifier.equivalent}
    now = time.monotonic
    seq = 0
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        op, items = msg
        fn = ops[op]
        out = []
        for item in items:
            progress[1] = now()  # start time first, then the counter: see _Worker.current()
            seq += 1
            progress[0] = seq
            try:
                v = fn(*item)
                out.append((v.verdict, v.extracted_answer, v.score, v.detail))
            except BaseException as e:  # math-verify's TimeoutException is not an Exception
                out.append((ERROR, None, None, _describe(e)))
        conn.send(out)
