"""log π of completion tokens, computed in chunks of positions over the LM head.

Pure tensor code (no files, no config). The trainer's log-probs must describe
the distribution the sampler drew from, so every logit row goes through
:func:`toprcli.sampling.token_logprobs` with the data's processing (temperature,
min-p, top-k, top-p; the sampled token always kept), in float32 whatever the
model's compute dtype.

Memory: a (tokens × vocabulary) logits tensor is never formed. The hidden
states of the positions that predict completion tokens are gathered, (P, H),
and projected ``chunk_size`` positions at a time; with gradients on, each
chunk is checkpointed, so backward recomputes its (chunk, V) logits instead of
keeping them. Peak memory for the head is a few (chunk × V) float32 buffers,
independent of the micro-batch's length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from toprcli.sampling import Processing, token_logprobs

# Default chunk: about 2**25 logits (128 MiB of float32) per projection.
CHUNK_ELEMENTS = 2**25


def default_chunk_size(vocab_size: int) -> int:
    return max(16, CHUNK_ELEMENTS // max(1, vocab_size))


def completion_index(prompt_lens: torch.Tensor, completion_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the completion tokens of a right-padded batch are.

    Row i of the batch is prompt_i (p_i ≥ 1 tokens) then completion_i (c_i
    tokens). Returns ``(rows, cols, positions)``, each (P,) with P = Σ c_i:
    completion token ``cols`` of row ``rows`` sits at ``positions + 1`` and is
    predicted by the hidden state at ``positions`` = p_i − 1 + j.
    """
    device = prompt_lens.device
    rows = torch.repeat_interleave(torch.arange(len(completion_lens), device=device), completion_lens)  # (P,)
    starts = torch.cumsum(completion_lens, 0) - completion_lens  # (B,)
    cols = torch.arange(int(completion_lens.sum()), device=device) - starts[rows]  # (P,)
    positions = prompt_lens[rows] - 1 + cols
    return rows, cols, positions


def _chunk(head: Callable[[torch.Tensor], torch.Tensor], processing: Processing, with_entropy: bool):
    def run(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = token_logprobs(head(hidden), targets, processing, with_entropy=with_entropy)
        return lp, (ent if ent is not None else torch.zeros_like(lp))

    return run


def chunked_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    processing: Processing,
    *,
    chunk_size: int,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Processed log-probs of ``targets`` (P,) from ``hidden`` (P, H), ``chunk_size`` rows at a time.

    ``head`` maps hidden states (n, H) to logits (n, V) (the LM head, with any
    logit scaling the model applies). Returns ``(logprobs (P,), entropy (P,) or
    None)``; with gradients enabled each chunk is recomputed in backward.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    run = _chunk(head, processing, with_entropy)
    lps, ents = [], []
    grad = torch.is_grad_enabled()  # the head's weight may need a gradient even if hidden does not
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if grad:
            lp, ent = checkpoint(run, h, t, use_reentrant=False)
        else:
            lp, ent = run(h, t)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def scatter_completion(values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, batch: int, width: int) -> torch.Tensor:
    """Per-token values (P,) into a completion-aligned (B, C) tensor (0 on padding)."""
    out = values.new_zeros(batch, width)
    return out.index_put((rows, cols), values)
