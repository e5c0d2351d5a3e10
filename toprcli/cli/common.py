"""What every command shares: consoles, tables and bars, the one-line error boundary, and the
process it runs in (signals, the watchdog, where other libraries' output goes)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.cells import cell_len
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from toprcli import interrupt
from toprcli.errors import OutputLocked, UserError
from toprcli.progress import ProgressFn
from toprcli.shards import json_safe, output_error

# Output that is not a terminal (a file, a pipe) is never wrapped: tables and lines keep their natural width.
console = Console(width=None if sys.stdout.isatty() else 1_000_000)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 1_000_000)

F = TypeVar("F", bound=Callable[..., Any])

Verbose = Annotated[
    bool,
    typer.Option("--verbose", metavar="", help="Show other libraries' warnings, banners and progress bars (by default they go to the command's log file)."),
]
Json = Annotated[bool, typer.Option("--json", metavar="", help="Print the summary as JSON on stdout instead of a table.")]
RESUME = "rerun the same command to resume (complete work is kept)"


# -- the process a command runs in (docs/architecture.md §6) ---------------------------

_own_process = False  # the command is this process's entry point (main()), not a call inside another program
_saved_fds: tuple[int, int] | None = None  # the terminal's stdout, stderr while others' output goes to _log
_log: Path | None = None
_made_for_log: list[Path] = []  # _log, if this command made it, and the directories made to hold it (removed again if empty)


def begin_process() -> None:
    """Called once by ``main()``: stop gracefully on SIGINT/SIGTERM; start the watchdog."""
    global _own_process
    from toprcli.processes import start_watchdog

    _own_process = True
    warnings.showwarning = _show_warning  # topr's own warnings one line from the start (a config's, as it loads)
    interrupt.install()
    start_watchdog()


def send_noise_to(log: str | os.PathLike[str] | None, verbose: bool = False, json_out: bool = False) -> None:
    """From here on, other libraries' output (warnings, banners, bars, child processes) goes to ``log``;
    topr's consoles keep the terminal. Only where the command owns its process, and not with ``verbose``:
    then, under ``json_out``, it goes to stderr (a plugin's print or vLLM's log on stdout broke the JSON)."""
    global _saved_fds, _log
    from toprcli.processes import redirect_output

    log = None if verbose else log
    if not _own_process or _saved_fds is not None or log is None and not json_out:
        return
    if log is not None:
        _made_for_log[:] = [p for p in (Path(log).absolute(), *Path(log).absolute().parents) if not p.exists()]
    _saved_fds = redirect_output(log)
    if _saved_fds is not None:
        console.file, err_console.file = (os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace") for fd in _saved_fds)
        if log is not None:
            warnings.showwarning, _log = _show_warning, Path(log)


def restore_output() -> None:
    """Point stdout and stderr back at the terminal (before a traceback is printed)."""
    from toprcli.processes import restore_output as restore

    if _saved_fds is not None:
        restore(_saved_fds)
    _drop_empty_log()  # nothing went to it: no empty <out>.log beside the output


def _drop_empty_log() -> None:
    """Remove the command's log, and the directories made for it, when nothing was written to it. Only a log this
    command made: a run's log may be open in the command running it (a second command, refused its lock, removed it)."""
    if _log is not None and _log.absolute() in _made_for_log and _log.is_file() and not _log.stat().st_size:
        _log.unlink(missing_ok=True)
        for d in _made_for_log[1:]:  # deepest first
            with contextlib.suppress(OSError):
                d.rmdir()


_default_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """topr's own warnings stay on screen as one line; other libraries' go to the log."""
    if Path(filename).resolve().is_relative_to(Path(__file__).resolve().parents[1]):
        err_console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


def echo(text: str) -> None:
    """A line on the command's stdout (``--json``), which stays the terminal's when others' output is logged."""
    console.file.write(text + "\n")
    console.file.flush()


def echo_json(data: Any, indent: int | None = None) -> None:
    """``--json`` output: ``data`` as one JSON document (what JSON has no type for, as text; NaN and infinities,
    a diverged loss, as null)."""
    echo(json.dumps(json_safe(data), indent=indent, default=str, allow_nan=False))


def _log_has_messages() -> bool:
    return _log is not None and _log.is_file() and _log.stat().st_size > 0


def note_in_log(text: str) -> None:
    """Append ``text`` to the command's log, stamped with the time and the command: how a long run ended (an error, a
    traceback, a stop) stays in the run's directory beside the other libraries' messages, not only on a terminal."""
    if _log is None or not _log.is_file():
        return
    with contextlib.suppress(OSError), open(_log, "a", encoding="utf-8") as f:
        f.write(f"\n[{time.strftime('%Y-%m-%d %H:%M:%S')}] {' '.join(['topr', *sys.argv[1:]])}\n{text.rstrip()}\n")


def fail(message: str, *, own_log: bool = True) -> typer.Exit:
    """Print one red error line and return the exit (code 2) to raise. While other libraries'
    output goes to a log, the line names it (a failure's root cause may be there) and goes to it too;
    not ``own_log`` (refused the output's lock), the log is the running command's: left alone."""
    if own_log and _log_has_messages():
        note_in_log(f"error: {message}")
        message += f" (other libraries' messages: {_log})"
    else:  # bad input, refused before anything wrote to the log: nothing of it is left
        _drop_empty_log()
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)  # paths, patterns: [a-z] is text
    return typer.Exit(code=2)


def user_errors(fn: F | None = None, *, resume: str = RESUME) -> Any:
    """Turn a :class:`UserError` raised anywhere below a command into one line and exit 2; so
    are permission and disk errors on any path (``shards.output_error``). A SIGTERM or SIGINT
    (:class:`~toprcli.interrupt.Interrupted`) is one line saying how to ``resume`` and exit
    143 or 130. Anything else is a bug and keeps its traceback.

    Use bare (``@user_errors``) or with the command's resume advice (``@user_errors(resume=...)``).
    """
    if fn is None:
        return functools.partial(user_errors, resume=resume)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise fail(str(e), own_log=not isinstance(e, OutputLocked)) from None
        except interrupt.Interrupted as e:
            tell_interrupted(e, resume)
            raise typer.Exit(code=e.exit_code) from None
        except OSError as e:
            err = output_error(e)
            if err is None:
                raise
            raise fail(str(err)) from None

    return wrapper


def tell_interrupted(e: interrupt.Interrupted, resume: str | None = None) -> None:
    """The one line a signal's stop ends with; a terminal that is gone (SIGHUP: the pty closed) takes nothing, and
    the exit code must still say which signal (an EIO here was a traceback and exit 1)."""
    detail = f" ({e.detail})" if e.detail else ""
    if _log_has_messages():
        note_in_log(f"interrupted by {e.name}{detail}")
    with contextlib.suppress(OSError):
        err_console.print(f"[bold yellow]interrupted by {e.name}[/]{escape(detail)}" + (f" — {escape(resume)}" if resume else ""),
                          highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress_bars(enabled: bool = True, *, transient: bool = False) -> Iterator[ProgressFn | None]:
    """A :data:`toprcli.progress.ProgressFn` that draws one rich bar per task (None when disabled).

    Each new ``task`` name gets a bar; ``info`` values show after it (``key value``). Off a terminal (a log file,
    CI) a bar is drawn once, at its end, or not at all: a task gets a plain line every :data:`LINE_EVERY_S` instead,
    and one when it completes.
    """
    if not enabled:
        yield None
        return
    if not err_console.is_terminal:
        yield _progress_lines(LINE_EVERY_S)
        return
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=transient)  # stderr: stdout stays clean
    tasks: dict[str, Any] = {}

    def progress(task: str, done: int, total: int | None = None, **info: Any) -> None:
        text = " · ".join(f"{k} {v}" for k, v in info.items())
        if task not in tasks:
            tasks[task] = bar.add_task(task, total=total, completed=done, info=text)
        else:
            bar.update(tasks[task], completed=done, total=total, info=text)

    bar.start()
    try:
        yield progress
    finally:
        with contextlib.suppress(OSError):  # its last refresh, to a terminal that is gone (SIGHUP), must not hide why it ended
            bar.stop()


LINE_EVERY_S = 30.0  # off a terminal: how often a running task's line is printed


def _progress_lines(every_s: float) -> ProgressFn:
    """A :data:`~toprcli.progress.ProgressFn` printing ``task done/total · info · elapsed`` lines on stderr: each time a
    task has run ``every_s`` since its last line, and when a task that printed one completes."""
    started: dict[str, float] = {}
    last: dict[str, float] = {}
    counted: dict[str, int] = {}
    ended: set[str] = set()

    def progress(task: str, done: int, total: int | None = None, **info: Any) -> None:
        now = time.monotonic()
        complete = total is not None and done >= total
        if task not in started or done < counted[task] or task in ended and not complete:  # a task run again (iterate's next round)
            started[task], last[task] = now, now
            ended.discard(task)
        counted[task] = done
        if task in ended or now - last[task] < every_s and not (complete and last[task] > started[task]):
            return  # a task done within every_s prints nothing: its command's summary follows
        last[task] = now
        if complete:
            ended.add(task)
        count = f"{done:,}/{total:,}" if total is not None else f"{done:,}"
        minutes, seconds = divmod(int(now - started[task]), 60)
        text = " · ".join([f"{task} {count}", *(f"{k} {v}" for k, v in info.items()), f"{minutes}:{seconds:02d}"])
        err_console.print(text, highlight=False, markup=False, soft_wrap=True)

    return progress


def print_tracked(run_root: str | os.PathLike[str], report_to: list[str]) -> None:
    """Where a command's tracked runs are (``tensorboard: runs/x/tb``), a line each, as `topr iterate` ends."""
    from toprcli.tracking import tracked_in

    for name, where in tracked_in(run_root, report_to).items():
        console.print(f"{name}: {where}", highlight=False, markup=False)


def print_summary(title: str, rows: Iterable[tuple[str, Any]], as_json: bool = False) -> None:
    """A command's (label, value) summary: a table, or with ``--json`` one object keyed by label (``hidden_size``)."""
    if as_json:
        echo_json({label.replace(" ", "_"): value for label, value in rows})
    else:
        console.print(summary_table(title, rows))


def summary_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    """A two-column rich table of (metric, value)."""
    return grid_table(title, ("metric", "value"), rows)


def grid_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    # Paths and values: [v1] is text, not markup. Off a terminal the title (often a path) is not wrapped to the
    # table's width; on one, a value too long for its column folds onto the next line rather than being cut.
    table = Table(title=escape(title), show_header=True, header_style="bold", min_width=None if console.is_terminal else cell_len(title))
    for i, c in enumerate(columns):
        table.add_column(escape(c), justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(escape(_fmt(v)) for v in row))
    return table


def record_table(title: str, columns: dict[str, str], records: Iterable[dict[str, Any]]) -> Table:
    """A row per record: ``columns`` maps each header to the record's key it shows (– where a record has none)."""
    return grid_table(title, list(columns), [[r.get(key) for key in columns.values()] for r in records])


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN: no value
        return "–"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3g}"
        if abs(value) >= 1000:  # tokens/s 19,342.5, not 19342.4597
            return f"{value:,.1f}"
        text = f"{value:.4f}".rstrip("0")
        return text + "0" if text.endswith(".") else text  # 0.99999999 is 1.0, as 1.0 is (it was "1")
    return str(value)
