"""maj@k votes by answer equivalence: vote keys, the pool's equivalence checks, real SmolLM2 output."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pyarrow as pa
import pytest

from builders import gsm8k_rows
from conftest import FIXTURES
from toprcli import shards
from toprcli.config import EvalConfig, ScoreConfig
from toprcli.evaluation import eval_metrics, normalize_answer
from toprcli.stages.eval import _sampled_metrics
from toprcli.stages.score import run as score
from toprcli.verifiers import VerifierPool, resolve_verifier
from toprcli.verifiers import math_verifier as mv
from toprcli.verifiers import voting
from toprcli.verifiers.voting import CORRECT_KEY, vote_keys


def score_dir(samples, out, cfg: ScoreConfig):
    """The score stage on ``samples`` into ``out`` with the other settings of ``cfg``."""
    return score(replace(cfg, samples=str(samples), out=str(out)))


DATA = FIXTURES


@pytest.fixture(scope="module")
def math_pool():
    with VerifierPool("math", workers=1, timeout=5) as pool:
        yield pool


def test_equivalent_answers_share_a_vote(math_pool):
    """Issue 14: [1/2, 0.5, 3, 3] with gold 1/2 is a tie between 1/2 and 3: maj = 0.5."""
    answers = ["\\frac{1}{2}", "0.5", "3", "3"]
    correct = [mv.check(f"The answer is $\\boxed{{{a}}}$.", "1/2").correct for a in answers]
    assert correct == [True, True, False, False]
    pids, verdicts = ["p"] * 4, [False] * 4  # verdicts: invalid flags (none)
    keys = vote_keys(math_pool.verifier, pids, answers, correct, 4, pool=math_pool)
    assert keys[0] == keys[1] == CORRECT_KEY and keys[2] == keys[3] != CORRECT_KEY
    assert eval_metrics(pids, correct, answers, verdicts, 4, vote_keys=keys)["maj@4"] == 0.5
    assert eval_metrics(pids, correct, answers, verdicts, 4)["maj@4"] == 0.0  # by string: 3 wins


def test_equivalent_wrong_answers_share_a_vote(math_pool):
    # 0.3 and 3/10 are one wrong answer with two votes: it beats the single right one.
    answers, correct = ["\\frac{1}{2}", "0.3", "\\frac{3}{10}", "7"], [True, False, False, False]
    pids, verdicts = ["p"] * 4, [False] * 4
    keys = vote_keys(math_pool.verifier, pids, answers, correct, 4, pool=math_pool)
    assert keys[1] == keys[2] and len({keys[0], keys[1], keys[3]}) == 3
    assert eval_metrics(pids, correct, answers, verdicts, 4, vote_keys=keys)["maj@4"] == 0.0
    assert eval_metrics(pids, correct, answers, verdicts, 4)["maj@4"] == pytest.approx(1 / 4)


def test_wrong_answers_clipped_like_a_right_one_do_not_vote_with_it(math_pool):
    """Extracted answers are clipped to 200 characters: two long wrong answers that share the right one's first 200 took
    its vote, and maj@k counted three votes for the right answer (it has one)."""
    from toprcli.verifiers.base import clip_text

    clipped = clip_text("x^{2}+" * 60 + "1")
    answers, correct = [clipped] * 3, [True, False, False]
    keys = vote_keys(math_pool.verifier, ["p"] * 3, answers, correct, 3, pool=math_pool)
    assert keys[0] == CORRECT_KEY and keys[1] == keys[2] != CORRECT_KEY
    assert eval_metrics(["p"] * 3, correct, answers, [False] * 3, 3, vote_keys=keys)["maj@3"] == 0.0


class RecordingPool:
    """Stands in for a VerifierPool: equivalence by a table of values, every comparison recorded."""

    def __init__(self, value: dict[str, object]) -> None:
        self.value = value
        self.pairs: list[tuple[str, str]] = []

    def equivalent(self, pairs, progress=None):
        self.pairs += pairs
        return [self.value[a] == self.value[b] for a, b in pairs]


def test_clustering_stops_when_nothing_left_can_win_or_tie():
    math = resolve_verifier("math")
    value = {"a": 1, "b": 2, "c": 3, "d": 2, "e": 5}
    # The right answer "a" has 3 votes; the wrong ones hold 2 < 3 together: no comparison at all.
    pool = RecordingPool(value)
    keys = vote_keys(math, ["p"] * 5, ["a", "a", "a", "b", "c"], [True] * 3 + [False] * 2, 5, pool=pool)
    assert pool.pairs == [] and keys[:3] == [CORRECT_KEY] * 3 and keys[3] != keys[4]
    # b (2 votes) leads and takes d: 3 votes. c and e hold 2 < 3 together: never compared.
    pool = RecordingPool(value)
    answers, correct = ["a", "b", "b", "d", "c", "e"], [True] + [False] * 5
    keys = vote_keys(math, ["p"] * 6, answers, correct, 6, pool=pool)
    assert pool.pairs == [("b", "d"), ("b", "c"), ("b", "e")]
    assert keys[1] == keys[2] == keys[3] and len({keys[0], keys[1], keys[4], keys[5]}) == 4
    assert eval_metrics(["p"] * 6, correct, answers, [False] * 6, 6, vote_keys=keys)["maj@6"] == 0.0
    # Single votes all round: every pair that could still tie is compared.
    pool = RecordingPool(value)
    keys = vote_keys(math, ["p"] * 4, ["b", "c", "d", "e"], [False] * 4, 4, pool=pool)
    assert pool.pairs == [("b", "c"), ("b", "d"), ("b", "e"), ("c", "e")]
    assert keys[0] == keys[2] and len(set(keys)) == 3


def test_only_the_first_k_samples_vote_and_prompts_are_separate():
    pool = RecordingPool({"u": 1, "v": 2, "x": 1})
    pids = ["p", "p", "p", "q", "q"]
    keys = vote_keys(resolve_verifier("math"), pids, ["u", "v", "x", "x", "u"], [False] * 5, 2, pool=pool)
    assert keys[2] is None  # the third sample of p: beyond k = 2, so p's "x" is never compared
    assert pool.pairs == [("u", "v"), ("x", "u")]
    assert keys[0] != keys[1] and keys[3] == keys[4]


def test_plain_numbers_are_compared_by_value_without_the_pool():
    value = {"x": 0.5, "0.5": 0.5, "0.50": 0.5, "7": 7, "007": 7, "8": 8, "0.3333333": 1 / 3, "0.333333": 1 / 3}
    pool = RecordingPool(value)
    answers = ["0.3333333", "0.3333333", "0.333333", "7", "007", "8", "0.5", "0.50", "x"]
    keys = vote_keys(resolve_verifier("math"), ["p"] * 9, answers, [False] * 9, 9, pool=pool)
    assert keys[0] == keys[1] == keys[2] and keys[3] == keys[4] != keys[5] and keys[6] == keys[7] == keys[8]
    asked = {frozenset(pair) for pair in pool.pairs}
    # Integers and equal decimals are settled by value; decimals that differ (math-verify rounds),
    # and anything not a plain number, go to the pool.
    assert not asked & {frozenset(("7", "007")), frozenset(("7", "8")), frozenset(("0.5", "0.50"))}
    assert {frozenset(("0.3333333", "0.333333")), frozenset(("7", "x")), frozenset(("0.5", "x"))} <= asked


def test_gsm8k_votes_are_unchanged_and_start_no_pool(monkeypatch):
    def no_pool(*a, **k):
        raise AssertionError("gsm8k voting must not start a pool")

    monkeypatch.setattr(voting, "VerifierPool", no_pool)
    rows = gsm8k_rows()[:50]
    pids, answers, correct = [], [], []
    for i, r in enumerate(rows):
        gold = r["answer"].rsplit("####", 1)[1].strip()
        for k, a in enumerate([gold, gold + ".00", "7", "7", None, "1,000"][: 2 + i % 5]):
            pids.append(f"p{i}")
            answers.append(a)
            correct.append(a is not None and normalize_answer(a) == normalize_answer(gold))
    verdicts = [a is None for a in answers]  # invalid: no answer
    keys = vote_keys("gsm8k", pids, answers, correct, 4)
    assert keys == [(CORRECT_KEY if c else normalize_answer(a)) if i < 4 and a is not None else None
                    for a, c, i in zip(answers, correct, _index_in_prompt(pids))]
    with pytest.warns(UserWarning):  # some prompts have fewer than 4 samples
        before = eval_metrics(pids, correct, answers, verdicts, 4)
    with pytest.warns(UserWarning):
        after = eval_metrics(pids, correct, answers, verdicts, 4, vote_keys=keys)
    assert after == before


def test_answers_vote_together_exactly_when_the_check_treats_them_alike():
    """A vote key is the form the verifier's check compares. gsm8k reads -$5, $-5, −5 (Unicode minus), -5.00 as
    one number: one vote, which wins here (it was three votes, and 7 won). exact tells "Paris." from "Paris":
    two votes, the wrong one wins (merged by value-and-punctuation normalisation, maj@k said 1.0)."""
    from toprcli.evaluation import prompt_scores

    answers = ["-$5", "$-5", "−5", "-5.00", "7", "7", "7"]
    correct = [True] * 4 + [False] * 3
    keys = vote_keys("gsm8k", ["p"] * 7, answers, correct, 7)
    assert len(set(keys[:4])) == 1 and prompt_scores(["p"] * 7, correct, 7, keys)[0]["maj@k"] == {"p": 1.0}
    assert vote_keys("gsm8k", ["p", "p"], ["-0", "0"], [False, False], 2) == ["0", "0"]
    answers, correct = ["Paris.", "Paris.", "Paris", "Lyon"], [False, False, True, False]
    for verifier in ("exact", "regex:(.+)"):
        keys = vote_keys(verifier, ["p"] * 4, answers, correct, 4)
        assert keys == ["Paris.", "Paris.", CORRECT_KEY, "Lyon"] and prompt_scores(["p"] * 4, correct, 4, keys)[0]["maj@k"] == {"p": 0.0}


def test_answers_judged_correct_vote_together_without_an_equivalence():
    """A verifier with no equivalence of its own (data_source, regex, plugins): answers it judged correct all say the
    gold, one vote. verl math data (data_source) split 1/2, 0.5 and \\dfrac{1}{2} into three votes and lost to 3, 3."""
    from toprcli.evaluation import prompt_scores

    answers, correct = ["\\frac{1}{2}", "0.5", "\\dfrac{1}{2}", "3", "3"], [True, True, True, False, False]
    keys = vote_keys("data_source", ["p"] * 5, answers, correct, 5)
    assert keys[:3] == [CORRECT_KEY] * 3 and prompt_scores(["p"] * 5, correct, 5, keys)[0]["maj@k"] == {"p": 1.0}


def _index_in_prompt(pids):
    seen: dict[str, int] = {}
    out = []
    for p in pids:
        out.append(seen.get(p, 0))
        seen[p] = out[-1] + 1
    return out


def test_equivalence_timeout_counts_as_different():
    # Expanding two 14th powers of trinomials takes seconds in sympy; the limit is half a second.
    with VerifierPool("math", workers=1, timeout=0.5) as pool:
        t = time.perf_counter()
        same = pool.equivalent([("(x+y+z)^{14}", "(x+y+z+1)^{14}"), ("\\frac{1}{2}", "0.5"), ("3", "4")])
        assert same == [False, True, False]
        assert pool.stats["timeouts"] == 1
        assert time.perf_counter() - t < 30


def test_pool_refuses_equivalence_for_a_verifier_without_one():
    with VerifierPool("exact", workers=1) as pool, pytest.raises(ValueError, match="no equivalence"):
        pool.equivalent([("a", "a")])


# -- real SmolLM2 completions -------------------------------------------------------


def smollm2_rows() -> list[dict]:
    return [json.loads(line) for line in (DATA / "smollm2_math_sample.jsonl").read_text().splitlines()]


def samples_table(rows: list[dict]) -> pa.Table:
    n = len(rows)
    return pa.table(
        {
            "prompt_id": [r["problem"] for r in rows],
            "prompt": [r["problem"] for r in rows],
            "answer": [r["answer"] for r in rows],
            "prompt_token_ids": [[1]] * n,
            "sample_index": [r["sample_index"] for r in rows],
            "completion": [r["completion"] for r in rows],
            "completion_token_ids": [[1]] * n,
            "behavior_logprobs": [[0.0]] * n,
            "finish_reason": [r["finish_reason"] for r in rows],
            "policy": ["SmolLM2-135M-Instruct"] * n,
            "iteration": [0] * n,
        },
        schema=shards.SAMPLES_SCHEMA.with_metadata(None),
    )


def test_real_smollm2_completions_score_like_math_verify_and_vote_by_equivalence(tmp_path):
    rows = smollm2_rows()
    assert len(rows) == 64
    shards.write_shard(tmp_path / "samples", 0, samples_table(rows))
    result = score_dir(tmp_path / "samples", tmp_path / "scored", ScoreConfig(verifier="math", workers=1))
    assert result["verdicts"]["error"] == 0 and result["verdicts"]["timeout"] == 0
    scored = shards.read_table(tmp_path / "scored").to_pylist()
    scored.sort(key=lambda r: (r["prompt_id"], r["sample_index"]))
    # Same verdicts as math-verify alone, except where it misreads a bare gold: it reads
    # "5\sqrt{2}" as 5, so the model's \sqrt{50} (m06) is right only for us.
    differ = [(r["prompt_id"], r["extracted_answer"]) for r, raw in zip(scored, rows) if r["correct"] != raw["raw_math_verify"]]
    assert differ == [("m06", "\\sqrt{50}")]
    assert sum(r["correct"] for r in scored) == 4

    # maj@4 through the eval stage's call site. m06: the model's majority answer is
    # 50 (also written \sqrt{50}\cdot\sqrt{50}), not the right \sqrt{50}: 0 instead of a 4-way tie's 1/4.
    table = pa.Table.from_pylist(scored)
    cfg = EvalConfig(verifier="math", k=4, workers=1)
    m, per_prompt = _sampled_metrics(cfg, table)
    assert sum(per_prompt["maj@k"].values()) == pytest.approx(0.5)  # the per-prompt scores the intervals resample
    by_string = eval_metrics(
        [r["prompt_id"] for r in scored], [r["correct"] for r in scored], [r["extracted_answer"] for r in scored],
        [r["verdict"] == "no_answer" for r in scored], 4,
    )
    assert by_string["maj@4"] == pytest.approx(0.75 / 16)
    assert m["maj@4"] == pytest.approx(0.5 / 16)
    assert m.pop("error_rate") == 0.0  # the eval stage's own: checks that failed, and completions cut at max_new_tokens
    assert m.pop("truncated_rate") == pytest.approx(sum(r["finish_reason"] == "length" for r in scored) / len(scored))
    assert {k: v for k, v in m.items() if k != "maj@4"} == {k: v for k, v in by_string.items() if k != "maj@4"}
