"""Evaluation metrics: pass@k, maj@k, invalid rate — pure functions, no I/O.

The eval stage (``toprcli/eval_stage.py``) samples and scores; this module
only turns per-sample verdicts into numbers.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from decimal import Decimal, InvalidOperation

import numpy as np


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


def normalize_answer(answer: str | None) -> str | None:
    """Canonical form for voting: numbers compare by value (``18.00`` ≡ ``18``), text by stripped content."""
    if answer is None:
        return None
    text = answer.strip().replace(",", "").rstrip(".").strip()
    if not text:
        return None
    try:
        value = Decimal(text.lstrip("$"))
    except (InvalidOperation, ValueError):
        return " ".join(text.split())
    if not value.is_finite() or abs(value.adjusted()) > 100:
        return text
    return format(value.normalize(), "f")


def majority_vote_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """maj@k of one prompt: is the most common extracted answer correct?

    Samples with no answer do not vote; if none voted the prompt scores 0.
    Ties are broken uniformly at random *in expectation*: with m answers tied
    for the most votes, of which j are correct, the score is j/m. This is
    deterministic and unbiased, unlike first-seen tie-breaking.
    """
    votes: Counter[str] = Counter()
    group_correct: dict[str, bool] = defaultdict(bool)
    for a, ok in zip(answers, correct):
        key = normalize_answer(a)
        if key is None:
            continue
        votes[key] += 1
        group_correct[key] |= bool(ok)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [a for a, v in votes.items() if v == top]
    return sum(group_correct[a] for a in tied) / len(tied)


def eval_metrics(
    prompt_ids: Sequence[str],
    correct: Sequence[bool],
    extracted: Sequence[str | None],
    verdicts: Sequence[str],
    k: int,
) -> dict[str, float]:
    """pass@1, pass@k, maj@k and invalid rate over sampled completions.

    pass@1 is the mean correctness over all samples (= the unbiased estimator
    at k=1); pass@k uses the unbiased estimator per prompt with the prompt's
    sample count n ≥ k; maj@k votes over the first k samples of each prompt.
    The invalid rate is the share of samples with no extractable answer.
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for i, pid in enumerate(prompt_ids):
        groups[pid].append(i)
    if not groups:
        raise ValueError("no samples to evaluate")
    pass1, passk, majk = [], [], []
    for rows in groups.values():
        n = len(rows)
        c = sum(bool(correct[i]) for i in rows)
        pass1.append(c / n)
        passk.append(pass_at_k(n, c, min(k, n)))
        first = rows[:k]
        majk.append(majority_vote_correct([extracted[i] for i in first], [correct[i] for i in first]))
    invalid = sum(v == "no_answer" for v in verdicts) / len(verdicts)
    return {
        "prompts": len(groups),
        "samples": len(prompt_ids),
        "pass@1": float(np.mean(pass1)),
        f"pass@{k}": float(np.mean(passk)),
        f"maj@{k}": float(np.mean(majk)),
        "invalid_rate": float(invalid),
    }


def accuracy(correct: Iterable[bool]) -> float:
    values = [bool(c) for c in correct]
    return sum(values) / len(values) if values else math.nan
