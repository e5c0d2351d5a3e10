"""MLflow through its client (no global active run): ``MLFLOW_TRACKING_URI`` or MLflow's default store;
the experiment is ``tracking.project``, else ``MLFLOW_EXPERIMENT_NAME``, else toprcli. Every call is
synchronous, so what returned is stored."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MAX_PARAM = 6000  # MLflow's limit on a parameter's value
UID_TAG = "toprcli_uid"  # the tag that finds a run whose start was killed before its id was saved
# MLflow retries an HTTP call 7 times with a doubling back-off (~4 min) and signals wait for a tracker's call: a server
# that is down held a Slurm job past its SIGTERM grace. A failed call turns MLflow off for the run, and the next run
# catches it up; what the user set is kept. Set for the tracker's own calls only (MLflow reads them per request).
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    unset = [name for name in HTTP_DEFAULTS if name not in os.environ]
    os.environ.update({name: HTTP_DEFAULTS[name] for name in unset})
    try:
        yield
    finally:
        for name in unset:
            os.environ.pop(name, None)


def key(name: str) -> str:
    """A parameter or tag key in MLflow's characters (letters, digits, ``_ - . / `` and space): one ``@`` in a tag key
    refused the whole run's start."""
    return re.sub(r"[^\w\-./ ]", "_", name)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{name}."))
        else:
            out[key(f"{prefix}{name}")] = str(value)[:MAX_PARAM]
    return out


class MlflowRun:
    def __init__(self, info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None]):
        with _bounded():
            self._open(info, state, config, save)

    def _open(self, info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None]) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=state.get("tracking_uri"))  # a run resumes in the store it was made in
        if state.get("run_id"):
            self.run_id = state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        if "uid" not in state:  # MLflow names a run only once it exists: our tag, saved first, finds a start killed midway
            state["uid"], state["tracking_uri"] = secrets.token_hex(8), _absolute(self.client.tracking_uri)
            save()
        name = info.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "toprcli"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        started = self.client.search_runs([experiment_id], filter_string=f"tags.{UID_TAG} = '{state['uid']}'")
        tags = {key(k): v for k, v in {**info.tags, **({"group": info.group} if info.group else {}), "run_dir": str(info.run_dir.resolve()),
                                       UID_TAG: state["uid"]}.items()}
        run = started[0] if started else self.client.create_run(experiment_id, run_name=info.name, tags=tags)
        self.run_id = run.info.run_id
        self.log_config(config, logged=run.data.params)  # a started run keeps what it has (a rerun's `resume: true` too)
        state["run_id"], state["tracking_uri"] = self.run_id, _absolute(self.client.tracking_uri)

    def log_config(self, config: dict[str, Any], logged: dict[str, str] | None = None) -> None:
        """Every config key as a parameter (``train.lr``), and the whole config as ``config.json``; ``logged``: the
        parameters the run has (MLflow refuses a parameter's second value)."""
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in _flatten(config).items() if k not in (logged or {})]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_dict(self.run_id, config, "config.json")

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        own = f"{axis}/step"  # the metric's own step (a round logged in two parts had it twice)
        with _bounded():
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items() if k != own])

    def log_table(self, key: str, rows: list[dict[str, Any]], step: int) -> None:
        pass  # MLflow's tables are artifacts; the samples stay in the run's Parquet files

    def log_artifacts(self, directory: Path, name: str) -> None:
        self.client.log_artifacts(self.run_id, str(directory), name)

    def flush(self) -> None:
        pass

    def close(self, status: str = "finished") -> None:
        with _bounded():
            self.client.set_terminated(self.run_id, status=status.upper())  # MLflow's FINISHED, KILLED, FAILED


def _absolute(uri: str) -> str:
    """A store given relative to the working directory (``sqlite:///mlflow.db``, ``mlruns``), made absolute: a resume
    from another directory finds the run where it is."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    if ":" not in uri and (os.sep in uri or uri.startswith((".", "~"))):  # a path (a file store); a word is a scheme (databricks)
        return str(Path(uri).expanduser().resolve())
    return uri


def open_run(info, state: dict[str, Any], config: dict[str, Any], save: Callable[[], None] = lambda: None) -> MlflowRun:
    return MlflowRun(info, state, config, save)
