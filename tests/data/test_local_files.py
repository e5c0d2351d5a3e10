"""Local dataset files (data/local_files.py): cells read as written."""

from __future__ import annotations

import json

from toprcli.config import DatasetSpec
from toprcli.data.datasets import load_examples


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
    f.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in (("A?", 5), ("B?", 2.5))) + "\n")
    assert [e.answer for e in load_examples(DatasetSpec(source=str(f)))] == ["5", "2.5"]


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
