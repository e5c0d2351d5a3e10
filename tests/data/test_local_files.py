"""Local dataset files (data/local_files.py): cells read as written."""

from __future__ import annotations

import json

import pytest

from toprcli.config import DatasetSpec
from toprcli.data.datasets import load_examples
from toprcli.errors import UserError


def test_csv_cells_are_read_as_written(tmp_path):
    """pandas' inference turned a blank-holed integer column into 5.0, 007 into 7 and NA or None into no gold, so a
    plain CSV (the exact verifier) scored every right "5" wrong."""
    f = tmp_path / "qa.csv"
    f.write_text("question,answer\nA?,5\nB?,\nC?,007\nD?,NA\nE?,None\nF?,1e3\n")
    golds = [e.answer for e in load_examples(DatasetSpec(source=str(f)))]
    assert golds == ["5", "", "007", "NA", "None", "1e3"]


def test_a_csv_saved_with_a_bom_reads_like_one_without(tmp_path):
    """Excel's "CSV UTF-8" (and pandas' utf-8-sig) starts with a BOM: the first column was named '\ufeffquestion'
    and the file was refused as "an error occurred while generating the dataset"."""
    f = tmp_path / "qa.csv"
    f.write_bytes("question,answer\nA?,007\n".encode("utf-8-sig"))
    examples = load_examples(DatasetSpec(source=str(f)))
    assert [(e.question, e.answer) for e in examples] == [("A?", "007")]


def test_json_answers_that_are_whole_numbers_read_as_integers(tmp_path):
    """A JSON column of 5 and 2.5 is read as floats; the answer 5 was the text "5.0"."""
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in (("A?", 5), ("B?", 2.5), ("C?", 1e-05))) + "\n")
    assert [e.answer for e in load_examples(DatasetSpec(source=str(f)))] == ["5", "2.5", "0.00001"]  # 1e-05: no number reader's gold


def test_few_shot_examples_of_a_local_file_come_from_another_file(tmp_path):
    """One file has no splits: --few-shot-split train read the evaluated file itself, so shots were other test
    problems with their solutions. Now the split names another file, or the command says so."""
    import pytest

    from toprcli.errors import UserError

    test, train = tmp_path / "test.jsonl", tmp_path / "train.jsonl"
    test.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(3)))
    train.write_text("".join(json.dumps({"question": f"What is {i}+2?", "answer": f"#### {i + 2}"}) + "\n" for i in range(5)))
    with pytest.raises(UserError, match="--few-shot-split FILE"):
        load_examples(DatasetSpec(source=str(test), split="test", few_shot=2))
    shots = [s.question for e in load_examples(DatasetSpec(source=str(test), split="test", few_shot=2, few_shot_split=str(train))) for s in e.shots]
    assert len(shots) == 6 and all(q.endswith("+2?") for q in shots)


def test_a_csv_with_an_unnamed_column_reads_as_pandas_names_it(tmp_path):
    """pandas' to_csv() writes its index under an empty header; a trailing comma makes one too."""
    (tmp_path / "index.csv").write_text(",question,answer\n0,What is 2+3?,5\n1,What is 2+4?,6\n")
    (tmp_path / "trailing.csv").write_text("question,answer,\nWhat is 1+1?,2,\n")
    assert [(e.question, e.answer) for e in load_examples(DatasetSpec(source=str(tmp_path / "index.csv")))] == [("What is 2+3?", "5"), ("What is 2+4?", "6")]
    assert [(e.question, e.answer) for e in load_examples(DatasetSpec(source=str(tmp_path / "trailing.csv")))] == [("What is 1+1?", "2")]


@pytest.mark.parametrize("table", [{"question": {"0": "What is 2+3?", "1": "What is 2+4?"}, "answer": {"0": "5", "1": "6"}},
                                   {"question": ["What is 2+3?", "What is 2+4?"], "answer": ["5", "6"]}], ids=["pandas-default", "lists"])
def test_a_json_table_by_columns_is_one_error_naming_the_fix(tmp_path, table):
    """It loaded as one prompt whose question was the whole column's text."""
    (tmp_path / "cols.json").write_text(json.dumps(table))
    with pytest.raises(UserError, match=r"cols.json is a table by columns .* orient='records'"):
        load_examples(DatasetSpec(source=str(tmp_path / "cols.json")))
    (tmp_path / "one.json").write_text(json.dumps([{"question": "What is 2+3?", "answer": "5"}]))  # one record is a record
    assert [e.answer for e in load_examples(DatasetSpec(source=str(tmp_path / "one.json")))] == ["5"]


@pytest.mark.parametrize("name, text, words", [("e.jsonl", "", "e.jsonl is empty — it holds no rows"),
                                                ("w.jsonl", "\n  \n", "w.jsonl is empty"),
                                                ("h.csv", "question,answer\n", "h.csv: it holds a header and no rows")])
def test_an_empty_file_is_one_line_saying_so(tmp_path, name, text, words):
    """An empty .jsonl was 'cannot read …: StopIteration'; a header-only CSV was 'Instruction "train" corresponds to no data!'."""
    (tmp_path / name).write_text(text)
    with pytest.raises(UserError, match=words):
        load_examples(DatasetSpec(source=str(tmp_path / name)))


def test_few_shot_errors_are_about_the_few_shot_split_and_a_file_of_shots_serves_any_source(tmp_path):
    """A directory with test.jsonl alone and --few-shot said 'cannot load split train' as if --split were wrong; a file of
    shots was taken only for a single-file source."""
    (tmp_path / "onlytest").mkdir()
    (tmp_path / "onlytest" / "test.jsonl").write_text(json.dumps({"question": "What is 1+1?", "answer": "#### 2"}) + "\n")
    with pytest.raises(UserError, match=r"^few-shot examples \(--few-shot-split train\): cannot load dataset .* split 'train'"):
        load_examples(DatasetSpec(source=str(tmp_path / "onlytest"), split="test", few_shot=1))
    (tmp_path / "shots.jsonl").write_text(json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}) + "\n")
    spec = DatasetSpec(source=str(tmp_path / "onlytest"), split="test", few_shot=1, few_shot_split=str(tmp_path / "shots.jsonl"))
    assert [s.question for s in load_examples(spec)[0].shots] == ["What is 2+2?"]


def test_compressed_files_and_tsv_read_as_their_plain_forms(tmp_path):
    """train.jsonl.gz (how large datasets ship) and .tsv were refused as unsupported file types."""
    import bz2
    import gzip
    import lzma

    rows = [{"question": "2+3?", "answer": "2+3=5\n#### 5"}, {"question": "1, 1?", "answer": "#### 2"}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    for name, opener in (("t.jsonl.gz", gzip.open), ("t.jsonl.bz2", bz2.open), ("t.jsonl.xz", lzma.open)):
        with opener(tmp_path / name, "wt") as f:
            f.write(text)
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        f.write(json.dumps(rows))
    (tmp_path / "t.tsv").write_text("question\tanswer\n2+3?\t#### 5\n1, 1?\t#### 2\n")
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write('question,answer\n2+3?,#### 5\n"1, 1?",#### 2\n')
    plain = [(e.prompt_id, e.question, e.answer) for e in load_examples(DatasetSpec(source=str(_write(tmp_path / "t.jsonl", text))))]
    for name in ("t.jsonl.gz", "t.jsonl.bz2", "t.jsonl.xz", "t.json.gz", "t.tsv", "t.csv.gz"):
        assert [(e.prompt_id, e.question, e.answer) for e in load_examples(DatasetSpec(source=str(tmp_path / name)))] == plain, name
    with gzip.open(tmp_path / "bad.jsonl.gz", "wt") as f:  # a broken line is named through the compression too
        f.write(text + '{"question": \n')
    with pytest.raises(UserError, match=r"bad.jsonl.gz: line 3 is not valid JSON"):
        load_examples(DatasetSpec(source=str(tmp_path / "bad.jsonl.gz")))
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(b"2+3?"))
    with pytest.raises(UserError, match=r"unsupported file type '.txt.gz' — use .jsonl, .json, .parquet, .csv or .tsv"):
        load_examples(DatasetSpec(source=str(tmp_path / "t.txt.gz")))


def _write(path, text: str):
    path.write_text(text)
    return path
