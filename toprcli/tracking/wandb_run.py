"""Weights & Biases: one run per run directory, resumed by id. ``WANDB_MODE=offline`` (or ``wandb
offline``) writes ``<run>/wandb/offline-run-*`` for ``wandb sync``; ``WANDB_PROJECT`` names the project
unless ``tracking.project`` does. Each axis has its own x-axis (``define_metric``); W&B's own step counts
log calls and is carried across resumes, so a resumed run never writes a step twice.

W&B's service buffers the run file in memory (flushed every 15 s and at the end), so a killed process
loses its last records. Rows are committed as they are logged (with a step, W&B holds a row open for more keys until
the next step or the end: in one CI run a run's last row, a table, was missing from its offline file after ``finish``). Offline, a resumed run therefore reads what its earlier files hold
(:func:`offline_marks`) and the tracker logs the rest again from the run's own files."""

from __future__ import annotations

import json
import os
import secrets
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768  # the run file is a leveldb-style log: 32 KiB blocks of records with a 7-byte header


def _stats() -> dict[str, bool]:
    """System metrics (CPU, GPU, memory) only when asked for (``WANDB_X_DISABLE_STATS=false``): W&B samples them in a
    process of its own, which a small machine's training shares its cores with."""
    return {} if "WANDB_X_DISABLE_STATS" in os.environ else {"x_disable_stats": True}


class WandbRun:
    def __init__(self, info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None]):
        import wandb

        self.wandb, self.state, self.axes = wandb, state, set()
        if "id" not in state:  # W&B ids: [a-z0-9]; saved before the run exists, so a start killed midway resumes it
            state["id"] = secrets.token_hex(6)
            save()
        state.setdefault("step", 0)
        self.run = wandb.init(
            project=info.project or os.environ.get("WANDB_PROJECT") or "toprcli", name=info.name, group=info.group,
            tags=[f"{k}={v}"[:64] for k, v in info.tags.items()], id=state["id"], resume="allow", config=config,
            dir=os.environ.get("WANDB_DIR") or str(info.root), settings=wandb.Settings(console="off", silent=True, **_stats()),
        )
        files = [f for f in sorted(Path(self.run.settings.wandb_dir).glob(f"offline-run-*-{state['id']}*/run-{state['id']}.wandb"))
                 if f.parent != Path(self.run.settings.sync_dir)]  # the earlier sessions' files, not this one's
        if state.get("mode") == "offline" and files:  # (mode: recorded once a start succeeded)  # what the killed process's buffer never wrote is logged again
            state["logged"] = with_offline_marks(state.get("logged") or {}, offline_marks(files))  # (none there: synced and cleaned, or another WANDB_DIR; the marks stand)
        state["mode"] = self.run.settings.mode

    def _next_step(self) -> int:
        step = self.state["step"]
        self.state["step"] = step + 1
        return step

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        if axis not in self.axes:  # charts of an axis use its own step as x
            self.run.define_metric(f"{axis}/step")
            self.run.define_metric(f"{axis}/*", step_metric=f"{axis}/step")
            self.axes.add(axis)
        self.run.log(metrics, step=self._next_step(), commit=True)  # each call is a whole row: out now, not held for the next step

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(rows[0])
        table = self.wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        self.run.log({key: table, f"{key.split('/')[0]}/step": step}, step=self._next_step(), commit=True)

    def log_artifacts(self, directory: Path, name: str) -> None:
        artifact = self.wandb.Artifact(f"{self.run.id}-{name}", type=name)
        artifact.add_dir(str(directory))
        self.run.log_artifact(artifact)

    def flush(self) -> None:
        pass  # no flush in W&B's API: see the module's note

    def close(self, status: str = "finished") -> None:
        offline, run_file = self.run.settings.mode == "offline", Path(self.run.settings.sync_file)
        self.run.finish(exit_code=0 if status == "finished" else 1)  # W&B marks a nonzero exit as crashed
        if offline:
            wait_for_exit_record(run_file)


def wait_for_exit_record(run_file: Path, seconds: float = 30.0) -> bool:
    """Whether the run file ends with its exit record within ``seconds``. A shared W&B service writes the file after
    ``finish`` returns (a run reopened at once in the same process read a bare header, took nothing as logged and
    logged it all again); a process killed in that window lost the records ``finish`` was given."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if run_file.exists() and any(r.WhichOneof("record_type") == "exit" for r in offline_records(run_file)):
            return True
        time.sleep(0.1)
    return False


def open_run(info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None] = lambda: None) -> WandbRun:
    return WandbRun(info, state, config, save)


def offline_records(run_file: Path) -> Iterator[Any]:
    """The records of an offline run file, as W&B's own protobuf ``Record`` (wandb 0.31 ships no Python reader).
    A record the kill cut short ends the file: what came before it is what the file holds."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf = Path(run_file).read_bytes(), 7, b""  # a 7-byte file header: ":W&B", magic, version
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # the rest of a block is padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # torn: the process was killed while writing it
            return
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or a record's last piece
            record = pb.Record()
            try:
                record.ParseFromString(buf)
            except DecodeError:
                return
            buf = b""
            yield record


def offline_history(run_files: list[Path]) -> Iterator[dict[str, Any]]:
    """Every history row the offline run files hold, oldest first."""
    for run_file in run_files:
        for record in offline_records(run_file):
            if record.WhichOneof("record_type") == "history":
                yield {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}


def with_offline_marks(saved: dict[str, Any], offline: dict[str, int]) -> dict[str, Any]:
    """The marks the offline files hold (what a killed process's buffer never wrote is logged again). A round's eval
    part is not told apart in them: its saved steps are kept up to the last round the files hold (dropping them
    logged every eval again on each rerun)."""
    marks = dict(offline)
    if "round:eval" in saved:
        got, last = saved["round:eval"], offline.get("round", -1)
        marks["round:eval"] = [s for s in got if s <= last] if isinstance(got, list) else min(got, last)
    return marks


def offline_marks(run_files: list[Path]) -> dict[str, int]:
    """Per axis (and per table), the last step the offline run files hold."""
    marks: dict[str, int] = {}
    for row in offline_history(run_files):
        tables = {key.rsplit("/", 1)[0] for key in row if key.endswith("/_type")}
        for key, value in row.items():
            if key.endswith("/step") and not key.startswith("_"):
                axis = key[: -len("/step")]
                for mark in [axis] if not tables else [f"table:{t}" for t in tables]:
                    marks[mark] = max(marks.get(mark, -1), int(value))
    return marks
