"""The verifier-data stage: scored completions → a verification dataset that `topr generate` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from builders import scored_table
from typer.testing import CliRunner

from toprcli import shards
from toprcli.cli.main import app
from toprcli.config import DatasetSpec, VerifierDataConfig
from toprcli.data.datasets import load_examples, render_prompt, resolve_preset
from toprcli.data.verification import REQUEST
from toprcli.errors import UserError
from toprcli.stages.verifier_data import run

ITEMS = [
    ("p1", "What is 3 + 4?", "3 + 4 = 7\n#### 7", "correct"),
    ("p1", "What is 3 + 4?", "3 + 4 = 8\n#### 8", "incorrect"),
    ("p1", "What is 3 + 4?", "3 + 4 = 7\n#### 7", "correct"),  # a duplicate of the first candidate
    ("p1", "What is 3 + 4?", "I do not know", "no_answer"),
    ("p2", "What is 2 + 2?", "#### 4", "correct"),
    ("p2", "What is 2 + 2?", "#### 5", "timeout"),  # unknown label: left out
]


def scored_dir(tmp: Path, items=ITEMS, **kw) -> Path:
    d = tmp / "scored"
    shards.write_shard(d, 0, scored_table(items, **kw))
    return d


def test_rows_are_labelled_candidates_and_generate_reads_them(tmp_path):
    out = tmp_path / "verify.parquet"
    res = run(VerifierDataConfig(scored=[str(scored_dir(tmp_path))], out=str(out)))
    assert res.stage == "verifier-data" and not res.skipped
    assert res["rows_in"] == 6 and res["rows_out"] == 4 and (res["yes"], res["no"]) == (2, 2)
    assert res["dropped"] == {"unscored (timeout/error)": 1, "duplicates": 1} and res["question_source"] == "question"
    t = pq.read_table(out).to_pylist()  # shuffled (seeded): the first N rows, a warm start's, are a sample of the candidates
    assert sorted(r["answer"] for r in t) == ["No", "No", "Yes", "Yes"] and all(r["label"] == (r["answer"] == "Yes") for r in t)
    again = tmp_path / "again.parquet"
    run(VerifierDataConfig(scored=[str(scored_dir(tmp_path / "again"))], out=str(again)))
    assert [r["id"] for r in pq.read_table(again).to_pylist()] == [r["id"] for r in t]  # one seed, one order
    first = next(r for r in t if r["candidate"] == "3 + 4 = 7\n#### 7")
    assert first["question"].startswith("Question: What is 3 + 4?\n\nProposed solution: 3 + 4 = 7\n#### 7")
    assert first["question"].endswith(REQUEST) and first["source_prompt_id"] == "p1" and first["candidate"] == "3 + 4 = 7\n#### 7"
    assert len({r["id"] for r in t}) == 4

    # A dataset like any other: the verification preset is read from the file, ids are kept, the label is the answer.
    spec = DatasetSpec(source=str(out), split="test")
    assert resolve_preset(spec).name == "verification" and resolve_preset(spec).verifier == "judge"
    examples = load_examples(spec)
    assert [e.prompt_id for e in examples] == [r["id"] for r in t] and [e.answer for e in examples] == [r["answer"] for r in t]
    assert render_prompt(examples[0], spec).endswith(REQUEST + "\nVerdict:")
    assert examples[0].solution == t[0]["answer"]  # what a supervised warm start trains the verifier to say


def test_balance_and_cap_are_seeded(tmp_path):
    items = [("p1", "Q1", f"c{i}", "correct" if i < 6 else "incorrect") for i in range(8)] + [("p2", "Q2", "x", "incorrect")]
    d = scored_dir(tmp_path, items)
    a = run(VerifierDataConfig(scored=[str(d)], out=str(tmp_path / "a.parquet"), balance=True, seed=3))
    assert (a["yes"], a["no"]) == (3, 3) and a["dropped"]["balance"] == 3
    run(VerifierDataConfig(scored=[str(d)], out=str(tmp_path / "b.parquet"), balance=True, seed=3))
    assert pq.read_table(tmp_path / "a.parquet").column("id").to_pylist() == pq.read_table(tmp_path / "b.parquet").column("id").to_pylist()
    c = run(VerifierDataConfig(scored=[str(d)], out=str(tmp_path / "c.parquet"), max_per_question=2))
    assert c["rows_out"] == 3 and c["questions"] == 2 and c["dropped"]["over max per question"] == 6


def test_old_samples_without_a_question_column_use_the_prompt(tmp_path):
    d = scored_dir(tmp_path, ITEMS[:2], with_question=False)
    res = run(VerifierDataConfig(scored=[str(d)], out=str(tmp_path / "v.parquet")))
    assert res["question_source"] == "prompt"
    assert pq.read_table(tmp_path / "v.parquet").column("question")[0].as_py().startswith("Question: Question: What is 3 + 4?\nAnswer:")


def test_rerun_is_skipped_and_other_settings_are_refused(tmp_path):
    d, out = scored_dir(tmp_path), tmp_path / "v.parquet"
    run(VerifierDataConfig(scored=[str(d)], out=str(out)))
    mtime = out.stat().st_mtime_ns
    again = run(VerifierDataConfig(scored=[str(d)], out=str(out)))
    assert again.skipped and again["rows_out"] == 4 and out.stat().st_mtime_ns == mtime
    with pytest.raises(UserError, match="already exists"):
        run(VerifierDataConfig(scored=[str(d)], out=str(out), dedupe=False))
    assert run(VerifierDataConfig(scored=[str(d)], out=str(out), dedupe=False, overwrite=True))["rows_out"] == 5
    # The repeated candidate is kept with an id of its own: the file loads as a dataset (twin ids were refused).
    examples = load_examples(DatasetSpec(source=str(out), split="test"))
    assert len(examples) == 5 and len({e.prompt_id for e in examples}) == 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "v.parquet"], "no scored data"),
        (["--scored", "SCORED", "--out", "v.jsonl"], "one Parquet file"),
        (["--scored", "nope", "--out", "v.parquet"], "nope"),
        (["--scored", "ONE_CLASS", "--out", "v.parquet", "--balance"], "--balance needs both"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    scored_dir(tmp_path)
    shards.write_shard(tmp_path / "one", 0, scored_table([("p", "Q", "a", "correct")]))
    args = [a.replace("SCORED", str(tmp_path / "scored")).replace("ONE_CLASS", str(tmp_path / "one")) for a in args]
    r = CliRunner().invoke(app, ["verifier-data", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1
    assert not list(tmp_path.glob("v.*"))


def test_cli_prints_a_table_and_json(tmp_path):
    d = scored_dir(tmp_path)
    r = CliRunner().invoke(app, ["verifier-data", "-s", str(d), "-o", str(tmp_path / "v.parquet")])
    assert r.exit_code == 0, r.output
    assert "labelled Yes / No" in r.output and "2 / 2" in r.output
    r = CliRunner().invoke(app, ["verifier-data", "-s", str(d), "-o", str(tmp_path / "v.parquet"), "--json"])
    assert json.loads(r.stdout)["skipped"] is True


def test_an_out_that_is_a_directory_or_an_input_is_refused(tmp_path):
    """--out a directory said 'already exists — pass --overwrite', then crashed with IsADirectoryError; with --overwrite
    an --out that is an input shard replaced it."""
    scored = scored_dir(tmp_path)
    (tmp_path / "d.parquet").mkdir()
    with pytest.raises(UserError, match="is a directory — name the dataset file"):
        run(VerifierDataConfig(scored=[str(scored)], out=str(tmp_path / "d.parquet"), overwrite=True))
    shard = next(scored.glob("shard-*.parquet"))
    before = shard.read_bytes()
    with pytest.raises(UserError, match="is inside the scored input"):
        run(VerifierDataConfig(scored=[str(scored)], out=str(shard), overwrite=True))
    assert shard.read_bytes() == before


def test_a_file_in_an_older_toprcli_s_input_order_is_not_taken_as_this_run_s(tmp_path):
    """`make verifier-demo` on a run dir of before the shuffle reused its unshuffled train.parquet as up to date."""
    from toprcli import shards

    out, scored = tmp_path / "v.parquet", [str(scored_dir(tmp_path))]
    run(VerifierDataConfig(scored=scored, out=str(out)))
    assert run(VerifierDataConfig(scored=scored, out=str(out))).skipped  # a rerun: up to date
    meta = shards.read_file_metadata(out)
    del meta["order"]
    shards.write_table_atomic(out, pq.read_table(out), meta)  # as an older toprcli wrote it
    with pytest.raises(UserError, match="in the input order of an older toprcli"):
        run(VerifierDataConfig(scored=scored, out=str(out)))
    assert not run(VerifierDataConfig(scored=scored, out=str(out), overwrite=True)).skipped
