"""The registered policy losses: each a pure per-token loss, reduced by ``aggregate``.

Shapes and notation: see :mod:`toprcli.losses`. Raises ``ValueError``.
"""

from __future__ import annotations

import math

import torch

from toprcli.losses.core import (
    LOG_RATIO_CLAMP,
    _as_float,
    _check,
    _log_ratio,
    _masked_frac,
    _reinforce,
    _safe_div,
    register_loss,
)


@register_loss(
    "topr",
    description="TOPR: positives as SFT, negatives weighted by clip(π/μ, 0, 1) (sequence ratio, stop-grad)",
)
def topr_loss(logprobs, behavior_logprobs, advantages, mask, *, ratio_level="sequence",
              positive_weight=1.0, negative_weight=1.0):
    """Tapered Off-Policy REINFORCE (Le Roux et al. 2025, Eq. 8).

    α_i = 1 if A_i ≥ 0 else clip(exp(s_i), 0, 1), s_i the sequence log-ratio;
    l_{i,t} = −sg(α_i) · w± · A_i log π_{i,t} with w± = ``positive_weight`` (w₊)
    if A_i ≥ 0 else ``negative_weight`` (w₋), both ≥ 0 and 1 by default (the
    paper); not the curated row weight, which the aggregation applies.
    ``ratio_level="token"`` uses α_{i,t} = clip(π_t/μ_t, 0, 1) per token
    instead. exp(min(s, 0)) ∈ [0, 1] never overflows (in float32 it is 0 below s ≈ −103).
    Shapes: (B, T), (B, T), (B,), (B, T) → (B, T).

    The weights scale the two terms after any whitening or clipping of A, so
    they are not a baseline: with ±1 rewards, a constant c and no whitening,
    (w₊, w₋) gives the same direction as c = (w₋ − w₊)/(w₋ + w₊), but whitening
    removes any constant c while the weights survive it (docs/from-roll.md).
    """
    for name, w in (("positive_weight", positive_weight), ("negative_weight", negative_weight)):
        v = _as_float(w)
        _check(v is not None and 0 <= v < math.inf, "topr", f"{name} must be a finite number ≥ 0, got {w!r}")
    positive_weight, negative_weight = float(positive_weight), float(negative_weight)
    log_r = _log_ratio(logprobs, behavior_logprobs, mask, ratio_level)  # (B,1)|(B,T)
    neg = (advantages < 0).unsqueeze(-1)  # (B, 1)
    alpha = torch.where(neg, torch.exp(log_r.clamp(max=0.0)), torch.ones_like(log_r))
    metrics = {}
    if ratio_level == "token":
        neg_tok = neg.to(mask.dtype) * mask
        metrics["neg_token_alpha_mean"] = _safe_div((alpha * neg_tok).sum(), neg_tok.sum())
        metrics["neg_tokens"] = neg_tok.sum()  # what the mean is over (the trainer weights micro-batches by it)
    if positive_weight != 1.0 or negative_weight != 1.0:
        side = torch.where(neg, torch.full_like(alpha[:, :1], negative_weight),
                           torch.full_like(alpha[:, :1], positive_weight))  # (B, 1)
        alpha = alpha * side
    return _reinforce(alpha, logprobs, advantages), metrics


@register_loss("sft", description="positives only (coef 1 for A > 0), negatives dropped", uses_behavior=False, trains_negatives=False)
def sft_loss(logprobs, behavior_logprobs, advantages, mask):
    """l_{i,t} = −1[A_i > 0] A_i log π_{i,t}."""
    coef = (advantages > 0).to(logprobs.dtype).unsqueeze(-1)  # (B, 1)
    return _reinforce(coef, logprobs, advantages), {}


@register_loss("reinforce", description="naive off-policy REINFORCE: coef 1 for every sample", uses_behavior=False)
def reinforce_loss(logprobs, behavior_logprobs, advantages, mask):
    """l_{i,t} = −A_i log π_{i,t} (ignores μ: biased when π ≠ μ)."""
    return _reinforce(torch.ones_like(advantages).unsqueeze(-1), logprobs, advantages), {}


@register_loss(
    "is",
    description="importance sampling: coef min(π/μ, max_weight) (stop-grad) for every sample",
)
def is_loss(logprobs, behavior_logprobs, advantages, mask, *, max_weight=1e3, ratio_level="sequence"):
    """l_{i,t} = −sg(min(exp(s_i), W)) A_i log π_{i,t}, computed as exp(min(s_i, log W)).

    W = ``max_weight`` (default 1e3) is a safety cap, not a bias/variance knob:
    it only keeps the weight finite (exp(s) of a sequence ratio overflows for
    s > 88 in float32). Use ``tis`` to truncate on purpose.
    """
    _check(
        max_weight is not None and 0 < float(max_weight) < math.inf,
        "is", f"max_weight must be a finite number > 0, got {max_weight!r}",
    )
    log_r = _log_ratio(logprobs, behavior_logprobs, mask, ratio_level)
    cap = math.log(float(max_weight))
    coef = torch.exp(log_r.clamp(max=cap))
    return _reinforce(coef, logprobs, advantages), _masked_frac(log_r > cap, mask)


@register_loss(
    "tis",
    description="truncated importance sampling: coef clip(π/μ, lower, upper) for every sample",
)
def tis_loss(logprobs, behavior_logprobs, advantages, mask, *, lower=0.0, upper=1.0, ratio_level="sequence"):
    """l_{i,t} = −sg(clip(exp(s_i), a, b)) A_i log π_{i,t}, a = ``lower``, b = ``upper``.

    Defaults [0, 1] are the truncation at 1 of V-trace/IMPALA (ρ̄ = 1), the
    "truncated IS" baseline TOPR is compared with: unlike TOPR it also tapers
    positives that π has made less likely than μ did. Computed as
    max(exp(min(s, log b)), a).
    """
    _check(
        lower is not None and upper is not None and 0 <= float(lower) <= float(upper) < math.inf
        and float(upper) > 0,
        "tis", f"need 0 ≤ lower ≤ upper < inf and upper > 0, got lower={lower!r} upper={upper!r}",
    )
    log_r = _log_ratio(logprobs, behavior_logprobs, mask, ratio_level)
    log_b = math.log(float(upper))
    coef = torch.exp(log_r.clamp(max=log_b)).clamp(min=float(lower))
    clipped = (log_r > log_b) | (torch.exp(log_r.clamp(max=log_b)) < float(lower))
    return _reinforce(coef, logprobs, advantages), _masked_frac(clipped, mask)


@register_loss(
    "ppo",
    description="PPO clipped surrogate per token (grad through r), optional dual clip for A < 0",
)
def ppo_loss(logprobs, behavior_logprobs, advantages, mask, *, clip_ratio=0.2, clip_low=None,
             clip_high=None, dual_clip=None):
    """l_{i,t} = max(−r A, −clip(r, 1−ε_lo, 1+ε_hi) A); if A < 0 and c = ``dual_clip``:
    l = min(l, −c A).

    r_t = exp(clamp(log π_t − log μ_t, ±20)) carries the gradient (surrogate
    form, not REINFORCE form). ε_lo = ``clip_low`` if set else ``clip_ratio``,
    same for ε_hi (verl's convention). ``dual_clip`` c > 1 (verl uses 3.0).
    """
    eps_lo = float(clip_ratio if clip_low is None else clip_low)
    eps_hi = float(clip_ratio if clip_high is None else clip_high)
    _check(eps_lo >= 0 and eps_hi >= 0, "ppo", f"clip ranges must be ≥ 0, got low={eps_lo} high={eps_hi}")
    _check(dual_clip is None or float(dual_clip) > 1.0, "ppo", f"dual_clip must be > 1, got {dual_clip!r}")
    a = advantages.unsqueeze(-1)  # (B, 1)
    ratio = torch.exp((logprobs - behavior_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T)
    l1 = -a * ratio
    l2 = -a * ratio.clamp(1.0 - eps_lo, 1.0 + eps_hi)
    loss = torch.maximum(l1, l2)
    metrics = _masked_frac(l2 > l1, mask)
    if dual_clip is not None:
        l3 = -a * float(dual_clip)
        dual = (a < 0) & (l3 < loss)
        loss = torch.where(dual, l3.expand_as(loss), loss)
        metrics.update(_masked_frac(dual, mask, "dual_clip_frac"))
    return loss, metrics


@register_loss(
    "cispo",
    description="CISPO (MiniMax-M1): coef sg(clip(r_t, 1−ε_lo, 1+ε_hi)) per token on log π",
)
def cispo_loss(logprobs, behavior_logprobs, advantages, mask, *, clip_low=None, clip_high=0.28):
    """l_{i,t} = −sg(clip(r_t, 1−ε_lo, 1+ε_hi)) A_i log π_{i,t}.

    MiniMax-M1 sets no lower bound ("ε_low large") and tunes only ε_high;
    ``clip_low=None`` means no lower bound; ε_high = 0.28 follows common
    implementations (DAPO's clip-higher value; trinity-rft's default). Clipping
    done on the log-ratio: exp(clamp(log r, log(1−ε_lo), log(1+ε_hi))).
    """
    _check(clip_high is not None and float(clip_high) >= 0, "cispo", f"clip_high must be ≥ 0, got {clip_high!r}")
    _check(clip_low is None or float(clip_low) >= 0, "cispo", f"clip_low must be ≥ 0 or None, got {clip_low!r}")
    log_r = (logprobs.detach() - behavior_logprobs) * mask  # (B, T)
    hi = math.log1p(float(clip_high))
    lo = None if clip_low is None or float(clip_low) >= 1.0 else math.log1p(-float(clip_low))
    coef = torch.exp(log_r.clamp(min=lo, max=hi))
    clipped = (log_r > hi) if lo is None else (log_r > hi) | (log_r < lo)
    return _reinforce(coef, logprobs, advantages), _masked_frac(clipped, mask)


@register_loss(
    "kimi15",
    description="Kimi k1.5: −A log π + τ/2 (log π − log μ)² per token",
)
def kimi15_loss(logprobs, behavior_logprobs, advantages, mask, *, tau=0.1):
    """l_{i,t} = −A_i log π_{i,t} + τ/2 (log π_{i,t} − log μ_{i,t})².

    Kimi k1.5's gradient (their Eq. 3) is −A ∇log π + τ/2 ∇(log π/π_old)² at
    the sequence level; this is its per-token form (the squared term is per
    token, so it is reduced by the chosen aggregation like the rest). The
    paper does not publish τ; 0.1 is a starting point to tune.
    """
    _check(tau is not None and float(tau) >= 0, "kimi15", f"tau must be ≥ 0, got {tau!r}")
    d = logprobs - behavior_logprobs  # (B, T) with grad
    pg = -advantages.unsqueeze(-1) * logprobs
    return pg + 0.5 * float(tau) * d * d, {}


# --------------------------------------------------------------------------- #


@register_loss(
    "dpo",
    description="offline DPO on (chosen, rejected) pairs: −log σ(β·margin), reference = the round's starting policy",
    uses_behavior=False,
    pairwise=True,
    aggregation="seq-mean-token-sum",
)
def dpo_loss(logprobs, behavior_logprobs, advantages, mask, *, beta=0.1, label_smoothing=0.0):
    """Direct Preference Optimization (Rafailov et al. 2023), offline, from curated pairs.

    Rows come in pairs: rows 2k (chosen, A > 0) and 2k+1 (rejected, A < 0) of
    the same prompt; ``behavior_logprobs`` holds log π_ref, the reference policy's
    *unprocessed* log-probs (temperature 1). With the sequence log-ratio
    s_i = Σ_t m (log π − log π_ref) (a sum over tokens) and z_k = β (s_chosen − s_rejected),

        ℓ_k = −(1 − ε) log σ(z_k) − ε log σ(−z_k)          (ε = ``label_smoothing``, cDPO)

    Each row of pair k carries ℓ_k spread over its tokens (Σ_t l_{i,t} = ℓ_k), so
    under ``seq-mean-token-sum`` with unit weights the loss is the mean of ℓ_k over
    pairs, and a micro-batch of whole pairs is its exact share of the step.
    A batch with no completion tokens (a padding micro-batch) gives zeros.
    Shapes: (B, T), (B, T), (B,), (B, T) → (B, T), B even.
    """
    b = _as_float(beta)
    _check(b is not None and 0 < b < math.inf, "dpo", f"beta must be a finite number > 0, got {beta!r}")
    eps = _as_float(label_smoothing)
    _check(eps is not None and 0 <= eps < 0.5, "dpo", f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    B = logprobs.shape[0]
    if B % 2 or not bool(mask.any()):
        _check(not bool(mask.any()), "dpo", f"rows come in (chosen, rejected) pairs — got a batch of {B} rows")
        return logprobs * 0.0, {}
    pair_adv = advantages.view(-1, 2)  # (P, 2)
    _check(bool(((pair_adv[:, 0] > 0) & (pair_adv[:, 1] < 0)).all()), "dpo",
           "each pair must be (chosen with A > 0, rejected with A < 0), in that order")
    s = ((logprobs - behavior_logprobs) * mask).sum(-1).view(-1, 2)  # (P, 2) log π/π_ref per sequence, with grad
    z = float(b) * (s[:, 0] - s[:, 1])  # (P,)
    pair_loss = -(1.0 - float(eps)) * torch.nn.functional.logsigmoid(z) - float(eps) * torch.nn.functional.logsigmoid(-z)
    lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
    per_token = (pair_loss.repeat_interleave(2) / lengths).unsqueeze(-1) * mask  # (B, T)
    with torch.no_grad():
        metrics = {
            "dpo_reward_accuracy": (z > 0).to(logprobs.dtype).mean(),
            "dpo_margin": z.mean(),  # chosen − rejected reward, β-scaled as the rewards (TRL's rewards/margins)
            "dpo_chosen_reward": float(b) * s[:, 0].mean(),
            "dpo_rejected_reward": float(b) * s[:, 1].mean(),
        }
    return per_token, metrics
