"""What every command shares: consoles, the one-line error boundary, option types."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from toprcli.errors import UserError
from toprcli.progress import ProgressFn
from toprcli.shards import output_error

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config (a stage's keys, or a pipeline config with a section per stage). Options given here override it."),
]


def fail(message: str) -> typer.Exit:
    """Print one red error line and return the exit (code 2) to raise."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def user_errors(fn: F) -> F:
    """Turn a :class:`UserError` raised anywhere below a command into one line and exit 2; so
    are permission and disk errors on any path (``shards.output_error``). Anything else is a
    bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            raise fail(str(e)) from None
        except OSError as e:
            err = output_error(e)
            if err is None:
                raise
            raise fail(str(err)) from None

    return wrapper  # type: ignore[return-value]


def make_progress(*extra_columns: Any, transient: bool = False) -> Progress:
    """The progress bar every long loop uses (stderr, so stdout stays clean for --json)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=transient,
    )


@contextlib.contextmanager
def progress_bars(enabled: bool = True, *, transient: bool = False) -> Iterator[ProgressFn | None]:
    """A :data:`toprcli.progress.ProgressFn` that draws one rich bar per task (None when disabled).

    Each new ``task`` name gets a bar; ``info`` values show after it (``key value``).
    """
    if not enabled:
        yield None
        return
    bar = make_progress(TextColumn("{task.fields[info]}"), transient=transient)
    tasks: dict[str, Any] = {}

    def progress(task: str, done: int, total: int | None = None, **info: Any) -> None:
        text = " · ".join(f"{k} {v}" for k, v in info.items())
        if task not in tasks:
            tasks[task] = bar.add_task(task, total=total, completed=done, info=text)
        else:
            bar.update(tasks[task], completed=done, total=total, info=text)

    with bar:
        yield progress


def summary_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    """A two-column rich table of (metric, value)."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, _fmt(value))
    return table


def grid_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row))
    return table


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN: no value
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3g}"
        return f"{value:.4f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"
    return str(value)
