"""The loss machinery: one registry, one aggregation, and :func:`policy_loss` around them.

Pure tensor code; raises ``ValueError``. The registered losses are in
:mod:`toprcli.losses.variants`; the package docstring has the notation.
"""

from __future__ import annotations

import functools
import inspect
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

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3", "k1+", "k3+")
KL_VALUE_CLAMP = 10.0  # k3's value and its slope are bounded here (verl clamps the value, which zeroes the slope beyond)
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
    # Whether the loss reads μ (behavior_logprobs). Greedy data has no μ: only losses that ignore it train on it.
    uses_behavior: bool = True
    # A pairwise loss reads rows as (chosen, rejected) pairs — rows 2k and 2k+1, the
    # chosen one (A > 0) first — and its ``behavior_logprobs`` slot holds the reference
    # policy's log-probs; π and the reference are the model's unprocessed distribution
    # (temperature 1, no truncation), whatever the data was sampled with.
    pairwise: bool = False
    # The aggregation the loss is defined with (None: the caller's choice).
    aggregation: Optional[str] = None
    # Whether rows with A < 0 carry gradient (sft drops them: its positive share is 1, whatever the data's p̃).
    trains_negatives: bool = True


LOSSES: Dict[str, LossSpec] = {}


def register_loss(
    name: str, *, description: str = "", uses_behavior: bool = True, pairwise: bool = False, aggregation: Optional[str] = None, trains_negatives: bool = True
) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn`` under ``name``; its options are its keyword-only parameters,
    their defaults the ones in its signature (declared once).

    Example::

        @register_loss("mine", description="...")
        def _mine(logprobs, behavior_logprobs, advantages, mask, *, beta=0.5):
            return per_token_loss, {}
    """

    def deco(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        params = inspect.signature(fn).parameters.values()
        options = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
        if any(v is inspect.Parameter.empty for v in options.values()):
            raise ValueError(f"loss {name!r}: every keyword-only option needs a default")
        if aggregation is not None and aggregation not in AGGREGATIONS:
            raise ValueError(f"loss {name!r}: unknown aggregation {aggregation!r}")
        LOSSES[name] = LossSpec(name, fn, options, description, uses_behavior, pairwise, aggregation, trains_negatives)
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
        raise ValueError(f"unknown loss {name!r} — choose one of: {', '.join(LOSSES)}") from None


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
            raise ValueError(f"option {key!r} does not apply to loss {name!r} — it accepts: {accepted}")
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
        raise ValueError(f"unknown aggregation {mode!r} — choose one of: {', '.join(AGGREGATIONS)}")
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
    d = torch.where(mask > 0, logprobs.detach() - behavior_logprobs, 0.0)  # a pad's −inf: 0, not 0·inf = NaN
    return d.sum(-1)


def _log_ratio(logprobs: Tensor, behavior_logprobs: Tensor, mask: Tensor, level: str) -> Tensor:
    """Detached log π/μ: (B, 1) sequence-level or (B, T) token-level (0 on pads)."""
    if level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {', '.join(RATIO_LEVELS)}, got {level!r}")
    if level == "sequence":
        return sequence_log_ratio(logprobs, behavior_logprobs, mask).unsqueeze(-1)
    return (logprobs.detach() - behavior_logprobs) * mask


def _reinforce(coef: Tensor, logprobs: Tensor, advantages: Tensor) -> Tensor:
    """l_{i,t} = −sg(coef) A_i log π_{i,t};  coef (B, 1) or (B, T) → (B, T)."""
    return -(coef.detach() * advantages.unsqueeze(-1)) * logprobs


def _masked_frac(flags: Tensor, mask: Tensor, name: str = "clip_frac") -> Dict[str, Tensor]:
    """``{name: share of flagged entries, name_units: what it is over}``: masked tokens if ``flags`` is (B, T),
    non-empty sequences if it is (B, 1); the share is 0 if there are none. The trainer weighs each micro-batch's
    share by its units, so a step's share is the one a single pass gives (``StepStats``)."""
    if flags.shape[-1] == 1 and mask.shape[-1] != 1:
        m = (mask.sum(-1, keepdim=True) > 0).to(mask.dtype)  # (B, 1)
    else:
        m = mask
    return {name: _safe_div((flags.to(mask.dtype) * m).sum(), m.sum()), f"{name}_units": m.sum()}


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
# KL estimators
# --------------------------------------------------------------------------- #


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π ‖ ref) from tokens sampled (ideally) from π.

    With d = log π − log ref (grad through log π) — Schulman, "Approximating
    KL divergence" (2020), r = ref/π = exp(−d):

    - ``k1`` = d                      (unbiased, high variance, can be < 0)
    - ``k2`` = d² / 2                 (biased, low variance, ≥ 0)
    - ``k3`` = exp(−d) − 1 + d        (unbiased, low variance, ≥ 0)
    - ``k1+``, ``k3+``: the value of k1, k3 with the gradient of k2 (straight-through)

    As a loss term the gradient matters, not the value: ∇k1 = ∇log π, whose mean
    on-policy is 0 (no pull toward ref at all); ∇k3 = (1 − ref/π) ∇log π follows
    KL(ref ‖ π); ∇k2 = d ∇log π follows KL(π ‖ ref), which the ``+`` forms keep while
    logging the unbiased value. d is clamped to ±20 inside exp, k3's value to ≤ 10, its slope 1 − ref/π to ±10
    everywhere (from d ≈ −2.40, before the value's cap at −2.61; bounded, not zeroed, where it is capped). Here
    tokens come from μ, not π, so all are off-policy estimates. Shapes: (B, T), (B, T) → (B, T).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r} — choose one of: {', '.join(KL_ESTIMATORS)}")
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator.endswith("+"):
        value, k2 = kl_penalty(logprobs, ref_logprobs, estimator[:-1]), 0.5 * d * d
        return value.detach() + k2 - k2.detach()
    r = torch.exp(-d.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # ref/π
    # The slope 1 − ref/π is bounded as the value is, not zeroed past the bound (a clamp's gradient would be).
    value, slope = (r - 1.0 + d.detach()).clamp(max=KL_VALUE_CLAMP), (1.0 - r).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)
    return value + slope * (d - d.detach())


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def whiten(advantages: Tensor, valid: Tensor, weights: Tensor | None = None) -> Tensor:
    """(A − mean) / (std + 1e-8), mean and population std over the ``valid`` rows by ``weights``.  (B,), (B,) bool, (B,) → (B,)

    Rows that are not valid (no completion tokens) take part in neither statistic.
    Whitening moves the sign boundary TOPR splits positives from negatives at.
    """
    a = advantages.double()  # float32's 1-ulp error in the mean of equal values, / 1e-8, would be O(1)
    v = valid.double() * (1.0 if weights is None else weights.detach().double())
    n = v.sum().clamp(min=1e-12)
    mean = (a * v).sum() / n
    std = (((a - mean) ** 2 * v).sum() / n).sqrt()
    return ((a - mean) / (std + 1e-8)).to(advantages.dtype)


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
    ``options`` must be declared by the loss (see ``LOSSES[name].options``). A loss
    registered with its own aggregation (``dpo``) uses it whatever ``aggregation`` says.

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
    aggregation = spec.aggregation or aggregation  # a loss defined with its own aggregation keeps it
    _check_arguments(aggregation, logprobs, behavior_logprobs, advantages, mask, weights, ref_logprobs, entropy,
                     kl_coef=kl_coef, entropy_coef=entropy_coef, adv_clip=adv_clip)
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
        adv = whiten(adv, m.sum(-1) > 0, w)  # statistics over the sequences that have tokens, by weight
    if adv_clip:
        adv = adv.clamp(-float(adv_clip), float(adv_clip))

    per_token, loss_metrics = spec.fn(lp, blp, adv, m, **opts)
    agg = functools.partial(aggregate, mask=m, mode=aggregation, weights=w, norm_length=norm_length)  # one aggregation for every term
    pg_loss = agg(per_token)
    ref = None if ref_logprobs is None else ref_logprobs.detach().to(dtype).masked_fill(~m_bool, 0.0)
    ent = None if entropy is None else entropy.to(dtype).masked_fill(~m_bool, 0.0)
    loss, metrics = _add_regularisers(pg_loss, agg, lp, ref, ent, kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef)
    out = {"loss": loss, "pg_loss": pg_loss, **_batch_statistics(lp, blp, adv, m, w), **metrics, **loss_metrics}
    return loss, {k: v.detach() for k, v in out.items()}


def _add_regularisers(pg_loss: Tensor, agg: Callable[[Tensor], Tensor], lp: Tensor, ref: Optional[Tensor], entropy: Optional[Tensor], *,
                      kl_coef: Optional[float], kl_estimator: str, entropy_coef: Optional[float]) -> Tuple[Tensor, Dict[str, Tensor]]:
    """``pg_loss + kl_coef · agg(KL_est(π‖ref)) − entropy_coef · agg(H)``, and the kl / kl_loss / entropy metrics
    (reported whenever ``ref`` / ``entropy`` is given, penalised only with a coefficient). ``lp``, ``ref``, ``entropy``: (B, T), pads 0."""
    loss, metrics = pg_loss, {}
    if ref is not None:
        kl = metrics["kl"] = agg(kl_penalty(lp, ref, kl_estimator))
        if kl_coef:
            loss = loss + float(kl_coef) * kl
            metrics["kl_loss"] = float(kl_coef) * kl
    if entropy is not None:
        ent = metrics["entropy"] = agg(entropy)
        if entropy_coef:
            loss = loss - float(entropy_coef) * ent
    return loss, metrics


def _check_arguments(aggregation: str, logprobs: Tensor, behavior_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                     weights: Optional[Tensor], ref_logprobs: Optional[Tensor], entropy: Optional[Tensor], *,
                     kl_coef: Optional[float], entropy_coef: Optional[float], adv_clip: Optional[float]) -> None:
    """:func:`policy_loss`'s arguments agree: (B, T) tensors of one shape, (B,) per sequence, a term's coefficient only with its input."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r} — choose one of: {', '.join(AGGREGATIONS)}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for tensor, what in ((behavior_logprobs, "behavior_logprobs"), (mask, "mask"), (ref_logprobs, "ref_logprobs"), (entropy, "entropy")):
        _check_shape(tensor, shape, what)
    _check_shape(advantages, shape[:1], "advantages")
    _check_shape(weights, shape[:1], "weights")
    if kl_coef is not None and not 0 <= float(kl_coef) < math.inf:  # below 0 it rewards drifting from the reference
        raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
    if weights is not None and not bool(((weights >= 0) & (weights < math.inf)).all()):  # < 0 flips a gradient; NaN, inf fail
        raise ValueError("weights must be finite and >= 0 — a sequence's weight scales its share of the loss")
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef is set but no ref_logprobs were given — pass a reference policy or set kl_coef to 0")
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef is set but no per-token entropy was given — pass entropy or set entropy_coef to 0")
    if adv_clip is not None and adv_clip != 0 and not float(adv_clip) > 0:
        raise ValueError(f"adv_clip must be > 0, got {adv_clip!r}")


@torch.no_grad()
def _batch_statistics(lp: Tensor, blp: Tensor, adv: Tensor, m: Tensor, w: Optional[Tensor]) -> Dict[str, Tensor]:
    """What :func:`policy_loss` reports of the batch besides the loss: the sequences in it (≥ 1 token,
    weight > 0) with A > 0 / A < 0, TOPR's α = min(1, π/μ) of those negatives, their log-ratios, the
    mean advantage. lp, blp, m: (B, T) with pads zeroed; adv: (B,); w: (B,) or None."""
    s = sequence_log_ratio(lp, blp, m)  # (B,)
    active = m.sum(-1) > 0
    if w is not None:
        active = active & (w > 0)
    pos = active & (adv > 0)
    neg = active & (adv < 0)
    alpha = torch.exp(s.clamp(max=0.0))
    negf = neg.to(lp.dtype)
    actf = active.to(lp.dtype)
    # where() instead of boolean indexing: no host sync on GPU.
    s_max = torch.where(active, s, torch.full_like(s, -math.inf)).amax()
    s_min = torch.where(active, s, torch.full_like(s, math.inf)).amin()
    return {
        "n_pos": pos.sum().to(lp.dtype),
        "n_neg": neg.sum().to(lp.dtype),
        "neg_alpha_mean": _safe_div((alpha * negf).sum(), negf.sum()),
        "neg_alpha_lt1_frac": _safe_div(((s < 0).to(lp.dtype) * negf).sum(), negf.sum()),
        "log_ratio_mean": _safe_div((s * actf).sum(), actf.sum()),
        "log_ratio_max": torch.where(torch.isfinite(s_max), s_max, torch.zeros_like(s_max)),
        "log_ratio_min": torch.where(torch.isfinite(s_min), s_min, torch.zeros_like(s_min)),
        "adv_mean": _safe_div((adv * actf).sum(), actf.sum()),
    }
