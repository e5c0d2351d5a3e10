"""The score stage: shards in → scored shards out, resume, summary, bad input, CLI."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from builders import gsm8k_rows
from toprcli import shards
from toprcli.cli.main import app as topr_app
from toprcli.config import ScoreConfig
from toprcli.errors import UserError
from toprcli.stages.score import run as score


def score_dir(samples, out, cfg: ScoreConfig):
    """The score stage on ``samples`` into ``out`` with the other settings of ``cfg``."""
    return score(replace(cfg, samples=str(samples), out=str(out)))



def samples_table(items: list[tuple[str, str, str | None]], n: int = 1, iteration: int = 0) -> pa.Table:
    """items: (prompt_id, completion, answer); each repeated as n samples."""
    cols: dict[str, list] = {f.name: [] for f in shards.SAMPLES_SCHEMA}
    for pid, completion, answer in items:
        for k in range(n):
            cols["prompt_id"].append(pid)
            cols["prompt"].append(f"Q {pid}")
            cols["answer"].append(answer)
            cols["prompt_token_ids"].append([1, 2, 3])
            cols["sample_index"].append(k)
            cols["completion"].append(completion)
            cols["completion_token_ids"].append([4, 5])
            cols["behavior_logprobs"].append([-0.5, -0.25])
            cols["finish_reason"].append("stop")
            cols["policy"].append("tiny")
            cols["iteration"].append(iteration)
    t = pa.table(cols, schema=shards.SAMPLES_SCHEMA.with_metadata(None))
    return t.append_column("extra_col", pa.array(list(range(t.num_rows)), pa.int64()))


def write_samples(d: Path, tables: list[pa.Table]) -> Path:
    for i, t in enumerate(tables):
        shards.write_shard(d, i, t, metadata={"generation": {"temperature": 1.0}})
    shards.write_manifest(d, stage="generate", config={})  # finished, as `topr generate` leaves it
    return d


@pytest.fixture
def gsm_samples(tmp_path):
    rows = gsm8k_rows()[:40]
    items = []
    for i, r in enumerate(rows):
        # sample 0..3 per prompt: prompt i gets (i % 5) correct out of 4 (capped)
        for k in range(4):
            right = k < (i % 5)  # i % 5 == 4: all four
            items.append((f"p{i}", r["answer"] if right else "#### -123456", r["answer"]))
    return write_samples(tmp_path / "samples", [samples_table(items[:80]), samples_table(items[80:])])


def test_score_dir_writes_scored_shards_with_passthrough(gsm_samples, tmp_path):
    out = tmp_path / "scored"
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1, reward_no_answer=0.0))
    assert res["rows"] == 160 and res["prompts"] == 40 and res["shards_scored"] == 2 and res["shards_skipped"] == 0
    files = shards.complete_shards(out)
    assert list(files) == [0, 1]
    for i, path in files.items():
        src = pq.read_table(gsm_samples / shards.shard_name(i))
        got = pq.read_table(path)
        shards.validate_columns(got.schema, "scored", path)
        for name in src.column_names:  # every input column unchanged
            assert got.column(name).equals(src.column(name)), name
        assert got.schema.field("reward").type == pa.float32()
        assert got.schema.field("correct").type == pa.bool_()
        meta = shards.read_file_metadata(path)
        assert meta["generation"] == {"temperature": 1.0} and meta["score"]["settings"]["verifier"] == "gsm8k"
    t = shards.read_table(out)
    correct = t.column("correct").to_pylist()
    assert t.column("verdict").to_pylist() == ["correct" if c else "incorrect" for c in correct]
    assert t.column("reward").to_pylist() == [1.0 if c else -1.0 for c in correct]
    # pass-rate distribution: prompt i has i % 5 of its 4 samples correct (4 → all)
    assert res["pass_rate"]["histogram"] == {"4": {"0": 8, "1": 8, "2": 8, "3": 8, "4": 8}}
    assert (res["pass_rate"]["none_correct"], res["pass_rate"]["some_correct"], res["pass_rate"]["all_correct"]) == (8, 24, 8)
    assert res["accuracy"] == pytest.approx(sum(correct) / 160)
    manifest = shards.read_manifest(out)
    assert manifest["stage"] == "score" and manifest["counts"]["rows"] == 160
    assert manifest["summary"]["pass_rate"]["histogram"]["4"]["0"] == 8


def test_rerun_skips_and_settings_change_needs_overwrite(gsm_samples, tmp_path):
    out = tmp_path / "scored"
    score_dir(gsm_samples, out, ScoreConfig(workers=1))
    mtimes = {p: p.stat().st_mtime_ns for p in shards.complete_shards(out).values()}
    # a killed run: shard 1 missing, manifest missing
    (out / shards.shard_name(1)).unlink()
    (out / shards.MANIFEST_NAME).unlink()
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1))
    assert (res["shards_scored"], res["shards_skipped"]) == (1, 1)
    assert (out / shards.shard_name(0)).stat().st_mtime_ns == mtimes[out / shards.shard_name(0)]
    assert shards.read_manifest(out) is not None and res["rows"] == 160
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1))
    assert (res["shards_scored"], res["shards_skipped"]) == (0, 2)
    with pytest.raises(UserError, match="other settings"):
        score_dir(gsm_samples, out, ScoreConfig(workers=1, reward_incorrect=0.0))
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1, reward_incorrect=0.0, overwrite=True))
    assert res["shards_scored"] == 2
    assert set(shards.read_table(out).column("reward").to_pylist()) == {1.0, 0.0}


def test_a_scored_shard_whose_input_is_gone_is_refused_then_removed_by_overwrite(gsm_samples, tmp_path):
    out = tmp_path / "scored"
    score_dir(gsm_samples, out, ScoreConfig(workers=1))
    (gsm_samples / shards.shard_name(1)).unlink()  # the samples shrank: scored shard 1 has no input any more
    with pytest.raises(UserError, match="no input shard"):
        score_dir(gsm_samples, out, ScoreConfig(workers=1))
    assert (out / shards.shard_name(1)).exists()  # refused: nothing touched
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1, overwrite=True))
    assert list(shards.complete_shards(out)) == [0] and res["rows"] == shards.read_table(out).num_rows == 80


def test_plugin_rows_and_float_rewards(tmp_path, monkeypatch):
    (tmp_path / "lenplug.py").write_text(
        "def reward(completion, answer, row):\n"
        "    assert 'completion_token_ids' in row and 'extra_col' in row\n"
        "    return None if completion == 'skip' else len(completion) / 10 - 0.2\n"
    )
    monkeypatch.chdir(tmp_path)
    d = write_samples(tmp_path / "s", [samples_table([("a", "x", "1"), ("b", "xyz", "1"), ("c", "skip", None)])])
    res = score_dir(d, tmp_path / "o", ScoreConfig(verifier="python:lenplug:reward", workers=1, reward_no_answer=-0.5))
    t = shards.read_table(tmp_path / "o")
    assert t.column("verdict").to_pylist() == ["incorrect", "correct", "no_answer"]
    assert t.column("reward").to_pylist() == pytest.approx([-0.1, 0.1, -0.5])
    assert res["verdicts"]["no_answer"] == 1


def test_timeouts_and_errors_get_the_incorrect_reward(tmp_path, monkeypatch):
    (tmp_path / "hang.py").write_text(
        "import time\ndef f(c, a, r):\n    if c == 'hang': time.sleep(60)\n    if c == 'boom': raise ValueError('bad')\n    return True\n"
    )
    monkeypatch.chdir(tmp_path)
    d = write_samples(tmp_path / "s", [samples_table([("a", "ok", "1"), ("b", "hang", "1"), ("c", "boom", "1")])])
    with pytest.warns(UserWarning, match="66.7% of the completions could not be checked"):
        res = score_dir(d, tmp_path / "o", ScoreConfig(verifier="python:hang:f", workers=1, timeout=1.0, reward_incorrect=-2.0))
    t = shards.read_table(tmp_path / "o")
    assert t.column("verdict").to_pylist() == ["correct", "timeout", "error"]
    assert t.column("reward").to_pylist() == [1.0, -2.0, -2.0]
    assert res["worker_stats"]["timeouts"] == 1 and any("ValueError" in e for e in res["error_examples"])
    # Rerun, every shard done: it said nothing of them, and its manifest lost their error examples.
    with pytest.warns(UserWarning, match=r"66.7% of the completions could not be checked \(first: timeout"):
        again = score_dir(d, tmp_path / "o", ScoreConfig(verifier="python:hang:f", workers=1, timeout=1.0, reward_incorrect=-2.0))
    assert again.skipped and again["error_examples"] == res["error_examples"]
    assert shards.read_manifest(tmp_path / "o")["summary"]["error_examples"] == res["error_examples"]


def test_rewards_set_beside_a_plugin_that_returns_numbers_are_said_to_be_unused(tmp_path, monkeypatch):
    """verl-style functions return 0/1: with --reward-incorrect -1 the wrong answers still got 0 (the plugin's number),
    in silence, and curate's default baseline 0 then gave them no negative signal."""
    (tmp_path / "verlish.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                         "    return float(solution_str == ground_truth)\n")
    monkeypatch.chdir(tmp_path)
    d = write_samples(tmp_path / "s", [samples_table([("a", "7", "7"), ("b", "8", "9")])])
    with pytest.warns(UserWarning, match=r"2 of 2 rewards are the plugin's own numbers .*--reward-incorrect -3 applies only to its True/False"):
        res = score_dir(d, tmp_path / "o", ScoreConfig(verifier="python:verlish.py:compute_score", workers=1, reward_incorrect=-3.0))
    assert shards.read_table(tmp_path / "o").column("reward").to_pylist() == [1.0, 0.0] and res["own_rewards"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default rewards: nothing was asked that the plugin overrides
        score_dir(d, tmp_path / "o2", ScoreConfig(verifier="python:verlish.py:compute_score", workers=1))


def test_a_verifier_that_does_not_fit_the_golds_is_a_warning_not_silence(tmp_path):
    """MATH-style golds under the gsm8k verifier: every check is an error, rewarded −1. Under `topr iterate` nothing
    said so, and the rounds trained on negatives only; now the score stage warns, naming the first error."""
    d = write_samples(tmp_path / "s", [samples_table([("a", "The answer is \\boxed{1/2}", "\\frac{1}{2}"), ("b", "#### 3", "3")])])
    with pytest.warns(UserWarning, match=r"50\.0% of the completions could not be checked \(first: error: .*\) .* verifier gsm8k fits"):
        score_dir(d, tmp_path / "o", ScoreConfig(verifier="gsm8k", workers=1))


# -- bad input: one line, nothing written ---------------------------------------


def _assert_nothing_written(out: Path) -> None:
    assert not out.exists() or not any(out.iterdir())


def test_missing_column_names_column_and_file(tmp_path):
    t = samples_table([("a", "#### 1", "1")]).drop_columns(["completion"])
    pq.write_table(t, (tmp_path / "s").mkdir() or tmp_path / "s" / "shard-00000.parquet")
    out = tmp_path / "o"
    with pytest.raises(UserError) as e:
        score_dir(tmp_path / "s", out, ScoreConfig(workers=1))
    assert "'completion'" in str(e.value) and "shard-00000.parquet" in str(e.value)
    _assert_nothing_written(out)


def test_several_missing_columns_are_all_named(tmp_path):
    t = samples_table([("a", "#### 1", "1")]).drop_columns(["completion", "answer"])
    write_samples(tmp_path / "s", [t])
    with pytest.raises(UserError, match="missing columns 'answer', 'completion'"):
        score_dir(tmp_path / "s", tmp_path / "o", ScoreConfig(workers=1))


def test_mistyped_column(tmp_path):
    t = samples_table([("a", "#### 1", "1")])
    t = t.set_column(t.column_names.index("answer"), "answer", pa.array([1], pa.int64()))
    write_samples(tmp_path / "s", [samples_table([("a", "#### 1", "1")]), t])
    with pytest.raises(UserError, match="'answer' has type int64"):
        score_dir(tmp_path / "s", tmp_path / "o", ScoreConfig(workers=1))
    _assert_nothing_written(tmp_path / "o")


def test_empty_and_missing_input(tmp_path):
    write_samples(tmp_path / "s", [samples_table([])])
    with pytest.raises(UserError, match="no rows"):
        score_dir(tmp_path / "s", tmp_path / "o", ScoreConfig(workers=1))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no shard"):
        score_dir(tmp_path / "empty", tmp_path / "o", ScoreConfig(workers=1))
    with pytest.raises(UserError, match="no such file"):
        score_dir(tmp_path / "nope", tmp_path / "o", ScoreConfig(workers=1))
    _assert_nothing_written(tmp_path / "o")


@pytest.mark.parametrize(
    "spec, words", [("nope", "unknown verifier"), ("python:not_a_module_qq:f", "does not import"), ("regex:(", "bad regular")]
)
def test_bad_verifier_writes_nothing(tmp_path, spec, words):
    write_samples(tmp_path / "s", [samples_table([("a", "#### 1", "1")])])
    with pytest.raises(UserError, match=words):
        score_dir(tmp_path / "s", tmp_path / "o", ScoreConfig(verifier=spec, workers=1))
    _assert_nothing_written(tmp_path / "o")


# -- CLI ---------------------------------------------------------------------------


def _app() -> typer.Typer:
    return topr_app


def test_cli_scores_and_prints_summary(gsm_samples, tmp_path):
    out = tmp_path / "scored"
    r = CliRunner().invoke(_app(), ["score", "--samples", str(gsm_samples), "--out", str(out), "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 160 and summary["pass_rate"]["histogram"]["4"]["4"] == 8
    r = CliRunner().invoke(_app(), ["score", "-s", str(gsm_samples), "-o", str(out), "-w", "1"])
    assert r.exit_code == 0 and "pass counts (n=4)" in r.output and "accuracy" in r.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--verifier", "nope"], "unknown verifier"),
        (["--verifier", "python:no_such_mod_zz:f"], "does not import"),
        (["--timeout", "-1"], "timeout"),
    ],
)
def test_cli_bad_input_one_line_exit_2(tmp_path, args, words):
    write_samples(tmp_path / "s", [samples_table([("a", "#### 1", "1")])])
    r = CliRunner().invoke(_app(), ["score", "--samples", str(tmp_path / "s"), "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    _assert_nothing_written(tmp_path / "o")


def test_cli_help_has_examples():
    r = CliRunner().invoke(_app(), ["score", "--help"])
    assert r.exit_code == 0 and "--verifier" in r.output and "topr score --samples" in r.output


def test_a_shard_deleted_from_a_finished_directory_is_refused_not_left_out(gsm_samples, tmp_path):
    """A scored shard deleted after score finished (its manifest stays): curate trained on the rest, exit 0 (48 rows of
    64, and p from 0.0156 to 0, in a reviewer's run). The same for samples a shard was deleted from before scoring."""
    out = tmp_path / "scored"
    score_dir(gsm_samples, out, ScoreConfig(workers=1))
    (out / shards.shard_name(1)).unlink()
    curated = tmp_path / "train.parquet"
    r = CliRunner().invoke(topr_app, ["curate", "-s", str(out), "-o", str(curated)])
    assert r.exit_code == 2 and "1 of the 2 shards its _manifest.json records are missing" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not curated.exists()
    shards.write_manifest(gsm_samples, stage="generate", config={}, counts={"shards": 2})
    (gsm_samples / shards.shard_name(0)).unlink()
    with pytest.raises(UserError, match="1 of the 2 shards .* are missing .* rerun the `topr generate`"):
        score_dir(gsm_samples, tmp_path / "scored-again", ScoreConfig(workers=1))
    # Hand-made samples numbered from 1 (no manifest: read as they are): score keeps their numbers, and its manifest
    # counts them; the scored dir is whole.
    hand = tmp_path / "hand"
    for i, t in enumerate([samples_table([("a", "#### 1", "1")]), samples_table([("b", "#### 2", "2")])], start=1):
        shards.write_shard(hand, i, t)
    score_dir(hand, tmp_path / "hand-scored", ScoreConfig(workers=1))
    shards.check_finished(tmp_path / "hand-scored", "score")


def test_an_unfinished_samples_directory_is_refused_and_stale_temporaries_go(gsm_samples, tmp_path):
    """Samples `topr generate` has not finished (killed, or data-parallel parts still running) were scored and the
    scored directory marked complete, so curate built a training set from part of the data."""
    (gsm_samples / shards.MANIFEST_NAME).unlink()
    out = tmp_path / "scored"
    with pytest.raises(UserError, match="`topr generate` has not finished this directory"):
        score_dir(gsm_samples, out, ScoreConfig(workers=1))
    assert not (out / shards.MANIFEST_NAME).exists()
    shards.write_manifest(gsm_samples, stage="generate", config={})
    out.mkdir()
    from toprcli.shards.files import _HOST

    dead = out / f".shard-00000.parquet.999999999-{_HOST}.tmp"  # a killed scorer's temporary (no such pid here)
    dead.write_bytes(b"x" * 100)
    score_dir(gsm_samples, out, ScoreConfig(workers=1))
    assert not dead.exists() and (out / shards.MANIFEST_NAME).exists()


def test_a_killed_rescoring_resumes_where_it_stopped_and_a_finished_one_rescores_all_again(gsm_samples, tmp_path, monkeypatch):
    """--overwrite rescored every shard on each rerun, also those the killed run had already rescored. It still
    rescores everything once a rescoring finished (a plugin's code may have changed: its name has not)."""
    from conftest import Killed

    out = tmp_path / "scored"
    score_dir(gsm_samples, out, ScoreConfig(workers=1))
    real = shards.write_shard

    def killed_after_one(*a, **k):
        real(*a, **k)
        raise Killed

    monkeypatch.setattr(shards, "write_shard", killed_after_one)
    with pytest.raises(Killed):
        score_dir(gsm_samples, out, ScoreConfig(workers=1, reward_incorrect=0.0, overwrite=True))
    monkeypatch.setattr(shards, "write_shard", real)
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1, reward_incorrect=0.0, overwrite=True))
    assert (res["shards_scored"], res["shards_skipped"]) == (1, 1)
    assert min(shards.read_table(out).column("reward").to_pylist()) == 0.0 and not (out / "_rescoring.json").exists()
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1, reward_incorrect=0.0, overwrite=True))
    assert (res["shards_scored"], res["shards_skipped"]) == (2, 0)


def test_data_source_on_data_without_sources_says_it_is_for_verl_data():
    """eval and iterate check the sources before generating; on a non-verl dataset every source is None, and the advice
    was '--verifier-by-source None=math', which can never match."""
    from toprcli.errors import UserError
    from toprcli.stages.score import check_sources

    with pytest.raises(UserError, match="no data_source values — --verifier data_source is for verl-format datasets"):
        check_sources({None}, {"openai/gsm8k": "gsm8k"})


def test_a_rerun_with_another_timeout_or_an_edited_plugin_is_not_the_same_scoring(tmp_path, monkeypatch):
    """Raising --timeout after a timeout warning reused the old verdicts in silence (and the manifest then named the new
    timeout); an edited plugin's rewards were reused too. --strict with a verifier it does not apply to was refused later."""
    (tmp_path / "plug.py").write_text("def reward(completion, answer, row):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    d = write_samples(tmp_path / "s", [samples_table([("a", "x", "1")])])
    cfg = ScoreConfig(verifier="python:plug.py:reward", workers=1, timeout=5.0)
    score_dir(d, tmp_path / "o", cfg)
    assert score_dir(d, tmp_path / "o", cfg).skipped
    with pytest.raises(UserError, match="other settings"):
        score_dir(d, tmp_path / "o", replace(cfg, timeout=30.0))
    (tmp_path / "plug.py").write_text("def reward(completion, answer, row):\n    return 0.75\n")
    with pytest.raises(UserError, match="other settings"):
        score_dir(d, tmp_path / "o", cfg)
    # A helper module the plugin imports decides its verdicts too: edited between a kill and the rerun, the rerun mixed
    # the two versions' rewards in one scored dir.
    (tmp_path / "rule_helper.py").write_text("VALUE = 0.25\n")
    (tmp_path / "plug2.py").write_text("import rule_helper\n\ndef reward(completion, answer, row):\n    return rule_helper.VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    helped = replace(cfg, verifier="python:plug2.py:reward")
    score_dir(d, tmp_path / "h", helped)
    assert score_dir(d, tmp_path / "h", helped).skipped  # loaded again in this process: the same scoring
    (tmp_path / "rule_helper.py").write_text("VALUE = 0.75\n")
    with pytest.raises(UserError, match="other settings"):
        score_dir(d, tmp_path / "h", helped)
    exact = ScoreConfig(verifier="exact", workers=1)
    score_dir(d, tmp_path / "e", replace(exact, strict=True))
    assert score_dir(d, tmp_path / "e", exact).skipped  # strict is gsm8k's: the same scoring


def test_rewards_are_finite_at_config_load():
    """--reward-correct nan wrote a finished scored dir that curate then refused, and score would not rescore."""
    from toprcli.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="'reward_correct'.*a finite number"):
        load_config(ScoreConfig, None, sets={"reward_correct": ".nan"})
    with pytest.raises(ConfigError, match="'reward_no_answer'.*within float32's range"):  # was stored as inf
        load_config(ScoreConfig, None, sets={"reward_no_answer": 1e40})


def test_a_rerun_with_another_memory_cap_is_not_the_same_scoring(tmp_path):
    """A check that hit --worker-memory-mb is rewarded as wrong: raising the cap reused those verdicts in silence."""
    d = write_samples(tmp_path / "s", [samples_table([("a", "x", "1")])])
    cfg = ScoreConfig(verifier="exact", workers=1)
    score_dir(d, tmp_path / "o", cfg)
    with pytest.raises(UserError, match="other settings"):
        score_dir(d, tmp_path / "o", replace(cfg, worker_memory_mb=8192))


def test_rows_without_a_data_source_are_named_not_given_an_impossible_fix():
    from toprcli.errors import UserError
    from toprcli.stages.score import check_sources

    with pytest.raises(UserError, match="some rows have no data_source value"):  # was '--verifier-by-source None=math'
        check_sources({"openai/gsm8k", None}, {"openai/gsm8k": "gsm8k"})


def test_overwrite_never_removes_what_score_did_not_write(gsm_samples, tmp_path):
    """`score -s S/shard-00000.parquet -o S --overwrite` (as the refusal advised) deleted S's other sample shards and
    scored over the first; --out on another run's samples was rescored over as 'scored otherwise'."""
    before = sorted(p.name for p in gsm_samples.iterdir())
    with pytest.raises(UserError, match="holds the samples being scored"):
        score(ScoreConfig(samples=str(gsm_samples / "shard-00000.parquet"), out=str(gsm_samples), overwrite=True, workers=1))
    other = write_samples(tmp_path / "other-samples", [samples_table([("q", "#### 1", "#### 1")])])
    with pytest.raises(UserError, match="is not a `topr score` output .* choose another --out"):
        score_dir(gsm_samples, other, ScoreConfig(workers=1, overwrite=True))
    assert sorted(p.name for p in gsm_samples.iterdir()) == before and (other / "shard-00000.parquet").exists()


def test_overwrite_rescores_a_damaged_shard_and_drops_orphans_when_resumed(gsm_samples, tmp_path):
    """A damaged output shard made --overwrite fail for good (and left the directory unfinished); a resumed --overwrite
    kept a shard whose samples had gone since, and curate read it."""
    out = tmp_path / "scored"
    score_dir(gsm_samples, out, ScoreConfig(workers=1))
    (out / "shard-00001.parquet").write_bytes(b"torn")
    res = score_dir(gsm_samples, out, ScoreConfig(workers=1, overwrite=True))
    assert res["rows"] == 160 and pq.read_table(out / "shard-00001.parquet").num_rows == 80
    from toprcli.config import config_to_dict

    cfg = ScoreConfig(samples=str(gsm_samples), out=str(out), workers=1, overwrite=True)
    (out / shards.MANIFEST_NAME).unlink()  # as a killed --overwrite leaves the directory: its token kept
    config = {k: v for k, v in config_to_dict(cfg).items() if k != "workers"}
    shards.write_json_atomic(out / "_rescoring.json", {"config": config, "token": "killed-run"})
    (gsm_samples / "shard-00001.parquet").unlink()  # the samples shrank before the same command was rerun
    res = score(cfg)
    assert sorted(shards.complete_shards(out)) == [0] and res["rows"] == 80


def test_a_null_where_the_samples_contract_has_none_is_refused_before_scoring(tmp_path):
    t = samples_table([("p1", "#### 1", "#### 1"), ("p2", "#### 2", "#### 2")])
    t = t.set_column(t.schema.get_field_index("prompt_id"), "prompt_id", pa.array(["p1", None]))
    samples = write_samples(tmp_path / "samples", [t])
    with pytest.raises(UserError, match="column 'prompt_id' has a null"):
        score_dir(samples, tmp_path / "scored", ScoreConfig(workers=1))
    assert not (tmp_path / "scored").exists()


def test_verl_reward_functions_run_as_they_are_and_a_misfit_signature_is_refused_at_load(tmp_path, monkeypatch):
    """verl's compute_score(data_source, solution_str, ground_truth, extra_info) was called as (completion, answer, row):
    the completion became data_source and every reward 0.0, exit 0. TRL's batched reward functions and two-argument
    functions failed every check, one at a time."""
    from toprcli.errors import UserError

    (tmp_path / "verl_style.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 1.0 if solution_str.strip() == ground_truth else -0.5, 'acc': data_source}\n"
        "def trl_style(completions, solution, **kwargs):\n    return [1.0 for _ in completions]\n"
        "def two(completion, answer):\n    return True\n"
        "import functools\n"
        "def by_source(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    assert data_source == 'openai/gsm8k', data_source\n    return 1.0\n"
        "gsm = functools.partial(by_source, data_source='openai/gsm8k')\n")
    monkeypatch.chdir(tmp_path)
    d = write_samples(tmp_path / "s", [samples_table([("a", "7", "7"), ("b", "8", "9")])])
    score_dir(d, tmp_path / "o", ScoreConfig(verifier="python:verl_style.py:compute_score", workers=1))
    t = shards.read_table(tmp_path / "o")
    assert t.column("reward").to_pylist() == [1.0, -0.5] and t.column("verdict").to_pylist() == ["correct", "incorrect"]
    score_dir(d, tmp_path / "p", ScoreConfig(verifier="python:verl_style.py:gsm", workers=1))  # rows without a data_source: the partial's
    assert shards.read_table(tmp_path / "p").column("reward").to_pylist() == [1.0, 1.0]
    for fn, words in (("trl_style", "takes TRL's batched arguments (completions, solution"), ("two", "cannot be called as f(completion, answer, row)")):
        with pytest.raises(UserError, match=re.escape(words)):
            score_dir(d, tmp_path / fn, ScoreConfig(verifier=f"python:verl_style.py:{fn}", workers=1))
        assert not (tmp_path / fn).exists()


def test_a_plugin_that_timed_out_on_every_row_is_warned_of_with_why(tmp_path, monkeypatch):
    """A plugin loading a model on its first call times out on every row (each worker started after a timeout loads it
    again): the warning said to check that the verifier fits the data. It names the likely cause; the run goes on, as a
    code reward's programs that all hang are a real (all wrong) result, not a failed scoring."""
    from toprcli.stages.score import ChecksFailed

    (tmp_path / "lazy.py").write_text("import time\nLOADED = []\n"
                                      "def check(completion, answer, row):\n    if not LOADED:\n        time.sleep(3)\n        LOADED.append(1)\n"
                                      "    return completion == answer\n")
    monkeypatch.chdir(tmp_path)
    d = write_samples(tmp_path / "s", [samples_table([("a", "7", "7"), ("b", "8", "9")])])
    with pytest.warns(ChecksFailed, match=r"100\.0% of the completions could not be checked .* every check ran past --timeout: a plugin that loads"):
        score_dir(d, tmp_path / "o", ScoreConfig(verifier="python:lazy.py:check", workers=1, timeout=1.0))
    assert shards.read_table(tmp_path / "o").column("verdict").to_pylist() == ["timeout", "timeout"]


def test_a_stop_while_a_plugin_imports_is_a_stop_not_a_broken_plugin(tmp_path):
    """Ctrl-C while the plugin imported said "plugin module does not import (Interrupted: SIGINT)", exit 2."""
    import subprocess
    import sys

    (tmp_path / "intr.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\ndef check(c, a, r):\n    return True\n")
    d = write_samples(tmp_path / "s", [samples_table([("a", "7", "7")])])
    r = subprocess.run([sys.executable, "-m", "toprcli", "score", "-s", str(d), "-o", str(tmp_path / "o"), "--verifier", "python:intr.py:check"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 130 and "does not import" not in r.stderr and "interrupted" in r.stderr.lower(), r.stderr


def test_a_scoring_where_every_check_failed_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    """Every completion an error (here: no golds for gsm8k) wrote a finished scored dir, exit 0, with a warning; curate
    then trained on it as if every sample were wrong."""
    from toprcli.errors import UserError

    d = write_samples(tmp_path / "s", [samples_table([("a", "#### 7", None)]), samples_table([("b", "#### 8", None)])])
    with pytest.raises(UserError, match=r"every one of the 2 completions failed its check \(first: .*\); the scored shards are removed"):
        score_dir(d, tmp_path / "o", ScoreConfig(verifier="gsm8k", workers=1))
    assert not list((tmp_path / "o").glob("shard-*")) and not (tmp_path / "o" / "_manifest.json").exists()


def test_score_checks_with_the_verifier_of_the_dataset_the_samples_came_from(tiny_model_dir, tmp_path):
    """Standalone score checked every dataset with gsm8k (MATH rows of a verl set too) and refused `--verifier auto`,
    which iterate and eval take."""
    from toprcli.cli.main import app

    (tmp_path / "math.jsonl").write_text("".join(json.dumps({"problem": f"{i}/2?", "solution": f"so $\\boxed{{\\frac{{{i}}}{{2}}}}$"}) + "\n"
                                                 for i in range(2)))
    gen = CliRunner().invoke(app, ["generate", "-m", str(tiny_model_dir), "-d", str(tmp_path / "math.jsonl"), "-o", str(tmp_path / "s"),
                                   "--n", "1", "--max-new-tokens", "2", "--backend", "hf"])
    assert gen.exit_code == 0, gen.output
    r = CliRunner().invoke(app, ["score", "-s", str(tmp_path / "s"), "-o", str(tmp_path / "o"), "-w", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert shards.read_manifest(tmp_path / "o")["config"]["verifier"] == "math"  # recorded as what auto stood for
    again = CliRunner().invoke(app, ["score", "-s", str(tmp_path / "s"), "-o", str(tmp_path / "o"), "-w", "1", "--verifier", "math", "--json"])
    assert again.exit_code == 0 and json.loads(again.output.strip().splitlines()[-1])["skipped"] is True  # math is what it was scored with
    (tmp_path / "math.jsonl").unlink()  # the dataset gone: auto cannot tell; said in one line
    r = CliRunner().invoke(app, ["score", "-s", str(tmp_path / "s"), "-o", str(tmp_path / "o2"), "-w", "1"])
    assert r.exit_code == 2 and "--verifier auto reads the dataset" in r.output and not (tmp_path / "o2").exists()
