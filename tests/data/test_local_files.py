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


def test_json_answers_that_are_whole_numbers_read_as_integers(tmp_path):
    """A JSON column of 5 and 2.5 is read as floats; the answer 5 was the text "5.0"."""
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in (("A?", 5), ("B?", 2.5))) + "\n")
    assert [e.answer for e in load_examples(DatasetSpec(source=str(f)))] == ["5", "2.5"]
