"""Experiment tracking: a run's metrics also go where users already look (TensorBoard, W&B, MLflow, trackio).

One :class:`Tracker` per run directory fans each call out to the backends named in
``tracking.report_to`` (a module each, imported only when named). Metrics live on *axes* — ``train``
(optimizer steps, counted over the whole run), ``warmstart``, ``round`` (the round is the step),
``eval`` — and are named ``<axis>/<name>`` in one scheme every backend accepts (:func:`metric_name`).

Resuming is the point: ``tracking.json`` beside the run's files holds each backend's run id and,
per axis, the last step it logged. A killed run that resumes reopens the same runs and, replaying
from the run's files, logs to each backend only what it does not have: a step is never logged
twice, and what a backend lost to the kill (W&B buffers in memory) is logged again. Tracking never
stops the work it tracks: a backend that fails is one warning and is dropped for the rest of the run.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow.compute as pc

from toprcli import __version__
from toprcli.config import TrackingConfig
from toprcli.errors import UserError
from toprcli.interrupt import Interrupted, deferred
from toprcli.shards import complete_shards, read_json, read_jsonl_records, read_table, write_json_atomic

STATE_FILE = "tracking.json"
TRACKER_FILES = (STATE_FILE, "tb", "wandb")  # what trackers keep under a run directory
# backend name → (module of toprcli.tracking, the package it needs)
BACKENDS = {"tensorboard": ("tensorboard_run", "tensorboard"), "wandb": ("wandb_run", "wandb"),
            "mlflow": ("mlflow_run", "mlflow"), "trackio": ("trackio_run", "trackio")}
EXTRA = "pip install -e '.[tracking]' in the toprcli checkout"
SAMPLE_ROWS = 8  # completions in a samples table: the first sample of the first prompts
SAMPLE_COLUMNS = ["prompt_id", "prompt", "completion", "extracted_answer", "answer", "verdict", "reward"]
# Names that read better than their file keys (p̃ is stored as p_effective).
RENAMED = {"p_effective": "p_tilde", "p_target": "p_tilde_target", "rows_out": "train_rows"}


def metric_name(axis: str, key: str) -> str:
    """``<axis>/<key>`` in characters every backend accepts: ``pass@1`` → ``round/pass_at_1``
    (MLflow refuses ``@``; W&B's filters take ``[_a-zA-Z0-9]``, ``/`` groups the charts)."""
    key = RENAMED.get(key, key).replace("@", "_at_")
    return f"{axis}/{re.sub(r'[^A-Za-z0-9_]', '_', key)}"


def numeric(metrics: dict[str, Any], axis: str) -> dict[str, float]:
    """The numbers of ``metrics`` (bools and nested dicts dropped), named for ``axis``; a 95% interval
    ``intervals: {key: [low, high]}`` becomes ``<key>_ci_low`` and ``<key>_ci_high``."""
    skip = {"step", "k", "iteration", axis}  # the step itself, and settings (k is eval.k among the parameters)
    out = {metric_name(axis, k): float(v) for k, v in metrics.items()
           if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)}  # NaN too: a diverged loss must show
    for key, (low, high) in (metrics.get("intervals") or {}).items():
        out[metric_name(axis, f"{key}_ci_low")], out[metric_name(axis, f"{key}_ci_high")] = float(low), float(high)
    return out


def sample_rows(scored: Path) -> list[dict[str, Any]]:
    """A few scored completions (one per prompt) for a samples table; none while ``scored`` is incomplete."""
    rows: list[dict[str, Any]] = []
    for path in complete_shards(scored).values():  # shard by shard, until there are enough (a round's eval is every completion)
        table = read_table(path, columns=SAMPLE_COLUMNS + ["sample_index"])
        first = table.filter(pc.equal(table.column("sample_index"), 0)).slice(0, SAMPLE_ROWS - len(rows))
        rows += first.select(SAMPLE_COLUMNS).to_pylist()
        if len(rows) == SAMPLE_ROWS:
            break
    return rows


def replay(metrics: Path, sink) -> None:
    """Hand each line of a training's ``metrics.jsonl`` to ``sink`` (what a tracker may not have yet). A line a kill cut
    short is skipped, as training's resume drops it; null, which the file writes for NaN, is NaN again (a diverged loss)."""
    if metrics.exists():
        for record in read_jsonl_records(metrics):
            if "step" in record:
                sink({k: float("nan") if v is None else v for k, v in record.items()})


def code_version() -> dict[str, str]:
    """toprcli's version and, from a git checkout, its commit."""
    out = {"toprcli_version": __version__}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


@dataclass
class RunInfo:
    """What names a tracked run, the same for every backend."""

    root: Path  # the run directory (backends' local files go under it)
    project: str | None
    name: str
    group: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    final_root: Path | None = None  # where ``root`` ends up (a training writes <out>.partial, then renames it <out>)

    @property
    def run_dir(self) -> Path:
        """The run directory as users will find it: what a tracked run names as its own."""
        return self.final_root or self.root


class Backend(Protocol):
    """One backend's run: ``open_run(info, state, config, save)`` of its module starts it (keeping its id in ``state``)
    and records the config and code version, or resumes the run ``state`` names. A backend that can name its run
    before it exists puts the name in ``state`` and calls ``save()`` first: a start killed midway (SIGKILL too)
    is resumed by that name, not opened a second time."""

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None: ...
    def log_table(self, key: str, rows: list[dict[str, Any]], step: int) -> None: ...
    def log_artifacts(self, directory: Path, name: str) -> None: ...
    def flush(self) -> None: ...
    def close(self, status: str = "finished") -> None:
        """End the run: ``finished``, ``killed`` (a signal: the run resumes later) or ``failed`` (an error)."""


def check_installed(report_to: list[str]) -> None:
    """One clear line, before any work, when a named backend's package is missing."""
    missing = [BACKENDS[b][1] for b in report_to if importlib.util.find_spec(BACKENDS[b][1]) is None]
    if missing:
        raise UserError(f"--report-to needs {', '.join(missing)} — `{EXTRA}` (or `pip install {' '.join(missing)}`)")


def _sparse(mark: str) -> bool:
    """Marks whose steps may come out of order (an eval after its round, ``eval_every`` lowered; a round's table):
    the steps logged, not the last one, which is enough for an axis logged in order (``train``, ``round``)."""
    return mark == "round:eval" or mark.startswith("table:")


def has_logged(marks: dict[str, Any], mark: str, step: int) -> bool:
    got = marks.get(mark, -1)
    return step in got if isinstance(got, list) else step <= got  # an int: every step up to it (as older runs recorded)


def mark_logged(marks: dict[str, Any], mark: str, step: int) -> None:
    got = marks.get(mark, -1)
    if not _sparse(mark):
        marks[mark] = max(step, got if isinstance(got, int) else max(got, default=-1))
        return
    marks[mark] = sorted({step, *(got if isinstance(got, list) else range(got + 1))})


def _older_marks(own: dict[str, Any]) -> None:
    """Marks of runs tracked by an older toprcli, under today's names: a step they logged is not logged again."""
    logged = own.get("logged") or {}
    if "round" in logged and "round:eval" not in logged:  # before round:eval had a mark, evals went with the round
        logged["round:eval"] = logged.get("round", -1)
    for axis in ("round", "eval"):  # the samples table was <axis>/samples, also the name of eval's count
        if f"table:{axis}/samples" in logged:
            logged.setdefault(f"table:{axis}/completions", logged.pop(f"table:{axis}/samples"))


class Tracker:
    """The backends of one run directory; a step a backend has is not logged to it again."""

    def __init__(self, cfg: TrackingConfig, info: RunInfo, config: dict[str, Any]):
        check_installed(cfg.report_to)
        self.path = info.root / STATE_FILE
        self.state: dict[str, Any] = {"backends": read_json(self.path, needs="backends")["backends"] if self.path.exists() else {}}
        self.backends: dict[str, Backend] = {}
        self.failed: list[Backend] = []  # dropped on a failure: ended as failed when the tracker closes
        config = {**config, **code_version()}
        for name in dict.fromkeys(cfg.report_to):  # in order, once each
            module = importlib.import_module(f"toprcli.tracking.{BACKENDS[name][0]}")
            own = self.state["backends"].setdefault(name, {})  # the backend's run id and marks, kept across resumes
            moved = own.get("tracked_project", info.project) != info.project and getattr(module, "PER_PROJECT", True)
            if moved:  # a run cannot move: a new one there, given everything (TensorBoard's <run>/tb has no project)
                warnings.warn(f"{name}: tracking.project changed ({own['tracked_project']} → {info.project}): a new tracked run there, "
                              "with this run's whole history", stacklevel=2)
                own.clear()
            own["tracked_project"] = info.project
            _older_marks(own)
            with deferred():  # a signal waits until the run id is saved: an interrupted start must not open a second run
                backend = self._call(name, lambda m=module, o=own: m.open_run(info, o, config, self._save), opening=True)
                _older_marks(own)  # W&B reads its marks back from its files, as they were logged
                if backend is not None:
                    self.backends[name] = backend
                self._save()

    def _call(self, name: str, fn, *, opening: bool = False, closing: bool = False) -> Any:
        """``fn()``; a failure is one warning and drops the backend (tracking never stops training); the dropped one is
        ended as failed when the tracker closes, not here (a signal held for a step's log would wait for it too)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any backend error, by design
            said = (str(e).strip().splitlines() or [""])[0][:300]  # one line: a database error carried its SQL and parameters
            warnings.warn(f"{name} tracking {'could not start' if opening else 'failed'} and is off for this run: {type(e).__name__}: {said}", stacklevel=3)
            dropped = self.backends.pop(name, None)
            if dropped is not None and not closing:
                self.failed.append(dropped)
            return None

    def _each(self, mark: str, step: int, call) -> None:
        """``call(backend)`` for each backend that has not logged ``step`` of ``mark``; the marks are saved."""
        for name, backend in list(self.backends.items()):
            marks = self.state["backends"][name].setdefault("logged", {})
            if not has_logged(marks, mark, step):
                with deferred():  # a step the backend took is marked before a signal stops the run: never logged twice
                    self._call(name, lambda b=backend: call(b))
                    if name in self.backends:  # a failure dropped it: the step stays to log on the next run
                        mark_logged(marks, mark, step)
                        self._save()

    def log(self, axis: str, metrics: dict[str, Any], step: int, *, mark: str | None = None) -> None:
        """Log ``metrics`` at ``step`` of ``axis`` to each backend that does not have that step (a resumed run);
        ``mark``: what counts the steps logged, when part of an axis's step comes separately (``round:eval``)."""
        named = {**numeric(metrics, axis), f"{axis}/step": float(step)}
        self._each(mark or axis, step, lambda b: (b.log(named, step, axis), b.flush()))

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int) -> None:
        """A table (W&B, trackio; other backends skip it) at ``step`` of its axis (``key``'s first part)."""
        if rows:
            self._each(f"table:{key}", step, lambda b: (b.log_table(key, rows, step), b.flush()))

    def where(self) -> dict[str, str]:
        """Each open backend's run, in words: where to look for it."""
        return where(self.state["backends"], list(self.backends))

    def log_artifacts(self, directory: Path, name: str) -> None:
        for backend_name, backend in list(self.backends.items()):
            self._call(backend_name, lambda b=backend: b.log_artifacts(Path(directory), name))

    def close(self, status: str = "finished") -> None:
        for name, backend in list(self.backends.items()):
            self._call(name, lambda b=backend, s=status: b.close(s), closing=True)
        for backend in self.failed:  # not left RUNNING where the backend can still end it (a rerun catches it up)
            with contextlib.suppress(Exception):
                backend.close("failed")
        self.backends, self.failed = {}, []

    def _save(self) -> None:
        write_json_atomic(self.path, self.state)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        """A run that stops on an error or a signal is not reported as finished."""
        killed = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, Interrupted))
        self.close("finished" if exc_type is None else "killed" if killed else "failed")


def where(backends: dict[str, Any], names: list[str]) -> dict[str, str]:
    """Where each of ``names``' tracked runs is, in words, from their state (``tracking.json``'s ``backends``)."""
    shown = {"tensorboard": "{log_dir}", "wandb": "run {id}", "mlflow": "run {run_id} in {tracking_uri}", "trackio": "run {name} of project {project}"}
    return {name: shown[name].format_map(_Missing(backends[name])) for name in names if name in backends}


def behind(root: str | Path, cfg: TrackingConfig, axis: str, last_step: int) -> bool:
    """Whether a tracker ``cfg`` names lacks a step of ``axis`` up to ``last_step`` in the run directory ``root`` (one
    not opened there yet, or moved to another project, lacks them all)."""
    path = Path(root) / STATE_FILE
    backends = read_json(path, needs="backends")["backends"] if path.is_file() else {}
    return any(name not in backends or backends[name].get("tracked_project", cfg.project) != cfg.project
               or not has_logged(backends[name].get("logged") or {}, axis, last_step) for name in cfg.report_to)


def tracked_in(root: str | Path, names: list[str]) -> dict[str, str]:
    """Where the tracked runs of the run directory ``root`` are: those that hold a step (a backend that could not start
    keeps the id it was to have, and is no run to look at)."""
    path = Path(root) / STATE_FILE
    backends = read_json(path, needs="backends")["backends"] if names and path.is_file() else {}
    return where(backends, [name for name in names if (backends.get(name) or {}).get("logged")])


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def open_tracker(cfg: TrackingConfig, root: str | Path, *, config: dict[str, Any], name: str | None = None,
                 group: str | None = None, final_root: str | Path | None = None) -> Tracker | None:
    """The tracker of the run rooted at ``root`` (None when ``report_to`` is empty); ``final_root``: where ``root`` will
    be renamed to when the run is complete."""
    if not cfg.report_to:
        return None
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    info = RunInfo(root, cfg.project, cfg.run_name or name or root.name, cfg.group or group, {k: str(v) for k, v in cfg.tags.items()},
                   Path(final_root) if final_root is not None else None)
    return Tracker(cfg, info, config)
