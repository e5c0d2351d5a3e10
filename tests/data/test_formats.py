"""The datasets users already have: verl's RLVR parquet, TRL's conversational format, chat `messages`,
nested gold answers, few-shot prompts — built the way those projects write them, read by the real loaders."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from toprcli.cli.main import app
from toprcli.config import DatasetSpec
from toprcli.data.datasets import default_verifier, load_examples, render_prompt, resolve_preset
from toprcli.errors import UserError

# verl's examples/data_preprocess/gsm8k.py: the instruction it appends to every question.
VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SYSTEM = "You are a careful math tutor."


def gsm8k_rows(gsm8k_dir, n=4, split="test"):
    return [json.loads(line) for line in (gsm8k_dir / f"{split}.jsonl").read_text().splitlines()[:n]]


def verl_file(path, gsm8k_dir, n=4):
    """A parquet file as verl's gsm8k.py preprocessing writes it (with `datasets`)."""
    import datasets

    rows = []
    for i, r in enumerate(gsm8k_rows(gsm8k_dir, n)):
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": r["question"] + " " + VERL_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": r["answer"].split("####")[-1].strip().replace(",", "")},
            "extra_info": {"split": "test", "index": i, "answer": r["answer"], "question": r["question"]},
        })
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path, rows


def trl_file(path, gsm8k_dir, n=4):
    """TRL's conversational prompt-only format (a system turn and a user turn) with an answer column, as JSON lines."""
    import datasets

    rows = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}], "answer": r["answer"]}
            for r in gsm8k_rows(gsm8k_dir, n)]
    datasets.Dataset.from_list(rows).to_json(str(path))
    return path, rows


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.mark.parametrize("name", ["gsm8k/test.parquet", "verl_data.parquet"])
def test_verl_parquet_is_read_as_written(name, tmp_path, gsm8k_dir, smollm2_tokenizer):
    path, rows = verl_file(tmp_path / name, gsm8k_dir)
    spec = DatasetSpec(source=str(path), split="test", chat_template=True, system_prompt=SYSTEM)
    examples = load_examples(spec)
    assert resolve_preset(spec, rows[0]).name == "verl" and default_verifier(spec) == "data_source"
    for ex, row in zip(examples, rows):
        assert ex.answer == row["reward_model"]["ground_truth"] and ex.data_source == "openai/gsm8k"
        assert ex.question == row["prompt"][0]["content"] and ex.solution == row["extra_info"]["answer"]
        # Rendered exactly as the conversation is, with --system-prompt added because the row has no system turn.
        want = smollm2_tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, *row["prompt"]], tokenize=False, add_generation_prompt=True)
        assert render_prompt(ex, spec, smollm2_tokenizer) == want


def test_trl_conversation_keeps_its_own_system_turn(tmp_path, gsm8k_dir, smollm2_tokenizer):
    path, rows = trl_file(tmp_path / "trl_gsm8k.jsonl", gsm8k_dir)
    spec = DatasetSpec(source=str(path), split="test", chat_template=True, system_prompt="IGNORED: the row has its own")
    examples = load_examples(spec)
    assert resolve_preset(spec, rows[0]).name == "trl"
    for ex, row in zip(examples, rows):
        want = smollm2_tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        text = render_prompt(ex, spec, smollm2_tokenizer)
        assert text == want and "IGNORED" not in text and "#### <number>" not in text  # no preset instruction
        assert ex.answer == row["answer"].split("####")[-1].strip().replace(",", "") and ex.question == row["prompt"][1]["content"]


def test_messages_last_assistant_turn_is_the_reference(tmp_path, gsm8k_dir, smollm2_tokenizer):
    rows = [{"messages": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]} for r in gsm8k_rows(gsm8k_dir)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = DatasetSpec(source=str(tmp_path / "chat.jsonl"), split="test", chat_template=True)
    ex = load_examples(spec)
    assert resolve_preset(spec, rows[0]).name == "messages"
    assert ex[0].answer == "18" and ex[0].solution == rows[0]["messages"][1]["content"]
    assert render_prompt(ex[0], spec, smollm2_tokenizer) == smollm2_tokenizer.apply_chat_template(rows[0]["messages"][:1], tokenize=False, add_generation_prompt=True)


def test_a_prompt_that_ends_with_the_assistant_s_words_is_continued(tmp_path, smollm2_tokenizer):
    """TRL continues a final assistant message (a prefill); topr closed it and opened a new turn, so the model answered
    after its own words were ended, the prefill's answer leaking in as a finished turn."""
    prompt = [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "Let me think step by step."}]
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": prompt, "answer": "2"}) + "\n")
    spec = DatasetSpec(source=str(tmp_path / "p.jsonl"), split="train", chat_template=True)
    (ex,) = load_examples(spec)
    text = render_prompt(ex, spec, smollm2_tokenizer)
    assert text == smollm2_tokenizer.apply_chat_template(prompt, tokenize=False, continue_final_message=True)
    assert text.endswith("Let me think step by step.")


@pytest.mark.parametrize("prompt, words", [
    ([{"role": "user"}], "message 0 must be a mapping with string 'role' and 'content'"),
    ([{"role": "narrator", "content": "x"}], "role 'narrator'"),
    ([{"role": "system", "content": "x"}], "no user turn"),
])
def test_a_malformed_conversation_is_one_clear_error(tmp_path, prompt, words):
    rows = [{"prompt": [{"role": "user", "content": "fine"}], "answer": "1"}, {"prompt": prompt, "answer": "2"}]
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError, match=words) as e:
        load_examples(DatasetSpec(source=str(tmp_path / "bad.jsonl"), split="test"))
    assert "row 1" in str(e.value) and "\n" not in str(e.value)


def test_chat_messages_need_the_chat_template(tmp_path, gsm8k_dir):
    path, _ = trl_file(tmp_path / "t.jsonl", gsm8k_dir, n=1)
    spec = DatasetSpec(source=str(path), split="test")
    with pytest.raises(UserError, match="holds chat messages — pass --chat-template"):
        render_prompt(load_examples(spec)[0], spec)


def test_nested_columns_and_a_literal_dotted_name(tmp_path):
    table = pa.table({"q": ["What is 2+3?"], "reward_model": [{"ground_truth": "5", "style": "rule"}], "reward_model.ground_truth": ["LITERAL"]})
    pq.write_table(table, tmp_path / "n.parquet")
    spec = DatasetSpec(source=str(tmp_path / "n.parquet"), split="test", question_column="q", answer_column="reward_model.ground_truth")
    assert load_examples(spec)[0].answer == "LITERAL"  # a column named a.b wins over the path
    pq.write_table(table.drop_columns(["reward_model.ground_truth"]), tmp_path / "m.parquet")
    assert load_examples(DatasetSpec(source=str(tmp_path / "m.parquet"), question_column="q", answer_column="reward_model.ground_truth"))[0].answer == "5"
    (tmp_path / "c.csv").write_text("q,a\nWhat?,1\n")
    with pytest.raises(UserError, match="CSV files have no nested columns"):
        load_examples(DatasetSpec(source=str(tmp_path / "c.csv"), question_column="q", answer_column="reward_model.ground_truth"))


def test_few_shot_prompts_hold_k_examples_never_the_problem(gsm8k_dir, smollm2_tokenizer):
    spec = DatasetSpec(source="builtin:gsm8k", split="test", limit=5, few_shot=8)
    examples = load_examples(spec)
    train = {e.question for e in load_examples(DatasetSpec(source="builtin:gsm8k", split="train"))}
    for ex in examples:
        assert len(ex.shots) == 8 and len({s.prompt_id for s in ex.shots}) == 8
        assert all(s.question in train and s.question != ex.question and "####" in s.solution for s in ex.shots)
        text = render_prompt(ex, spec)
        assert text.count("Question: ") == 9 and text.rstrip().endswith(ex.question + "\nAnswer:")
    assert [s.prompt_id for s in load_examples(spec)[0].shots] == [s.prompt_id for s in examples[0].shots]  # seeded: the same again
    # From the test split itself: the problem is never its own example.
    same = load_examples(DatasetSpec(source="builtin:gsm8k", split="test", limit=20, few_shot=4, few_shot_split="test"))
    assert all(ex.question not in {s.question for s in ex.shots} for ex in same)
    # Under a chat template: alternating user/assistant turns before the problem.
    chat = DatasetSpec(source="builtin:gsm8k", split="test", limit=1, few_shot=4, chat_template=True)
    ex = load_examples(chat)[0]
    text = render_prompt(ex, chat, smollm2_tokenizer)
    assert text.count("<|im_start|>user") == 5 and text.count("<|im_start|>assistant") == 5  # 4 answered, 1 to answer
    assert text.index(ex.shots[-1].solution) < text.index(ex.question)


@pytest.mark.real_model
def test_verl_data_generated_and_scored_by_data_source(tmp_path, gsm8k_dir, smollm2_dir, smollm2_tokenizer):
    """generate keeps the conversation and data_source; score picks gsm8k by data_source and rewards a right `#### n`."""
    path, rows = verl_file(tmp_path / "gsm8k.parquet", gsm8k_dir, n=2)
    r = CliRunner().invoke(app, ["generate", "-m", str(smollm2_dir), "-d", str(path), "--split", "test", "-o", str(tmp_path / "s"),
                                 "--chat-template", "--n", "1", "--max-new-tokens", "4", "--backend", "hf", "--json"])
    assert r.exit_code == 0, r.output
    samples = pq.read_table(tmp_path / "s" / "shard-00000.parquet")
    assert samples.column("data_source").to_pylist() == ["openai/gsm8k"] * 2
    assert samples.column("messages").to_pylist() == [row["prompt"] for row in rows]
    assert samples.column("prompt").to_pylist() == [smollm2_tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in rows]
    assert samples.column("answer").to_pylist() == [row["reward_model"]["ground_truth"] for row in rows]
    # The model's 4 tokens are wrong; a completion ending in the right `#### n` is rewarded.
    right = samples.set_column(samples.schema.get_field_index("completion"), "completion",
                               pa.array([f"Step by step.\n#### {row['reward_model']['ground_truth']}" for row in rows]))
    from toprcli import shards

    shards.write_shard(tmp_path / "right", 0, right, metadata=shards.read_file_metadata(tmp_path / "s" / "shard-00000.parquet"))
    shutil.copy(tmp_path / "s" / shards.MANIFEST_NAME, tmp_path / "right")  # a finished samples directory
    for src, want in (("s", -1.0), ("right", 1.0)):
        r = CliRunner().invoke(app, ["score", "-s", str(tmp_path / src), "-o", str(tmp_path / f"{src}-scored"), "--verifier", "data_source", "-w", "1", "--json"])
        assert r.exit_code == 0, r.output
        assert pq.read_table(tmp_path / f"{src}-scored").column("reward").to_pylist() == [want, want]
    # verifier-data reads what came of it: the question a verifier is shown is the conversation's last user turn.
    r = CliRunner().invoke(app, ["verifier-data", "-s", str(tmp_path / "right-scored"), "-o", str(tmp_path / "v.parquet"), "--json"])
    assert r.exit_code == 0, r.output
    verify = pq.read_table(tmp_path / "v.parquet").to_pylist()
    assert [v["answer"] for v in verify] == ["Yes", "Yes"] and all(row["prompt"][0]["content"] in v["question"] for v, row in zip(verify, rows))
    r = CliRunner().invoke(app, ["score", "-s", str(tmp_path / "right"), "-o", str(tmp_path / "x"), "--verifier", "data_source",
                                 "--set", "verifier_by_source={}"])
    assert r.exit_code == 2 and "no verifier for data_source openai/gsm8k" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("completion", [[{"role": "assistant", "content": "1 + 1 = 2\n#### 2"}], "1 + 1 = 2\n#### 2"])
def test_trl_prompt_completion_rows_take_the_gold_from_the_completion(tmp_path, completion):
    """TRL's prompt-completion format: the reference is `completion` (assistant turns, or text). It was ignored
    and the gold was silently None, so every sample failed to score."""
    f = tmp_path / "trl.jsonl"
    f.write_text(json.dumps({"prompt": [{"role": "user", "content": "1 + 1?"}], "completion": completion}) + "\n")
    ex = load_examples(DatasetSpec(source=str(f)))[0]
    assert resolve_preset(DatasetSpec(source=str(f)), {"prompt": [{"role": "user", "content": "x"}]}).name == "trl"
    assert (ex.answer, ex.solution) == ("2", "1 + 1 = 2\n#### 2")


def test_trl_standard_text_prompt_completion_takes_the_gold_from_the_completion(tmp_path):
    """TRL's standard (not conversational) prompt-completion: a text prompt. It loaded as plain columns with no gold,
    and eval reported pass@1 0 with every sample an unseen 'error'."""
    f = tmp_path / "trl.jsonl"
    f.write_text(json.dumps({"prompt": "1 + 1?", "completion": "1 + 1 = 2\n#### 2"}) + "\n")
    ex = load_examples(DatasetSpec(source=str(f)))[0]
    assert (ex.question, ex.answer, ex.messages) == ("1 + 1?", "2", None) and default_verifier(DatasetSpec(source=str(f))) == "gsm8k"  # a `#### n` reference


def test_an_explicit_answer_column_wins_over_the_conversations_last_turn(tmp_path):
    """A `messages` row with a separate final-answer column: --answer-column was ignored, and the whole reference
    solution was the gold, so a boxed 5 was wrong and a boxed 2 (a number in the check) right."""
    f = tmp_path / "chats.jsonl"
    turns = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "2+3 = 5. Check: 5 - 3 = 2."}]
    f.write_text(json.dumps({"messages": turns, "final": "5"}) + "\n")
    ex = load_examples(DatasetSpec(source=str(f), answer_column="final"))[0]
    assert (ex.answer, ex.solution) == ("5", "2+3 = 5. Check: 5 - 3 = 2.")


def test_columns_are_found_when_the_first_rows_value_is_null(tmp_path):
    """Columns were read off row 0: a null struct there made --answer-column meta.sol 'no column', and a verl file
    whose first reward_model is null was read as trl."""
    rows = [{"q": "A?", "meta": None}, {"q": "B?", "meta": {"sol": "#### 4"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "st.parquet")
    golds = [e.answer for e in load_examples(DatasetSpec(source=str(tmp_path / "st.parquet"), question_column="q", answer_column="meta.sol"))]
    assert golds == [None, "4"]  # and its "#### n" content, in the named column, reads as gsm8k


def test_few_shot_draws_on_when_the_problem_is_in_the_pool_twice():
    """A pool holding the problem twice: both copies may be drawn, leaving k - 1 examples and a false 'only N solved
    examples' error. Every seed now gets k examples, none of them the problem."""
    from types import SimpleNamespace

    from toprcli.data.formats import choose_shots

    pool = [SimpleNamespace(question="A?")] * 2 + [SimpleNamespace(question=f"Q{i}?") for i in range(20)]
    for seed in range(200):
        shots = choose_shots(pool, "p", "A?", 5, seed)
        assert len(shots) == 5 and all(s.question != "A?" for s in shots)


def test_a_text_question_column_is_the_question_under_the_chat_presets_too(tmp_path):
    """verl data for a base model (--question-column extra_info.question) was refused as 'expected a list of chat
    messages'; a prompt-only conversation with --answer-column was refused as not ending with the reference answer."""
    pq.write_table(pa.table({"data_source": ["openai/gsm8k"], "prompt": [[{"role": "user", "content": "What is 2+3? Think."}]],
                             "reward_model": [{"ground_truth": "5", "style": "rule"}], "extra_info": [{"question": "What is 2+3?"}]}),
                   tmp_path / "verl.parquet")
    (e,) = load_examples(DatasetSpec(source=str(tmp_path / "verl.parquet"), question_column="extra_info.question"))
    assert (e.question, e.answer, e.messages, e.data_source) == ("What is 2+3?", "5", None, "openai/gsm8k")
    (tmp_path / "m.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "2+3?"}], "answer": "5"}) + "\n")
    (e,) = load_examples(DatasetSpec(source=str(tmp_path / "m.jsonl"), answer_column="answer"))
    assert (e.question, e.answer, e.messages) == ("2+3?", "5", ({"role": "user", "content": "2+3?"},))
    (tmp_path / "d.jsonl").write_text(json.dumps({"question": {"text": "2+3?"}, "answer": "5"}) + "\n")  # it was the text "{'text': ...}"
    with pytest.raises(UserError, match=r"the question is a mapping \(fields: text\) — .*\(--question-column question.FIELD\)"):
        load_examples(DatasetSpec(source=str(tmp_path / "d.jsonl")))


def test_a_verl_ground_truth_list_of_one_is_its_answer_and_of_several_is_refused(tmp_path):
    """verl QA sets write ``ground_truth`` as a list of accepted answers; read as text, "['5']" matched no completion."""
    prompt = [[{"role": "user", "content": "What is 2+3?"}], [{"role": "user", "content": "What is 2+2?"}]]
    rows = {"data_source": ["qa", "qa"], "prompt": prompt, "ability": ["math", "math"]}
    pq.write_table(pa.table({**rows, "reward_model": [{"ground_truth": ["5"], "style": "rule"}, {"ground_truth": ["4"], "style": "rule"}]}),
                   tmp_path / "one.parquet")
    assert [e.answer for e in load_examples(DatasetSpec(source=str(tmp_path / "one.parquet"), split="test"))] == ["5", "4"]
    pq.write_table(pa.table({**rows, "reward_model": [{"ground_truth": ["5"], "style": "rule"}, {"ground_truth": ["4", "four"], "style": "rule"}]}),
                   tmp_path / "two.parquet")
    with pytest.raises(UserError, match=r"row 1, column 'reward_model.ground_truth': the gold answer is a list of 2"):
        load_examples(DatasetSpec(source=str(tmp_path / "two.parquet"), split="test"))


def test_a_list_answer_column_a_conversation_overrides_is_not_read(tmp_path):
    """An answer column holding no one answer (a list of several) beside a conversation: the conversation's last
    (assistant) turn is the reference, not a refusal."""
    rows = [{"messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "2+3=5\n#### 5"}], "answer": ["5", "five"]}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (example,) = load_examples(DatasetSpec(source=str(tmp_path / "m.jsonl"), split="train"))
    assert example.answer == "5"


def test_an_answer_column_beside_a_conversation_is_the_gold(tmp_path):
    """OpenR1-Math style, messages + answer: the gold was the whole assistant turn, from which the math verifier read the
    wrong number (\"Four apples plus 10 pears\" gave 10: the right answer scored -1). The turn is the worked solution."""
    turn = "Four apples plus 10 pears, so the total is four."
    rows = [{"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": turn}], "answer": "4"},
            {"messages": [{"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": "#### 3"}], "answer": None},
            {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "#### 4"}], "answer": " "}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    first, second, third = load_examples(DatasetSpec(source=str(tmp_path / "m.jsonl"), split="train"))
    assert (first.answer, first.solution, first.messages[-1]["role"]) == ("4", turn, "user")
    assert (second.answer, third.answer) == ("3", "4")  # a row with no (or a blank) answer: its own turn


@pytest.mark.parametrize("text", [json.dumps([{"role": "user", "content": "What is 1+1?"}]), str([{"role": "user", "content": "What is 1+1?"}])])
def test_a_conversation_saved_as_text_is_refused_not_sent_as_its_repr(tmp_path, text):
    """pandas' to_csv of TRL's conversational prompts (or a json.dumps of them): the model was sent the text
    "[{'role': 'user', ...", with exit 0."""
    import csv

    with open(tmp_path / "chat.csv", "w", newline="") as f:
        csv.writer(f).writerows([["prompt", "answer"], [text, "2"]])
    with pytest.raises(UserError, match=r"row 0, column 'prompt': the question is a conversation saved as text .* save the dataset as JSONL"):
        load_examples(DatasetSpec(source=str(tmp_path / "chat.csv"), split="train"))
    (tmp_path / "plain.csv").write_text('prompt,answer\n"[{1, 2}] is a set of two; how many role models?",2\n')  # not a chat
    assert load_examples(DatasetSpec(source=str(tmp_path / "plain.csv"), split="train"))[0].question.startswith("[{1, 2}]")
