"""Policy losses for offline RL of LLMs: pure tensor functions in one registry.

Nothing here reads files, configs or the CLI: every function takes tensors and
returns tensors. A trainer calls :func:`policy_loss` once per micro-batch. The
formulas, with the aggregations and the baseline ↔ p̃ relation: docs/architecture.md §4.

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
    dpo       ℓ = −log σ(β[(s_c − s_c^ref) − (s_r − s_r^ref)]) per (chosen, rejected) pair
              (offline DPO; s a sequence log-prob, the reference in the μ slot)

Generic options of :func:`policy_loss` (valid for every loss): ``adv_clip``,
``whiten_advantages``, a KL penalty to a reference (``ref_logprobs``,
``kl_coef``, ``kl_estimator``) and an entropy bonus (``entropy``,
``entropy_coef``).
"""

from toprcli.losses import variants  # noqa: F401  (registers the losses)
from toprcli.losses.core import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    RATIO_LEVELS,
    LossSpec,
    aggregate,
    get_loss,
    kl_penalty,
    list_losses,
    policy_loss,
    register_loss,
    resolve_options,
    sequence_log_ratio,
    whiten,
)

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "RATIO_LEVELS",
    "LossSpec",
    "aggregate",
    "get_loss",
    "kl_penalty",
    "list_losses",
    "policy_loss",
    "register_loss",
    "resolve_options",
    "sequence_log_ratio",
    "whiten",
]
