"""Stopping on a signal: SIGTERM, SIGINT and SIGHUP end a command at a safe point (docs/architecture.md §6).

The CLI calls :func:`install` once; after that a signal raises :class:`Interrupted`
wherever the main thread is, which abandons the shard in flight (shards are written
atomically, so nothing half-written stays) — except inside :func:`deferred`, where the
signal is only recorded: a loop with a natural boundary (the trainer's optimizer step)
polls :func:`requested`, saves what it needs and raises :class:`Interrupted` itself.
A second signal inside :func:`deferred` stops at once. Without :func:`install` (library
use, tests) nothing changes: signals keep Python's default behaviour.

Imports nothing of toprcli: the training loop and the CLI both use it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# SIGHUP: the terminal closed or the ssh session dropped (torchrun passes it to the ranks too).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_requested: int | None = None  # the first signal received
_deferring = 0  # depth of deferred() sections


class Interrupted(BaseException):
    """A command stopped by a signal (a BaseException: no ``except Exception`` swallows it).

    ``detail`` says how far it got (e.g. "stopped after step 3, checkpoint saved").
    """

    def __init__(self, signum: int, detail: str = "") -> None:
        self.signum = int(signum)
        self.detail = detail
        super().__init__(f"{self.name}{': ' + detail if detail else ''}")

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended (130, 143)."""
        return 128 + self.signum


def _on_signal(signum: int, frame: object) -> None:
    global _requested
    first = _requested is None
    if first:
        _requested = signum
    if _deferring and first:
        return  # the loop stops at its next boundary
    raise Interrupted(signum)


def install() -> None:
    """Stop gracefully on SIGINT, SIGTERM and SIGHUP (main thread only; a no-op elsewhere). An ignored
    SIGHUP stays ignored: `nohup topr ...` must survive the hang-up it was started for."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _on_signal)


def requested() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _requested


def reset() -> None:
    """Forget a recorded signal (for callers that run several commands in one process)."""
    global _requested
    _requested = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, a first signal is recorded instead of raised; the code polls :func:`requested`.

    On leaving normally, a recorded signal is raised as :class:`Interrupted`, so work that
    finished its last step still ends the command with the signal's exit code. The outermost section starts with no
    signal recorded: an earlier one has ended what it stopped (raised), and a second run in the same process (a
    notebook's) must not stop before its first step.
    """
    global _deferring
    if not _deferring:
        reset()
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _requested is not None and not _deferring:
        raise Interrupted(_requested, "stopped after finishing")
