"""Dataset specs: every source, presets, templates, stable ids, clear errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from toprcli.config import DatasetSpec
from toprcli.data.datasets import (
    encode_prompt,
    load_examples,
    render_prompt,
    resolve_preset,
)
from toprcli.data.formats import gsm8k_gold, last_boxed
from toprcli.errors import UserError


def test_gsm8k_local_jsonl(gsm8k_dir):
    ex = load_examples(DatasetSpec(source=str(gsm8k_dir / "test.jsonl"), split="test"))
    assert len(ex) == 1319
    assert ex[0].answer == "18" and ex[0].solution.endswith("#### 18")
    assert len({e.prompt_id for e in ex}) == 1319
    prompt = render_prompt(ex[0], DatasetSpec(source=str(gsm8k_dir / "test.jsonl")))
    assert "#### <number>" in prompt and ex[0].question in prompt


def test_gsm8k_dataset_dir_through_the_hub_loader(gsm8k_dir):
    # A local directory laid out like a hub repo goes through the same load_dataset(id, config, split) call.
    spec = DatasetSpec(source=str(gsm8k_dir), split="test", limit=5)
    ex = load_examples(spec)
    assert len(ex) == 5 and resolve_preset(spec).name == "gsm8k"
    train = load_examples(DatasetSpec(source=str(gsm8k_dir), split="train", limit=5))
    assert {e.prompt_id for e in train}.isdisjoint({e.prompt_id for e in ex})


def test_builtin_gsm8k_is_the_shipped_file(gsm8k_dir):
    # builtin:gsm8k names the package's copy: same rows, same ids as the file, the gsm8k preset.
    for split, size in (("test", 1319), ("train", 7473)):
        spec = DatasetSpec(source="builtin:gsm8k", split=split)
        ex = load_examples(spec)
        assert len(ex) == size and resolve_preset(spec).name == "gsm8k"
        assert ex[:3] == load_examples(DatasetSpec(source=str(gsm8k_dir / f"{split}.jsonl"), split=split, limit=3))
    assert len(load_examples(DatasetSpec(source="builtin:gsm8k", split="test", limit=7))) == 7
    assert (gsm8k_dir / "LICENSE").read_text().startswith("MIT License")


def test_builtin_gsm8k_unknown_split_is_one_error():
    with pytest.raises(UserError, match="builtin:gsm8k has no split 'validation' — choose train or test"):
        load_examples(DatasetSpec(source="builtin:gsm8k", split="validation"))
    with pytest.raises(UserError, match="choose one of: builtin:arith, builtin:gsm8k"):
        load_examples(DatasetSpec(source="builtin:gsm9k"))


def test_ids_are_stable_under_reordering(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    ia = {e.question: e.prompt_id for e in load_examples(DatasetSpec(source=str(a), preset="gsm8k"))}
    ib = {e.question: e.prompt_id for e in load_examples(DatasetSpec(source=str(b), preset="gsm8k"))}
    assert ia == ib


@pytest.mark.parametrize("fmt", ["json", "parquet", "csv"])
def test_other_local_formats_with_column_mapping(tmp_path, fmt):
    data = {"problem_text": ["What is \\frac{1}{2}+\\frac{1}{2}?", "2+2?"], "sol": ["so \\boxed{1}", "\\boxed{4}"], "uid": ["a", "b"]}
    path = tmp_path / f"d.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps([dict(zip(data, v)) for v in zip(*data.values())]))
    elif fmt == "parquet":
        pq.write_table(pa.table(data), path)
    else:
        path.write_text("problem_text,sol,uid\n" + "\n".join(f'"{a}","{b}",{c}' for a, b, c in zip(*data.values())) + "\n")
    spec = DatasetSpec(source=str(path), preset="math", question_column="problem_text", answer_column="sol", id_column="uid")
    ex = load_examples(spec)
    assert [e.prompt_id for e in ex] == ["a", "b"] and [e.answer for e in ex] == ["1", "4"]
    assert "\\boxed{}" in render_prompt(ex[0], spec)


def test_builtin_arith():
    spec = DatasetSpec(source="builtin:arith", split="train", size=50, seed=3)
    ex = load_examples(spec)
    assert len(ex) == 50 and all(e.solution.rstrip().split("#### ")[-1] == e.answer for e in ex)
    assert ex == load_examples(spec)
    test = load_examples(DatasetSpec(source="builtin:arith", split="test", size=50, seed=3))
    assert {e.question for e in ex}.isdisjoint({e.question for e in test})


def test_templates_and_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ex = load_examples(DatasetSpec(size=3))[0]
    spec = DatasetSpec(template="Problem: {question}\nSolution:")
    text = render_prompt(ex, spec)
    assert text == f"Problem: {ex.question}\nSolution:"
    ids = encode_prompt(text, tok, spec)
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == text
    chat = render_prompt(ex, DatasetSpec(chat_template=True, system_prompt="Be brief."), tok)
    assert ex.question in chat and "Be brief." in chat and chat != text
    with pytest.raises(UserError, match="no \\{question\\} placeholder"):
        render_prompt(ex, DatasetSpec(template="no placeholder"))
    with pytest.raises(UserError, match="no \\{question\\} placeholder"):  # the chat instruction too (the problem was dropped)
        render_prompt(ex, DatasetSpec(template="Solve it step by step.", chat_template=True), tok)
    # Gemma's template refuses a system turn: that was a jinja2 traceback
    tok.chat_template = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(UserError, match=f"refused prompt {ex.prompt_id}: System role not supported — drop --system-prompt"):
        render_prompt(ex, DatasetSpec(chat_template=True, system_prompt="Be brief."), tok)
    assert ex.question in render_prompt(ex, DatasetSpec(chat_template=True), tok)


@pytest.mark.parametrize(
    "spec, match",
    [
        (DatasetSpec(source="builtin:nope"), "unknown built-in dataset"),
        (DatasetSpec(source="./missing.jsonl"), "not found"),
        (DatasetSpec(source="missing.jsonl"), "not found"),
        (DatasetSpec(source="builtin:arith", split="validation"), "split"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(UserError, match=match):
        load_examples(spec)


def test_bad_columns_and_empty(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "hi", "label": "1"}\n')
    with pytest.raises(UserError, match="no question column.*columns are: text, label"):
        load_examples(DatasetSpec(source=str(f)))
    with pytest.raises(UserError, match="no column 'q'"):
        load_examples(DatasetSpec(source=str(f), question_column="q"))
    e = tmp_path / "e.csv"
    e.write_text("question,answer\n")
    with pytest.raises(UserError):
        load_examples(DatasetSpec(source=str(e)))
    # a row without its question is one error naming the row (it became the text "None")
    n = tmp_path / "n.jsonl"
    n.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": null, "answer": "#### 3"}\n')
    with pytest.raises(UserError, match="row 1, column 'question': no question"):
        load_examples(DatasetSpec(source=str(n)))
    u = tmp_path / "d.txt"
    u.write_text("x")
    with pytest.raises(UserError, match="unsupported file type"):
        load_examples(DatasetSpec(source=str(u)))
    # no answer column (a header " answer" with a space): said at load, not after a whole generation as 100% check errors
    s = tmp_path / "spaced.csv"
    s.write_text("question, answer\n1+1?,2\n")
    with pytest.warns(UserWarning, match="no answer column .*columns are: question,  answer\\): every gold answer is empty"):
        (example,) = load_examples(DatasetSpec(source=str(s)))
    assert example.answer is None


@pytest.mark.integration  # waits for the hub's connection attempts to fail
def test_unreachable_hub_id_is_one_line(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read as the libraries import: once imported, their own flags (else 23 s of retries)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError) as e:
        load_examples(DatasetSpec(source="nobody-xyz/not-a-dataset", split="test"))
    assert "\n" not in str(e.value) and "nobody-xyz/not-a-dataset" in str(e.value)


def test_gold_helpers():
    assert gsm8k_gold("a\nb\n#### 1,234") == "1234"
    assert gsm8k_gold("42") == "42"
    assert gsm8k_gold("3 + 15 = 18.\n#### 18\nThe answer is: 18") == "18"  # MetaMathQA: text after the answer line
    assert gsm8k_gold("#### 3 then #### 4") == "4"  # the last one, as the verifiers read it
    assert last_boxed("x \\boxed{\\frac{1}{2}} y \\boxed{3}") == "3"
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("none") is None
    # MATH writes some answers as `\boxed 5`: the argument is that token, never a later brace's content (it was 'x').
    assert last_boxed("so $\\boxed 5$. Check {x}.") == "5" and last_boxed("$\\boxed {7}$") == "7"
    assert last_boxed("\\boxed") is None and last_boxed("\\boxed$ then {x}") is None


def test_the_files_own_name_names_its_dataset_before_its_folders(tmp_path):
    """gsm8k-rl/data/math500.jsonl was read as GSM8K: refused for want of a question column, or its gold (1,2) made 12."""
    from toprcli.data.datasets import default_verifier

    folder = tmp_path / "gsm8k-rl" / "data"
    folder.mkdir(parents=True)
    (folder / "math500.jsonl").write_text(json.dumps({"problem": "Find the point.", "solution": "so \\boxed{(1,2)}", "answer": "(1,2)"}) + "\n")
    spec = DatasetSpec(source=str(folder / "math500.jsonl"))
    assert [(e.answer, e.preset) for e in load_examples(spec)] == [("(1,2)", "math")] and default_verifier(spec) == "math"
    (folder / "train.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")  # a neutral name: the folder's
    assert load_examples(DatasetSpec(source=str(folder / "train.jsonl")))[0].preset == "gsm8k"


def test_cli_reports_bad_dataset_in_one_line(tmp_path):
    from toprcli.cli.main import app

    r = CliRunner().invoke(app, ["config", "check", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "config file not found" in r.stderr


def test_a_solution_column_beside_the_answer_is_the_worked_solution(tmp_path):
    """MATH-500's rows have problem, solution and answer: the gold is the answer, the solution (few-shot examples,
    the warm start) is the solution column's working (it was the bare answer)."""
    f = tmp_path / "math500.jsonl"
    f.write_text(json.dumps({"problem": "What is 1 - 0?", "solution": "1 - 0 = $\\boxed{1}$.", "answer": "1"}) + "\n")
    ex = load_examples(DatasetSpec(source=str(f), preset="math"))[0]
    assert (ex.answer, ex.solution) == ("1", "1 - 0 = $\\boxed{1}$.")


def test_auto_reads_an_unnamed_file_by_its_content_and_renders_it_so(tmp_path):
    """data/train.jsonl with MATH's problem and a boxed solution once got the `none` preset: exact matching of the whole
    solution text, a bare prompt. Now the math preset reads the gold, renders the prompt and picks the verifier."""
    from toprcli.data.datasets import MATH_INSTRUCTION, default_verifier

    rows = [{"problem": "What is 1/2 + 1/2?", "solution": "Add them: $\\frac{2}{2} = \\boxed{1}$."}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = DatasetSpec(source=str(tmp_path / "train.jsonl"))
    (example,) = load_examples(spec)
    assert example.answer == "1" and default_verifier(spec) == "math"
    assert render_prompt(example, spec).startswith(MATH_INSTRUCTION)
    rows = [{"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5"}]
    (tmp_path / "gsm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (example,) = load_examples(DatasetSpec(source=str(tmp_path / "gsm.jsonl")))
    assert example.answer == "5" and example.preset == "gsm8k"


def test_content_is_read_from_the_columns_the_spec_names_and_from_the_rows_the_preset_is(tmp_path):
    """The README's plain-columns example (--question-column problem --answer-column meta.solution) got the `none` preset:
    the whole solution as gold, checked by `exact`. And a first row with a null answer gave default_verifier (one row)
    `exact` while the examples were read as gsm8k (from the first rows, nulls filled): every right answer scored wrong."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from toprcli.data.datasets import default_verifier

    pq.write_table(pa.table({"problem": ["What is 1/1?"], "meta": [{"solution": "It is \\boxed{1}."}]}), tmp_path / "problems.parquet")
    spec = DatasetSpec(source=str(tmp_path / "problems.parquet"), question_column="problem", answer_column="meta.solution")
    (example,) = load_examples(spec)
    assert (example.preset, example.answer, default_verifier(spec)) == ("math", "1", "math")
    pq.write_table(pa.table({"question": ["What is 2+2?", "What is 3+3?"], "answer": [None, "#### 6"]}), tmp_path / "nulls.parquet")
    spec = DatasetSpec(source=str(tmp_path / "nulls.parquet"))
    assert {e.preset for e in load_examples(spec)} == {"gsm8k"} and default_verifier(spec) == "gsm8k"


@pytest.mark.parametrize("row, gold, preset, verifier", [
    ({"instruction": "1 + 1?", "output": "1 + 1 = 2\n#### 2"}, "2", "gsm8k", "gsm8k"),
    ({"prompt": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}, "2", "gsm8k", "gsm8k"),
    ({"input": "1 + 1?", "target": "so $\\boxed{2}$"}, "2", "math", "math"),
    # A number as the gold is read as GSM8K's (was `none`: a bare prompt, `exact` matching of the whole completion).
    ({"question": "1 + 1?", "answer": "2"}, "2", "gsm8k", "gsm8k"),
    ({"question": "1 + 1?", "answer": 2}, "2", "gsm8k", "gsm8k"),
    ({"prompt": "1 + 1?", "solution": "1,200"}, "1200", "gsm8k", "gsm8k"),
    ({"prompt": "1 + 1?", "solution": "so $\\boxed{2}$"}, "2", "math", "math"),
    ({"prompt": "1 + 1?", "ground_truth": "2"}, "2", "gsm8k", "gsm8k"),  # a top-level ground_truth was no gold: all checks failed
    ({"question": "1 + 1?", "ground_truth": 2}, "2", "gsm8k", "gsm8k"),
    ({"prompt": "What is the capital of France?", "output": "Paris"}, "Paris", "none", "exact"),
    ({"question": "1 + 1?", "answer": "two"}, "two", "none", "exact"),
])
def test_content_is_read_from_the_columns_the_none_preset_reads_too(tmp_path, row, gold, preset, verifier):
    """An instruction/output file with `#### n` answers got the `none` preset: the whole worked solution as gold,
    checked by `exact`, so every answer scored wrong, in silence. A `prompt` column (TRL's name for the model's input)
    got the preset's instruction and `Question:`/`Answer:` wrapped around it: it is rendered as written."""
    from toprcli.data.datasets import default_verifier, render_prompt

    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    spec = DatasetSpec(source=str(tmp_path / "train.jsonl"))
    (example,) = load_examples(spec)
    question = row.get("prompt") or "1 + 1?"
    assert (example.question, example.answer, example.preset) == (question, gold, preset)
    assert default_verifier(spec) == verifier
    if "prompt" in row:
        assert render_prompt(example, spec) == question
    else:
        assert render_prompt(example, spec) != question or preset == "none"


def test_common_layouts_a_review_found_misread(tmp_path, monkeypatch):
    """Alpaca's empty `input` was taken as the question (refused, or the instruction lost); `~/gsm8k-rl/math500.jsonl`
    was matched by its whole path (gsm8k, gold '(12)'); a local folder named gsm8k got the hub's config `main`; a
    user-final conversation beside an `answer` column was refused; topr's own outputs were read as TRL datasets."""
    def jsonl(path, rows):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    alpaca = jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "What is 12 times 3?", "input": "", "output": "#### 36"},
                                               {"instruction": "Solve for x.", "input": "2x + 3 = 7", "output": "#### 2"}])
    assert [e.question for e in load_examples(DatasetSpec(source=alpaca))] == ["What is 12 times 3?", "Solve for x.\n\n2x + 3 = 7"]
    monkeypatch.setenv("HOME", str(tmp_path))
    jsonl(tmp_path / "gsm8k-rl" / "math500.jsonl", [{"problem": "Point?", "answer": "(1,2)"}])
    spec = DatasetSpec(source="~/gsm8k-rl/math500.jsonl")
    assert resolve_preset(spec).name == "math" and load_examples(spec)[0].answer == "(1,2)"
    jsonl(tmp_path / "data" / "gsm8k" / "train.jsonl", [{"question": "What is 2+2?", "answer": "#### 4"}])
    monkeypatch.chdir(tmp_path / "data")
    assert load_examples(DatasetSpec(source="gsm8k"))[0].answer == "4"
    chat = jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "What is 2+2?"}], "answer": "4"}])
    assert load_examples(DatasetSpec(source=chat))[0].answer == "4"
    from toprcli import shards

    shards.write_table_atomic(tmp_path / "train.parquet", pa.table({"prompt": ["q"], "completion": ["c"]}), {"stage": "curate"})
    with pytest.raises(UserError, match="was written by topr's curate stage, it is not a dataset"):
        load_examples(DatasetSpec(source=str(tmp_path / "train.parquet")))


def test_chat_datasets_with_gsm8k_references_are_checked_by_gsm8k(tmp_path):
    """A conversation (or TRL prompt) whose reference ends in `#### 9` got math-verify, which ignores `####` and reads
    another number of a completion written the same way."""
    from toprcli.data.datasets import default_verifier

    chat = [{"role": "user", "content": "4+5?"}]
    for name, row, verifier in (("messages", {"messages": [*chat, {"role": "assistant", "content": "4+5=9\n#### 9"}]}, "gsm8k"),
                                ("trl", {"prompt": chat, "solution": "4+5=9\n#### 9"}, "gsm8k"),
                                ("boxed", {"prompt": chat, "solution": "$\\boxed{9}$"}, "math")):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
        spec = DatasetSpec(source=str(tmp_path / f"{name}.jsonl"), chat_template=True)
        assert (load_examples(spec)[0].answer, default_verifier(spec)) == ("9", verifier), name


def test_a_trl_unpaired_preference_file_and_a_template_on_chat_rows_are_refused(tmp_path):
    """A completion labelled false was taken as the gold answer; --template on chat rows was ignored and recorded as used."""
    (tmp_path / "kto.jsonl").write_text(json.dumps({"prompt": "What is 3*3?", "completion": " 6", "label": False}) + "\n")
    with pytest.raises(UserError, match="unpaired-preference dataset .* --answer-column"):
        load_examples(DatasetSpec(source=str(tmp_path / "kto.jsonl")))
    row = {"messages": [{"role": "user", "content": "4+5?"}, {"role": "assistant", "content": "9"}]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(row) + "\n")
    spec = DatasetSpec(source=str(tmp_path / "chat.jsonl"), chat_template=True, template="Solve: {question}")
    with pytest.raises(UserError, match="holds chat messages, rendered as given: --template does nothing"):
        render_prompt(load_examples(spec)[0], spec)


def test_verl_rows_with_a_text_prompt_are_verl_rows(tmp_path):
    """verl's reward_model.ground_truth beside a text prompt (not a conversation) was not found: no gold, every check failed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from toprcli.data.datasets import default_verifier, render_prompt

    pq.write_table(pa.table({"prompt": ["1 + 1?"], "reward_model": [{"ground_truth": "2", "style": "rule"}], "data_source": ["openai/gsm8k"]}),
                   tmp_path / "verl.parquet")
    spec = DatasetSpec(source=str(tmp_path / "verl.parquet"))
    (example,) = load_examples(spec)
    assert (example.preset, example.answer, example.data_source, default_verifier(spec)) == ("verl", "2", "openai/gsm8k", "data_source")
    assert render_prompt(example, spec) == "1 + 1?"


def test_a_saved_dataset_directory_is_read_and_a_missing_hub_id_names_the_builtin(tmp_path, monkeypatch):
    """A `Dataset.save_to_disk` directory failed with datasets' "Please use `load_from_disk` instead"; an offline hub id
    was told to check its split and config name."""
    import datasets

    from toprcli.errors import UserError

    datasets.Dataset.from_list([{"question": "1 + 1?", "answer": "#### 2"}]).save_to_disk(str(tmp_path / "saved"))
    (example,) = load_examples(DatasetSpec(source=str(tmp_path / "saved")))
    assert (example.question, example.answer) == ("1 + 1?", "2")
    # A saved split knows its name: eval's default --split test read a saved train split as test problems, labelled test-…
    datasets.Dataset.from_list([{"question": "1 + 1?", "answer": "#### 2"}], split="train").save_to_disk(str(tmp_path / "train"))
    assert load_examples(DatasetSpec(source=str(tmp_path / "train"), split="train"))[0].answer == "2"
    with pytest.warns(UserWarning, match=r"was saved as the train split and is read as 'test' .* pass --split train"):
        load_examples(DatasetSpec(source=str(tmp_path / "train"), split="test"))  # a warning: train_test_split's test part says train too
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as this machine is: no half-minute of retries
    with pytest.raises(UserError, match="builtin:gsm8k ships with topr"):
        load_examples(DatasetSpec(source="no-such-user-zz/no-such-dataset-zz"))


def test_a_dataset_of_several_configs_names_them(tmp_path):
    """'Config name is missing.' was all a user was told: datasets' next line names the configs to pick from."""
    from toprcli.errors import UserError

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    splits = "  data_files:\n  - split: test\n    path: a.jsonl\n"
    (tmp_path / "ds" / "README.md").write_text(f"---\nconfigs:\n- config_name: main\n{splits}- config_name: other\n{splits}---\n")
    with pytest.raises(UserError, match=r"pick one among the available configs: \['main', 'other'\] — check the split and config name"):
        load_examples(DatasetSpec(source=str(tmp_path / "ds"), split="test"))
    (example,) = load_examples(DatasetSpec(source=str(tmp_path / "ds"), split="test", config_name="main"))
    assert example.answer == "2"


def test_rows_with_an_empty_gold_are_named_before_generation(tmp_path):
    """verl's model-reward rows (ground_truth null) and a null answer went through generate in silence; every such row
    then failed its check after the generation was spent."""
    rows = [{"question": "1 + 1?", "answer": "#### 2"}, {"question": "2 + 2?", "answer": None}, {"question": "3 + 3?", "answer": " "}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match=r"2 of 3 rows have no gold answer \(column 'answer' empty"):
        load_examples(DatasetSpec(source=str(tmp_path / "d.jsonl")))
