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

from builders import MICRO_PIPELINE as MICRO
from toprcli.cli.main import app

pytestmark = pytest.mark.slow

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
    # Each accuracy has its 95% bootstrap interval over prompts, from the per-prompt scores kept beside it.
    from toprcli.evaluation import bootstrap_interval

    m, per_prompt = ev["metrics"], ev["per_prompt"]
    assert m["bootstrap"] == {"method": "percentile", "level": 0.95, "resamples": 1000, "seed": 0, "over": "prompts"}
    for key in ("pass@1", "maj@k", "greedy_accuracy"):
        assert len(per_prompt[key]) == m["prompts"] and sum(per_prompt[key].values()) / m["prompts"] == pytest.approx(m[key])
        assert m["intervals"][key] == list(bootstrap_interval(list(per_prompt[key].values()), resamples=1000, seed=0))
        assert m["intervals"][key][0] <= m[key] <= m["intervals"][key][1]
    state = json.loads((reference / "state.json").read_text())
    assert "round-001/train" in state["steps"]

    rows = json.loads(CliRunner().invoke(app, ["report", str(reference), "--json"]).stdout)
    assert [r["round"] for r in rows] == [0, 1]
    assert {"round", "pass@1", "maj@k", "invalid_rate"} <= set(rows[1])
    assert rows[1]["intervals"] == m["intervals"] and "[" in (reference / "report" / "summary.md").read_text()
    # The micro policy is barely trained: p̃ is the configured 0.5 when the round has both
    # outcomes, else the fallback baseline c = 0 applies (all negatives: p̃ = 0).
    expected = 0.5 if 0 < rows[1]["p"] < 1 else (0.0 if rows[1]["p"] == 0 else 1.0)
    assert rows[1]["p_effective"] == pytest.approx(expected, abs=1e-6)


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


@pytest.mark.parametrize("where", ["round-001/samples", "round-001/scored", "round-001/eval/samples"])
def test_a_killed_run_resumes_after_its_run_dir_moved(reference, tmp_path, where):
    """A run dir moved (mv keeps the files) between the kill and the rerun resumes its partial
    work: the shards were made by the same model from the same data, now at another path."""
    run_dir = tmp_path / "before"
    run_dir.mkdir()
    for part in ("base", "warmstart", "round-000"):
        shutil.copytree(reference / part, run_dir / part)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, str(script), str(write_config(tmp_path, run_dir)), where, "1"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    kept = {p.name: p.stat().st_mtime_ns for p in (run_dir / where).glob("shard-*.parquet")}
    assert kept

    moved = tmp_path / "after"
    run_dir.rename(moved)
    r = CliRunner().invoke(app, ["iterate", "--config", str(write_config(tmp_path, moved)), "--no-report"])
    assert r.exit_code == 0, r.output
    assert {n: t for n, t in ((p.name, p.stat().st_mtime_ns) for p in (moved / where).glob("shard-*.parquet")) if n in kept} == kept
    assert inventory(moved) == inventory(reference)


# -- beyond one device: torchrun training, the engine hand-over, data-parallel generation ---------


def _distributed_config(tmp: Path, run_dir: Path, rounds: int = 2) -> Path:
    cfg = tmp / f"{run_dir.name}.yaml"
    text = MICRO.format(run_dir=run_dir).replace("rounds: 1", f"rounds: {rounds}")
    text = text.replace("train: {{loss: topr, optimizer: adamw, lr: 1.0e-3, batch_size: 16, save_every: 1}}".replace("{{", "{").replace("}}", "}"),
                        "train: {loss: topr, optimizer: adamw, lr: 1.0e-3, batch_size: 16, save_every: 1, nproc_per_node: 2}")
    assert "nproc_per_node: 2" in text
    cfg.write_text(text)
    return cfg


def _orphans(run_dir: Path) -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(run_dir) in cmd and p.pid != os.getpid():
            found.append(cmd)
    return found


def test_iterate_trains_under_torchrun_and_resumes_after_a_kill(reference, tmp_path):
    """train.nproc_per_node: 2 (gloo on CPU): every round trains on 2 ranks; SIGKILL of `topr iterate`
    mid-training takes its torchrun children with it, and the rerun resumes to completion."""
    import time

    run_dir = tmp_path / "dist"
    run_dir.mkdir()
    for part in ("base", "warmstart", "round-000"):
        shutil.copytree(reference / part, run_dir / part)
    cfg = _distributed_config(tmp_path, run_dir)
    cfg.write_text(cfg.read_text() + "tracking: {report_to: [tensorboard]}\n")  # the ranks' steps, reported by iterate
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "toprcli", "iterate", "--config", str(cfg), "--no-report"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = run_dir / "round-001" / "policy.partial" / "checkpoints" / "step-00000001"
    deadline = time.monotonic() + 300
    while not ckpt.is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ckpt.is_dir(), "training never checkpointed"
    proc.kill()
    proc.wait()
    time.sleep(2)
    assert not _orphans(run_dir), "the torchrun children outlived the killed iterate"
    assert not (run_dir / "round-001" / "policy").exists()

    r = CliRunner().invoke(app, ["iterate", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    for rnd in (1, 2):
        summary = json.loads((run_dir / f"round-{rnd:03d}" / "policy" / "train_summary.json").read_text())
        assert summary["world_size"] == 2 and summary["steps"] == 4
    assert json.loads((run_dir / "round-001" / "policy" / "train_summary.json").read_text())["resumed_from_step"] >= 1
    rows = json.loads(CliRunner().invoke(app, ["report", str(run_dir), "--json"]).stdout)
    assert [row["round"] for row in rows] == [0, 1, 2] and all(row.get("pass@1") is not None for row in rows)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses = [json.loads(line)["loss"] for rnd in (1, 2) for line in (run_dir / f"round-{rnd:03d}" / "policy" / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload().Scalars("train/loss")
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events] == list(enumerate(losses, start=1))  # run-wide steps, each once
    state = json.loads((run_dir / "state.json").read_text())
    assert "release_s" in state["steps"]["round-002/train"]  # the engine was closed before training ...
    assert "reacquire_s" in state["steps"]["round-002/eval"]  # ... and reopened for the next generation/eval


def test_engine_is_closed_before_training_and_reopened_after(reference, tmp_path, monkeypatch):
    """engine_handover: release on CPU: the hf engine is closed when training starts, reopened after."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline
    from toprcli.stages import train

    run_dir = tmp_path / "handover"
    run_dir.mkdir()
    for part in ("base", "warmstart", "round-000"):
        shutil.copytree(reference / part, run_dir / part)
    cfg = load_config(IterateConfig, write_config(tmp_path, run_dir), sets={"engine_handover": "release"})
    pipeline = Pipeline(cfg)
    seen = []
    real = train.run

    def spy(tcfg, **kw):
        seen.append(pipeline.engine.backend)
        return real(tcfg, **kw)

    monkeypatch.setattr(train, "run", spy)
    pipeline.run()
    assert seen == [None]  # closed while training
    state = json.loads((run_dir / "state.json").read_text())["steps"]
    assert state["round-001/train"]["release_s"] >= 0 and state["round-001/eval"]["reacquire_s"] > 0


def test_dpo_round_trains_on_curated_pairs(tmp_path):
    """`--loss dpo` per round like any loss: curate writes pairs; sampled at T = 0.3 (where the tiny model gets
    some right), the reference is a new unprocessed pass of the starting policy."""
    run_dir = tmp_path / "dpo"
    cfg = tmp_path / "dpo.yaml"  # a longer warm start and 8 samples a prompt, so that prompts have both outcomes
    cfg.write_text(MICRO.format(run_dir=run_dir).replace("examples: 64", "examples: 256").replace("n: 4", "n: 8"))
    r = CliRunner().invoke(app, ["iterate", "--config", str(cfg), "--set", "train.loss=dpo", "--set", "curate.pairs=matched",
                                 "--set", "generate.sampling.temperature=0.3",
                                 "--set", "train.loss_options.beta=0.2", "--no-report"])
    assert r.exit_code == 0, r.output
    curated = pq.read_table(run_dir / "round-001" / "train.parquet")
    assert curated.column("chosen").to_pylist() == [True, False] * (curated.num_rows // 2)
    manifest = json.loads((run_dir / "round-001" / "train.parquet.manifest.json").read_text())
    assert manifest["counts"]["pairs"] == curated.num_rows // 2 > 0
    summary = json.loads((run_dir / "round-001" / "policy" / "train_summary.json").read_text())
    assert summary["loss"] == "dpo" and summary["reference_logprobs"] == "recomputed" and summary["batch_units"] == "pairs"
    first = json.loads((run_dir / "round-001" / "policy" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["dpo_margin"] == pytest.approx(0.0, abs=1e-3)  # π_0 = the reference: margins start at 0
    rows = json.loads(CliRunner().invoke(app, ["report", str(run_dir), "--json"]).stdout)
    assert [r["round"] for r in rows] == [0, 1] and rows[1]["pass@1"] is not None


def test_dpo_without_pairs_is_refused_at_config_load(reference, tmp_path):
    r = CliRunner().invoke(app, ["iterate", "--config", str(reference.parent / "reference.yaml"), "--run-dir", str(tmp_path / "x"),
                                 "--set", "train.loss=dpo"])
    assert r.exit_code != 0 and "curate.pairs=matched" in r.output
    assert not (tmp_path / "x").exists()


def test_a_round_recorded_with_other_engine_settings_gets_an_engine_with_them(tiny_model_dir):
    """A round started before a change keeps its recorded config, its engine settings included: the run's engine
    is reopened with them (it served the current config's) instead of generating the round with others."""
    from toprcli.config import EngineConfig
    from toprcli.pipeline import EngineHolder

    current, recorded = EngineConfig(backend="hf", batch_size=8), EngineConfig(backend="hf", batch_size=4)
    holder = EngineHolder(current, seed=0)
    try:
        first = holder.get(str(tiny_model_dir))
        assert holder.get(str(tiny_model_dir), current) is first  # the same settings: the same engine
        second = holder.get(str(tiny_model_dir), recorded)
        assert second is not first and second.options.batch_size == 4 and holder.engine == recorded
        assert "reacquire_s" not in holder.handover_s  # another engine, not a hand-over
    finally:
        holder.close()


def test_an_eval_with_its_own_engine_settings_does_not_run_beside_the_runs_engine(tiny_model_dir, tmp_path, monkeypatch):
    """With engine_handover keep and eval.engine unlike generate's, eval opened a second engine while the run's stayed
    loaded: two models' weights and caches on one GPU. The run's gives its memory back first."""
    from toprcli.config import EngineConfig, EvalConfig, GenerateConfig, IterateConfig
    from toprcli.pipeline import Pipeline

    cfg = IterateConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir), engine_handover="keep",
                        generate=GenerateConfig(engine=EngineConfig(backend="hf", batch_size=8)),
                        eval=EvalConfig(engine=EngineConfig(backend="hf", batch_size=4)))
    pipeline = Pipeline(cfg)
    seen = []
    monkeypatch.setattr("toprcli.pipeline.run_eval", lambda ecfg, backend, progress: seen.append((backend, pipeline.engine.backend)))
    pipeline.engine.get(str(tiny_model_dir))
    try:
        pipeline._eval(0)
        assert seen == [(None, None)]  # the stage opens its own; the run's is closed (hf cannot sleep; vLLM on a GPU sleeps)
        pipeline.cfg = IterateConfig(**{**cfg.__dict__, "eval": EvalConfig(engine=cfg.generate.engine)})
        pipeline._round_cfgs.clear()
        pipeline._eval(0)  # the same settings: the run's engine serves eval
        assert seen[1][0] is not None and seen[1][0] is seen[1][1]
    finally:
        pipeline.engine.close()


def test_a_rounds_eval_with_verifier_auto_judges_its_own_dataset(tmp_path):
    """eval.verifier auto: on the rounds' task, as the rounds are scored (verifier, strict, sources); on another
    dataset, that dataset's verifier, as `topr eval` does — a MATH eval of a gsm8k-trained run was scored by gsm8k."""
    from toprcli.config import IterateConfig, from_dict
    from toprcli.pipeline import Pipeline

    same = from_dict(IterateConfig, {"run_dir": str(tmp_path / "a"), "generate": {"dataset": {"source": "builtin:gsm8k"}},
                                     "eval": {"dataset": {"source": "builtin:gsm8k"}}, "score": {"verifier": "gsm8k", "strict": True}})
    ecfg = Pipeline(same).eval_config(1, "policy")
    assert (ecfg.verifier, ecfg.strict, ecfg.out, ecfg.iteration) == ("gsm8k", True, str(tmp_path / "a" / "round-001" / "eval"), 1)
    other = from_dict(IterateConfig, {"run_dir": str(tmp_path / "b"), "generate": {"dataset": {"source": "builtin:gsm8k"}},
                                      "eval": {"dataset": {"source": "HuggingFaceH4/MATH-500", "preset": "math"}}})
    assert Pipeline(other).eval_config(1, "policy").verifier == "auto"  # resolved by the eval stage from its dataset: math


def test_partial_work_made_otherwise_gets_the_run_s_fix_not_the_command_s(tmp_path):
    """A run dir copied with `cp -r` (new file times) mid-train: the checkpoint's refusal said 'run without --resume',
    which iterate has no way to do; the run names what to remove, and how to copy a run."""
    from toprcli.config import IterateConfig
    from toprcli.errors import MadeOtherwise, UserError
    from toprcli.pipeline import Pipeline, Step

    cfg = IterateConfig(run_dir=str(tmp_path / "run"), model="m")
    partial = tmp_path / "run" / "round-001" / "policy.partial"

    def resume():
        raise MadeOtherwise(f"the checkpoint in {partial} was made with a different data — run without --resume to start over", partial)

    with pytest.raises(UserError) as e:
        Pipeline(cfg)._run_step(Step("round-001/train", lambda: False, resume))
    assert not isinstance(e.value, MadeOtherwise) and "--resume" not in str(e.value)
    assert f"round-001/train cannot resume it: remove {partial} to redo the step" in str(e.value) and "`cp -a`" in str(e.value)
