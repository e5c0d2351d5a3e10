"""log π of given completion tokens under a causal LM, at the sampling temperature.

Pure tensor code (no files). The trainer's log-probs must describe the same
distribution the sampler drew from, so the logits are divided by the sampling
temperature before the softmax (ARCHITECTURE.md §4), and computed in float32
whatever the model's compute dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    prompt_lens: torch.Tensor,
    completion_lens: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log π(y_j | x, y_<j) for every completion token, completion-aligned.

    Row i of ``input_ids`` (B, T) is prompt_i (p_i tokens, p_i ≥ 1) followed by
    completion_i (c_i tokens), right-padded. Completion token j sits at position
    p_i + j and is predicted by the logits at p_i + j − 1. Only the logits from
    position k0 = min_i p_i − 1 onwards are computed (``logits_to_keep``), so
    prompts cost no vocabulary projection.

        log π_{i,j} = z[y] / τ − logsumexp(z / τ),   z = logits at p_i + j − 1

    Returns ``(logprobs (B, C), entropy (B, C) or None)`` with C = max(max_i c_i, 1);
    entries past c_i are garbage-but-finite and must be masked by the caller.
    Entropy H = −Σ_v π_v log π_v (with gradient) only when ``with_entropy``.
    """
    B, T = input_ids.shape
    k0 = int(prompt_lens.min()) - 1
    keep = T - k0  # positions k0 .. T-1 (the last one predicts nothing)
    try:
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits
    except TypeError:  # a model class without ``logits_to_keep``: compute all, keep the tail
        logits = model(input_ids=input_ids, use_cache=False).logits[:, -keep:]
    logits = logits[:, :-1].float()  # (B, K, V), K = T-1-k0, position k0+q predicts token k0+q+1
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, k0 + 1 :]  # (B, K)
    K, V = logits.shape[1], logits.shape[2]
    token_lp = -F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none").view(B, K)
    C = max(int(completion_lens.max()), 1)
    # Completion token j of row i ↔ kept position p_i − 1 − k0 + j.
    idx = (prompt_lens - 1 - k0).unsqueeze(1) + torch.arange(C, device=input_ids.device).unsqueeze(0)
    idx = idx.clamp(max=K - 1)
    logprobs = token_lp.gather(1, idx)  # (B, C)
    entropy = None
    if with_entropy:
        logp = torch.log_softmax(logits, dim=-1)
        ent = -(logp.exp() * logp).sum(-1)  # (B, K)
        entropy = ent.gather(1, idx)
    return logprobs, entropy
