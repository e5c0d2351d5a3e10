"""The eval stage (stages/eval.py): what a rerun into an existing --out returns."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from toprcli.cli.main import app


def test_a_rerun_returns_the_eval_only_if_it_measured_the_same_thing(tiny_model_dir, tmp_path):
    """The same eval again is skipped, also with other workers or engines; another k (or model, dataset, sampling,
    verifier) is refused with what changed — it returned the old metrics as if they were the new ones."""
    out = tmp_path / "eval"
    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--split", "test", "--limit", "4", "--k", "2",
            "--max-new-tokens", "8", "--backend", "hf", "--no-greedy", "-o", str(out), "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    metrics = json.loads(first.output.strip().splitlines()[-1])["metrics"]
    again = CliRunner().invoke(app, [*args, "--workers", "1", "--batch-size", "2"])
    assert again.exit_code == 0 and json.loads(again.output.strip().splitlines()[-1])["metrics"] == metrics
    refused = CliRunner().invoke(app, [*args, "--k", "3", "--bootstrap-seed", "1"])
    assert refused.exit_code == 2 and "holds an eval made with other settings (changed: k)" in refused.output
    # Other bootstrap settings alone: the same samples, new intervals (it was refused, and the advice was to delete the eval).
    rebooted = CliRunner().invoke(app, [*args, "--bootstrap-seed", "1", "--bootstrap-resamples", "50"])
    assert rebooted.exit_code == 0, rebooted.output
    m = json.loads(rebooted.output.strip().splitlines()[-1])["metrics"]
    assert m["pass@1"] == metrics["pass@1"] and m["bootstrap"]["seed"] == 1 and m["bootstrap"]["resamples"] == 50
    assert json.loads((out / "eval.json").read_text())["metrics"]["bootstrap"]["seed"] == 1
    table = CliRunner().invoke(app, [a for a in args if a != "--json"])  # the table names what checked the samples (auto: its choice)
    assert table.exit_code == 0 and "checked by" in table.output and "gsm8k" in table.output.split("checked by")[1].splitlines()[0]


def test_auto_is_the_verifier_it_stands_for_and_verifier_settings_need_a_verifier(tiny_model_dir, tmp_path):
    """An eval scored with `exact` came back for `--verifier auto` (gsm8k here): auto was let through unresolved. And
    a verifier-only setting (`--verifier-samples`) made an eval without a verifier refuse its own result."""
    out = tmp_path / "eval"
    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--split", "test", "--limit", "4", "--k", "2",
            "--max-new-tokens", "8", "--backend", "hf", "--no-greedy", "-o", str(out), "--json"]
    assert CliRunner().invoke(app, [*args, "--verifier", "exact"]).exit_code == 0
    refused = CliRunner().invoke(app, [*args, "--verifier", "auto"])
    assert refused.exit_code == 2 and "(changed: verifier)" in refused.output
    kept = CliRunner().invoke(app, [*args, "--verifier", "exact", "--verifier-samples", "8", "--verifier-mode", "sampled"])
    assert kept.exit_code == 0, kept.output
    assert json.loads((out / "eval.json").read_text())["config"]["verifier"] == "exact"


def test_a_finished_auto_eval_needs_no_dataset_to_recompute_its_intervals(tiny_model_dir, tmp_path):
    """Resolving auto read the dataset again for a finished eval: one whose held-out file had moved could no longer
    take other bootstrap settings."""
    data = tmp_path / "held-out.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(3)))
    args = ["eval", "-m", str(tiny_model_dir), "-d", str(data), "--k", "2", "--max-new-tokens", "8", "--backend", "hf",
            "--no-greedy", "-o", str(tmp_path / "eval"), "--json"]
    assert CliRunner().invoke(app, args).exit_code == 0
    data.rename(tmp_path / "moved.jsonl")
    again = CliRunner().invoke(app, [*args, "--bootstrap-resamples", "50"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output.strip().splitlines()[-1])["metrics"]["bootstrap"]["resamples"] == 50


def test_eval_scores_verl_data_by_its_own_data_sources(tiny_model_dir, tmp_path):
    """verl rows name their verifier by data_source; eval takes --verifier-by-source as score does (it had no such
    option: every source outside the built-in map failed, after all the samples were generated)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "my_math", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "verl.parquet")
    args = ["eval", "-m", str(tiny_model_dir), "-d", str(tmp_path / "verl.parquet"), "--chat-template", "--k", "2",
            "--max-new-tokens", "4", "--backend", "hf", "--no-greedy", "-o", str(tmp_path / "e")]
    r = CliRunner().invoke(app, args)  # an unmapped source is refused before any sample is generated
    assert r.exit_code == 2 and "no verifier for data_source my_math" in r.output and not (tmp_path / "e" / "samples").exists()
    r = CliRunner().invoke(app, [*args, "--verifier-by-source", "my_math=math", "--json"])
    assert r.exit_code == 0, r.output
    done = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert done["config"]["verifier"] == "data_source" and done["config"]["verifier_by_source"]["my_math"] == "math"
    import pyarrow.compute as pc

    verdicts = pq.read_table(tmp_path / "e" / "scored").column("verdict")
    assert len(verdicts) == 6 and pc.sum(pc.equal(verdicts, "error")).as_py() in (0, None)


def test_checks_that_failed_are_reported_not_hidden_in_the_rates(tiny_model_dir, tmp_path):
    """Problems with no gold answer: their checks are errors, counted wrong. eval printed pass@1 and invalid rate with
    no word of it; now eval.json has error_rate (the greedy pass's too) and the table a warning naming where the
    examples are. With no gold at all nothing is measured: refused (it reported pass@1 0)."""
    rows = [{"question": f"{i}+1?", **({"answer": f"#### {i + 1}"} if i % 2 else {})} for i in range(4)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "-m", str(tiny_model_dir), "--k", "2", "--max-new-tokens", "4", "--backend", "hf", "--greedy"]
    r = CliRunner().invoke(app, [*args, "-d", str(tmp_path / "q.jsonl"), "-o", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "e" / "eval.json").read_text())["metrics"]
    assert m["error_rate"] == 0.5 and m["greedy_error_rate"] == 0.5  # the greedy pass's failed checks were not counted anywhere
    assert "50.0% of the samples could not be checked" in r.output and "50.0% of the greedy completions could not be checked" in r.output
    (tmp_path / "none.jsonl").write_text("".join(json.dumps({"question": r["question"]}) + "\n" for r in rows))
    with pytest.warns(UserWarning, match="has no answer column"):  # said at load, before anything is generated
        r = CliRunner().invoke(app, [*args, "-d", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "n")])
    assert r.exit_code == 2 and "every one of the 8 completions failed its check" in r.output and not (tmp_path / "n" / "eval.json").exists()


def test_a_verifier_that_extracts_no_answer_has_no_maj_at_k(tiny_model_dir, tmp_path):
    """A plugin that only judges gave maj@k 0.0000 [0.0000, 0.0000], which report and compare then paired as a
    measurement: nothing was voted on. pass@k has its interval now, and the share of completions cut at
    max_new_tokens is recorded."""
    (tmp_path / "plug.py").write_text("def judge(completion, answer, row):\n    return 1.0 if len(completion) % 2 else 0.0\n")
    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--split", "test", "--limit", "4", "--k", "2",
            "--max-new-tokens", "4", "--backend", "hf", "--no-greedy", "-o", str(tmp_path / "e"), "-v", f"python:{tmp_path / 'plug.py'}:judge"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    done = json.loads((tmp_path / "e" / "eval.json").read_text())
    m = done["metrics"]
    assert m["maj@k"] is None and m["maj@2"] is None and "maj@k" not in m["intervals"] and "maj@k" not in done["per_prompt"]
    assert "maj@2 is not measured" in r.output and 0 < m["pass@1"] < 1
    assert set(done["per_prompt"]["pass@k"]) == set(done["per_prompt"]["pass@1"]) and len(m["intervals"]["pass@k"]) == 2
    assert m["truncated_rate"] == 1.0  # 4 tokens: every completion stops at the limit
    gsm = CliRunner().invoke(app, [*args[:-2], "-o", str(tmp_path / "g"), "--json"])  # a verifier that extracts: maj@k as before
    assert gsm.exit_code == 0 and json.loads(gsm.output.strip().splitlines()[-1])["metrics"]["maj@k"] is not None


def test_a_model_retrained_at_the_same_path_is_not_reported_with_the_old_eval(tiny_model_dir, tmp_path):
    """Retraining -o work/policy and rerunning the README's eval printed the old metrics as if they were new."""
    import shutil

    model = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, model)
    args = ["eval", "-m", str(model), "-d", "builtin:arith", "--split", "test", "--limit", "2", "--k", "2", "--max-new-tokens", "4",
            "--backend", "hf", "--no-greedy", "-o", str(tmp_path / "e")]
    assert CliRunner().invoke(app, args).exit_code == 0
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "already evaluated (same model and settings)" in again.output
    CliRunner().invoke(app, ["init-model", str(tmp_path / "other"), "--seed", "7"])
    shutil.copy(tmp_path / "other" / "model.safetensors", model / "model.safetensors")  # retrained in place
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "as it was before it changed" in refused.output


def test_a_moved_eval_of_a_moved_model_is_still_its_eval(tiny_model_dir, tmp_path):
    """A project moved as a whole (mv keeps the files): the eval of the same model files is returned, not refused as
    'other settings (changed: model)' — while a model really changed at the new path is still refused."""
    import shutil

    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    shutil.copytree(tiny_model_dir, before / "policy", copy_function=shutil.copy2)

    def args(root):
        return ["eval", "-m", str(root / "policy"), "-d", "builtin:arith", "--split", "test", "--limit", "2", "--k", "2",
                "--max-new-tokens", "4", "--backend", "hf", "--no-greedy", "-o", str(root / "e")]

    assert CliRunner().invoke(app, args(before)).exit_code == 0
    before.rename(after)
    again = CliRunner().invoke(app, args(after))
    assert again.exit_code == 0 and "already evaluated (same model and settings)" in again.output, again.output
    CliRunner().invoke(app, ["init-model", str(tmp_path / "other"), "--seed", "7"])
    shutil.copy(tmp_path / "other" / "model.safetensors", after / "policy" / "model.safetensors")
    refused = CliRunner().invoke(app, args(after))
    assert refused.exit_code == 2 and "other settings (changed: model)" in refused.output


def test_a_killed_eval_rerun_with_another_verifier_is_told_what_to_delete(tiny_model_dir, tmp_path):
    """It was refused with '... or --overwrite to rescore', a flag eval does not have."""
    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--split", "test", "--limit", "2", "--k", "2", "--max-new-tokens", "4",
            "--backend", "hf", "--no-greedy", "-o", str(tmp_path / "e")]
    assert CliRunner().invoke(app, args).exit_code == 0
    (tmp_path / "e" / "eval.json").unlink()  # killed before the result was written
    r = CliRunner().invoke(app, [*args, "--strict"])
    assert r.exit_code == 2 and "scored was scored with other verifier settings by an interrupted eval — delete it" in r.output
    import shutil

    shutil.rmtree(tmp_path / "e" / "scored")
    assert CliRunner().invoke(app, [*args, "--strict"]).exit_code == 0
    from toprcli.shards import complete_shards, read_file_metadata

    assert all(read_file_metadata(p)["score"]["settings"]["strict"] is True for p in complete_shards(tmp_path / "e" / "scored").values())


def test_more_samples_than_k_lower_the_variance_of_pass_at_k(tiny_model_dir, tmp_path):
    """n samples per prompt, n > k: pass@1 and pass@k (Chen et al.'s unbiased estimator) over all n, maj@k over the
    first k — an eval could only draw k."""
    from toprcli.evaluation import pass_at_k
    from toprcli.shards import read_table

    args = ["eval", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--split", "test", "--limit", "3", "--k", "2", "--n", "6",
            "--max-new-tokens", "4", "--backend", "hf", "--no-greedy", "-o", str(tmp_path / "e"), "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    m = json.loads(r.output.strip().splitlines()[-1])["metrics"]
    t = read_table(tmp_path / "e" / "scored", columns=["prompt_id", "correct"])
    by: dict[str, list[bool]] = {}
    for pid, ok in zip(t.column("prompt_id").to_pylist(), t.column("correct").to_pylist()):
        by.setdefault(pid, []).append(ok)
    assert m["samples"] == 18 and {len(v) for v in by.values()} == {6}
    assert m["pass@k"] == pytest.approx(sum(pass_at_k(6, sum(v), 2) for v in by.values()) / 3)
    assert m["pass@1"] == pytest.approx(sum(sum(v) / 6 for v in by.values()) / 3)
    refused = CliRunner().invoke(app, [*args[:-3], "--n", "1", "-o", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "eval n 1 is below k 2" in refused.output
