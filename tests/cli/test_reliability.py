"""Reliability edges: outputs that cannot be written, requests past the context, broken local
files, and one writer per output. Every bad input: exit 2, one line, no traceback, nothing written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import write_curated
from typer.testing import CliRunner

from conftest import REPO
from toprcli.cli.main import app
from toprcli.shards import read_manifest, read_table

# As root, permission bits do not stop writes: drop the capabilities that bypass them (the
# way a read-only mount or another user's directory stops a normal user).
DROP_PRIVILEGES = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []


def one_error_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in text, text
    return lines[0]


@pytest.fixture(scope="module")
def inputs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """One valid input for every stage (samples, scored, curated) on the tiny model."""
    root = tmp_path_factory.mktemp("inputs")
    run = lambda *a: CliRunner().invoke(app, list(a))  # noqa: E731
    r = run("generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "-o", str(root / "samples"), "--backend", "hf",
            "--limit", "4", "--n", "2", "--max-new-tokens", "8")
    assert r.exit_code == 0, r.output
    assert run("score", "-s", str(root / "samples"), "-o", str(root / "scored")).exit_code == 0
    assert run("curate", "--scored", str(root / "scored"), "--out", str(root / "train.parquet"), "--baseline", "0").exit_code == 0
    return {"samples": root / "samples", "scored": root / "scored", "curated": root / "train.parquet", "model": tiny_model_dir,
            "config": REPO / "configs" / "demo.yaml"}


def _commands(i: dict[str, Path], out: Path) -> dict[str, list[str]]:
    m = str(i["model"])
    return {
        "generate": ["generate", "-m", m, "-d", "builtin:arith", "-o", str(out), "--backend", "hf", "--limit", "2", "--n", "1", "--max-new-tokens", "4"],
        "score": ["score", "-s", str(i["samples"]), "-o", str(out)],
        "curate": ["curate", "--scored", str(i["scored"]), "--out", str(out) + ".parquet", "--baseline", "0"],
        "train": ["train", "-m", m, "-d", str(i["curated"]), "-o", str(out), "--max-steps", "1", "--no-progress"],
        "eval": ["eval", "--model", m, "--dataset", "builtin:arith", "--out", str(out), "--k", "1", "--limit", "2", "--max-new-tokens", "4", "--backend", "hf"],
        "iterate": ["iterate", "--config", str(i["config"]), "--run-dir", str(out)],
        "init-model": ["init-model", str(out)],
        "report": ["report", str(out)],
    }


@pytest.mark.parametrize("stage", ["generate", "score", "curate", "train", "eval", "iterate", "init-model"])
def test_an_output_name_too_long_for_its_side_files_is_one_line(inputs, tmp_path, stage):
    """A 245-character name took its lock, then failed on a side file's name (curate after its first pass; generate on
    the lock): OSError ENAMETOOLONG, a traceback."""
    out = tmp_path / ("x" * 236)
    res = CliRunner().invoke(app, _commands(inputs, out)[stage])
    assert res.exit_code == 2, res.output
    line = one_error_line(res.stderr)
    assert "cannot write" in line and "choose a shorter output name" in line, line
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv cannot drop DAC override")
@pytest.mark.parametrize("stage", ["generate", "score", "curate", "train", "eval", "iterate", "init-model"])
def test_an_output_that_cannot_be_written_is_one_line(inputs, tmp_path, stage):
    locked = tmp_path / "read-only"
    locked.mkdir()
    out = locked / "out"
    locked.chmod(0o555)
    try:
        cmd = [*DROP_PRIVILEGES, sys.executable, "-m", "toprcli", *_commands(inputs, out)[stage]]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert res.returncode == 2, res.stderr[-3000:]
        line = one_error_line(res.stderr)
        assert "cannot write" in line and "permission denied" in line and str(locked) in line, line
        assert list(locked.iterdir()) == []  # nothing half-written
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("named", [True, False])
def test_a_full_disk_is_one_line_and_leaves_no_shard(inputs, tmp_path, monkeypatch, named):
    import pyarrow.parquet as pq

    def full(*args, **kwargs):  # pyarrow's own error names no file: the line said "cannot write the output"
        raise OSError(errno.ENOSPC, "No space left on device", str(args[1])) if named else OSError("IOError: No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    out = tmp_path / "scored"
    res = CliRunner().invoke(app, ["score", "-s", str(inputs["samples"]), "-o", str(out)])
    assert res.exit_code == 2
    line = one_error_line(res.stderr)
    assert "no space left on device" in line and "free disk space" in line and str(out) in line
    assert not list(out.glob("shard-*")) and not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("how", ["safetensors says so", "torch.save on a full disk"])
def test_a_full_disk_while_saving_weights_is_one_line(inputs, tiny_model_dir, tmp_path, monkeypatch, how):
    """safetensors (SafetensorError "os error 28") and torch.save (RuntimeError "unexpected pos") report a full disk in
    their own types: training and init-model ended in a traceback and exit 1."""
    import safetensors
    import torch
    import transformers.modeling_utils

    import toprcli.shards.files as files
    from builders import write_curated

    if how == "safetensors says so":
        def full(*args, **kwargs):
            raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
        commands = [["init-model", str(tmp_path / "m")], ["train", "-m", str(tiny_model_dir), "-d", str(write_curated(tmp_path / "t.parquet", n=8)),
                                                          "-o", str(tmp_path / "p"), "--max-steps", "1", "--batch-size", "4", "--no-progress"]]
    else:  # checkpoints go through write_atomic: the disk, checked before the half-written file is removed, is full

        def full(obj, f, *args, **kwargs):
            monkeypatch.setattr(files.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 0))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

        monkeypatch.setattr(torch, "save", full)
        commands = [["train", "-m", str(tiny_model_dir), "-d", str(write_curated(tmp_path / "t.parquet", n=8)), "-o", str(tmp_path / "p"),
                     "--max-steps", "2", "--save-every", "1", "--batch-size", "4", "--no-progress"]]
    for args in commands:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        line = one_error_line(res.stderr)
        assert "no space left on device" in line and "free disk space" in line, line
    # the half-written checkpoint (a model and its optimizer state) kept the disk full until the next save
    assert not [p for p in (tmp_path / "p.partial").rglob("*") if p.name.endswith(".tmp")]
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="unexpected pos"):  # a failed write with room on the disk is what it was
        files.write_atomic(tmp_path / "x.pt", lambda tmp: (_ for _ in ()).throw(RuntimeError("unexpected pos")))


def test_max_new_tokens_past_the_context_is_refused_or_clipped_on_request(tiny_model_dir, tmp_path):
    out = tmp_path / "s"
    base = ["generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "-o", str(out), "--backend", "hf", "--limit", "3", "--n", "1"]
    res = CliRunner().invoke(app, [*base, "--max-new-tokens", "100000"])
    assert res.exit_code == 2
    line = one_error_line(res.stderr)
    assert "context of 512 tokens" in line and "longest" in line and "--clip-to-context" in line
    assert not out.exists()
    res = CliRunner().invoke(app, [*base, "--max-new-tokens", "100000", "--clip-to-context", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["clipped_to_context"]["prompts_clipped"] == 3 and summary["clipped_to_context"]["context"] == 512
    assert read_manifest(out)["clipped_to_context"]["max_new_tokens_requested"] == 100000
    lengths = [len(p) + len(c) for p, c in zip(*(read_table(out, [k]).column(0).to_pylist() for k in ("prompt_token_ids", "completion_token_ids")))]
    assert max(lengths) <= 512


@pytest.mark.parametrize("name, text, words", [
    ("bad.jsonl", '{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": \n', ["bad.jsonl", "line 2", "not valid JSON"]),
    ("bad.json", '[{"question": "1+1?", "answer": "2"},\n {"question": ]', ["bad.json", "line 2"]),
    ("bad.csv", 'question,answer\n"1+1?",2\n"2+2?,4\n', ["bad.csv", "line 3"]),
    ("bad.parquet", "not a parquet file", ["bad.parquet", "Parquet"]),
])
def test_a_broken_local_dataset_names_the_file_and_line(tiny_model_dir, tmp_path, name, text, words):
    data = tmp_path / name
    data.write_text(text)
    out = tmp_path / "s"
    res = CliRunner().invoke(app, ["generate", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--backend", "hf"])
    assert res.exit_code == 2
    line = one_error_line(res.stderr)
    assert all(w in line for w in words) and "hub id" not in line, line
    assert not out.exists()


@pytest.mark.slow
def test_two_writers_on_one_output_one_fails_fast_the_other_completes(tiny_model_dir, tmp_path):
    """Two `topr generate` processes on the same --out: the second stops at once naming the first;
    the first completes; the output equals a single run's."""
    args = [sys.executable, "-m", "toprcli", "generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--backend", "hf",
            "--limit", "96", "--n", "8", "--shard-size", "8", "--max-new-tokens", "96", "--batch-size", "2", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "shared"
    first = subprocess.Popen([*args, "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".shared.lock"
    deadline = time.monotonic() + 120
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock.exists(), "the first writer never took its lock"
    t0 = time.monotonic()
    second = subprocess.run([*args, "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and time.monotonic() - t0 < 60
    line = one_error_line(second.stderr)
    assert "is being written by pid" in line and str(first.pid) in line, line
    assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    assert not lock.exists()  # released and removed
    clean = tmp_path / "clean"
    subprocess.run([*args, "--out", str(clean)], env=env, check=True, capture_output=True, timeout=300)
    cols = ["prompt_id", "sample_index", "completion_token_ids", "behavior_logprobs"]
    assert read_table(out, cols).to_pylist() == read_table(clean, cols).to_pylist()


def test_a_stale_lock_of_a_killed_run_never_blocks(tiny_model_dir, tmp_path):
    """A lock file left by a killed process holds no lock: the rerun proceeds and removes it."""
    out = tmp_path / "policy"
    (tmp_path / ".policy.lock").write_text("pid 999999 on elsewhere since 00:00:00 (topr train)")
    data = write_curated(tmp_path / "train.parquet", n=8, policy=str(tiny_model_dir))
    res = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--max-steps", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / ".policy.lock").exists()


# -- bad input found in review: each was a traceback, a misleading line, or a run dir blocked for good ------------


def test_brackets_in_an_error_are_text_not_markup(tmp_path):
    """A path or pattern with [..] lost its brackets (rich markup), or crashed with a MarkupError traceback."""
    r = CliRunner().invoke(app, ["score", "-s", str(tmp_path / "[/foo]"), "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "[/foo]" in one_error_line(r.stderr)


def test_a_config_that_is_not_text_or_has_a_number_for_a_key_is_one_line(tiny_model_dir, tmp_path):
    (tmp_path / "numkey.yaml").write_text("sampling:\n  1: x\n")
    for config, words in [(tiny_model_dir / "model.safetensors", "is not a text file"), (tmp_path / "numkey.yaml", "'sampling.1' (a key is a name, not int)")]:
        r = CliRunner().invoke(app, ["generate", "-c", str(config), "-m", str(tiny_model_dir), "-o", str(tmp_path / "o")])
        assert r.exit_code == 2 and words in one_error_line(r.stderr), r.output


def test_an_output_below_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "p.yaml").write_text("rounds: 1\nwarm_start: {init_model: true}\n")
    r = CliRunner().invoke(app, ["iterate", "-c", str(tmp_path / "p.yaml"), "--run-dir", str(tmp_path / "afile" / "run")])
    assert r.exit_code == 2 and "a part of that path is a file" in one_error_line(r.stderr)


def test_empty_output_names_are_refused_not_the_current_directory(tmp_path, monkeypatch):
    """An unset "$DIR": init-model "" offered to --overwrite the current directory; iterate --run-dir "" wrote into it."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["init-model", ""])
    assert r.exit_code == 2 and "the model directory is empty" in one_error_line(r.stderr)
    (tmp_path.parent / "p.yaml").write_text("rounds: 1\nwarm_start: {init_model: true}\n")
    r = CliRunner().invoke(app, ["iterate", "-c", str(tmp_path.parent / "p.yaml"), "--run-dir", ""])
    assert r.exit_code == 2 and "bad value for 'run_dir': ''" in one_error_line(r.stderr)
    assert list(tmp_path.iterdir()) == []


def test_an_out_with_a_trailing_slash_is_that_directory(tiny_model_dir, tmp_path):
    """train -o newpol/ was refused as 'newpol already exists': its log went to newpol/.log, inside it (the log
    exists only where topr owns its process: a real command)."""
    curated = write_curated(tmp_path / "train.parquet", n=8, policy=str(tiny_model_dir))
    r = subprocess.run([sys.executable, "-m", "toprcli", "train", "-m", str(tiny_model_dir), "-d", str(curated), "-o", f"{tmp_path / 'newpol'}/",
                        "--max-steps", "1", "--no-progress"], capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "newpol" / "config.json").exists() and not (tmp_path / "newpol" / ".log").exists()


def test_a_mistyped_model_leaves_no_run_dir(tiny_model_dir, tmp_path):
    """(A run dir a refused first run left behind takes the corrected config: tests/test_runs.py.)"""
    (tmp_path / "min.yaml").write_text("model: ./nomodel\nrounds: 1\n")
    r = CliRunner().invoke(app, ["iterate", "-c", str(tmp_path / "min.yaml"), "--run-dir", str(tmp_path / "run"), "--no-report"])
    assert r.exit_code == 2 and "model dir not found: ./nomodel" in one_error_line(r.stderr)
    assert not (tmp_path / "run").exists()


def test_set_inside_a_mapping_adds_to_it_as_the_flag_does():
    from toprcli.config import ScoreConfig, load_config

    cfg = load_config(ScoreConfig, None, sets={"verifier_by_source.my_source": "math"})
    assert cfg.verifier_by_source["my_source"] == "math" and cfg.verifier_by_source["openai/gsm8k"] == "gsm8k"


def test_a_stage_command_takes_a_pipeline_configs_model_and_refuses_a_scalar_section(tmp_path):
    from toprcli.config import ConfigError, GenerateConfig, TrainConfig, load_config

    (tmp_path / "p.yaml").write_text("model: base/model\ntrain: {lr: 1.0e-6}\ngenerate: {n: 2}\n")
    assert load_config(TrainConfig, tmp_path / "p.yaml").model == "base/model"
    assert load_config(GenerateConfig, tmp_path / "p.yaml").model == "base/model"
    (tmp_path / "s.yaml").write_text("train: {lr: 1.0e-6}\ngenerate: 0\n")
    with pytest.raises(ConfigError, match="config section 'generate' must be a mapping"):
        load_config(GenerateConfig, tmp_path / "s.yaml")


def test_import_roll_to_a_directory_says_so_first(tmp_path):
    (tmp_path / "roll.yaml").write_text("pretrain: m\n")
    (tmp_path / "outdir").mkdir()
    r = CliRunner().invoke(app, ["config", "import-roll", str(tmp_path / "roll.yaml"), "-o", str(tmp_path / "outdir")])
    assert r.exit_code == 2 and "is a directory — give a file name" in one_error_line(r.stderr)


def test_bad_input_to_a_multi_rank_training_is_its_own_line_before_any_rank_starts(tiny_model_dir, tmp_path):
    """It printed torchrun's boilerplate ('To enable traceback see ...') after starting the ranks, and left
    <out>.train.yaml and .train.log; with no --out it was a traceback."""
    r = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(tmp_path / "nodata.parquet"), "-o", str(tmp_path / "pol"),
                                 "--nproc-per-node", "2"])
    assert r.exit_code == 2 and "nodata.parquet" in one_error_line(r.stderr)
    assert list(tmp_path.iterdir()) == []
    r = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(tmp_path / "nodata.parquet"), "--nproc-per-node", "2"])
    assert r.exit_code == 2 and "--out" in one_error_line(r.stderr)


def test_an_error_off_a_terminal_is_exactly_one_line(tmp_path):
    """stderr to a file or CI log: a transient progress bar left a blank line before the error."""
    r = subprocess.run([sys.executable, "-m", "toprcli", "score", "-s", str(tmp_path / "none"), "-o", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error:"), repr(r.stderr)


def test_json_output_is_json_when_a_number_is_not_finite(monkeypatch):
    """A training that ended on a skipped non-finite step printed NaN/Infinity under --json: not JSON (JSON.parse refuses it)."""
    from toprcli.cli import common

    printed: list[str] = []
    monkeypatch.setattr(common, "echo", printed.append)  # (not console.file: monkeypatch would pin the stdout of this moment)
    common.echo_json({"final_loss": float("nan"), "final_grad_norm": float("inf"), "steps": [1.5, float("-inf")], "name": "x"})
    assert json.loads(printed[0], parse_constant=lambda c: pytest.fail(f"not JSON: {c}")) == {
        "final_loss": None, "final_grad_norm": None, "steps": [1.5, None], "name": "x"}


def test_off_a_terminal_progress_is_a_line_now_and_then_and_one_at_the_end(tiny_model_dir, tmp_path, monkeypatch):
    """Piped to a log (`topr generate ... 2> log`), a bar was one line at the very end, or none: an hour of generation
    showed nothing. Off a terminal each task prints a plain line every LINE_EVERY_S and one when it completes."""
    import toprcli.cli.common as common

    clock = iter(range(0, 10_000, 20))  # each call 20 s after the last
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    lines: list[str] = []
    monkeypatch.setattr(common.err_console, "print", lambda text, **kw: lines.append(text))
    progress = common._progress_lines(30)
    for done in range(4):
        progress("generate", done, 3, completions=done * 2)  # a line at 40 s, and its end at 60 s (20 s after that line)
    progress("generate", 3, 3)  # the end, told twice: one line
    progress("generate", 0, 3)  # the next round's, done within 30 s: nothing (the command's summary follows)
    progress("generate", 3, 3)
    assert lines == ["generate 2/3 · completions 4 · 0:40", "generate 3/3 · completions 6 · 1:00"]
    for done in (0, 1, 3):
        progress("generate", done, 3)  # its end 40 s after it began
    assert lines[2:] == ["generate 3/3 · 0:40"]

    monkeypatch.undo()
    out = tmp_path / "s"
    args = ["generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--limit", "8", "--n", "2", "--max-new-tokens", "4",
            "--backend", "hf", "-o", str(out), "--shard-size", "4"]
    monkeypatch.setattr(common, "LINE_EVERY_S", 0.0)
    res = CliRunner().invoke(app, args)  # not a terminal
    assert res.exit_code == 0, res.output
    assert "generate 8/8 · completions 16 · tok/s" in res.stderr and "━" not in res.stderr
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.stderr == "" and json.loads(res.stdout)["stage"] == "generate"


def test_json_with_verbose_keeps_other_programs_output_off_stdout(inputs, tmp_path):
    """`--json --verbose`: a plugin's print (and vLLM's log, which goes to stdout) came before the JSON: no JSON at all.
    Other programs' output goes to stderr then; stdout is the stage result alone."""
    (tmp_path / "noisy.py").write_text("def reward(completion, answer, row):\n    print('checking', row.get('prompt_id'))\n    return False\n")
    done = subprocess.run([sys.executable, "-m", "toprcli", "score", "-s", str(inputs["samples"]), "-o", str(tmp_path / "sc"),
                           "--verifier", "python:noisy:reward", "--workers", "1", "--json", "--verbose"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["stage"] == "score" and "checking" in done.stderr


def test_inputs_a_sweep_found_misread(inputs, tmp_path):
    """train -o DATA --overwrite replaced the training data with a policy (its own advice); a damaged safetensors file was
    a 132-line traceback; a model dir with no tokenizer trained a policy nothing could generate with; a mistyped -m
    retried the hub for half a minute; generate left an empty --out when its model did not load; generate and score
    wrote shards among a model's weights; a zero-row file and a missing few-shot file got datasets' words or the wrong
    advice; iterate refused max_new_tokens past the model's context at round 0, after the engine started."""
    model, data = inputs["model"], inputs["curated"]
    before = data.read_bytes()
    train = ["train", "-d", str(data), "--max-steps", "1", "--batch-size", "4", "--no-progress"]
    r = CliRunner().invoke(app, [*train, "-m", str(model), "-o", str(data), "--overwrite"])
    assert r.exit_code == 2 and "is a file (the training data)" in one_error_line(r.stderr) and data.read_bytes() == before
    corrupt, bare = tmp_path / "corrupt", tmp_path / "bare"
    shutil.copytree(model, corrupt)
    (corrupt / "model.safetensors").write_bytes(os.urandom(100))
    shutil.copytree(model, bare)
    for f in bare.glob("tokenizer*"):
        f.unlink()
    for m, words in ((corrupt, "cannot load the model"), (bare, "has no tokenizer"), (tmp_path / "nope", "model dir not found")):
        r = CliRunner().invoke(app, [*train, "-m", str(m), "-o", str(tmp_path / f"p-{m.name}")])
        assert r.exit_code == 2 and words in one_error_line(r.stderr) and not list(tmp_path.glob(f"p-{m.name}*"))
    r = CliRunner().invoke(app, [*train, "-m", str(model), "-o", str(tmp_path / "p-ref"), "--ref-model", str(corrupt), "--kl-coef", "0.1"])
    assert r.exit_code == 2 and "cannot load the model" in one_error_line(r.stderr) and not list(tmp_path.glob("p-ref*"))
    r = CliRunner().invoke(app, [*train, "-m", str(model), "-o", str(tmp_path / "p-bare-ref"), "--ref-model", str(bare), "--kl-coef", "0.1"])
    assert r.exit_code == 0, r.output  # a KL reference's weights are read, not its tokenizer
    gen = ["generate", "-d", "builtin:arith", "--limit", "1", "--n", "1", "--max-new-tokens", "4", "--backend", "hf"]
    r = CliRunner().invoke(app, [*gen, "-m", str(corrupt), "-o", str(tmp_path / "g")])
    assert r.exit_code == 2 and "cannot load model" in one_error_line(r.stderr) and not (tmp_path / "g").exists()
    for args in ([*gen, "-m", str(model), "-o", str(bare)], ["score", "-s", str(inputs["samples"]), "-o", str(bare)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "is a model's directory" in one_error_line(r.stderr) and not list(bare.glob("shard-*"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), tmp_path / "zero.parquet")
    (tmp_path / "none.json").write_text("[]\n")
    for f in ("zero.parquet", "none.json"):
        r = CliRunner().invoke(app, [*gen, "-m", str(model), "-d", str(tmp_path / f), "-o", str(tmp_path / "z")])
        assert r.exit_code == 2 and "is empty — it holds no rows" in one_error_line(r.stderr)
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    r = CliRunner().invoke(app, [*gen, "-m", str(model), "-d", str(tmp_path / "q.jsonl"), "-o", str(tmp_path / "f"), "--few-shot", "1",
                                 "--few-shot-split", str(tmp_path / "nope.jsonl")])
    assert r.exit_code == 2 and "file not found" in one_error_line(r.stderr)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {model}\nrun_dir: {tmp_path / 'run'}\n")  # tiny's context is 512, the default max_new_tokens 512
    for args in (["config", "check", str(config)], ["iterate", "-c", str(config)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "generate.sampling.max_new_tokens 512 leaves no room" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


def test_a_missing_out_and_a_file_for_a_run_dir_say_so(inputs, tmp_path):
    """verifier-data without --out said '--out (none): … name it *.parquet'; report on a file said 'run dir not found'."""
    r = CliRunner().invoke(app, ["verifier-data", "-s", str(inputs["scored"])])
    assert r.exit_code == 2 and "no --out given" in one_error_line(r.stderr)
    (tmp_path / "notes.txt").write_text("x")
    r = CliRunner().invoke(app, ["report", str(tmp_path / "notes.txt")])
    assert r.exit_code == 2 and "not a run directory (a file)" in one_error_line(r.stderr)


def test_a_copied_run_s_own_config_names_the_original_and_is_refused(tmp_path, monkeypatch):
    """`cp -r runs/d moved/d; topr iterate -c moved/d/config.yaml` resumed the original runs/d (the copy untouched)."""
    import yaml
    from typer.testing import CliRunner

    from toprcli.cli.iterate import check_config
    from toprcli.cli.main import app
    from toprcli.config import IterateConfig, config_to_dict

    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "moved" / "d"
    (copy / "round-000").mkdir(parents=True)
    (copy / "config.yaml").write_text(yaml.safe_dump(config_to_dict(IterateConfig(run_dir="runs/d"))))
    r = CliRunner().invoke(app, ["iterate", "-c", str(copy / "config.yaml")])
    assert r.exit_code == 2 and f"is the record of the run in {copy}, but names run_dir runs/d" in r.output
    assert f"topr iterate --run-dir {copy}" in r.output and not (tmp_path / "runs").exists()
    check_config(str(copy / "config.yaml"), {"run_dir": "runs/d"}, IterateConfig(run_dir="runs/d"))  # --run-dir said which
    check_config(str(copy / "config.yaml"), {}, IterateConfig(run_dir=str(copy)))  # the run's own dir
