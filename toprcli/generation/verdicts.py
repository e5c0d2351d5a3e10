"""A generative verifier's P(Yes): the probabilities of the verdict words at the verdict position.

GenRM's direct score (Zhang et al. 2024): show the verifier a verification
prompt (:mod:`toprcli.data.verification`) and read how likely its answer is to
start with the verdict ``Yes`` rather than ``No``. Each verdict may be spelled
with or without a leading space (a plain ``...Verdict:`` prompt is answered
`` Yes``, a chat turn ``Yes``), so

    P(Yes) = Σ_s P(s | prompt) over the spellings s of Yes, likewise P(No),
    score = P(Yes) / (P(Yes) + P(No)),    verdict mass = P(Yes) + P(No),

where P(s | prompt) is the probability of the whole token sequence of ``s``
(one token with most BPE vocabularies, several with a character vocabulary)
under the model's own distribution (temperature 1, no truncation), computed
by the engine that serves the verifier (:meth:`continuation_logprobs` of a
generation backend: vLLM's prompt log-probs, or a transformers forward).
1 − verdict mass is how likely the verifier's first words are *not* a verdict:
the invalid-verdict rate to expect when sampling it at temperature 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from toprcli.data.verification import NO, YES
from toprcli.errors import UserError
from toprcli.generation.base import GenerationBackend

SPELLINGS = {YES: ("Yes", " Yes"), NO: ("No", " No")}


def spelling_ids(tokenizer: Any) -> dict[str, list[list[int]]]:
    """The distinct token sequences of each verdict's spellings (no special tokens), and the vocabulary's own
    token for a spelling: a SentencePiece tokenizer that adds a leading space encodes "Yes" and " Yes" alike as
    ``▁Yes``, but a chat turn after a newline starts with its ``Yes`` piece, which would go unscored."""
    out: dict[str, list[list[int]]] = {}
    for verdict, spellings in SPELLINGS.items():
        seqs: list[list[int]] = []
        for s in spellings:
            piece = tokenizer.convert_tokens_to_ids(s)
            for ids in (list(tokenizer(s, add_special_tokens=False)["input_ids"]), [piece] if _known(tokenizer, piece) else []):
                if ids and ids not in seqs:
                    seqs.append(ids)
        out[verdict] = seqs
    if set(map(tuple, out[YES])) & set(map(tuple, out[NO])):
        raise ValueError("the tokenizer spells Yes and No alike")
    return out


def _known(tokenizer: Any, token_id: Any) -> bool:
    return isinstance(token_id, int) and token_id != getattr(tokenizer, "unk_token_id", None)


def verdict_scores(backend: GenerationBackend, tokenizer: Any, prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(score, verdict mass) of each verification prompt, both (N,) float64, from ``backend``'s model."""
    spellings = spelling_ids(tokenizer)
    _check_context(prompts, max(len(ids) for variants in spellings.values() for ids in variants), getattr(backend, "max_model_len", None))
    owners: list[tuple[int, str]] = []  # (prompt index, verdict) of each scored continuation
    heads: list[list[int]] = []
    tails: list[list[int]] = []
    for i, p in enumerate(prompts):
        for verdict, variants in spellings.items():
            for ids in variants:
                owners.append((i, verdict))
                heads.append(list(p))
                tails.append(ids)
    logp = backend.continuation_logprobs(heads, tails)
    mass = {YES: np.zeros(len(prompts)), NO: np.zeros(len(prompts))}
    for (i, verdict), lp in zip(owners, logp):
        mass[verdict][i] += np.exp(lp)
    total = mass[YES] + mass[NO]
    score = np.divide(mass[YES], total, out=np.full(len(prompts), 0.5), where=total > 0)
    return score, total


def _check_context(prompts: list[list[int]], verdict_tokens: int, context: int | None) -> None:
    """A verification prompt and its verdict must fit the verifier's context: past it, a transformers forward reads
    positions the model never had and vLLM refuses the request."""
    long = [len(p) for p in prompts if context is not None and len(p) + verdict_tokens >= context]  # vLLM keeps one position free
    if long:
        raise UserError(f"{len(long)} of {len(prompts)} verification prompts do not fit the verifier's context of {context} tokens with "
                        f"a verdict (the longest: {max(long)} tokens) — judge shorter candidates (a lower --max-new-tokens) or use a "
                        "verifier with a longer context")
