"""The generate stage on the tiny model (hf backend): shards, resume, bad input.

The backends themselves are tested in tests/generation/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conftest import tiny_generate_config as _cfg
from conftest import REPO
from toprcli.errors import UserError
from toprcli.shards import complete_shards, read_file_metadata, read_manifest, read_table, validate_columns


# -- the stage ----------------------------------------------------------------


def test_stage_writes_contract_shards_and_resumes(tiny_model_dir, tmp_path):
    from toprcli.stages.generate import run as generate_samples

    out = tmp_path / "samples"
    cfg = _cfg(tiny_model_dir, out)
    s = generate_samples(cfg)
    assert s["prompts"] == 10 and s["completions"] == 30 and s["shards_written"] == 3
    assert sum(s["finish_reasons"].values()) == 30
    shards = complete_shards(out)
    assert list(shards) == [0, 1, 2]
    table = read_table(out)
    validate_columns(table, "samples", out)
    rows = table.to_pylist()
    assert len(rows) == 30
    by_prompt: dict[str, list[int]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_id"], []).append(r["sample_index"])
        assert len(r["completion_token_ids"]) == len(r["behavior_logprobs"])
        assert all(x <= 0 for x in r["behavior_logprobs"])
        assert r["prompt_token_ids"][0] == 1  # bos, token-in as encoded
        assert r["policy"] == str(tiny_model_dir) and r["iteration"] == 0
        assert r["answer"] is not None
    assert all(sorted(v) == [0, 1, 2] for v in by_prompt.values()) and len(by_prompt) == 10
    meta = read_file_metadata(shards[0])
    gen = meta["generation"]
    assert gen["backend"] == "hf" and gen["sampling"]["temperature"] == 1.0 and gen["sampling"]["max_new_tokens"] == 24
    assert meta["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_new_tokens": 24, "seed": 0}
    assert gen["engine_version"] and gen["logprob_mode"]
    manifest = read_manifest(out)
    assert manifest["stage"] == "generate"
    assert manifest["counts"]["completions"] == 30 and manifest["counts"]["shards"] == 3
    assert manifest["config"]["n"] == 3 and manifest["engine"]["backend"] == "hf" and manifest["sampling"]["max_new_tokens"] == 24
    assert manifest["wall_time_s"] > 0 and "transformers" in manifest["versions"]

    # A rerun skips every complete shard and rewrites nothing.
    mtimes = {p.name: p.stat().st_mtime_ns for p in shards.values()}
    s2 = generate_samples(cfg)
    assert s2["shards_skipped"] == 3 and s2["shards_written"] == 0
    assert (s2["prompts"], s2["completions"]) == (10, 30)  # the output's counts (a rerun said 0 prompts, 0 completions)
    assert {p.name: p.stat().st_mtime_ns for p in complete_shards(out).values()} == mtimes

    # Other settings into the same directory: refused, nothing mixed.
    with pytest.raises(UserError, match="other settings"):
        generate_samples(_cfg(tiny_model_dir, out, temperature=0.7))


def test_shards_keyed_by_the_models_path_still_resume(tiny_model_dir, tmp_path):
    """Shards written before the run key held a model by its files (it held the path) resume, and are not refused."""
    import pyarrow.parquet as pq

    from toprcli.shards import write_shard
    from toprcli.stages.generate import run as generate_samples

    out = tmp_path / "samples"
    cfg = _cfg(tiny_model_dir, out)
    generate_samples(cfg)
    for index, path in complete_shards(out).items():
        meta = read_file_metadata(path)
        meta["run_key"]["model"] = str(tiny_model_dir)
        write_shard(out, index, pq.read_table(path), metadata=meta)
    complete_shards(out)[2].unlink()
    (out / "_manifest.json").unlink()
    s = generate_samples(cfg)
    assert (s["shards_skipped"], s["shards_written"]) == (2, 1)


def test_stage_is_reproducible_and_data_parallel_split_matches(tiny_model_dir, tmp_path):
    from toprcli.stages.generate import run as generate_samples

    generate_samples(_cfg(tiny_model_dir, tmp_path / "one"))
    # Two "processes" (shard ranges 0 of 2 and 1 of 2) into one directory.
    both = tmp_path / "two"
    s0 = generate_samples(_cfg(tiny_model_dir, both, shard_index=0, num_shards=2))
    assert s0["shards_written"] == 2 and read_manifest(both) is None  # shard 1 still missing
    s1 = generate_samples(_cfg(tiny_model_dir, both, shard_index=1, num_shards=2))
    assert s1["shards_written"] == 1
    assert read_manifest(both)["counts"]["completions"] == 30
    assert sorted(p.name for p in both.glob("_manifest.part-*")) == [
        "_manifest.part-000-of-002.json", "_manifest.part-001-of-002.json"]
    cols = ["prompt_id", "sample_index", "completion_token_ids", "behavior_logprobs"]
    assert read_table(tmp_path / "one", cols).to_pylist() == read_table(both, cols).to_pylist()


def test_stage_accepts_examples_and_an_open_backend(hf_backend, tiny_model_dir, tmp_path):
    from toprcli.data.datasets import Example
    from toprcli.stages.generate import run as generate_samples

    examples = [Example(prompt_id=f"p{i}", question=f"What is {i} + 1?", answer=str(i + 1)) for i in range(3)]
    cfg = _cfg(tiny_model_dir, tmp_path / "s", n=2, limit=None)
    s = generate_samples(cfg, backend=hf_backend, examples=examples)
    assert s["prompts"] == 3 and s["completions"] == 6
    assert hf_backend.net is not None  # not closed: the caller owns it
    assert sorted(set(read_table(tmp_path / "s", ["prompt_id"]).column(0).to_pylist())) == ["p0", "p1", "p2"]


# -- the CLI: bad input ---------------------------------------------------------


def _cli(args):
    from toprcli.cli.main import app

    return CliRunner().invoke(app, ["generate", *args])


def _error_line(result) -> str:
    text = (result.stderr if hasattr(result, "stderr") else result.output).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got: {text!r}"
    assert lines[0].startswith("error:")
    return lines[0]


@pytest.fixture
def bad_input(tiny_model_dir, tmp_path):
    def run(extra, model=None):
        out = tmp_path / "out"
        args = ["--model", str(model or tiny_model_dir), "--dataset", "builtin:arith", "--out", str(out),
                "--backend", "hf", "--limit", "4", "--max-new-tokens", "8", *extra]
        result = _cli(args)
        assert result.exit_code == 2, result.output
        assert not complete_shards(out), "no shard may be written on bad input"
        return _error_line(result)

    return run


def test_cli_missing_model_dir(bad_input, tmp_path):
    line = bad_input([], model=tmp_path / "no-such-model")
    assert "model dir not found" in line


def test_cli_unknown_dataset(bad_input):
    line = bad_input(["--dataset", "builtin:nope"])
    assert "unknown built-in dataset" in line


def test_cli_empty_dataset(bad_input, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = bad_input(["--dataset", str(empty)])
    assert "empty" in line or "no examples" in line


def test_cli_n_below_one_and_unknown_backend(bad_input):
    assert "'n'" in bad_input(["--n", "0"])
    assert "backend" in bad_input(["--backend", "tensorrt"])


def test_cli_prompts_longer_than_context(tiny_model_dir, tmp_path, bad_input):
    data = tmp_path / "mixed.jsonl"
    rows = [{"question": "1 + 1?", "answer": "2"}, {"question": "x" * 600, "answer": "0"}, {"question": "2 + 2?", "answer": "4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = bad_input(["--dataset", str(data)])
    assert "1 of 3 prompts" in line and "--skip-long" in line and "tokens" in line

    out = tmp_path / "ok"
    result = _cli(["--model", str(tiny_model_dir), "--dataset", str(data), "--out", str(out), "--backend", "hf",
                   "--n", "2", "--max-new-tokens", "8", "--skip-long", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["skipped_long"] == 1 and summary["prompts"] == 2 and summary["completions"] == 4
    assert read_manifest(out)["skipped_long"] == 1


def test_an_engine_with_a_shorter_context_than_the_config_is_refused_before_a_shard(tiny_model_dir, tmp_path, monkeypatch):
    """vLLM may derive a context below the config's (RoPE scaling, the tokenizer's limit): prompts planned against the
    config's 512 tokens once reached an engine of 16 and failed there, mid-run."""
    import toprcli.stages.generate as stage

    real = stage.open_backend

    def short_context(*args, **kwargs):
        backend = real(*args, **kwargs)
        backend.max_model_len = 16  # what the engine says it takes
        return backend

    monkeypatch.setattr(stage, "open_backend", short_context)
    with pytest.raises(UserError, match="the engine's context is 16 tokens \\(the config's 512\\).*--max-model-len 16"):
        stage.run(_cfg(tiny_model_dir, tmp_path / "out"))
    assert not complete_shards(tmp_path / "out")
    # A config that declares no context: the prompts were checked against nothing, and failed in the engine mid-run.
    monkeypatch.setattr(stage, "context_length", lambda *a, **k: None)
    with pytest.raises(UserError, match="the engine's context is 16 tokens \\(the config declares none\\)"):
        stage.run(_cfg(tiny_model_dir, tmp_path / "out2"))
    assert not complete_shards(tmp_path / "out2")


def test_cli_summary_table(tiny_model_dir, tmp_path):
    result = _cli(["--model", str(tiny_model_dir), "--dataset", "builtin:arith", "--out", str(tmp_path / "o"),
                   "--backend", "hf", "--limit", "3", "--n", "2", "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    for word in ("prompts", "completions", "mean completion length", "finish reasons", "tokens/s"):
        assert word in result.stdout


# -- kill and resume ------------------------------------------------------------


def test_sigkill_mid_run_then_rerun_has_exactly_n_per_prompt(tiny_model_dir, tmp_path):
    """SIGKILL the CLI once a shard exists, rerun: every prompt has exactly n rows, and they
    equal an uninterrupted run's (per-shard seeds make the resumed shards the same)."""
    out = tmp_path / "killed"
    n, limit = 4, 24
    args = [sys.executable, "-m", "toprcli", "generate", "--model", str(tiny_model_dir), "--dataset", "builtin:arith",
            "--backend", "hf", "--n", str(n), "--limit", str(limit), "--shard-size", "2", "--max-new-tokens", "48",
            "--batch-size", "1", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*args, "--out", str(out)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not complete_shards(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = len(complete_shards(out))
    assert 1 <= done_at_kill < limit // 2, f"kill landed after {done_at_kill} shards"
    assert read_manifest(out) is None

    rerun = subprocess.run([*args, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert summary["shards_skipped"] == done_at_kill
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    table = read_table(out, ["prompt_id", "sample_index", "completion_token_ids"])
    pairs = list(zip(table.column("prompt_id").to_pylist(), table.column("sample_index").to_pylist()))
    assert len(pairs) == len(set(pairs)) == n * limit
    counts: dict[str, int] = {}
    for pid, _ in pairs:
        counts[pid] = counts.get(pid, 0) + 1
    assert len(counts) == limit and set(counts.values()) == {n}

    clean = tmp_path / "clean"
    subprocess.run([*args, "--out", str(clean)], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    assert read_table(clean, ["prompt_id", "sample_index", "completion_token_ids"]).to_pylist() == table.to_pylist()
    assert read_manifest(out)["counts"]["completions"] == n * limit
    assert pq.read_metadata(complete_shards(out)[0]).num_rows == 2 * n


def test_a_resume_with_another_precision_is_refused_and_a_regeneration_drops_the_old_manifest(tiny_model_dir, tmp_path, monkeypatch):
    """A killed generate resumed with --dtype bfloat16 mixed shards of two precisions; and while shards were added
    to a finished directory its old _manifest.json still said 'finished', so score took the partial set."""
    from toprcli.stages import generate as stage

    out = tmp_path / "samples"
    stage.run(_cfg(tiny_model_dir, out))
    complete_shards(out)[2].unlink()
    with pytest.raises(UserError, match=r"other settings \(dtype='float32' there vs 'bfloat16' now\)"):
        stage.run(_cfg(tiny_model_dir, out, dtype="bfloat16"))

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(stage, "_run_shards", killed)
    with pytest.raises(KeyboardInterrupt):
        stage.run(_cfg(tiny_model_dir, out))
    assert read_manifest(out) is None


def test_a_rerun_with_nothing_to_do_keeps_the_record_and_another_stages_output_is_no_samples(tiny_model_dir, tmp_path):
    """A no-op rerun with --batch-size 7 rewrote _manifest.json: the engine record erased, batch_size 7 recorded for shards
    drawn with 64. And generate took score's output dir (its shards keep the samples' run key) as its own samples."""
    from dataclasses import replace

    from toprcli.config import ScoreConfig
    from toprcli.stages.generate import run as generate_samples
    from toprcli.stages.score import run as score

    out = tmp_path / "samples"
    cfg = _cfg(tiny_model_dir, out)
    generate_samples(cfg)
    first = read_manifest(out)
    again = generate_samples(replace(cfg, engine=replace(cfg.engine, batch_size=7)))
    assert again.skipped and read_manifest(out) == first and first["engine"]["batch_size"] == 64
    score(ScoreConfig(samples=str(out), out=str(tmp_path / "scored"), verifier="gsm8k", workers=1))
    with pytest.raises(UserError, match="holds the output of `topr score`, not samples"):
        generate_samples(replace(cfg, out=str(tmp_path / "scored")))


def test_a_dataset_edited_in_place_is_not_resumed_into(tiny_model_dir, tmp_path):
    """Ids hash the question only: a file whose answers changed resumed into its old shards, old and new golds mixed."""
    from dataclasses import replace

    from toprcli.config import DatasetSpec
    from toprcli.stages.generate import run as generate_samples

    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = replace(_cfg(tiny_model_dir, tmp_path / "s", shard_size=2, n=1, max_new_tokens=4), dataset=DatasetSpec(source=str(data)))
    generate_samples(cfg)
    (tmp_path / "s" / "_manifest.json").unlink()
    sorted((tmp_path / "s").glob("shard-*.parquet"))[1].unlink()  # killed before its second shard
    data.write_text("".join(json.dumps({**r, "answer": str(int(r["answer"]) + 100)}) + "\n" for r in rows))
    with pytest.raises(UserError, match="shard-00000.parquet in .* holds other prompts than this run would put there"):
        generate_samples(cfg)


def test_what_the_engines_context_clips_is_recorded(tiny_model_dir, tmp_path, monkeypatch):
    """--clip-to-context with an engine context below the config's cut every completion, and the summary and manifest
    said nothing was clipped."""
    import toprcli.stages.generate as stage

    real = stage.open_backend

    def short_context(*args, **kwargs):
        backend = real(*args, **kwargs)
        backend.max_model_len = 40
        return backend

    monkeypatch.setattr(stage, "open_backend", short_context)
    s = stage.run(_cfg(tiny_model_dir, tmp_path / "out", max_new_tokens=30, clip_to_context=True))
    assert s["clipped_to_context"] and s["clipped_to_context"]["prompts_clipped"] > 0
    assert read_manifest(tmp_path / "out")["clipped_to_context"] == s["clipped_to_context"]


def test_parts_that_began_together_are_checked_before_the_manifest(tiny_model_dir, tmp_path):
    """Two data-parallel parts planned before either wrote (srun on unlike nodes) with other dtypes: the finished
    directory was certified with mixed precisions."""
    import time as clock
    from dataclasses import replace

    import toprcli.stages.generate as stage

    base = _cfg(tiny_model_dir, tmp_path / "dp", n=1, max_new_tokens=4, limit=4, shard_size=2, num_shards=2)
    a = base
    b = replace(base, shard_index=1, engine=replace(base.engine, dtype="bfloat16"))
    plan_a, plan_b = stage._plan(a, None, None), stage._plan(b, None, None)
    stage._write(a, plan_a, None, None, clock.perf_counter())
    with pytest.raises(UserError, match="dtype='float32' there vs 'bfloat16' now"):
        stage._write(b, plan_b, None, None, clock.perf_counter())
    assert read_manifest(tmp_path / "dp") is None


def test_the_summary_says_how_the_dataset_was_read(tiny_model_dir, tmp_path):
    """Which format a file was taken for (and so whether an instruction went around its prompts) could only be seen by
    reading the samples' prompt column."""
    from toprcli.cli.main import app

    (tmp_path / "trl.jsonl").write_text(json.dumps({"prompt": "Compute 1+5.", "solution": "6"}) + "\n")
    r = CliRunner().invoke(app, ["generate", "-m", str(tiny_model_dir), "-d", str(tmp_path / "trl.jsonl"), "-o", str(tmp_path / "s"), "--n", "1",
                                 "--max-new-tokens", "2", "--backend", "hf", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["dataset_preset"] == "gsm8k, prompts as written"  # a number as the gold
    assert read_table(tmp_path / "s").column("prompt").to_pylist() == ["Compute 1+5."]
    table = CliRunner().invoke(app, ["generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "-o", str(tmp_path / "a"), "--n", "1",
                                     "--limit", "1", "--max-new-tokens", "2", "--backend", "hf"])
    assert table.exit_code == 0 and "dataset read as" in table.output and "arith" in table.output.split("dataset read as")[1].splitlines()[0]
