"""TensorBoard: event files under ``<run>/tb`` (``tensorboard --logdir <run>/tb``); each axis keeps its own steps."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

PER_PROJECT = False  # its event files are <run>/tb whatever tracking.project says: a project change keeps them


class TensorBoardRun:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))  # a resumed run adds an events file to the same dir

    def log_config(self, config: dict[str, Any]) -> None:
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", f"```\n{text}\n```", 0)

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        for key, value in metrics.items():
            if key != f"{axis}/step":  # the event's own step (a round logged in two parts had it twice)
                self.writer.add_scalar(key, value, step)

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int) -> None:
        pass  # TensorBoard has no tables; the samples stay in the run's Parquet files

    def log_artifacts(self, directory: Path, name: str) -> None:
        pass  # the report's PNGs are beside the run; TensorBoard draws its own charts

    def flush(self) -> None:
        self.writer.flush()

    def close(self, status: str = "finished") -> None:  # TensorBoard has no run status
        self.writer.close()


def open_run(info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None] = lambda: None) -> TensorBoardRun:
    run = TensorBoardRun(info.root / "tb")
    if "log_dir" not in state:  # a new run: the config once
        run.log_config(config)
        state["log_dir"] = str((info.run_dir / "tb").absolute())  # where to look: <out>/tb once a training's <out>.partial is renamed
    return run
