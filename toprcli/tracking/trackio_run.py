"""trackio: a local SQLite store per project under ``TRACKIO_DIR`` (``trackio show`` opens the
dashboard); one step axis per run, so like W&B the step counts log calls and each axis's own step is
logged beside its metrics (``round/step``, ``train/step``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class TrackioRun:
    def __init__(self, info, state: dict[str, Any], config: dict[str, Any]):
        import trackio

        self.trackio, self.state = trackio, state
        project = info.project or "toprcli"
        resume = "allow" if state.get("name") else "never"  # a named run trackio never stored (nothing logged before a kill) is made
        state.setdefault("step", 0)
        self.run = trackio.init(project=project, name=state.get("name") or _free_name(trackio, project, info.name), group=info.group,
                                resume=resume, config=config, auto_log_cpu=False, auto_log_gpu=False, embed=False)
        state["name"], state["project"] = self.run.name, self.run.project

    def _next_step(self) -> int:
        step = self.state["step"]
        self.state["step"] = step + 1
        return step

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        self.run.log(metrics, step=self._next_step())

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(rows[0])
        self.run.log({key: self.trackio.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])}, step=self._next_step())

    def log_artifacts(self, directory: Path, name: str) -> None:
        self.trackio.log_artifact(str(directory), name=name, type="report")

    def flush(self) -> None:
        # trackio writes from a thread every 0.5 s; write now, so that a killed run has stored what it logged.
        # (No public flush in trackio 0.4x: this is its sender's own step, guarded for versions without it.)
        flush = getattr(self.run, "_flush_queues_inline", None)
        if flush is not None:
            with self.run._client_lock:
                flush()

    def close(self, status: str = "finished") -> None:  # trackio has no run status
        self.run.finish()
        if self.trackio.context_vars.current_run.get() is self.run:  # else trackio's exit hook finishes it again, on screen
            self.trackio.context_vars.current_run.set(None)


def _free_name(trackio, project: str, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``, ...: trackio keys a run by its name, and two run directories
    called ``policy`` must not write into one run."""
    taken, candidate, k = set(trackio.SQLiteStorage.get_runs(project)), name, 2
    while candidate in taken:
        candidate, k = f"{name}-{k}", k + 1
    return candidate


def open_run(info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None] = lambda: None) -> TrackioRun:
    """(``save`` is not needed: trackio stores a run with its first log, after ``state`` holds its name.)"""
    return TrackioRun(info, state, config)  # trackio keeps the config of its latest init: given every time
