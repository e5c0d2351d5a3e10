"""Evaluation metrics: pass@k, maj@k, invalid rate, and the measures of a verifier — pure functions, no I/O.

The eval stage (``toprcli/stages/eval.py``) samples and scores; this module
only turns per-sample verdicts into numbers. Which answers vote together for
maj@k is decided outside (:mod:`toprcli.verifiers.voting`, where the math
verifier compares answers in its worker pool); here votes are keys.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from decimal import Decimal, InvalidOperation

import numpy as np


class FewerSamplesThanK(UserWarning):
    """Some prompts have fewer than k samples: their pass@k and maj@k use the n they have."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``n`` samples of which ``c`` are correct.

    pass@k = 1 − C(n−c, k) / C(n, k)  (Chen et al., 2021), computed as a
    product so it never forms huge binomials: 1 − Π_{i=n−c+1}^{n} (1 − k/i).
    Requires k ≤ n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


_THOUSANDS = re.compile(r"[-+]?\$?\d{1,3}(,\d{3})+(\.\d*)?")  # 1,234,567.5: commas that group digits, nothing else


def normalize_answer(answer: str | None) -> str | None:
    """Canonical form for voting: numbers compare by value (``18.00`` ≡ ``18``, ``1,000`` ≡ ``1000``), text by
    stripped content (``1,2`` is a list, not 12)."""
    if answer is None:
        return None
    text = answer.strip().rstrip(".").strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if not text:
        return None
    sign, number = re.fullmatch(r"([-+]?)\$?(.*)", text, re.S).groups()  # -$5 is -5, as $-5 and -5 are
    try:
        value = Decimal(sign + number)
    except (InvalidOperation, ValueError):
        return " ".join(text.split())
    if not value.is_finite() or abs(value.adjusted()) > 100:
        return text
    return format(value.normalize() + 0, "f")  # + 0: -0 is 0


def majority_vote_correct(
    keys: Sequence[Hashable | None], correct: Sequence[bool], weights: Sequence[float] | None = None
) -> float:
    """maj@k of one prompt: is the most voted answer correct?

    ``keys``: one vote key per sample — samples with equal keys gave the same
    answer (:func:`normalize_answer` of the extracted answers, or cluster ids);
    None: no answer, no vote. ``weights``: what each vote counts (a verifier's
    score: weighted majority voting); default 1. If none voted the prompt
    scores 0. A key is correct if any of its samples is. Ties are broken
    uniformly at random *in expectation*: with m keys tied for the most votes,
    of which j are correct, the score is j/m. This is deterministic and
    unbiased, unlike first-seen tie-breaking.
    """
    votes: Counter[Hashable] = Counter()
    group_correct: dict[Hashable, bool] = defaultdict(bool)
    for i, (key, ok) in enumerate(zip(keys, correct)):
        if key is None:
            continue
        votes[key] += 1 if weights is None else float(weights[i])
        group_correct[key] |= bool(ok)
    if not votes:
        return 0.0
    top = max(votes.values())
    # Weights summed in floats: three votes of 1/3 make 0.9999999 against a 1.0 — that is a tie, not a loss.
    tied = [a for a, v in votes.items() if math.isclose(v, top, rel_tol=1e-6)]
    return sum(group_correct[a] for a in tied) / len(tied)


def prompt_scores(
    prompt_ids: Sequence[str],
    correct: Sequence[bool],
    k: int,
    vote_keys: Sequence[Hashable | None],
) -> tuple[dict[str, dict[str, float]], list[int]]:
    """Per prompt: pass@1 (share correct), pass@k (unbiased) and maj@k (over its first k samples), as
    ``{"pass@1": {prompt_id: value}, ...}``; and the sample counts of prompts with fewer than k samples."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, pid in enumerate(prompt_ids):
        groups[pid].append(i)
    if not groups:
        raise ValueError("no samples to evaluate")
    scores: dict[str, dict[str, float]] = {"pass@1": {}, "pass@k": {}, "maj@k": {}}
    short = []
    for pid, rows in groups.items():
        n, c = len(rows), sum(bool(correct[i]) for i in rows)
        if n < k:
            short.append(n)
        first = rows[:k]
        scores["pass@1"][pid] = c / n
        scores["pass@k"][pid] = pass_at_k(n, c, min(k, n))
        scores["maj@k"][pid] = majority_vote_correct([vote_keys[i] for i in first], [correct[i] for i in first])
    return scores, short


def eval_metrics(
    prompt_ids: Sequence[str],
    correct: Sequence[bool],
    extracted: Sequence[str | None],
    invalid: Sequence[bool],
    k: int,
    vote_keys: Sequence[Hashable | None] | None = None,
) -> dict[str, float]:
    """pass@1, pass@k, maj@k and invalid rate over sampled completions.

    pass@1 is the mean over prompts of each prompt's share of correct samples
    (= the unbiased estimator at k=1; the mean over all samples when every
    prompt has as many); pass@k uses the unbiased estimator per prompt; maj@k votes over
    the first k samples of each prompt, by ``vote_keys`` (default:
    :func:`normalize_answer` of ``extracted``). A prompt with n < k samples
    can only give pass@n and maj@n: those are used for it, counted in
    ``prompts_fewer_than_k`` and announced with a :class:`FewerSamplesThanK`
    warning. The invalid rate is the share of samples flagged ``invalid`` (no
    extractable answer: the ``no_answer`` verdict). All sequences are (N,), one
    entry per sample.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for name, values in (("correct", correct), ("extracted", extracted), ("invalid", invalid), ("vote_keys", vote_keys)):
        if values is not None and len(values) != len(prompt_ids):  # a short invalid list gave an invalid rate of 1.0
            raise ValueError(f"{len(values)} {name} for {len(prompt_ids)} samples (prompt_ids)")
    if vote_keys is None:
        vote_keys = [normalize_answer(a) for a in extracted]
    return summarize_scores(*prompt_scores(prompt_ids, correct, k, vote_keys), k=k, samples=len(prompt_ids), invalid=invalid)


def summarize_scores(scores: dict[str, dict[str, float]], short: list[int], *, k: int, samples: int, invalid: Sequence[bool]) -> dict[str, float]:
    """:func:`eval_metrics` from :func:`prompt_scores`' output (for callers that keep the per-prompt scores)."""
    if short:
        warnings.warn(
            f"pass@{k}/maj@{k}: {len(short)} of {len(scores['pass@1'])} prompts have fewer than {k} samples "
            f"(as few as {min(short)}); for those, pass@n and maj@n of their n samples are averaged in",
            FewerSamplesThanK,
            stacklevel=2,
        )
    invalid_rate = sum(bool(v) for v in invalid) / len(invalid)
    return {
        "prompts": len(scores["pass@1"]),
        "samples": samples,
        "pass@1": float(np.mean(list(scores["pass@1"].values()))),
        f"pass@{k}": float(np.mean(list(scores["pass@k"].values()))),
        f"maj@{k}": float(np.mean(list(scores["maj@k"].values()))),
        "invalid_rate": float(invalid_rate),
        "prompts_fewer_than_k": len(short),
    }


def bootstrap_interval(values: Sequence[float], *, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (N,), one per prompt.

    Draws ``resamples`` samples of N prompts with replacement (numpy's default_rng(seed)), takes
    each one's mean, and returns the empirical (1 − level)/2 and (1 + level)/2 quantiles (inverse
    CDF: each bound is a mean some resample had).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError(f"need a non-empty 1-d sequence of per-prompt values, got shape {x.shape}")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need resamples >= 1 and 0 < level < 1, got {resamples}, {level}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 256):  # (256, N) indices at a time: bounded memory
        idx = rng.integers(0, len(x), size=(min(256, resamples - start), len(x)))
        means[start:start + len(idx)] = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(lo), float(hi)


def paired_bootstrap_interval(a: dict[str, float], b: dict[str, float], **kw) -> tuple[float, float, int]:
    """Interval of mean(a − b) over the prompts both were evaluated on (same prompt ids), resampling
    prompts jointly; returns (low, high, prompts shared)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two evaluations share no prompt")
    lo, hi = bootstrap_interval([a[p] - b[p] for p in shared], **kw)
    return lo, hi, len(shared)


def accuracy(correct: Iterable[bool]) -> float:
    values = [bool(c) for c in correct]
    return sum(values) / len(values) if values else math.nan


# -- a verifier's measures ------------------------------------------------------------


def best_of_k_correct(scores: Sequence[float], correct: Sequence[bool]) -> float:
    """Best-of-k of one prompt: is the candidate the verifier scores highest correct?

    Ties for the highest score count in expectation (j correct of m tied: j/m).
    """
    if len(scores) != len(correct):
        raise ValueError(f"{len(scores)} scores for {len(correct)} candidates (correct)")
    if len(scores) == 0:
        return 0.0
    s = np.asarray(scores, dtype=np.float64)
    top = s == s.max()
    return float(np.asarray(correct, dtype=bool)[top].mean())


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for ``labels``: the chance that a random
    positive outscores a random negative, ties counting half (Mann–Whitney U / n₊n₋).
    NaN when one class is absent."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    # Average ranks over ties (1-based).
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def verifier_prompt_scores(
    prompt_ids: Sequence[str], correct: Sequence[bool], vote_keys: Sequence[Hashable | None], scores: Sequence[float], k: int
) -> dict[str, dict[str, float]]:
    """Per prompt, over its first ``k`` candidates: best-of-k by the verifier's scores, the verifier-weighted and the
    plain majority vote, as ``{"best_of_k_verifier": {prompt_id: value}, "weighted_maj@k": ..., "candidates_maj@k": ...}``
    (what :func:`verifier_metrics` averages, and a bootstrap over prompts resamples). Sequences are (N,)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, pid in enumerate(prompt_ids):
        groups[pid].append(i)
    out: dict[str, dict[str, float]] = {"best_of_k_verifier": {}, "weighted_maj@k": {}, "candidates_maj@k": {}}
    for pid, rows in groups.items():
        first = rows[:k]
        c = [bool(correct[i]) for i in first]
        out["best_of_k_verifier"][pid] = best_of_k_correct([scores[i] for i in first], c)
        out["weighted_maj@k"][pid] = majority_vote_correct([vote_keys[i] for i in first], c, [scores[i] for i in first])
        out["candidates_maj@k"][pid] = majority_vote_correct([vote_keys[i] for i in first], c)
    return out


def verifier_metrics(
    prompt_ids: Sequence[str],
    correct: Sequence[bool],
    vote_keys: Sequence[Hashable | None],
    scores: Sequence[float],
    k: int,
    valid: Sequence[float] | None = None,
    per_prompt: dict[str, dict[str, float]] | None = None,
) -> dict[str, float]:
    """How a verifier's scores of sampled candidates help (GenRM's measures; the paper's Table 2).

    Per prompt, over its first ``k`` candidates (in the order given): best-of-k
    (:func:`best_of_k_correct`), verifier-weighted majority vote
    (:func:`majority_vote_correct` with the scores as weights) and plain maj@k
    on the same candidates. Over every candidate: the verifier's accuracy (it
    calls a candidate correct when its score ≥ 0.5; a candidate it gave no
    valid verdict, ``valid`` 0, is a wrong call whatever its score) and the ROC
    AUC of its scores. ``per_prompt``: :func:`verifier_prompt_scores` of the same, when the caller has it. All sequences are (N,), one entry per candidate; scores
    in [0, 1].
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not (len(prompt_ids) == len(correct) == len(vote_keys) == len(scores) == len(scores if valid is None else valid)):
        raise ValueError("prompt_ids, correct, vote_keys, scores and valid must have the same length")
    per_prompt = per_prompt or verifier_prompt_scores(prompt_ids, correct, vote_keys, scores, k)
    best, weighted, plain = (list(per_prompt[key].values()) for key in ("best_of_k_verifier", "weighted_maj@k", "candidates_maj@k"))
    y = np.asarray(correct, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    decided = np.ones(len(s), dtype=bool) if valid is None else np.asarray(valid, dtype=np.float64) > 0  # (N,)
    return {
        "candidates": len(s),
        f"best_of_{k}_verifier": float(np.mean(best)),
        f"weighted_maj@{k}": float(np.mean(weighted)),
        f"candidates_maj@{k}": float(np.mean(plain)),
        "candidates_pass@1": float(y.mean()),
        "verifier_accuracy": float((((s >= 0.5) == y) & decided).mean()),
        "verifier_auc": roc_auc(s, y),
    }
