"""Progress reporting: stages call a plain function; only ``cli/`` draws bars.

A stage takes ``progress: ProgressFn | None`` and calls it as
``progress(task, done, total, **info)`` — ``task`` names the loop
("generate", "score", "train", "curate:scan", ...), ``done`` counts finished
units out of ``total`` (None when unknown), and ``info`` carries short
display values (completions, tok/s, loss). The CLI turns the calls into rich
bars (``progress_bars`` in cli/common.py); library callers pass their own
function or nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ProgressFn = Callable[..., None]


def report(progress: ProgressFn | None, task: str, done: int, total: int | None = None, **info: Any) -> None:
    """Call ``progress`` if there is one (stages use this instead of checking each time)."""
    if progress is not None:
        progress(task, done, total, **info)
