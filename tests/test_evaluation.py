"""Eval metrics against hand-computed values."""

from __future__ import annotations

import math
import warnings
from math import comb

import pytest

from toprcli.evaluation import FewerSamplesThanK, eval_metrics, majority_vote_correct, normalize_answer, pass_at_k


@pytest.mark.parametrize("n,c,k", [(5, 2, 1), (5, 2, 2), (5, 2, 3), (5, 2, 4), (10, 0, 3), (10, 10, 3), (16, 3, 8)])
def test_pass_at_k_matches_the_binomial_formula(n, c, k):
    expected = 1 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - 1/6
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_vote_and_ties():
    assert majority_vote_correct(["5", "5", "7"], [True, True, False]) == 1.0
    assert majority_vote_correct(["7", "5", "7"], [False, True, False]) == 0.0
    # Tie between 5 (correct) and 7: expected credit 1/2.
    assert majority_vote_correct(["5", "7"], [True, False]) == 0.5
    # Three-way tie, one correct: 1/3.
    assert majority_vote_correct(["1", "2", "3"], [False, True, False]) == pytest.approx(1 / 3)
    # Equal keys vote together; no-answers (None) do not vote.
    keys = [normalize_answer(a) for a in ["18.00", "18", None, None, "3"]]
    assert majority_vote_correct(keys, [True, True, False, False, False]) == 1.0
    assert majority_vote_correct(["18.00", "18", None, None, "3"], [True, True, False, False, False]) == pytest.approx(2 / 3)
    assert majority_vote_correct([None, None], [False, False]) == 0.0


def test_normalize_answer():
    assert normalize_answer("1,000.") == "1000" and normalize_answer("$1,234,567.50") == "1234567.5"
    assert normalize_answer("1,2") == "1,2" != normalize_answer("12")  # a list (or a pair) is not the number 12
    assert normalize_answer("10,00") == "10,00"  # not digits grouped in threes: left as written
    assert normalize_answer("$18.50") == "18.5"
    assert normalize_answer(" x  y ") == "x y"
    assert normalize_answer("") is None and normalize_answer(None) is None
    # a sign before the dollar, and zero's sign: -$1,000 voted apart from -1000, and -0 from 0
    assert normalize_answer("-$1,000") == normalize_answer("-1000") == normalize_answer("$-1000") == "-1000"
    assert normalize_answer("-0") == normalize_answer("0") == "0" and normalize_answer("+3") == "3"


def test_eval_metrics_by_hand():
    # prompt a: 2 samples, 1 correct; prompt b: 2 samples, 0 correct, one has no answer.
    m = eval_metrics(
        ["a", "a", "b", "b"],
        [True, False, False, False],
        ["4", "5", None, "9"],
        [False, False, True, False],  # invalid: no answer
        k=2,
    )
    assert m["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["pass@2"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["maj@2"] == pytest.approx((0.5 + 0.0) / 2)  # a: tie 4 vs 5 -> 1/2
    assert m["invalid_rate"] == pytest.approx(0.25)
    assert m["prompts"] == 2 and m["samples"] == 4


def test_pass_at_k_with_fewer_samples_warns_and_counts_them():
    # a: 2 samples (1 correct), b: 3 samples (none correct); k = 3.
    args = (["a", "a", "b", "b", "b"], [True, False, False, False, False], ["1", "2", "3", "4", "5"], [False] * 5)
    with pytest.warns(FewerSamplesThanK, match=r"1 of 2 prompts have fewer than 3 samples \(as few as 2\)"):
        m = eval_metrics(*args, k=3)
    assert m["prompts_fewer_than_k"] == 1
    assert m["pass@3"] == pytest.approx((pass_at_k(2, 1, 2) + 0.0) / 2)  # a contributes its pass@2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enough samples: no warning
        m = eval_metrics(*args, k=2)
    assert m["prompts_fewer_than_k"] == 0


def test_vote_keys_replace_string_voting():
    pids, correct = ["a"] * 4, [True, True, False, False]
    answers, invalid = ["\\frac{1}{2}", "0.5", "3", "3"], [False] * 4
    assert eval_metrics(pids, correct, answers, invalid, k=4)["maj@4"] == 0.0
    assert eval_metrics(pids, correct, answers, invalid, k=4, vote_keys=[0, 0, 1, 1])["maj@4"] == 0.5
    with pytest.raises(ValueError, match="vote_keys for 4 samples"):
        eval_metrics(pids, correct, answers, invalid, k=4, vote_keys=[0, 0, 1])
    with pytest.raises(ValueError, match="k must be"):
        eval_metrics(pids, correct, answers, invalid, k=0)


# -- a verifier's measures --------------------------------------------------------------


def test_best_of_k_takes_the_top_score_and_shares_ties():
    from toprcli.evaluation import best_of_k_correct

    assert best_of_k_correct([0.1, 0.9, 0.5], [False, True, False]) == 1.0
    assert best_of_k_correct([0.1, 0.9, 0.5], [True, False, True]) == 0.0
    assert best_of_k_correct([0.7, 0.7, 0.2], [True, False, True]) == 0.5  # tied top: expected credit
    assert best_of_k_correct([], []) == 0.0


def test_weighted_majority_vote_by_hand():
    # Answers 5, 5, 7 (7 is correct). Plain vote: 5 wins. Weighted by the verifier: 5 gets 0.2 + 0.3, 7 gets 0.9.
    keys, correct, scores = ["5", "5", "7"], [False, False, True], [0.2, 0.3, 0.9]
    assert majority_vote_correct(keys, correct) == 0.0
    assert majority_vote_correct(keys, correct, scores) == 1.0
    assert majority_vote_correct(keys, correct, [0.25, 0.25, 0.5]) == 0.5  # 0.5 vs 0.5: a tie, half credit
    assert majority_vote_correct([None, None], [True, True], [1.0, 1.0]) == 0.0  # nobody voted


def test_roc_auc_by_hand():
    from toprcli.evaluation import roc_auc

    assert roc_auc([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == 1.0
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    # positives 0.8, 0.4; negatives 0.6, 0.4: pairs (0.8>0.6) 1, (0.8>0.4) 1, (0.4<0.6) 0, (0.4=0.4) 0.5 → 2.5/4
    assert roc_auc([0.8, 0.4, 0.6, 0.4], [True, True, False, False]) == pytest.approx(0.625)
    assert math.isnan(roc_auc([0.5, 0.6], [True, True]))


def test_verifier_metrics_by_hand():
    from toprcli.evaluation import verifier_metrics

    # prompt a: answers 1 (wrong), 1 (wrong), 2 (right); the verifier likes 2. prompt b: one right answer it dislikes.
    pids = ["a", "a", "a", "b"]
    correct = [False, False, True, True]
    keys = ["1", "1", "2", "9"]
    scores = [0.2, 0.4, 0.8, 0.3]
    m = verifier_metrics(pids, correct, keys, scores, k=3)
    assert m["best_of_3_verifier"] == 1.0  # a: 0.8 → right; b: its only candidate is right
    assert m["weighted_maj@3"] == 1.0  # a: "1" has 0.6, "2" has 0.8
    assert m["candidates_maj@3"] == 0.5  # a: "1" wins the plain vote; b: right
    assert m["candidates_pass@1"] == 0.5 and m["candidates"] == 4
    assert m["verifier_accuracy"] == 0.75  # 0.2 ✓ 0.4 ✓ 0.8 ✓ 0.3 ✗ (a right answer called wrong)
    assert m["verifier_auc"] == pytest.approx(((1 + 1) + (1 + 1) / 2 + 0) / 4)  # positives 0.8, 0.3 vs negatives 0.2, 0.4
    # only the first k candidates of a prompt count for the per-prompt measures
    assert verifier_metrics(pids, correct, keys, scores, k=2)["best_of_2_verifier"] == 0.5
    with pytest.raises(ValueError, match="same length"):
        verifier_metrics(pids, correct, keys, scores[:3], k=2)


def test_a_candidate_without_a_valid_verdict_is_a_wrong_call():
    """Sampled verdicts score 0.5 when none is valid, which is >= 0.5: a verifier that never answered had the accuracy
    of calling every candidate correct (its candidates' pass@1)."""
    from toprcli.evaluation import verifier_metrics

    pids, correct, keys = ["a", "a", "b", "b"], [True, False, True, False], ["1", "2", "3", "4"]
    silent = verifier_metrics(pids, correct, keys, [0.5] * 4, k=2, valid=[0.0] * 4)
    assert silent["verifier_accuracy"] == 0.0 and silent["candidates_pass@1"] == 0.5
    some = verifier_metrics(pids, correct, keys, [0.9, 0.5, 0.5, 0.1], k=2, valid=[1.0, 0.0, 0.25, 1.0])
    assert some["verifier_accuracy"] == 0.75  # ✓ (no verdict: ✗) ✓ ✓
    assert verifier_metrics(pids, correct, keys, [0.5] * 4, k=2)["verifier_accuracy"] == 0.5  # no validity given: scores alone


# -- intervals ------------------------------------------------------------------------


def _exact_interval(values, level):
    """The percentile interval of the bootstrap distribution computed exactly: all n**n resamples, equally likely."""
    import itertools

    import numpy as np

    means = sorted(float(np.mean(s)) for s in itertools.product(values, repeat=len(values)))
    cdf = np.arange(1, len(means) + 1) / len(means)
    q = [(1 - level) / 2, (1 + level) / 2]
    return tuple(means[int(np.searchsorted(cdf, x))] for x in q)  # inverse CDF: the smallest mean with F >= q


@pytest.mark.parametrize("values", [[0.0, 0.25, 1.0], [1.0, 0.0, 0.0], [0.5, 0.75, 0.125]])
@pytest.mark.parametrize("level", [0.95, 0.8, 0.5])
def test_bootstrap_interval_matches_the_exact_enumeration_for_n_3(values, level):
    from toprcli.evaluation import bootstrap_interval

    assert bootstrap_interval(values, resamples=200_000, seed=0, level=level) == pytest.approx(_exact_interval(values, level))
    assert bootstrap_interval(values, resamples=500, seed=3) == bootstrap_interval(values, resamples=500, seed=3)  # seeded


def test_paired_bootstrap_interval_of_a_difference():
    from toprcli.evaluation import bootstrap_interval, paired_bootstrap_interval

    a = {f"p{i}": float(i % 2) for i in range(40)}
    same = paired_bootstrap_interval(a, dict(a), resamples=300)
    assert same == (0.0, 0.0, 40)
    better = {p: 1.0 for p in a}  # correct everywhere a was wrong: +0.5 on the 40 shared prompts
    lo, hi, n = paired_bootstrap_interval(better, {**a, "only-in-a": 1.0}, resamples=2000, seed=1)
    assert n == 40 and 0 < lo <= 0.5 <= hi
    assert (lo, hi) == bootstrap_interval([better[p] - a[p] for p in sorted(a)], resamples=2000, seed=1)
    with pytest.raises(ValueError, match="share no prompt"):
        paired_bootstrap_interval({"x": 1.0}, {"y": 1.0})


def test_weighted_votes_that_tie_in_exact_arithmetic_tie_in_floats():
    """Three votes of 1/3 (sampled verdicts: 1 Yes of 3) against one of 1.0 is a tie: credit 1/2, not a loss."""
    import numpy as np

    third = np.float32(1 / 3)
    assert majority_vote_correct(["A", "A", "A", "B"], [False, False, False, True], [third, third, third, np.float32(1.0)]) == 0.5
    assert majority_vote_correct(["A"] * 5 + ["B"], [False] * 5 + [True], [np.float32(0.2)] * 5 + [np.float32(1.0)]) == 0.5


def test_inputs_of_other_lengths_are_a_value_error():
    """An `invalid` of length 1 gave an invalid rate of 1.0 in silence; a long `correct` was cut to fit; a short one
    was an IndexError."""
    from toprcli.evaluation import best_of_k_correct

    ids, ok, got = ["a", "a", "b", "b"], [True, False, True, True], ["1", "2", "3", "3"]
    for correct, extracted, invalid in ((ok, got, [True]), (ok + [True], got, [False] * 4), (ok[:3], got, [False] * 4), (ok, got[:1], [False] * 4)):
        with pytest.raises(ValueError, match="for 4 samples"):
            eval_metrics(ids, correct, extracted, invalid, k=2)
    with pytest.raises(ValueError, match="2 scores for 3 candidates"):
        best_of_k_correct([0.1, 0.9], [True, False, True])
