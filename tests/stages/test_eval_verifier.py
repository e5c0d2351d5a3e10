"""The eval stage with a generative verifier: p-yes and sampled verdicts, judged candidates, metrics by hand."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from toprcli.cli.main import app
from toprcli.config import DatasetSpec, EngineConfig, EvalConfig, SamplingConfig
from toprcli.evaluation import verifier_metrics
from toprcli.stages.eval import run
from toprcli.verifiers.voting import vote_keys


def eval_config(model, out, **kw) -> EvalConfig:
    base = dict(
        model=str(model), out=str(out), k=3, greedy=False, workers=1,
        dataset=DatasetSpec(source="builtin:arith", split="test", level=1, size=6),
        sampling=SamplingConfig(max_new_tokens=16, seed=1), engine=EngineConfig(backend="hf"),
    )
    base.update(kw)
    return EvalConfig(**base)


def test_p_yes_judges_the_k_samples_and_the_measures_follow_from_the_scores(tiny_model_dir, hf_backend, tmp_path):
    out = tmp_path / "eval"
    res = run(eval_config(tiny_model_dir, out, verifier_model=str(tiny_model_dir)), backend=hf_backend)
    m = res["metrics"]
    for key in ("pass@1", "maj@k", "best_of_k_verifier", "weighted_maj@k", "verifier_accuracy", "verifier_invalid_rate", "verifier_auc"):
        assert key in m, key
    assert m["verifier_mode"] == "p-yes" and m["candidates"] == 18 and m["candidates_maj@k"] == m["maj@k"]

    verified = pq.read_table(out / "verified")
    scores, valid = verified.column("verifier_score").to_numpy(), verified.column("verifier_valid").to_numpy()
    assert verified.num_rows == 18 and np.all((scores >= 0) & (scores <= 1)) and np.all((valid > 0) & (valid <= 1))
    assert verified.schema.field("verifier_score").type == pa.float64()  # float32 tied confident candidates (1 − 1e-8, 1 − 1e-9)
    assert m["verifier_invalid_rate"] == pytest.approx(1 - valid.astype(np.float64).mean())
    pids, correct = verified.column("prompt_id").to_pylist(), verified.column("correct").to_pylist()
    keys = vote_keys("gsm8k", pids, verified.column("extracted_answer").to_pylist(), correct, 3)
    expect = verifier_metrics(pids, correct, keys, scores.astype(np.float64), 3)
    assert m["best_of_k_verifier"] == pytest.approx(expect["best_of_3_verifier"])
    assert m["weighted_maj@k"] == pytest.approx(expect["weighted_maj@3"])
    auc = expect["verifier_auc"]
    assert m["verifier_auc"] == (None if auc != auc else pytest.approx(auc))  # no AUC when every candidate is wrong
    # The paper's Table 2 numbers have their 95% intervals over problems too, from per-problem scores kept in eval.json.
    per_prompt = res["per_prompt"]
    for key in ("best_of_k_verifier", "weighted_maj@k", "candidates_maj@k"):
        assert len(m["intervals"][key]) == 2 and set(per_prompt[key]) == set(pids)
        assert np.mean(list(per_prompt[key].values())) == pytest.approx(m[key])

    again = run(eval_config(tiny_model_dir, out, verifier_model=str(tiny_model_dir)))
    assert again.skipped and again["metrics"]["best_of_k_verifier"] == m["best_of_k_verifier"]


def test_sampled_verdicts_go_through_generate_and_the_judge_verifier(tiny_model_dir, hf_backend, tmp_path):
    out = tmp_path / "eval"
    cfg = eval_config(tiny_model_dir, out, verifier_model=str(tiny_model_dir), verifier_mode="sampled", verifier_samples=2,
                      verifier_max_new_tokens=4)
    m = run(cfg, backend=hf_backend)["metrics"]
    samples = pq.read_table(out / "judge" / "samples")
    assert samples.num_rows == 18 * 2  # two verdicts per candidate
    scored = pq.read_table(out / "judge" / "scored")
    assert set(scored.column("verdict").to_pylist()) <= {"correct", "incorrect", "no_answer"}
    valid = pq.read_table(out / "verified").column("verifier_valid").to_numpy()
    assert set(np.round(valid * 2).astype(int).tolist()) <= {0, 1, 2}
    # A random character model almost never ends with a Yes/No line: nearly every verdict is invalid.
    assert m["verifier_invalid_rate"] == pytest.approx(1 - valid.astype(np.float64).mean()) and m["verifier_invalid_rate"] > 0.5


def test_a_verifier_of_another_architecture_gets_its_own_engine(tiny_model_dir, hf_backend, tmp_path):
    """Sampled verdicts of a verifier unlike the policy: rendered, tokenised and decoded with the verifier's own
    engine and tokenizer. The policy's engine was swapped to it and kept the policy's tokenizer and context."""
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model

    verifier = build_tiny_model(tmp_path / "small", seed=3, **TINY_PRESETS["small"])
    cfg = eval_config(tiny_model_dir, tmp_path / "eval", verifier_model=str(verifier), verifier_mode="sampled", verifier_samples=1,
                      verifier_max_new_tokens=4)
    try:
        run(cfg, backend=hf_backend)
        assert str(hf_backend.model) == str(tiny_model_dir)  # the policy's engine still serves the policy
        assert pq.read_table(tmp_path / "eval" / "judge" / "samples").num_rows == 18
    finally:
        if str(hf_backend.model) != str(tiny_model_dir):
            hf_backend.load_weights(str(tiny_model_dir))


def test_candidates_are_judged_by_the_evaluated_model(tiny_model_dir, hf_backend, tmp_path):
    first = tmp_path / "generator-eval"
    run(eval_config(tiny_model_dir, first), backend=hf_backend)
    # 2 verdicts per prompt here; the candidates have 3 samples per problem: best-of-3 and maj@3 over all of them
    # (the eval's own k once cut them to the first 2).
    cfg = eval_config(tiny_model_dir, tmp_path / "verifier-eval", candidates=str(first / "scored"), k=2)
    m = run(cfg, backend=hf_backend)["metrics"]
    assert m["verifier_model"] == str(tiny_model_dir) and m["candidates"] == 18 and m["candidates_k"] == 3
    assert m["candidates_maj@k"] == m["candidates_maj@3"] == json.loads((first / "eval.json").read_text())["metrics"]["maj@k"]


def test_verifier_model_and_candidates_are_exclusive_and_the_cli_prints_the_measures(tiny_model_dir, tmp_path):
    base = ["eval", "--model", str(tiny_model_dir), "--dataset", "builtin:arith", "--split", "test", "--limit", "2",
            "--k", "2", "--max-new-tokens", "8", "--backend", "hf", "--no-greedy"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "x"), "--verifier-model", str(tiny_model_dir), "--candidates", str(tmp_path)])
    assert r.exit_code == 2 and "choose one" in r.output and len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "e"), "--verifier-model", str(tiny_model_dir)])
    assert r.exit_code == 0, r.output
    assert "best-of-2 by verifier" in r.output and "verifier-weighted maj@2" in r.output and "verifier AUC" in r.output
    assert "best_of_k_verifier" in json.loads((tmp_path / "e" / "eval.json").read_text())["metrics"]


def test_a_verifier_that_is_not_a_model_is_one_line(tiny_model_dir, tmp_path):
    r = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--dataset", "builtin:arith", "--split", "test", "--limit", "2",
                                 "--k", "2", "--max-new-tokens", "8", "--backend", "hf", "--no-greedy", "--out", str(tmp_path / "e"),
                                 "--verifier-model", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "missing" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()  # refused before anything was generated


def test_a_killed_eval_rerun_with_another_verifier_does_not_report_the_old_judgement(tiny_model_dir, hf_backend, tmp_path):
    """verified/ was reused whatever judged it: a kill after judging (before eval.json), then a rerun with another
    --verifier-model, reported the first verifier's best-of-k under the second one's name."""
    import shutil

    from toprcli.errors import UserError
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=3, **TINY_PRESETS["small"])  # other files (sizes), whenever it was built
    out = tmp_path / "eval"
    run(eval_config(tiny_model_dir, out, verifier_model=str(tiny_model_dir)), backend=hf_backend)
    (out / "eval.json").unlink()  # killed after the judgement was written
    with pytest.raises(UserError, match=r"verified holds a judgement made with other settings \(changed: verifier_files\)"):
        run(eval_config(tiny_model_dir, out, verifier_model=str(other)), backend=hf_backend)
    shutil.rmtree(out / "verified")  # as the message says: judged again, by the other model
    res = run(eval_config(tiny_model_dir, out, verifier_model=str(other)), backend=hf_backend)
    assert res["metrics"]["verifier_model"] == str(other)
    assert pq.read_metadata(out / "verified" / "shard-00000.parquet").metadata is not None


def test_a_verifier_with_another_tokenizer_gets_its_own_engine(tiny_model_dir, hf_backend, tmp_path):
    """Same architecture, another chat template: the sampled verdicts were rendered with the policy's (the shared
    engine's) tokenizer while the `policy` column named the verifier."""
    import shutil

    verifier = tmp_path / "tinyv"
    shutil.copytree(tiny_model_dir, verifier)
    (verifier / "chat_template.jinja").write_text("{% for m in messages %}VERIFY: {{ m['content'] }}{% endfor %}\nVerdict:")
    cfg = eval_config(tiny_model_dir, tmp_path / "eval", verifier_model=str(verifier), verifier_mode="sampled", verifier_samples=1,
                      verifier_max_new_tokens=4, verifier_chat_template=True)
    run(cfg, backend=hf_backend)
    assert str(hf_backend.model) == str(tiny_model_dir)  # not swapped: the verifier had an engine of its own
    prompts = pq.read_table(tmp_path / "eval" / "judge" / "samples").column("prompt").to_pylist()
    assert prompts and all(p.startswith("VERIFY: ") for p in prompts)


def test_verification_prompts_past_the_verifiers_context_are_refused(tiny_model_dir, hf_backend, tmp_path):
    """P(Yes) read positions past the verifier's context with transformers (and vLLM raised a traceback)."""
    from toprcli.errors import UserError

    questions = [{"question": "What is " + " + ".join(["1"] * 120) + "?", "answer": "120"}]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    cfg = eval_config(tiny_model_dir, tmp_path / "eval", verifier_model=str(tiny_model_dir), k=2,
                      dataset=DatasetSpec(source=str(tmp_path / "long.jsonl"), preset="none"), sampling=SamplingConfig(max_new_tokens=8, seed=1))
    with pytest.raises(UserError, match=r"2 of 2 verification prompts do not fit the verifier's context of 512 tokens"):
        run(cfg, backend=hf_backend)


def test_the_verifier_groups_votes_as_maj_at_k_does_under_data_source():
    """--verifier data_source on MATH rows: maj@k voted \\frac{1}{2} with 0.5 (math), the verifier's candidates_maj@k
    by their text (the literal data_source spec has no equivalence)."""
    from toprcli.verifiers.voting import voting_verifier

    assert voting_verifier("data_source", ["lighteval/MATH", "lighteval/MATH"], {"lighteval/MATH": "math"}) == "math"
    assert voting_verifier("data_source", ["a", "b"], {"a": "math", "b": "gsm8k"}) == "data_source"
    assert voting_verifier("gsm8k", [], {}) == "gsm8k"


def test_a_finished_eval_is_not_reported_after_its_verifier_changed(tiny_model_dir, hf_backend, tmp_path):
    """The verifier's files were compared only when an eval resumed: a finished eval judged by the verifier as it was
    came back, as the judgement of the verifier retrained at the same path."""
    import os
    import shutil

    from toprcli.errors import UserError

    verifier = tmp_path / "verifier"
    shutil.copytree(tiny_model_dir, verifier)
    out = tmp_path / "eval"
    first = run(eval_config(tiny_model_dir, out, verifier_model=str(verifier)), backend=hf_backend)
    assert run(eval_config(tiny_model_dir, out, verifier_model=str(verifier))).skipped  # unchanged: reused
    weights = verifier / "model.safetensors"
    os.utime(weights, (weights.stat().st_atime, weights.stat().st_mtime + 100))  # retrained in place
    with pytest.raises(UserError, match=r"verified holds a judgement made with other settings \(changed: verifier_files\).*eval\.json"):
        run(eval_config(tiny_model_dir, out, verifier_model=str(verifier)))
    for stale in (out / "verified", out / "eval.json"):  # as the message says: judged again, the samples kept
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    again = run(eval_config(tiny_model_dir, out, verifier_model=str(verifier)), backend=hf_backend)
    assert not again.skipped and again["metrics"]["pass@1"] == first["metrics"]["pass@1"]


def test_candidates_that_are_an_evals_verified_dir_are_judged_again(tiny_model_dir, hf_backend, tmp_path):
    """verified/ holds scored columns plus the first verifier's scores: judging it again appended the score columns
    twice (a KeyError traceback)."""
    from toprcli.shards import read_file_metadata

    first = tmp_path / "first"
    run(eval_config(tiny_model_dir, first, verifier_model=str(tiny_model_dir), verifier="math"), backend=hf_backend)
    m = run(eval_config(tiny_model_dir, tmp_path / "second", candidates=str(first / "verified")), backend=hf_backend)["metrics"]
    assert m["candidates"] == 18
    assert pq.read_table(tmp_path / "second" / "verified").column_names.count("verifier_score") == 1
    # Their answers vote as math grouped them (verified/ lost the score record: gsm8k's rules, the default, grouped them).
    for judged in (first, tmp_path / "second"):
        assert read_file_metadata(judged / "verified" / "shard-00000.parquet")["score"]["settings"]["verifier"] == "math"


def test_candidates_without_verdicts_are_refused_before_anything_is_generated(tiny_model_dir, hf_backend, tmp_path):
    """A samples dir as --candidates (no `correct`) was refused only after the whole eval had been generated."""
    from toprcli.errors import UserError

    first = tmp_path / "first"
    run(eval_config(tiny_model_dir, first), backend=hf_backend)
    with pytest.raises(UserError, match=r"have no 'correct', 'extracted_answer' column"):
        run(eval_config(tiny_model_dir, tmp_path / "second", candidates=str(first / "samples")), backend=hf_backend)
    assert not (tmp_path / "second").exists()
    (first / "scored" / "_manifest.json").unlink()  # a score killed part-way: its shards so far, no manifest
    with pytest.raises(UserError, match="has not finished"):  # it judged 720 of 1,200 candidates as a finished result
        run(eval_config(tiny_model_dir, tmp_path / "third", candidates=str(first / "scored")), backend=hf_backend)
    assert not (tmp_path / "third").exists()


def test_a_judged_eval_that_moved_with_its_verifier_is_still_its_eval(tiny_model_dir, hf_backend, tmp_path):
    """The verifier and candidates are compared by their files; their paths, which a move changes, were refused as
    "changed: verifier_model" with the advice to delete the whole eval."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "a" / "verifier")  # copy2: the files' times kept, as a move keeps them
    first = run(eval_config(tiny_model_dir, tmp_path / "a" / "eval", verifier_model=str(tmp_path / "a" / "verifier")), backend=hf_backend)
    shutil.move(tmp_path / "a", tmp_path / "b")
    again = run(eval_config(tiny_model_dir, tmp_path / "b" / "eval", verifier_model=str(tmp_path / "b" / "verifier")))
    assert again.skipped and again["metrics"]["best_of_k_verifier"] == first["metrics"]["best_of_k_verifier"]


def test_data_parallel_evals_refuse_bad_candidates_before_their_passes(tiny_model_dir, tmp_path):
    """With --data-parallel-size > 1 the passes are generated in child processes before the stage runs: its refusals
    came after them."""
    from toprcli.errors import UserError
    from toprcli.launch import run_eval

    with pytest.raises(UserError, match="no scored shards there"):
        run_eval(eval_config(tiny_model_dir, tmp_path / "eval", candidates=str(tmp_path), data_parallel_size=2))
    assert not (tmp_path / "eval").exists()
