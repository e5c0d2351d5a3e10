"""Majority-vote keys: which extracted answers count as the same vote.

maj@k (:func:`toprcli.evaluation.eval_metrics`) counts votes per key within a
prompt; this module computes the keys.

* A verifier without ``equivalent`` (gsm8k, exact, regex, plugins): the key is
  its ``vote_key`` — the form its check compares (gsm8k: the number, so
  ``-$5`` ≡ ``−5`` ≡ ``-5.00``; exact and regex: the text, whitespace
  collapsed, so ``Paris.`` and ``Paris`` are two votes, as the check tells them
  apart) — else :func:`~toprcli.evaluation.normalize_answer`. No worker is started.
* math: answers vote together when math-verify finds them equivalent
  (``\\frac{1}{2}`` ≡ ``0.5``). Per prompt, over its first ``k`` samples:
  identical strings merge first; every string some sample got right is
  equivalent to the gold, so all of them form one vote with no comparison;
  the other strings are clustered greedily, most-voted first: each leader is
  compared with every string not yet placed, by the verifier's ``equivalent``
  in the :class:`~toprcli.verifiers.pool.VerifierPool` (worker processes, the
  per-check time limit; a comparison that times out counts as different) —
  except two plain numbers, compared by value here when that settles it
  (equal values, or two different integers).
  Clustering stops as soon as the strings still unplaced hold fewer votes
  than the largest vote so far: whatever they form can neither win nor tie.

All prompts advance together: one round sends one leader's comparisons for
every prompt still clustering, so the workers stay busy.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from decimal import Decimal

from toprcli.evaluation import normalize_answer
from toprcli.verifiers.base import Verifier
from toprcli.verifiers.pool import DEFAULT_TIMEOUT, VerifierPool
from toprcli.verifiers.registry import resolve_verifier

CORRECT_KEY = 0  # the vote of the answers that were verified correct
_PLAIN_NUMBER_RE = re.compile(r"-?\d{1,50}(?:\.\d{1,50})?")


class _Prompt:
    """The distinct incorrect answers of one prompt and how far their clustering got."""

    __slots__ = ("texts", "counts", "cluster", "unplaced", "best")

    def __init__(self, texts: list[str], counts: list[int], best: int) -> None:
        order = sorted(range(len(texts)), key=lambda i: -counts[i])  # stable: first seen wins ties
        self.texts = [texts[i] for i in order]
        self.counts = [counts[i] for i in order]
        self.cluster = list(range(1, len(texts) + 1))  # own key each until merged (0 is CORRECT_KEY)
        self.unplaced = list(range(len(texts)))
        self.best = best  # largest vote so far (the correct answers' to start with)

    def next_leader(self) -> int | None:
        """The next leader, or None when nothing left could reach ``best``."""
        if len(self.unplaced) < 2 or sum(self.counts[i] for i in self.unplaced) < self.best:
            return None
        return self.unplaced[0]


def voting_verifier(spec: str, sources: Sequence[str | None], by_source: dict[str, str]) -> str:
    """The verifier whose equivalence groups votes: ``spec``; under ``data_source``, the one verifier every row's
    source names (rows of several verifiers vote by their text)."""
    if spec != "data_source":
        return spec
    named = {by_source.get(s) for s in set(sources)}
    return named.pop() if len(named) == 1 and None not in named else spec


def vote_keys(
    verifier: Verifier | str,
    prompt_ids: Sequence[str],
    extracted: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    *,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    pool: VerifierPool | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Hashable | None]:
    """One vote key per sample (None: no vote), for ``eval_metrics(..., vote_keys=...)``.

    Samples are taken in the order given; only the first ``k`` of each prompt
    vote, as in maj@k. ``pool``: a running pool of the same verifier to use
    (else one is started when there is something to compare, and closed).
    """
    if isinstance(verifier, str):
        verifier = resolve_verifier(verifier)
    n = len(prompt_ids)
    if len(extracted) != n or len(correct) != n:
        raise ValueError("prompt_ids, extracted and correct must have the same length")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    rows: dict[str, list[int]] = defaultdict(list)
    for i, pid in enumerate(prompt_ids):
        if len(rows[pid]) < k:
            rows[pid].append(i)
    keys: list[Hashable | None] = [None] * n
    if verifier.equivalent is None:
        key_of = verifier.vote_key or normalize_answer
        for voting in rows.values():
            for i in voting:
                text = extracted[i]
                # Answers the verifier judged correct say the same as the gold, however written: one vote.
                keys[i] = None if text is None or not text.strip() else CORRECT_KEY if correct[i] else key_of(text)
        return keys

    prompts: dict[str, _Prompt] = {}
    for pid, voting in rows.items():
        text_of = {i: extracted[i].strip() for i in voting if extracted[i] is not None and extracted[i].strip()}
        right = {t for i, t in text_of.items() if correct[i]}
        # A wrong answer whose text is a right one's (both clipped alike, past MAX_EXTRACTED_CHARS): a vote of its own kind.
        clashing = {i: t for i, t in text_of.items() if not correct[i] and t in right}
        for i, t in clashing.items():
            del text_of[i]
            keys[i] = ("wrong, written as a right answer", t)
        counts: dict[str, int] = defaultdict(int)
        for t in text_of.values():
            counts[t] += 1
        wrong = [t for t in counts if t not in right]
        p = _Prompt(wrong, [counts[t] for t in wrong], best=sum(counts[t] for t in right))
        prompts[pid] = p
        key_of = {t: CORRECT_KEY for t in right}
        for i, t in text_of.items():
            keys[i] = key_of.get(t)  # wrong answers are filled in after clustering

    _cluster(prompts, verifier, pool, workers, timeout, progress)

    for pid, voting in rows.items():
        p = prompts[pid]
        key_of = {t: c for t, c in zip(p.texts, p.cluster)}
        for i in voting:
            if keys[i] is None and extracted[i] is not None and extracted[i].strip():
                keys[i] = key_of[extracted[i].strip()]
    return keys


def _numbers_equal(a: str, b: str) -> bool | None:
    """Two plain numbers: equal values are the same answer, different integers are not; else None (ask the pool)."""
    if not (_PLAIN_NUMBER_RE.fullmatch(a) and _PLAIN_NUMBER_RE.fullmatch(b)):
        return None
    if Decimal(a) == Decimal(b):
        return True
    # Decimals that differ may still be equal to math-verify's rounding (0.3333333 vs 0.333333).
    return False if "." not in a and "." not in b else None


def _cluster(
    prompts: dict[str, _Prompt],
    verifier: Verifier,
    pool: VerifierPool | None,
    workers: int | None,
    timeout: float,
    progress: Callable[[int], None] | None,
) -> None:
    own_pool = None
    try:
        while True:
            batch: list[tuple[_Prompt, int, int]] = []  # (prompt, leader, candidate)
            for p in prompts.values():
                lead = p.next_leader()
                if lead is None:
                    p.unplaced = []
                    continue
                batch += [(p, lead, j) for j in p.unplaced[1:]]
            if not batch:
                return
            same = [_numbers_equal(p.texts[lead], p.texts[j]) for p, lead, j in batch]
            ask = [i for i, v in enumerate(same) if v is None]
            if ask:
                if pool is None:
                    pool = own_pool = VerifierPool(verifier, workers=workers, timeout=timeout)
                pairs = [(batch[i][0].texts[batch[i][1]], batch[i][0].texts[batch[i][2]]) for i in ask]
                for i, eq in zip(ask, pool.equivalent(pairs, progress=progress)):
                    same[i] = eq
            joined: dict[int, list[int]] = defaultdict(list)
            for (p, lead, j), eq in zip(batch, same):
                if eq:
                    joined[id(p)].append(j)
            for p in {id(p): p for p, _, _ in batch}.values():
                lead = p.unplaced[0]
                members = set(joined.get(id(p), ()))
                for j in members:
                    p.cluster[j] = p.cluster[lead]
                p.best = max(p.best, p.counts[lead] + sum(p.counts[j] for j in members))
                p.unplaced = [j for j in p.unplaced[1:] if j not in members]
    finally:
        if own_pool is not None:
            own_pool.close()
