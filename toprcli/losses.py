"""Policy losses for offline RL of LLMs: pure tensor functions in one registry.

Nothing here reads files, configs or the CLI: every function takes tensors and
returns tensors. A trainer calls :func:`policy_loss` once per micro-batch.

Notation (shapes in comments throughout)::

    logprobs           (B, T)  log π(y_t | x, y_<t) of the sampled tokens, WITH grad
    behavior_logprobs  (B, T)  log μ of the same tokens (the sampler), no grad
    mask               (B, T)  1 on completion tokens, 0 on prompt/padding
    advantages         (B,)    A_i = R_i − c
    weights            (B,)    curation weight w_i ≥ 0 (default 1)

Every loss is written as a per-token loss l_{i,t} (B, T) and reduced by the ONE
function :func:`aggregate`. REINFORCE-form losses are

    l_{i,t} = − sg(coef_{i(,t)}) · A_i · log π_{i,t}

where sg is stop-gradient, so the coefficient only weights the score function
and never contributes a gradient of its own. Importance ratios are always
formed in log space: the sequence log-ratio is s_i = Σ_t m_{i,t}(log π − log μ)
and it is clamped from above before ``exp`` so nothing overflows.

Registered losses (``list_losses()``):

    topr      coef = w₊ if A ≥ 0 else w₋·clip(π/μ, 0, 1)        (TOPR, Le Roux et al. 2025, Eq. 8; w± = 1)
    sft       coef = 1 if A > 0 else 0                          (positives only)
    reinforce coef = 1                                          (naive off-policy REINFORCE)
    is        coef = min(π/μ, max_weight)                       (plain importance sampling)
    tis       coef = clip(π/μ, lower, upper)                    (truncated IS, all samples)
    ppo       l = max(−r A, −clip(r, 1−ε_lo, 1+ε_hi) A) [dual clip for A<0]; grad through r
    cispo     coef_t = clip(r_t, 1−ε_lo, 1+ε_hi)                 (MiniMax-M1)
    kimi15    l = −A log π_t + τ/2 (log π_t − log μ_t)²          (Kimi k1.5)

Generic options of :func:`policy_loss` (valid for every loss): ``adv_clip``,
``whiten_advantages``, a KL penalty to a reference (``ref_logprobs``,
``kl_coef``, ``kl_estimator``) and an entropy bonus (``entropy``,
``entropy_coef``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch


Tensor = torch.Tensor
LossFn = Callable[..., Tuple[Tensor, Dict[str, Tensor]]]

# exp(20) ≈ 4.9e8: the PPO surrogate and the k3 estimator need exp of a
# log-ratio *with* gradient; beyond this range the value is meaningless anyway
# and clamping keeps both value and gradient finite (verl does the same).
LOG_RATIO_CLAMP = 20.0

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("sequence", "token")


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: its function, the options it accepts (with defaults)
    and a one-line description.

    ``fn(logprobs, behavior_logprobs, advantages, mask, **options)`` returns
    ``(per_token_loss (B, T), metrics)``; ``policy_loss`` does the rest.
    """

    name: str
    fn: LossFn
    options: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    # Whether the loss reads μ (behavior_logprobs). Greedy data has no μ; only losses
    # that ignore it can train on it.
    uses_behavior: bool = True


LOSSES: Dict[str, LossSpec] = {}


def register_loss(
    name: str, *, options: Optional[Mapping[str, Any]] = None, description: str = "", uses_behavior: bool = True
) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn`` under ``name`` with its option defaults.

    Example::

        @register_loss("mine", options={"beta": 0.5}, description="...")
        def _mine(logprobs, behavior_logprobs, advantages, mask, *, beta):
            return per_token_loss, {}
    """

    def deco(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = LossSpec(name, fn, dict(options or {}), description, uses_behavior)
        return fn

    return deco


def list_losses() -> Dict[str, str]:
    """Registered loss names → one-line description (registration order)."""
    return {name: spec.description for name, spec in LOSSES.items()}


def get_loss(name: str) -> LossSpec:
    """The spec registered under ``name``; ValueError listing the names otherwise."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(
            f"unknown loss {name!r} — choose one of: {', '.join(LOSSES)}"
        ) from None


def resolve_options(name: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """Defaults of loss ``name`` updated with ``options``.

    An option the loss does not declare raises ValueError naming the option, the
    loss and the options it does accept (so a typo or a PPO knob passed to TOPR
    never passes silently).
    """
    spec = get_loss(name)
    for key in options:
        if key not in spec.options:
            accepted = ", ".join(f"{k}={v!r}" for k, v in spec.options.items()) or "none"
            raise ValueError(
                f"option {key!r} does not apply to loss {name!r} — "
                f"it accepts: {accepted}"
            )
    return {**spec.options, **options}


# --------------------------------------------------------------------------- #
# Aggregation
# --------------------------------------------------------------------------- #


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den, and 0 where den == 0 (no NaN in value or gradient)."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def aggregate(
    per_token_loss: Tensor,
    mask: Tensor,
    mode: str = "seq-mean-token-mean",
    weights: Optional[Tensor] = None,
    *,
    norm_length: Optional[float] = None,
) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar.

    With m the mask, L_i = Σ_t m_{i,t} the completion length and w_i the sample
    weight (a sequence with L_i = 0 gets weight 0 — it has no tokens):

    - ``token-mean``:  Σ_i w_i Σ_t m l / Σ_i w_i L_i
      (every token counts once, scaled by its sample's weight; long
      completions weigh more)
    - ``seq-mean-token-sum``:  Σ_i w_i (Σ_t m l) / Σ_i w_i
    - ``seq-mean-token-mean`` (default; the paper's "divide by length"):
      ℓ_i = Σ_t m l / L_i,  loss = Σ_i w_i ℓ_i / Σ_i w_i
    - ``seq-mean-token-sum-norm`` (Dr. GRPO):  Σ_i w_i (Σ_t m l / N) / Σ_i w_i
      with N = ``norm_length`` (default T, the padded length; pass a constant
      such as max_new_tokens so the scale does not vary between batches).

    An all-empty mask or all-zero weights give 0, never NaN.

    Args:
        per_token_loss: (B, T)
        mask: (B, T) bool or {0, 1}
        mode: one of ``AGGREGATIONS``
        weights: (B,) ≥ 0, default ones
        norm_length: N for ``seq-mean-token-sum-norm`` (ignored by other modes)
    Returns:
        scalar tensor
    """
    if mode not in AGGREGATIONS:
        raise ValueError(
            f"unknown aggregation {mode!r} — choose one of: {', '.join(AGGREGATIONS)}"
        )
    m = mask.to(per_token_loss.dtype)  # (B, T)
    if weights is None:
        weights = torch.ones(m.shape[0], dtype=m.dtype, device=m.device)
    lengths = m.sum(-1)  # (B,)
    w = weights.to(m.dtype) * (lengths > 0).to(m.dtype)  # (B,) empty rows drop out
    # where(), not multiply: a masked position may hold inf/NaN (padding).
    tok_sum = torch.where(m > 0, per_token_loss, torch.zeros_like(per_token_loss)).sum(-1)  # (B,)

    if mode == "token-mean":
        return _safe_div((w * tok_sum).sum(), (w * lengths).sum())
    if mode == "seq-mean-token-sum":
        seq = tok_sum
    elif mode == "seq-mean-token-mean":
        seq = _safe_div(tok_sum, lengths)
    else:  # seq-mean-token-sum-norm
        n = float(m.shape[-1] if norm_length is None else norm_length)
        if not n > 0:
            raise ValueError(f"norm_length must be > 0, got {norm_length!r} — pass e.g. max_new_tokens")
        seq = tok_sum / n
    return _safe_div((w * seq).sum(), w.sum())


# --------------------------------------------------------------------------- #
# Helpers shared by the losses
# --------------------------------------------------------------------------- #


def sequence_log_ratio(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor) -> Tensor:
    """s_i = Σ_t m_{i,t} (log π − log μ), detached.  (B, T) → (B,)"""
    d = (logprobs.detach() - behavior_logprobs) * mask
    return d.sum(-1)


def _log_ratio(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, level: str) -> Tensor:
    """Detached log π/μ: (B, 1) sequence-level or (B, T) token-level (0 on pads)."""
    if level not in RATIO_LEVELS:
        raise ValueError(
            f"ratio_level must be one of {', '.join(RATIO_LEVELS)}, got {level!r}"
        )
    if level == "sequence":
        return sequence_log_ratio(logprobs, behavior_logprobs, mask).unsqueeze(-1)
    return (logprobs.detach() - behavior_logprobs) * mask


def _reinforce(coef: Tensor, logprobs: Tensor, advantages: Tensor) -> Tensor:
    """l_{i,t} = −sg(coef) A_i log π_{i,t};  coef (B, 1) or (B, T) → (B, T)."""
    return -(coef.detach() * advantages.unsqueeze(-1)) * logprobs


def _masked_frac(flags: Tensor, mask: Tensor) -> Tensor:
    """Share of flagged entries: over masked tokens if ``flags`` is (B, T), over
    non-empty sequences if it is (B, 1). 0 if there are none."""
    if flags.shape[-1] == 1 and mask.shape[-1] != 1:
        m = (mask.sum(-1, keepdim=True) > 0).to(mask.dtype)  # (B, 1)
    else:
        m = mask
    return _safe_div((flags.to(mask.dtype) * m).sum(), m.sum())


def _as_float(value: Any) -> Optional[float]:
    """``value`` as a float (numbers and numeric strings such as YAML's "1e-1"); None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _check(cond: bool, loss: str, message: str) -> None:
    if not cond:
        raise ValueError(f"loss {loss!r}: {message}")


# --------------------------------------------------------------------------- #
# Losses
# --------------------------------------------------------------------------- #


@register_loss(
    "topr",
    options={"ratio_level": "sequence", "positive_weight": 1.0, "negative_weight": 1.0},
    description="TOPR: positives as SFT, negatives weighted by clip(π/μ, 0, 1) (sequence ratio, stop-grad)",
)
def topr_loss(logprobs, behavior_logprobs, advantages, mask, *, ratio_level="sequence",
              positive_weight=1.0, negative_weight=1.0):
    """Tapered Off-Policy REINFORCE (Le Roux et al. 2025, Eq. 8).

    α_i = 1 if A_i ≥ 0 else clip(exp(s_i), 0, 1), s_i the sequence log-ratio;
    l_{i,t} = −sg(α_i) · w_i · A_i log π_{i,t} with w_i = ``positive_weight`` (w₊)
    if A_i ≥ 0 else ``negative_weight`` (w₋), both ≥ 0 and 1 by default (the
    paper). ``ratio_level="token"`` uses α_{i,t} = clip(π_t/μ_t, 0, 1) per token
    instead. exp(min(s, 0)) ∈ (0, 1] never overflows.
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
    if positive_weight != 1.0 or negative_weight != 1.0:
        side = torch.where(neg, torch.full_like(alpha[:, :1], negative_weight),
                           torch.full_like(alpha[:, :1], positive_weight))  # (B, 1)
        alpha = alpha * side
    return _reinforce(alpha, logprobs, advantages), metrics


@register_loss("sft", description="positives only (coef 1 for A > 0), negatives dropped", uses_behavior=False)
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
    options={"max_weight": 1e3, "ratio_level": "sequence"},
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
    return _reinforce(coef, logprobs, advantages), {"clip_frac": _masked_frac(log_r > cap, mask)}


@register_loss(
    "tis",
    options={"lower": 0.0, "upper": 1.0, "ratio_level": "sequence"},
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
    return _reinforce(coef, logprobs, advantages), {"clip_frac": _masked_frac(clipped, mask)}


@register_loss(
    "ppo",
    options={"clip_ratio": 0.2, "clip_low": None, "clip_high": None, "dual_clip": None},
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
    metrics = {"clip_frac": _masked_frac(l2 > l1, mask)}
    if dual_clip is not None:
        l3 = -a * float(dual_clip)
        dual = (a < 0) & (l3 < loss)
        loss = torch.where(dual, l3.expand_as(loss), loss)
        metrics["dual_clip_frac"] = _masked_frac(dual, mask)
    return loss, metrics


@register_loss(
    "cispo",
    options={"clip_low": None, "clip_high": 0.28},
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
    return _reinforce(coef, logprobs, advantages), {"clip_frac": _masked_frac(clipped, mask)}


@register_loss(
    "kimi15",
    options={"tau": 0.1},
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
# KL estimators
# --------------------------------------------------------------------------- #


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π ‖ ref) from tokens sampled (ideally) from π.

    With d = log π − log ref (grad through log π) — Schulman, "Approximating
    KL divergence" (2020), r = ref/π = exp(−d):

    - ``k1`` = d                      (unbiased, high variance, can be < 0)
    - ``k2`` = d² / 2                 (biased, low variance, ≥ 0)
    - ``k3`` = exp(−d) − 1 + d        (unbiased, low variance, ≥ 0)

    d is clamped to ±20 inside exp for k3. Here tokens come from μ, not π, so
    all three are off-policy estimates. Shapes: (B, T), (B, T) → (B, T).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown kl_estimator {estimator!r} — choose one of: {', '.join(KL_ESTIMATORS)}"
        )
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(-d) - 1.0 + d


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def _check_shape(t: Optional[Tensor], shape: torch.Size, what: str) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def policy_loss(
    name: str,
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    weights: Optional[Tensor] = None,
    aggregation: str = "seq-mean-token-mean",
    norm_length: Optional[float] = None,
    adv_clip: Optional[float] = None,
    whiten_advantages: bool = False,
    ref_logprobs: Optional[Tensor] = None,
    kl_coef: Optional[float] = None,
    kl_estimator: str = "k3",
    entropy: Optional[Tensor] = None,
    entropy_coef: Optional[float] = None,
    **options: Any,
) -> Tuple[Tensor, Dict[str, Tensor]]:
    """Loss ``name`` over a batch, aggregated, plus detached scalar metrics.

        loss = agg(l^name) + kl_coef · agg(KL_est(π‖ref)) − entropy_coef · agg(H)

    with agg = :func:`aggregate` (``aggregation``, ``weights``,
    ``norm_length``). Before the loss, advantages are whitened over the batch
    (``whiten_advantages``: (A − mean)/(std + 1e-8), population std — note this
    moves the sign boundary TOPR uses) and then clipped to [−c, c]
    (``adv_clip`` = c). None/0/False switch a generic option off. Loss-specific
    ``options`` must be declared by the loss (see ``LOSSES[name].options``).

    Args:
        logprobs: (B, T) log π, with grad. Computed in ≥ float32.
        behavior_logprobs: (B, T) log μ (detached here).
        advantages: (B,)
        mask: (B, T) 1 on completion tokens. Masked positions may hold anything.
        weights: (B,) ≥ 0 per-sample weight, default ones.
        ref_logprobs: (B, T) log ref, enables the ``kl`` metric; penalty iff kl_coef.
        entropy: (B, T) per-token entropy of π (with grad); bonus iff entropy_coef.
    Returns:
        (scalar loss, dict of detached 0-dim tensors): loss, pg_loss, n_pos,
        n_neg, neg_alpha_mean, neg_alpha_lt1_frac, log_ratio_mean/max/min,
        adv_mean, [kl, kl_loss, entropy, clip_frac, ...].
        n_pos/n_neg count sequences in the loss (≥1 token, weight > 0) with
        A > 0 / A < 0. neg_alpha_* is the sequence-level TOPR α = min(1, π/μ)
        of those negatives, reported for every loss (how far π left them).
        log_ratio_* are over sequence log-ratios s_i of the same sequences.
    """
    spec = get_loss(name)
    opts = resolve_options(name, options)
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"unknown aggregation {aggregation!r} — choose one of: {', '.join(AGGREGATIONS)}"
        )
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    _check_shape(behavior_logprobs, shape, "behavior_logprobs")
    _check_shape(mask, shape, "mask")
    _check_shape(ref_logprobs, shape, "ref_logprobs")
    _check_shape(entropy, shape, "entropy")
    _check_shape(advantages, shape[:1], "advantages")
    _check_shape(weights, shape[:1], "weights")
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef is set but no ref_logprobs were given — pass a reference policy or set kl_coef to 0")
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef is set but no per-token entropy was given — pass entropy or set entropy_coef to 0")
    if adv_clip is not None and adv_clip != 0 and not float(adv_clip) > 0:
        raise ValueError(f"adv_clip must be > 0, got {adv_clip!r}")

    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    m_bool = mask.bool()
    m = m_bool.to(dtype)
    # Zero the padding first: pads may hold -inf/NaN, and 0 keeps every
    # product, ratio and gradient there finite (and exactly zero).
    lp = logprobs.to(dtype).masked_fill(~m_bool, 0.0)
    blp = behavior_logprobs.detach().to(dtype).masked_fill(~m_bool, 0.0)
    adv = advantages.detach().to(dtype)
    w = None if weights is None else weights.detach().to(dtype)

    if whiten_advantages:
        # Statistics over the sequences that have tokens (padding rows excluded).
        has = (m.sum(-1) > 0).to(dtype)  # (B,)
        n = has.sum().clamp(min=1.0)
        mean = (adv * has).sum() / n
        std = (((adv - mean) ** 2 * has).sum() / n).sqrt()
        adv = (adv - mean) / (std + 1e-8)
    if adv_clip:
        adv = adv.clamp(-float(adv_clip), float(adv_clip))

    per_token, loss_metrics = spec.fn(lp, blp, adv, m, **opts)
    pg_loss = aggregate(per_token, m, aggregation, w, norm_length=norm_length)
    loss = pg_loss

    metrics: Dict[str, Tensor] = {}
    if ref_logprobs is not None:
        ref = ref_logprobs.detach().to(dtype).masked_fill(~m_bool, 0.0)
        kl = aggregate(kl_penalty(lp, ref, kl_estimator), m, aggregation, w, norm_length=norm_length)
        metrics["kl"] = kl
        if kl_coef:
            loss = loss + float(kl_coef) * kl
            metrics["kl_loss"] = float(kl_coef) * kl
    if entropy is not None:
        ent = aggregate(entropy.to(dtype).masked_fill(~m_bool, 0.0), m, aggregation, w, norm_length=norm_length)
        metrics["entropy"] = ent
        if entropy_coef:
            loss = loss - float(entropy_coef) * ent

    # Batch statistics (no gradient).
    with torch.no_grad():
        s = sequence_log_ratio(lp, blp, m)  # (B,)
        active = m.sum(-1) > 0
        if w is not None:
            active = active & (w > 0)
        pos = active & (adv > 0)
        neg = active & (adv < 0)
        alpha = torch.exp(s.clamp(max=0.0))
        negf = neg.to(dtype)
        actf = active.to(dtype)
        # where() instead of boolean indexing: no host sync on GPU.
        s_max = torch.where(active, s, torch.full_like(s, -math.inf)).amax()
        s_min = torch.where(active, s, torch.full_like(s, math.inf)).amin()
        s_max = torch.where(torch.isfinite(s_max), s_max, torch.zeros_like(s_max))
        s_min = torch.where(torch.isfinite(s_min), s_min, torch.zeros_like(s_min))
        base = {
            "loss": loss,
            "pg_loss": pg_loss,
            "n_pos": pos.sum().to(dtype),
            "n_neg": neg.sum().to(dtype),
            "neg_alpha_mean": _safe_div((alpha * negf).sum(), negf.sum()),
            "neg_alpha_lt1_frac": _safe_div(((s < 0).to(dtype) * negf).sum(), negf.sum()),
            "log_ratio_mean": _safe_div((s * actf).sum(), actf.sum()),
            "log_ratio_max": s_max,
            "log_ratio_min": s_min,
            "adv_mean": _safe_div((adv * actf).sum(), actf.sum()),
        }
    out = {**base, **metrics, **loss_metrics}
    return loss, {k: v.detach() for k, v in out.items()}


__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "LossSpec",
    "aggregate",
    "get_loss",
    "kl_penalty",
    "list_losses",
    "policy_loss",
    "register_loss",
    "resolve_options",
    "sequence_log_ratio",
]
