"""Experiment tracking: a short `topr iterate` reports to TensorBoard, W&B (offline), MLflow (SQLite) and
trackio (local), is killed once and resumed, and every backend read back through its own reader holds
the config, the per-step and per-round series `topr report --json` and metrics.jsonl hold: one run each,
no step twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from builders import MICRO_PIPELINE
from toprcli.cli.main import app
from toprcli.config import TrackingConfig, TrainConfig, from_dict
from toprcli.errors import UserError
from toprcli.tracking import check_installed, metric_name, numeric, open_tracker

PROJECT = "topr-tracking-test"
CONFIG = MICRO_PIPELINE + "tracking: {{report_to: [tensorboard, wandb, mlflow, trackio], project: {project}, tags: {{variant: topr}}}}\n"
# SIGKILLs the pipeline right after its N-th training checkpoint (the warm start saves two, round 1 four: the last step too).
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline
    import toprcli.training.checkpoint as ckpt

    config, n = sys.argv[1], int(sys.argv[2])
    count, original = [0], ckpt.save_checkpoint

    def save(*a, **k):
        out = original(*a, **k)
        count[0] += 1
        if count[0] >= n:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    ckpt.save_checkpoint = save
    Pipeline(load_config(IterateConfig, config)).run()
    """
)


# -- the names, the package check, a failing backend ---------------------------------------------


def test_metric_names_are_valid_in_every_backend():
    assert metric_name("round", "pass@1") == "round/pass_at_1"
    assert metric_name("round", "p_effective") == "round/p_tilde"
    assert metric_name("round", "weighted_maj@k") == "round/weighted_maj_at_k"
    named = numeric({"pass@1": 0.5, "k": 4, "round": 1, "ok": True, "bootstrap": {"seed": 0}, "intervals": {"pass@1": [0.25, 0.75]}}, "round")
    assert named == {"round/pass_at_1": 0.5, "round/pass_at_1_ci_low": 0.25, "round/pass_at_1_ci_high": 0.75}


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"needs wandb — `pip install -e '\.\[tracking\]' in the toprcli checkout` \(or `pip install wandb`\)"):
        check_installed(["tensorboard", "wandb"])


def test_a_failing_backend_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/a-file/mlflow.db")  # a store that cannot be made
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = open_tracker(TrackingConfig(report_to=["mlflow", "tensorboard"]), tmp_path / "run", config={"a": 1})
        tracker.log("train", {"loss": 1.0}, 1)
        tracker.close()
    ours = [str(w.message).split(":")[0] for w in caught if "tracking" in str(w.message)]
    assert ours == ["mlflow tracking could not start and is off for this run"]
    state = json.loads((tmp_path / "run" / "tracking.json").read_text())["backends"]
    assert state["tensorboard"]["logged"] == {"train": 1} and "logged" not in state["mlflow"]


def test_a_step_a_backend_failed_to_take_is_logged_on_the_next_run(tmp_path, monkeypatch, mlflow_store):
    """MLflow's server is down while round 2 is logged: the backend is dropped for this run, and round 2 is not
    marked as logged, so the rerun logs it (it was marked, and the run's MLflow series had a hole for good)."""
    from mlflow.tracking import MlflowClient

    from toprcli.tracking import mlflow_run

    cfg, run = TrackingConfig(report_to=["mlflow"]), tmp_path / "run"
    backend_class = mlflow_run.MlflowRun
    real = backend_class.log

    def down_at_round_2(self, metrics, step, axis):
        if step == 2:
            raise ConnectionError("mlflow server unreachable")
        return real(self, metrics, step, axis)

    monkeypatch.setattr(backend_class, "log", down_at_round_2)
    with warnings.catch_warnings(record=True), open_tracker(cfg, run, config={}) as tracker:
        warnings.simplefilter("always")
        for r in (1, 2, 3):
            tracker.log("round", {"pass@1": r / 10}, r)
    monkeypatch.setattr(backend_class, "log", real)  # the server is back
    with open_tracker(cfg, run, config={}) as tracker:
        for r in (1, 2, 3):
            tracker.log("round", {"pass@1": r / 10}, r)
        run_id = tracker.state["backends"]["mlflow"]["run_id"]
    history = MlflowClient().get_metric_history(run_id, "round/pass_at_1")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3)]


@pytest.mark.parametrize("stop, status", [(None, "FINISHED"), (RuntimeError, "FAILED"), (KeyboardInterrupt, "KILLED")])
def test_a_run_that_stops_on_an_error_or_a_signal_is_not_reported_finished(tmp_path, monkeypatch, stop, status, mlflow_store):
    """The tracked run's status says how the command ended (MLflow marked every run FINISHED, a crash too)."""
    from mlflow.tracking import MlflowClient

    tracker = open_tracker(TrackingConfig(report_to=["mlflow"]), tmp_path / "run", config={})
    run_id = tracker.state["backends"]["mlflow"]["run_id"]
    try:
        with tracker:
            tracker.log("round", {"pass@1": 0.5}, 1)
            if stop is not None:
                raise stop("stopped")
    except (RuntimeError, KeyboardInterrupt):
        pass
    assert MlflowClient().get_run(run_id).info.status == status


def test_train_tensorboard_of_older_configs_is_report_to():
    assert from_dict(TrainConfig, {"tensorboard": True}).tracking.report_to == ["tensorboard"]
    assert from_dict(TrainConfig, {"tensorboard": False}).tracking.report_to == []


# -- one iterate, killed and resumed, read back from all four backends --------------------------


def _wandb_run(run_dir: Path) -> tuple[set[str], dict, list[dict]]:
    """Run ids, config and history of the offline run files (read with W&B's own protobuf records)."""
    from toprcli.tracking.wandb_run import offline_records

    ids, config, rows = set(), {}, []
    for run_file in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        assert run_file.read_bytes()[:4] == b":W&B"
        for record in offline_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind in ("run", "config"):
                ids |= {record.run.run_id} if kind == "run" else set()
                updates = record.run.config.update if kind == "run" else record.config.update
                config.update({u.key: json.loads(u.value_json) for u in updates})
            elif kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return ids, config, rows


def _series(rows: list[dict], key: str, axis: str) -> list[tuple[int, float]]:
    return [(int(r[f"{axis}/step"]), r[key]) for r in rows if key in r]


def _env(tmp: Path) -> dict[str, str]:
    """A child's environment with every backend's store under ``tmp``, and without this process's W&B service
    (WANDB_SERVICE, set by an in-process W&B test): children sharing one service share its open runs."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return {**env, "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "TRACKIO_DIR": str(tmp / "trackio"),
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracked")
    env = _env(tmp)
    cfg = tmp / "run.yaml"
    cfg.write_text(CONFIG.format(run_dir=tmp / "run", project=PROJECT))
    (tmp / "killer.py").write_text(KILLER)
    # cwd: MLflow puts a SQLite store's artifacts in ./mlruns
    killed = subprocess.run([sys.executable, str(tmp / "killer.py"), str(cfg), "4"], env=env, cwd=tmp, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    marks = json.loads((tmp / "run" / "tracking.json").read_text())["backends"]["mlflow"]["logged"]
    assert marks["train"] == 2 and marks["round"] == 0  # round 0 and two steps of round 1 were logged
    resumed = subprocess.run([sys.executable, "-m", "toprcli", "iterate", "-c", str(cfg)], env=env, cwd=tmp, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "tracking" not in resumed.stderr + killed.stderr  # no backend failed (a failure is a warning naming it)
    wandb_id = json.loads((tmp / "run" / "tracking.json").read_text())["backends"]["wandb"]["id"]
    assert f"wandb: run {wandb_id}" in resumed.stdout and "tensorboard: " in resumed.stdout  # where each tracked run is
    screen = [line for line in (resumed.stdout + resumed.stderr).splitlines() if line != f"wandb: run {wandb_id}"]
    assert not [line for line in screen if "Trackio" in line or "trackio show" in line or line.lower().startswith("wandb")]  # banners: the log
    report = CliRunner().invoke(app, ["report", str(tmp / "run"), "--json"])
    assert report.exit_code == 0, report.output
    steps = [json.loads(line) for line in (tmp / "run" / "round-001" / "policy" / "metrics.jsonl").read_text().splitlines()]
    return {"tmp": tmp, "run": tmp / "run", "env": env, "rounds": json.loads(report.stdout), "steps": steps}


def _expected(tracked_run) -> tuple[list[tuple[int, float]], list[tuple[int, float]], list[tuple[int, float]]]:
    rounds = [(r["round"], r["pass@1"]) for r in tracked_run["rounds"]]
    p_tilde = [(r["round"], r["p_effective"]) for r in tracked_run["rounds"] if "p_effective" in r]
    losses = [(s["step"], s["loss"]) for s in tracked_run["steps"]]
    return rounds, p_tilde, losses


def test_tensorboard_holds_the_series_once(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked_run["run"] / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    scalars = lambda tag: [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(tag)]  # noqa: E731 - float32 in events
    rounds, p_tilde, losses = _expected(tracked_run)
    assert scalars("round/pass_at_1") == rounds and scalars("round/p_tilde") == p_tilde
    assert scalars("train/loss") == losses  # steps 1-2 before the kill, 3-4 after: each once
    assert "config" in " ".join(events.Tags()["tensors"])


def test_mlflow_holds_one_run_with_config_and_series(tracked_run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracked_run["env"]["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].info.run_name == "run"
    run = runs[0]
    assert run.data.params["train.loss"] == "topr" and run.data.params["rounds"] == "1" and run.data.tags["variant"] == "topr"
    history = lambda key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]  # noqa: E731
    rounds, p_tilde, losses = _expected(tracked_run)
    assert history("round/pass_at_1") == rounds and history("round/p_tilde") == p_tilde and history("train/loss") == losses
    assert "report" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_trackio_holds_one_run_with_config_and_series(tracked_run):
    code = textwrap.dedent(f"""
        import json
        from trackio.sqlite_storage import SQLiteStorage
        print(json.dumps({{"runs": SQLiteStorage.get_runs({PROJECT!r}), "config": SQLiteStorage.get_run_config({PROJECT!r}, "run"),
                          "logs": SQLiteStorage.get_logs({PROJECT!r}, "run")}}, default=str))
    """)  # trackio reads TRACKIO_DIR when imported: in a process with the run's environment
    out = subprocess.run([sys.executable, "-c", code], env=tracked_run["env"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    store = json.loads(out.stdout.strip().splitlines()[-1])
    assert store["runs"] == ["run"] and store["config"]["train"]["loss"] == "topr" and "toprcli_version" in store["config"]
    rounds, p_tilde, losses = _expected(tracked_run)
    assert _series(store["logs"], "round/pass_at_1", "round") == rounds and _series(store["logs"], "round/p_tilde", "round") == p_tilde
    assert _series(store["logs"], "train/loss", "train") == losses
    assert [r["step"] for r in store["logs"]] == sorted({r["step"] for r in store["logs"]})  # trackio's own step: never twice
    assert any("round/completions" in r for r in store["logs"])


def test_wandb_offline_files_hold_one_run_with_config_and_series(tracked_run):
    ids, config, rows = _wandb_run(tracked_run["run"])
    assert len(ids) == 1 and ids == {json.loads((tracked_run["run"] / "tracking.json").read_text())["backends"]["wandb"]["id"]}
    assert len(list(tracked_run["run"].glob("wandb/offline-run-*"))) == 2  # the killed process and the resumed one, one run id
    assert config["train"]["loss"] == "topr" and "toprcli_version" in config
    rounds, p_tilde, losses = _expected(tracked_run)
    assert _series(rows, "round/pass_at_1", "round") == rounds and _series(rows, "round/p_tilde", "round") == p_tilde
    assert _series(rows, "train/loss", "train") == losses
    w_steps = [r["_step"] for r in rows]
    assert w_steps == sorted(set(w_steps))  # W&B's step carried across the resume: never twice
    assert any(key.startswith("round/completions") for r in rows for key in r)


def test_eval_reports_its_metrics_once(tiny_model_dir, tmp_path):
    """`topr eval --report-to tensorboard`: the eval's numbers at step --iteration, once even when rerun."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "eval"
    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--set", "dataset.level=1", "--set", "dataset.size=4", "--k", "2", "--max-new-tokens", "8",
            "--backend", "hf", "--iteration", "3", "-o", str(out), "--report-to", "tensorboard", "--no-progress"]
    for _ in range(2):  # the second run finds the eval done and the step logged
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
    metrics = json.loads((out / "eval.json").read_text())["metrics"]
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0}).Reload()
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("eval/pass_at_1")] == [(3, metrics["pass@1"])]
    assert [e.value for e in events.Scalars("eval/pass_at_1_ci_high")] == [pytest.approx(metrics["intervals"]["pass@1"][1])]


def test_wandb_reads_back_what_its_offline_files_hold(tmp_path, monkeypatch):
    """What a resumed W&B run takes as logged: the last step per axis and table its earlier files hold."""
    from toprcli.tracking import RunInfo
    from toprcli.tracking.wandb_run import offline_marks, open_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    state: dict = {}
    run = open_run(RunInfo(tmp_path, "p", "r"), state, {"a": 1})
    for step in (1, 2, 3):
        run.log({"train/loss": 1.0 / step, "train/step": float(step)}, step, "train")
    run.log_table("round/samples", [{"prompt": "q", "reward": 1.0}], 0)
    run.close()
    files = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert offline_marks(files) == {"train": 3, "table:round/samples": 0}
    again = open_run(RunInfo(tmp_path, "p", "r"), state, {"a": 1})  # resuming reads them into the state
    again.close()
    assert state["logged"] == {"train": 3, "table:round/samples": 0} and state["step"] == 4
    # A kill while W&B wrote a record leaves it torn: the records before it count (the resume raised, and W&B was dropped).
    whole = files[0].read_bytes()
    seen = set()
    for cut in range(len(whole)):  # cut anywhere: what the file holds up to the cut, never an error
        files[0].write_bytes(whole[:cut])
        seen.add(offline_marks(files[:1]).get("train"))
    assert seen == {None, 1, 2, 3}
    files[0].write_bytes(whole)
    # `wandb sync --clean` removed the files: the marks stand (they were reset to none, and every step went out again).
    import shutil

    shutil.rmtree(tmp_path / "wandb")
    state["logged"] = {"train": 5}
    open_run(RunInfo(tmp_path, "p", "r"), state, {"a": 1}).close()
    assert state["logged"] == {"train": 5}



def test_a_closed_offline_wandb_run_has_written_its_file(tmp_path, monkeypatch):
    """A shared W&B service wrote the run file after ``finish`` returned (CI read a bare 7-byte header): a run reopened
    at once took nothing as logged. Close waits for the file's exit record, and gives up in bounded time."""
    from toprcli.tracking import RunInfo
    from toprcli.tracking.wandb_run import offline_records, open_run, wait_for_exit_record

    monkeypatch.setenv("WANDB_MODE", "offline")
    for attempt in range(3):  # the service outlives each run: the race was between runs of one process
        run = open_run(RunInfo(tmp_path / str(attempt), "p", "r"), {}, {"a": 1})
        run.log({"train/loss": 1.0, "train/step": 1.0}, 1, "train")
        run.close()
        (run_file,) = (tmp_path / str(attempt) / "wandb").glob("offline-run-*/run-*.wandb")
        assert [r.WhichOneof("record_type") for r in offline_records(run_file)][-1] == "exit"
    header_only = tmp_path / "header.wandb"
    header_only.write_bytes(run_file.read_bytes()[:7])
    assert not wait_for_exit_record(header_only, seconds=0.3)
    assert wait_for_exit_record(run_file, seconds=0.3)

def _mlflow_history(tracker, key):
    from mlflow.tracking import MlflowClient

    run_id = tracker.state["backends"]["mlflow"]["run_id"]
    return sorted((m.step, m.value) for m in MlflowClient().get_metric_history(run_id, key))


def test_a_rounds_eval_that_comes_after_the_round_was_logged_is_logged(tmp_path, monkeypatch, mlflow_store):
    """rounds 10, eval_every 5: round 3 was logged after its training; ended early with rounds=3, its eval then ran,
    and its pass@1 never reached the trackers (the round's mark was taken). NaN is logged as NaN (it was dropped)."""
    from toprcli.pipeline import EVAL_KEYS
    from toprcli.run_tracking import log_round

    cfg, run = TrackingConfig(report_to=["mlflow"]), tmp_path / "run"
    with open_tracker(cfg, run, config={}) as tracker:
        log_round(tracker, run, 3, {"round": 3, "p_effective": 0.5, "train_final_loss": float("nan")}, {}, EVAL_KEYS)
        log_round(tracker, run, 3, {"round": 3, "p_effective": 0.5, "pass@1": 0.25}, {}, EVAL_KEYS)  # its eval, later
        assert _mlflow_history(tracker, "round/pass_at_1") == [(3, 0.25)] and _mlflow_history(tracker, "round/p_tilde") == [(3, 0.5)]
        assert [v != v for _, v in _mlflow_history(tracker, "round/train_final_loss")] == [True]


def test_evals_that_come_out_of_order_are_each_logged_once(tmp_path, monkeypatch, mlflow_store):
    """eval_every 2, then lowered to 1: round 1's eval came after round 2's and never reached the trackers (a mark held
    the last eval's round); and a W&B offline rerun logged every round's eval again (its marks from the files had no
    round:eval)."""
    from toprcli.pipeline import EVAL_KEYS
    from toprcli.run_tracking import log_round

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    cfg, run = TrackingConfig(report_to=["mlflow", "wandb"]), tmp_path / "run"

    def rounds(evaluated):
        with open_tracker(cfg, run, config={}) as tracker:
            for r in range(4):
                log_round(tracker, run, r, {"round": r, "p_effective": 0.5, **({"pass@1": r / 10} if r in evaluated else {})}, {}, EVAL_KEYS)
        return tracker

    rounds({0, 2})
    tracker = rounds({0, 1, 2, 3})  # eval_every lowered: rounds 1 and 3 evaluated now
    assert _mlflow_history(tracker, "round/pass_at_1") == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3)]
    rounds({0, 1, 2, 3})  # a rerun: nothing new
    from toprcli.tracking.wandb_run import offline_history

    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    logged = sorted(int(row["round/step"]) for row in offline_history(files) if "round/pass_at_1" in row)
    assert logged == [0, 1, 2, 3]


def test_a_changed_project_keeps_tensorboards_series_once(tmp_path):
    """TensorBoard's files are <run>/tb whatever the project: a project change wrote every series a second time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    for project in ("a", "b"):
        with open_tracker(TrackingConfig(report_to=["tensorboard"], project=project), run, config={}) as tracker:
            for step in (1, 2):
                tracker.log("train", {"loss": step / 10}, step)
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]


def test_a_signal_while_a_backend_logs_does_not_log_the_step_twice(tmp_path, monkeypatch, mlflow_store):
    """A Ctrl-C after a backend stored a step but before tracking.json said so: the resumed run logged it again."""
    import signal

    from toprcli import interrupt
    from toprcli.interrupt import Interrupted
    from toprcli.tracking import mlflow_run

    cfg, run = TrackingConfig(report_to=["mlflow"]), tmp_path / "run"
    real = mlflow_run.MlflowRun.log

    def stored_then_interrupted(self, metrics, step, axis):
        real(self, metrics, step, axis)
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the step is in MLflow; tracking.json is written next

    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    monkeypatch.setattr(mlflow_run.MlflowRun, "log", stored_then_interrupted)
    interrupt.install()
    try:
        with pytest.raises(Interrupted), open_tracker(cfg, run, config={}) as tracker:
            for step in (1, 2, 3):
                tracker.log("train", {"loss": step / 10}, step)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        interrupt.reset()
    monkeypatch.setattr(mlflow_run.MlflowRun, "log", real)
    with open_tracker(cfg, run, config={}) as tracker:
        for step in (1, 2, 3):
            tracker.log("train", {"loss": step / 10}, step)
        assert _mlflow_history(tracker, "train/loss") == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_a_changed_project_starts_a_tracked_run_there_with_the_whole_history(tmp_path, monkeypatch, mlflow_store):
    """trackio refused the resume for good (its run was in the old project), W&B reused the id without the earlier
    steps, MLflow stayed in the old experiment: now each starts a new run in the new project and takes every step."""
    run = tmp_path / "run"
    with open_tracker(TrackingConfig(report_to=["mlflow"], project="a"), run, config={}) as tracker:
        for step in (1, 2):
            tracker.log("train", {"loss": step / 10}, step)
        first = tracker.state["backends"]["mlflow"]["run_id"]
    with pytest.warns(UserWarning, match="tracking.project changed \\(a → b\\)"), open_tracker(
            TrackingConfig(report_to=["mlflow"], project="b"), run, config={}) as tracker:
        for step in (1, 2, 3):
            tracker.log("train", {"loss": step / 10}, step)
        assert tracker.state["backends"]["mlflow"]["run_id"] != first
        assert _mlflow_history(tracker, "train/loss") == [(1, 0.1), (2, 0.2), (3, 0.3)]


# Starts a tracked run and SIGKILLs itself as soon as the backend has made its run (inside the start, before
# tracking.json could record it); with "resume", starts again, logs a step and prints the backend's runs.
START = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from toprcli.config import TrackingConfig
    from toprcli.tracking import open_tracker

    backend, run, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode in ("kill", "kill-after-params"):
        import mlflow.tracking, trackio, wandb
        owner, attr = {"wandb": (wandb, "init"), "trackio": (trackio, "init"), "mlflow": (mlflow.tracking.MlflowClient, "create_run")}[backend]
        if mode == "kill-after-params":  # MLflow: the run made and its parameters logged, its id not saved
            owner, attr = mlflow.tracking.MlflowClient, "log_dict"
        real = getattr(owner, attr)
        def made_then_killed(*a, **k):
            real(*a, **k)
            os.kill(os.getpid(), signal.SIGKILL)
        setattr(owner, attr, made_then_killed)
    with open_tracker(TrackingConfig(report_to=[backend], project="p"), run, config={"a": 1, "resume": mode == "resume"}) as tracker:
        tracker.log("train", {"loss": 0.5}, 1)
    if backend == "mlflow":
        from mlflow.tracking import MlflowClient
        client = MlflowClient()
        runs = [r.info.run_id for r in client.search_runs([client.get_experiment_by_name("p").experiment_id])]
    elif backend == "trackio":
        from trackio.sqlite_storage import SQLiteStorage
        runs = SQLiteStorage.get_runs("p")
    else:
        runs = sorted({d.name.rsplit("-", 1)[1] for d in (run / "wandb").glob("offline-run-*")})
    print(json.dumps(runs))
    """
)


@pytest.mark.parametrize("backend", ["wandb", "mlflow", "trackio"])
def test_a_start_killed_after_the_backend_made_its_run_resumes_that_run(tmp_path, backend):
    """A SIGKILL inside a backend's start (the run made, its id not yet in tracking.json) left a second W&B or MLflow
    run on resume: their run names are now saved before the run exists, and the resumed start finds that run.
    (trackio stores a run with its first log, after its name is saved.)"""
    env = _env(tmp_path)
    (tmp_path / "start.py").write_text(START)
    run = [sys.executable, str(tmp_path / "start.py"), backend, str(tmp_path / "run")]
    killed = subprocess.run([*run, "kill"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = subprocess.run([*run, "resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "tracking" not in resumed.stderr, resumed.stderr[-2000:]
    assert len(json.loads(resumed.stdout.strip().splitlines()[-1])) == 1


def test_a_start_killed_after_mlflow_logged_the_parameters_resumes_that_run(tmp_path):
    """The resumed start found the run by its tag and logged the parameters again: `resume` had changed (False, then
    True), MLflow refuses a parameter's second value, and MLflow was off for the run."""
    env = _env(tmp_path)
    (tmp_path / "start.py").write_text(START)
    run = [sys.executable, str(tmp_path / "start.py"), "mlflow", str(tmp_path / "run")]
    killed = subprocess.run([*run, "kill-after-params"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = subprocess.run([*run, "resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "tracking" not in resumed.stderr, resumed.stderr[-2000:]
    assert len(json.loads(resumed.stdout.strip().splitlines()[-1])) == 1


# Opens a tracked run in the working directory; `log` logs one step at the step given, else nothing is logged.
OPEN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from toprcli.config import TrackingConfig
    from toprcli.tracking import open_tracker

    backend, run, step = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    with open_tracker(TrackingConfig(report_to=[backend], project="p"), run, config={"a": 1}) as tracker:
        if step:
            tracker.log("train", {"loss": 1 / step}, step)
    """
)


def test_trackio_resumes_a_run_it_never_stored(tmp_path):
    """trackio stores a run with its first log: a run opened, then stopped before it logged anything (a training killed
    while its model loaded), was resumed with resume="must", which trackio refused, and trackio was off for good."""
    env = _env(tmp_path)
    (tmp_path / "open.py").write_text(OPEN)
    for step in (0, 1):
        done = subprocess.run([sys.executable, str(tmp_path / "open.py"), "trackio", str(tmp_path / "run"), str(step)],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "tracking" not in done.stderr, done.stderr[-2000:]
    code = "import json; from trackio.sqlite_storage import SQLiteStorage as S; print(json.dumps(S.get_logs('p', 'run'), default=str))"
    logs = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert [row["train/loss"] for row in json.loads(logs.stdout.strip().splitlines()[-1])] == [1.0]


def test_mlflow_resumes_in_the_store_it_began_in_from_another_directory(tmp_path):
    """With a relative MLFLOW_TRACKING_URI (sqlite:///mlflow.db), a resume from another working directory looked for the
    run in another store ("not found") and MLflow was off for the run: the store is saved, absolute, with the run."""
    env = {**_env(tmp_path), "MLFLOW_TRACKING_URI": "sqlite:///mlflow.db"}
    (tmp_path / "open.py").write_text(OPEN)
    first, other = tmp_path / "first", tmp_path / "other"
    for step, cwd in ((1, first), (2, other)):
        cwd.mkdir()
        done = subprocess.run([sys.executable, str(tmp_path / "open.py"), "mlflow", str(tmp_path / "run"), str(step)],
                              env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "tracking" not in done.stderr, done.stderr[-2000:]
    from mlflow.tracking import MlflowClient

    state = json.loads((tmp_path / "run" / "tracking.json").read_text())["backends"]["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{first}/mlflow.db"
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    assert [m.step for m in client.get_metric_history(state["run_id"], "train/loss")] == [1, 2]


def test_a_torn_metrics_line_is_skipped_and_null_is_nan_again(tmp_path):
    """A kill mid-write leaves the last line of metrics.jsonl cut short: replaying it (a `train --resume` with
    --report-to) was a JSONDecodeError traceback. The file writes NaN as null, which was then dropped, not logged."""
    from toprcli.tracking import replay

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": null}\n{"step": 3, "lo')
    got: list[dict] = []
    replay(metrics, got.append)
    assert [r["step"] for r in got] == [1, 2] and got[0]["loss"] == 0.5 and got[1]["loss"] != got[1]["loss"]


def test_a_round_logged_in_two_parts_has_its_step_once(tmp_path, monkeypatch, mlflow_store):
    """MLflow and TensorBoard have a step of their own: `round/step` as a metric was logged again with the round's eval."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from toprcli.pipeline import EVAL_KEYS
    from toprcli.run_tracking import log_round

    run = tmp_path / "run"
    with open_tracker(TrackingConfig(report_to=["mlflow", "tensorboard"]), run, config={}) as tracker:
        log_round(tracker, run, 1, {"round": 1, "p_effective": 0.5, "pass@1": 0.25, "train_final_loss": None, "train_steps": 3}, {}, EVAL_KEYS)
        assert _mlflow_history(tracker, "round/step") == [] and _mlflow_history(tracker, "round/pass_at_1") == [(1, 0.25)]
        assert [v != v for _, v in _mlflow_history(tracker, "round/train_final_loss")] == [True]  # null in train_summary.json: NaN
    tags = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0}).Reload().Tags()["scalars"]
    assert "round/step" not in tags and "round/pass_at_1" in tags


def test_an_older_runs_table_marks_keep_their_tables_logged_once(tmp_path):
    """The samples table was <axis>/samples (also eval's count); a run tracked before it became <axis>/completions
    logged every finished round's table again on resume."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "tracking.json").write_text(json.dumps({"backends": {"tensorboard": {"log_dir": str(run / "tb"), "logged": {"table:round/samples": [0, 1]}}}}))
    with open_tracker(TrackingConfig(report_to=["tensorboard"]), run, config={}) as tracker:
        assert tracker.state["backends"]["tensorboard"]["logged"] == {"table:round/completions": [0, 1]}


def test_an_mlflow_store_is_saved_absolute_and_a_scheme_word_as_it_is(tmp_path, monkeypatch):
    from toprcli.tracking.mlflow_run import _absolute

    monkeypatch.chdir(tmp_path)
    assert _absolute("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert _absolute("sqlite:////abs/m.db") == "sqlite:////abs/m.db" and _absolute("./mlruns") == str(tmp_path / "mlruns")
    assert _absolute("databricks") == "databricks" and _absolute("http://host:5000") == "http://host:5000"


def test_mlflow_takes_tag_and_config_keys_it_would_refuse_and_gives_up_on_a_dead_server_in_seconds(tmp_path, monkeypatch, mlflow_store):
    """`--tag split@k=test` refused MLflow's whole run (an empty run left RUNNING, every rerun the same); a server that
    is down held the command ~4 minutes in MLflow's retries while a SIGTERM waited (a Slurm job killed before its
    checkpoint)."""
    import time

    from mlflow.tracking import MlflowClient

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with open_tracker(TrackingConfig(report_to=["mlflow"], tags={"split@k": "test"}), tmp_path / "run", config={"a@b": {"c#d": 1}}) as tracker:
            tracker.log("train", {"loss": 1.0}, 1)
            run_id = tracker.state["backends"]["mlflow"]["run_id"]
    assert not [w for w in caught if "tracking" in str(w.message)]
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["split_k"] == "test" and run.data.params["a_b.c_d"] == "1" and run.info.status == "FINISHED"

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):  # unset here, and unset again after the test
        monkeypatch.setenv(name, "")  # (the tracker sets them in the process: monkeypatch restores what it recorded)
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        open_tracker(TrackingConfig(report_to=["mlflow"]), tmp_path / "down", config={}).close()
    assert time.monotonic() - t0 < 60 and any("mlflow tracking could not start" in str(w.message) for w in caught)
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # bounded for the tracker's calls, not set for the process


def test_where_a_run_is_tracked_names_only_backends_that_logged(tmp_path):
    """W&B that could not start (no login) was still named, `wandb: run f394…`, a run that exists nowhere."""
    from toprcli.tracking import tracked_in

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tracking.json").write_text(json.dumps({"backends": {"wandb": {"id": "f394715491ad"},
                                                                            "tensorboard": {"log_dir": "/x/tb", "logged": {"train": 3}}}}))
    assert tracked_in(tmp_path / "run", ["wandb", "tensorboard"]) == {"tensorboard": "/x/tb"}


def test_a_damaged_tracking_record_is_one_line_naming_it(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tracking.json").write_text('{"backends": {')
    with pytest.raises(UserError, match=r"tracking.json is not valid JSON .* restore or delete it"):
        open_tracker(TrackingConfig(report_to=["tensorboard"]), tmp_path / "run", config={})


def test_a_finished_training_run_again_catches_up_a_tracker_named_since(tiny_model_dir, tmp_path, monkeypatch, mlflow_store):
    """The rerun of a finished `topr train` returned before its trackers: a backend that failed mid-run (or one added)
    never got the steps it lacked, and MLflow's run stayed RUNNING."""
    from mlflow.tracking import MlflowClient

    from builders import write_curated

    data, out = write_curated(tmp_path / "train.parquet", n=16), tmp_path / "pol"
    args = ["train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--optimizer", "adamw", "--lr", "1e-3", "--batch-size", "4",
            "--max-steps", "3", "--no-progress", "--report-to", "tensorboard"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and f"tensorboard: {out / 'tb'}" in first.stdout, first.output  # train said nowhere; iterate did
    again = CliRunner().invoke(app, [*args, "--report-to", "mlflow", "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["skipped"], again.output
    state = json.loads((out / "tracking.json").read_text())["backends"]["mlflow"]
    client = MlflowClient()
    assert [m.step for m in client.get_metric_history(state["run_id"], "train/loss")] == [1, 2, 3]
    assert client.get_run(state["run_id"]).info.status == "FINISHED"
    events = sorted((out / "tb").iterdir())  # TensorBoard writes an events file each time it opens
    assert CliRunner().invoke(app, [*args, "--report-to", "mlflow"]).exit_code == 0
    assert sorted((out / "tb").iterdir()) == events  # nothing lacking: no tracker reopened on every rerun of a script


def test_wandb_system_metrics_on_when_asked_for(tmp_path, monkeypatch):
    """WANDB_X_DISABLE_STATS=false wrote no system metrics: the tracker turned them off whatever the user said."""
    import time

    from toprcli.tracking.wandb_run import offline_records

    def stats_records(run: Path, seconds: float = 2) -> int:
        with open_tracker(TrackingConfig(report_to=["wandb"], project="p"), run, config={"a": 1}) as tracker:
            tracker.log("train", {"loss": 1.0}, 1)
            time.sleep(seconds)
        (run_file,) = run.glob("wandb/offline-run-*/run-*.wandb")
        return sum(r.WhichOneof("record_type") == "stats" for r in offline_records(run_file))

    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_X_DISABLE_STATS", raising=False)
    assert stats_records(tmp_path / "off") == 0  # by default: W&B's sampler shares a small machine's cores
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "false")
    monkeypatch.setenv("WANDB_X_STATS_SAMPLING_INTERVAL", "0.2")
    # A loaded machine starts W&B's sampler late (CI once saw none in 3 s): a longer run before calling it off.
    assert any(stats_records(tmp_path / f"on-{seconds}", seconds) > 0 for seconds in (2, 8, 20))


def test_a_failed_backend_is_ended_once_and_when_the_tracker_closes(tmp_path, monkeypatch):
    """A failed log closed its backend at once, inside the step's held signals (an MLflow server that does not answer: ~35 s
    more), and a failed close was closed a second time."""
    from toprcli.tracking import tensorboard_run

    calls: list[str] = []
    real_close = tensorboard_run.TensorBoardRun.close

    def close(self, status="finished"):
        calls.append(f"close {status}")
        real_close(self, status)

    def failing_log(self, metrics, step, axis):
        calls.append("log")
        raise ConnectionError("down")

    monkeypatch.setattr(tensorboard_run.TensorBoardRun, "close", close)
    monkeypatch.setattr(tensorboard_run.TensorBoardRun, "log", failing_log)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        tracker = open_tracker(TrackingConfig(report_to=["tensorboard"]), tmp_path / "run", config={})
        tracker.log("train", {"loss": 1.0}, 1)
        assert calls == ["log"]  # not ended inside the step
        tracker.close()
    assert calls == ["log", "close failed"]

    def failing_close(self, status="finished"):
        calls.append(f"close {status}")
        raise ConnectionError("down")

    calls.clear()
    monkeypatch.setattr(tensorboard_run.TensorBoardRun, "close", failing_close)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        open_tracker(TrackingConfig(report_to=["tensorboard"]), tmp_path / "run2", config={}).close()
    assert calls == ["close finished"]


def test_the_completions_table_is_the_first_sample_of_the_first_prompts_read_shard_by_shard(tmp_path):
    """It read every completion of a round's eval into Python to keep 8 (on every resume, for every round)."""
    import pyarrow as pa

    from toprcli import shards
    from toprcli.tracking import SAMPLE_COLUMNS, SAMPLE_ROWS, sample_rows

    def shard(first: int, prompts: int) -> pa.Table:
        rows = [{"prompt_id": f"p{p}", "prompt": "q", "completion": f"c{p}-{k}", "extracted_answer": None, "answer": "1",
                 "verdict": "incorrect", "reward": -1.0, "sample_index": k} for p in range(first, first + prompts) for k in (1, 0)]
        return pa.Table.from_pylist(rows)

    for j, (first, prompts) in enumerate([(0, 3), (3, 3), (6, 5), (11, 5)]):
        shards.write_shard(tmp_path, j, shard(first, prompts))
    rows = sample_rows(tmp_path)
    assert [r["completion"] for r in rows] == [f"c{p}-0" for p in range(SAMPLE_ROWS)] and list(rows[0]) == SAMPLE_COLUMNS
    assert sample_rows(tmp_path / "none") == []
