"""launch.py: a stage in this process or in child processes gives the same rows and the same metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import tiny_generate_config as _cfg
from toprcli.cli.main import app
from toprcli.shards import read_manifest, read_table, shard_name


@pytest.mark.slow
def test_data_parallel_generation_writes_the_rows_of_one_process(tiny_model_dir, tmp_path):
    """generate.data_parallel_size 2: two processes, one engine each, disjoint shards — same rows."""
    from toprcli.launch import run_generate

    seen = []
    run_generate(_cfg(tiny_model_dir, tmp_path / "one"))
    two = run_generate(_cfg(tiny_model_dir, tmp_path / "two", data_parallel_size=2), progress=lambda task, done, total, **_: seen.append((done, total)))
    assert (two.summary["shards_written"], two.summary["shards_skipped"]) == (3, 0)
    (tmp_path / "two" / shard_name(1)).unlink()  # a killed run: one shard missing
    again = run_generate(_cfg(tiny_model_dir, tmp_path / "two", data_parallel_size=2))
    assert (again.summary["shards_written"], again.summary["shards_skipped"]) == (1, 2)  # only the missing one is made
    cols = ["prompt_id", "sample_index", "completion_token_ids", "behavior_logprobs"]
    assert read_table(tmp_path / "one", cols).to_pylist() == read_table(tmp_path / "two", cols).to_pylist()
    manifest = read_manifest(tmp_path / "two")
    assert manifest["counts"]["completions"] == 30 and (tmp_path / "two" / "_logs" / "part-1.log").is_file()
    assert seen[-1] == (2, 2)  # the processes done, reported as a bar
    # Shards made with other settings: the children's refusal reaches the caller as one (iterate says to remove them;
    # it said "generation process 0 of 2 failed ... use a new --out", which iterate cannot do).
    from toprcli.errors import MadeOtherwise

    with pytest.raises(MadeOtherwise, match=r"^\S*two already holds shards generated with other settings") as refused:
        run_generate(_cfg(tiny_model_dir, tmp_path / "two", data_parallel_size=2, seed=7))
    assert refused.value.where == tmp_path / "two"


@pytest.mark.slow
def test_eval_data_parallel_size_from_the_command_line_runs_child_engines_with_one_process_metrics(tiny_model_dir, tmp_path):
    """`topr eval --data-parallel-size 2` generates in two processes (it once ran one engine, ignoring the
    setting); every metric equals the one-process eval's."""
    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--split", "test", "--limit", "6", "--k", "3",
            "--max-new-tokens", "16", "--backend", "hf", "--json"]
    one = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "one")])
    two = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "two"), "--data-parallel-size", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    for generated in ("samples", "greedy/samples"):
        assert (tmp_path / "two" / generated / "_logs" / "part-1.log").is_file()
        assert not (tmp_path / "one" / generated / "_logs").exists()
    metrics = [json.loads(r.output.strip().splitlines()[-1])["metrics"] for r in (one, two)]
    assert metrics[0] == metrics[1] and metrics[0]["samples"] == 18


@pytest.mark.parametrize("args, message", [
    (["-m", "m", "--data-parallel-size", "2"], "no output directory — pass --out DIR"),
    (["-m", "m", "-o", "{tmp}/x", "--data-parallel-size", "2", "--num-shards", "2"], "choose one split"),
])
def test_data_parallel_generation_refuses_what_it_cannot_split_in_one_line(tmp_path, args, message):
    """No --out was a ValueError traceback; with --num-shards the children's split overlapped the command's."""
    r = CliRunner().invoke(app, ["generate", *(a.format(tmp=tmp_path) for a in args)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_stops_multi_rank_training_at_a_checkpoint(tiny_model_dir, tmp_path):
    """A Ctrl-C reaches the terminal's whole foreground process group. torchrun once got it twice (from the
    terminal and forwarded by topr) and then sent its ranks SIGTERM after the SIGINT: they stopped at once,
    with no checkpoint. Now the ranks stop at a step boundary with a checkpoint, and --resume continues there."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from builders import write_curated

    data = write_curated(tmp_path / "train.parquet", n=48)
    out = tmp_path / "policy"
    args = [sys.executable, "-m", "toprcli", "train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--optimizer", "adamw",
            "--lr", "1e-3", "--batch-size", "4", "--max-steps", "120", "--nproc-per-node", "2", "--no-progress", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out.with_name("policy.partial") / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while (not metrics.exists() or len(metrics.read_text().splitlines()) < 3) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    from toprcli.processes import descendants

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # a short-lived process already gone
            return b""

    (torchrun,) = [p for p in descendants(proc.pid) if b"torch.distributed.run" in cmdline(p)]
    stat = Path(f"/proc/{torchrun}/stat").read_text()
    assert int(stat[stat.rindex(")") + 2:].split()[3]) != os.getsid(proc.pid)  # out of the terminal's reach: topr forwards once
    assert b"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=110" in Path(f"/proc/{torchrun}/environ").read_bytes()  # not 30 s: time to checkpoint
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: every process of the group
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130 and "interrupted by SIGINT" in err, err[-2000:]
    checkpoints = sorted((out.with_name("policy.partial") / "checkpoints").glob("step-*"))
    assert checkpoints, "no checkpoint at the stop"
    stopped_at = int(checkpoints[-1].name.split("-")[1])
    resumed = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["resumed_from_step"] == stopped_at < 120 and summary["steps"] == 120


def test_a_stopped_launcher_is_asked_to_stop_with_sigterm(tmp_path):
    """srun reads a single SIGINT as a request for its status and keeps running; every launcher passes SIGTERM
    on as a stop. Whatever stopped topr, its launcher child gets SIGTERM."""
    import subprocess
    import time

    from toprcli.launch import _stop_child

    got = tmp_path / "got"
    proc = subprocess.Popen(["bash", "-c", f"trap 'echo TERM > {got}; exit 0' TERM; trap 'echo INT > {got}; exit 0' INT; "
                                           f"touch {tmp_path / 'ready'}; while :; do sleep 0.05; done"])
    while not (tmp_path / "ready").exists():
        time.sleep(0.05)
    _stop_child(proc, grace_s=30)
    assert proc.returncode == 0 and got.read_text().strip() == "TERM"


def test_data_parallel_engines_take_their_gpus_from_the_jobs_visible_devices(monkeypatch):
    """CUDA_VISIBLE_DEVICES=4,5,6,7 gave the engines 0, 1, 2, 3: GPUs of another job on a shared node."""
    import torch

    from toprcli.launch import device_groups

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert device_groups(2, 2) == ["4,5", "6,7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a1,GPU-b2,GPU-c3,GPU-d4")
    assert device_groups(4, 1) == ["GPU-a1", "GPU-b2", "GPU-c3", "GPU-d4"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_groups(2, 1) == ["0", "1"]


def test_a_bad_launcher_template_is_refused_before_its_config_is_written(tmp_path, monkeypatch):
    """`--launcher 'x {cmd}'` wrote <out>.train.yaml, then refused the template."""
    import toprcli.launch as launch
    from toprcli.config import TrainConfig
    from toprcli.errors import UserError

    monkeypatch.setattr(launch.train_stage, "check", lambda cfg: None)  # the template alone: no model or data to check here
    with pytest.raises(UserError, match="train.launcher: bad template"):
        launch.train_in_child(TrainConfig(model="m", data="d.parquet", out=str(tmp_path / "p"), launcher="x {cmd}"))
    assert not list(tmp_path.iterdir())


def test_ranks_refusing_their_checkpoint_reach_iterate_as_work_made_otherwise(tmp_path, monkeypatch):
    """Under torchrun the ranks' refusal ('run without --resume') came back as a plain error: iterate could not say to
    remove <out>.partial, the only fix it has."""
    import toprcli.launch as launch
    from toprcli.config import TrainConfig
    from toprcli.errors import RESUME_REFUSED, MadeOtherwise, UserError

    def refused(command, log, what):
        raise UserError(f"{what} failed (exit code 2): error: the checkpoint in x {RESUME_REFUSED} data (d) — run without --resume")

    monkeypatch.setattr(launch.train_stage, "check", lambda cfg: None)
    monkeypatch.setattr(launch, "run_logged", refused)
    with pytest.raises(MadeOtherwise) as e:
        launch.train_in_child(TrainConfig(model="m", data="d.parquet", out=str(tmp_path / "p"), nproc_per_node=2))
    assert e.value.where == tmp_path / "p.partial"
    monkeypatch.setattr(launch, "run_logged", lambda command, log, what: (_ for _ in ()).throw(UserError("out of memory")))
    with pytest.raises(UserError) as e:
        launch.train_in_child(TrainConfig(model="m", data="d.parquet", out=str(tmp_path / "q"), nproc_per_node=2))
    assert not isinstance(e.value, MadeOtherwise)


def test_a_failed_child_is_told_by_its_own_lines_not_an_earlier_attempt_s(tmp_path):
    """The log is appended to: attempt 1's 'error: ... was made with a different ...' was read again when attempt 2
    died without a line of its own, and iterate said to remove the valid checkpoints attempt 2 had written."""
    from toprcli.errors import UserError
    from toprcli.launch import run_logged

    log = tmp_path / "p.train.log"
    log.write_text("error: the checkpoint in p.partial was made with a different data — run without --resume\n")
    with pytest.raises(UserError) as e:
        run_logged("echo training; exit 137", log, what="training of p")
    assert "was made with a different" not in str(e.value) and "exit code 137" in str(e.value) and "training" in str(e.value)
