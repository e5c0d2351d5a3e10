"""`topr iterate` end to end on a micro config, and resume after SIGKILL in each stage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from toprcli.cli.main import app

pytestmark = pytest.mark.slow

MICRO = """
run_dir: {run_dir}
rounds: 1
warm_start:
  enabled: true
  init_model: true
  examples: 64
  train: {{epochs: 1, lr: 2.0e-3, batch_size: 32}}
generate:
  dataset: {{source: builtin:arith, split: train, level: 1, size: 16}}
  n: 4
  sampling: {{max_new_tokens: 24}}
  engine: {{backend: hf}}
  shard_size: 4
score: {{verifier: gsm8k, workers: 1}}
curate: {{positive_fraction: 0.5, unreachable_baseline: 0.0}}
train: {{loss: topr, optimizer: adamw, lr: 1.0e-3, batch_size: 16, save_every: 1}}
eval:
  dataset: {{source: builtin:arith, split: test, level: 1, size: 8}}
  k: 2
  sampling: {{max_new_tokens: 24}}
  engine: {{backend: hf}}
"""

# Runs the pipeline in a child process and SIGKILLs it from inside at a chosen point:
# after the N-th shard written into a directory ending in DIR_SUFFIX, or after the
# N-th training checkpoint. A real kill of a real process; no hooks in the product.
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline
    import toprcli.shards as shards
    import toprcli.training.checkpoint as ckpt

    config, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    count = [0]

    def maybe_die():
        count[0] += 1
        if count[0] >= n:
            os.kill(os.getpid(), signal.SIGKILL)

    if where == "checkpoint":
        original_save = ckpt.save_checkpoint
        def save(*a, **k):
            out = original_save(*a, **k)
            maybe_die()
            return out
        ckpt.save_checkpoint = save
    else:
        original_write = shards.write_shard
        def write(out_dir, *a, **k):
            path = original_write(out_dir, *a, **k)
            if str(out_dir).rstrip("/").endswith(where):
                maybe_die()
            return path
        shards.write_shard = write

    if __name__ == "__main__":
        Pipeline(load_config(IterateConfig, config)).run()
    """
)


def write_config(tmp: Path, run_dir: Path) -> Path:
    cfg = tmp / f"{run_dir.name}.yaml"
    cfg.write_text(MICRO.format(run_dir=run_dir))
    return cfg


def inventory(run_dir: Path) -> dict[str, int]:
    """Every file of the run (minus timing-dependent ones), with row counts for Parquet files."""
    out = {}
    for p in sorted(run_dir.rglob("*")):
        rel = str(p.relative_to(run_dir))
        if not p.is_file() or rel in ("state.json",) or "report/" in rel or "/checkpoints/" in rel:
            continue
        out[rel] = pq.ParquetFile(p).metadata.num_rows if p.suffix == ".parquet" else -1
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted micro run through the real CLI."""
    tmp = tmp_path_factory.mktemp("iterate")
    run_dir = tmp / "reference"
    r = CliRunner().invoke(app, ["iterate", "--config", str(write_config(tmp, run_dir))])
    assert r.exit_code == 0, r.output
    return run_dir


def test_micro_run_completes_with_every_artifact(reference):
    for rel in ["config.yaml", "state.json", "base/config.json", "warmstart/gold.parquet", "warmstart/policy/model.safetensors",
                "round-000/eval/eval.json", "round-001/samples/_manifest.json", "round-001/scored/_manifest.json",
                "round-001/train.parquet", "round-001/policy/model.safetensors", "round-001/policy/metrics.jsonl",
                "round-001/eval/eval.json", "report/summary.md", "report/accuracy.png"]:
        assert (reference / rel).exists(), rel
    samples = pq.read_table(reference / "round-001" / "samples")
    assert samples.num_rows == 16 * 4 and set(samples.column("iteration").to_pylist()) == {1}
    ev = json.loads((reference / "round-001" / "eval" / "eval.json").read_text())
    assert {"pass@1", "maj@k", "invalid_rate", "greedy_accuracy"} <= set(ev["metrics"])
    state = json.loads((reference / "state.json").read_text())
    assert "round-001/train" in state["steps"]

    rows = json.loads(CliRunner().invoke(app, ["report", str(reference), "--json"]).stdout)
    assert [r["round"] for r in rows] == [0, 1]
    assert {"round", "pass@1", "maj@k", "invalid_rate"} <= set(rows[1])
    # The micro policy is barely trained: p̃ is the configured 0.5 when the round has both
    # outcomes, else the fallback baseline c = 0 applies (all negatives: p̃ = 0).
    expected = 0.5 if 0 < rows[1]["p"] < 1 else (0.0 if rows[1]["p"] == 0 else 1.0)
    assert rows[1]["p_tilde"] == pytest.approx(expected, abs=1e-6)


def test_rerun_of_a_finished_run_does_nothing(reference):
    before = {p: p.stat().st_mtime_ns for p in reference.rglob("*.parquet")}
    r = CliRunner().invoke(app, ["iterate", "--config", str(reference.parent / "reference.yaml"), "--no-report"])
    assert r.exit_code == 0, r.output
    assert before == {p: p.stat().st_mtime_ns for p in reference.rglob("*.parquet")}


def test_changed_config_is_refused(reference):
    r = CliRunner().invoke(app, ["iterate", "--config", str(reference.parent / "reference.yaml"), "--set", "train.lr=0.5"])
    assert r.exit_code == 2 and "different config" in r.stderr and "train.lr" in r.stderr


@pytest.mark.parametrize("where, n", [("round-001/samples", 2), ("round-001/scored", 2), ("checkpoint", 2)])
def test_killed_run_resumes_to_the_same_files(reference, tmp_path, where, n):
    run_dir = tmp_path / "killed"
    # Start from the reference's warm start so the test spends its time in round 1.
    run_dir.mkdir()
    for part in ("base", "warmstart", "round-000"):
        shutil.copytree(reference / part, run_dir / part)
    cfg = write_config(tmp_path, run_dir)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, str(script), str(cfg), where, str(n)], env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run_dir / "round-001" / "eval" / "eval.json").exists()

    r = CliRunner().invoke(app, ["iterate", "--config", str(cfg), "--no-report"])
    assert r.exit_code == 0, r.output
    got, want = inventory(run_dir), inventory(reference)
    assert got.keys() == want.keys()
    assert got == want  # same files, same row counts
    samples = pq.read_table(run_dir / "round-001" / "samples").to_pandas()
    assert samples.groupby("prompt_id").size().eq(4).all()
    assert not samples.duplicated(["prompt_id", "sample_index"]).any()
