"""Curation math: baselines, the effective positive share, and row selection.

Pure functions over NumPy / Arrow arrays: no config, no files, no CLI. Every
function is vectorised (sorts, ``np.bincount``, Arrow kernels); none loops over
rows in Python. Shapes: ``N`` rows, ``G`` groups (prompts); a *group id* array
is ``int64 (N,)`` with values in ``[0, G)`` (see :func:`group_ids`).

Conventions
-----------
* Advantage ``A = R − c`` with ``R`` the reward and ``c`` the baseline.
* A row is **positive when A ≥ 0** (TOPR's α = 1 branch, docs/architecture.md §4);
  a row with ``A = 0`` is positive but carries no weight in any share below.
* ``w ≥ 0`` is the row's training weight (the per-source weight); ``None``
  means all ones.
* The **effective positive share** of a data set is the share of its sample-level
  advantage mass carried by positives,

      p̃ = Σ_{A ≥ 0} w·|A|  /  Σ w·|A|,

  defined for any reward values. It is a property of the data, not of a step's
  gradient: that also depends on the loss's aggregation over tokens (longer
  negatives weigh more under ``token-mean``) and on TOPR's α < 1 for negatives. With ±1 rewards, raw positive share ``p``
  and a constant ``c ∈ [−1, 1]`` this is the paper's §4.3 closed form
  ``p̃ = p(1 − c) / (1 + c(1 − 2p))`` (:func:`closed_form_share`), whose
  inverse is ``c = (p − p̃) / (p + p̃(1 − 2p))`` (:func:`closed_form_baseline`).
"""

from toprcli.curation.baselines import (
    advantages,
    batch_mean,
    closed_form_baseline,
    closed_form_share,
    effective_positive_share,
    encode,
    group_ids,
    group_mean_baseline,
    group_reward_std,
    leave_one_out_baseline,
    positive_share,
    reward_std,
    scale_advantages,
    solve_baseline,
)
from toprcli.curation.pairs import PAIR_FIELDS, PAIR_MODES, as_pair_rows, groups_without_pair, preference_pairs
from toprcli.curation.selection import (
    accuracy_range_mask,
    cap_per_group_mask,
    dedupe_mask,
    duplicate_candidates,
    first_occurrence_mask,
    first_positive_mask,
    mixed_outcome_mask,
    rank_in_group,
    string_fingerprint,
    subsample_indices,
)

__all__ = [
    "closed_form_share",
    "closed_form_baseline",
    "positive_share",
    "effective_positive_share",
    "solve_baseline",
    "advantages",
    "encode",
    "group_ids",
    "group_mean_baseline",
    "leave_one_out_baseline",
    "reward_std",
    "batch_mean",
    "group_reward_std",
    "scale_advantages",
    "accuracy_range_mask",
    "rank_in_group",
    "mixed_outcome_mask",
    "first_positive_mask",
    "cap_per_group_mask",
    "first_occurrence_mask",
    "string_fingerprint",
    "duplicate_candidates",
    "dedupe_mask",
    "subsample_indices",
    "PAIR_MODES",
    "PAIR_FIELDS",
    "as_pair_rows",
    "preference_pairs",
    "groups_without_pair",
]
