"""Curation math: baselines, the effective positive share, and row selection.

Pure functions over NumPy / Arrow arrays: no config, no files, no CLI. Every
function is vectorised (sorts, ``np.bincount``, Arrow kernels); none loops over
rows in Python. Shapes: ``N`` rows, ``G`` groups (prompts); a *group id* array
is ``int64 (N,)`` with values in ``[0, G)`` (see :func:`group_ids`).

Conventions
-----------
* Advantage ``A = R − c`` with ``R`` the reward and ``c`` the baseline.
* A row is **positive when A ≥ 0** (TOPR's α = 1 branch, ARCHITECTURE.md §4);
  a row with ``A = 0`` is positive but carries no weight in any share below.
* ``w ≥ 0`` is the row's training weight (the per-source weight); ``None``
  means all ones.
* The **effective positive share** of a data set is the share of the total
  gradient magnitude carried by positives,

      p̃ = Σ_{A ≥ 0} w·|A|  /  Σ w·|A|,

  defined for any reward values. With ±1 rewards, raw positive share ``p``
  and a constant ``c ∈ [−1, 1]`` this is the paper's §4.3 closed form
  ``p̃ = p(1 − c) / (1 + c(1 − 2p))`` (:func:`closed_form_share`), whose
  inverse is ``c = (p − p̃) / (p + p̃(1 − 2p))`` (:func:`closed_form_baseline`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
]

# -- the baseline ↔ composition identity --------------------------------------


def closed_form_share(p: float, c: float) -> float:
    """Effective positive share for ±1 rewards: ``p̃ = p(1 − c) / (1 + c(1 − 2p))``.

    ``p`` is the raw share of R = +1 rows, ``c ∈ [−1, 1]`` the constant
    baseline. c = 0 gives p̃ = p; c = −1 gives p̃ = 1 (negatives drop out);
    c = 1 gives p̃ = 0.
    """
    return p * (1.0 - c) / (1.0 + c * (1.0 - 2.0 * p))


def closed_form_baseline(p: float, target: float) -> float:
    """Inverse of :func:`closed_form_share`: ``c = (p − P) / (p + P(1 − 2p))``.

    E.g. p = 0.5, P = 0.15 gives c = 0.35 / 0.5 = 0.7.
    """
    return (p - target) / (p + target * (1.0 - 2.0 * p))


def _weights(n: int, weight: np.ndarray | None) -> np.ndarray:
    if weight is None:
        return np.ones(n, dtype=np.float64)
    return np.asarray(weight, dtype=np.float64)


def positive_share(positive: np.ndarray, weight: np.ndarray | None = None) -> float:
    """Weighted share of rows flagged positive: ``p = Σ w·[pos] / Σ w``.

    ``positive``: bool (N,). NaN when Σ w = 0.
    """
    positive = np.asarray(positive, dtype=bool)
    w = _weights(len(positive), weight)
    total = float(w.sum())
    return float(w[positive].sum()) / total if total > 0 else float("nan")


def effective_positive_share(advantage: np.ndarray, weight: np.ndarray | None = None) -> float:
    """``p̃ = Σ_{A≥0} w·|A| / Σ w·|A|`` over rows; NaN when every w·|A| is 0.

    ``advantage``: float (N,); ``weight``: float (N,) ≥ 0 or None.
    """
    a = np.asarray(advantage, dtype=np.float64)
    w = _weights(len(a), weight)
    mass = w * np.abs(a)
    total = float(mass.sum())
    if total <= 0:
        return float("nan")
    return float(mass[a >= 0].sum()) / total


def solve_baseline(reward: np.ndarray, target: float, weight: np.ndarray | None = None) -> float:
    """The constant ``c`` whose advantages ``A = R − c`` have effective share ``target``.

    Solves ``p̃(c) = P`` exactly for any reward values (not only ±1).
    ``p̃(c)`` falls continuously and monotonically from 1 at ``c = min R`` to
    0 at ``c = max R``, and between two consecutive distinct reward values
    ``u_j < c ≤ u_{j+1}`` it is a ratio of linear functions of ``c``:

        N(c) = Σ_{R > u_j} w(R − c) = S_hi − c·W_hi      (positive mass)
        M(c) = Σ_{R ≤ u_j} w(c − R) = c·W_lo − S_lo      (negative mass)
        p̃ = N / (N + M) = P   ⇔   c = ((1 − P)·S_hi + P·S_lo) / ((1 − P)·W_hi + P·W_lo)

    so the root find is: collapse rows to the K distinct rewards (``np.unique``
    + ``np.bincount``), evaluate p̃ at the K knots with cumulative sums, pick
    the bracketing segment, and apply the formula. With ±1 rewards (K = 2)
    this is exactly :func:`closed_form_baseline`.

    ``reward``: float (N,); ``weight``: float (N,) ≥ 0 or None; ``0 < target < 1``.
    Raises ``ValueError`` when fewer than two distinct rewards carry weight
    (no positives or no negatives can exist, so no c reaches the target).
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target share must be strictly between 0 and 1, got {target}")
    r = np.asarray(reward, dtype=np.float64)
    w = _weights(len(r), weight)
    keep = w > 0
    u, inv = np.unique(r[keep], return_inverse=True)  # distinct rewards, ascending (K,)
    if len(u) < 2:
        raise ValueError("the rewards take fewer than two distinct values, so no baseline gives both positives and negatives")
    W = np.bincount(inv, weights=w[keep], minlength=len(u))  # weight per distinct reward (K,)
    S = W * u
    cw, cs = np.cumsum(W), np.cumsum(S)  # Σ over u_i ≤ u_j
    tw, ts = cw[-1], cs[-1]
    # p̃ at each knot c = u_j: positives are u_i > u_j (u_i = u_j has A = 0).
    pos = (ts - cs) - u * (tw - cw)
    neg = u * cw - cs
    share = pos / np.maximum(pos + neg, np.finfo(np.float64).tiny)  # (K,), 1 at j=0 ... 0 at j=K-1
    # Segment j: share[j] ≥ P ≥ share[j+1]; share is non-increasing.
    j = int(np.searchsorted(-share, -target, side="right")) - 1
    j = min(max(j, 0), len(u) - 2)
    s_hi, w_hi = ts - cs[j], tw - cw[j]
    s_lo, w_lo = cs[j], cw[j]
    c = ((1.0 - target) * s_hi + target * s_lo) / ((1.0 - target) * w_hi + target * w_lo)
    return float(min(max(c, u[j]), u[j + 1]))  # guard float round-off at the segment ends


def advantages(reward: np.ndarray, baseline: float | np.ndarray) -> np.ndarray:
    """``A = R − c`` as float32 (N,); ``baseline`` is a scalar or (N,)."""
    return (np.asarray(reward, dtype=np.float64) - baseline).astype(np.float32)


# -- groups -------------------------------------------------------------------


def encode(values: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """Dense integer codes (int64 (N,)) for any column: equal values, equal codes.

    Strings go through Arrow's hash-based ``dictionary_encode`` (one shared
    dictionary across chunks); numbers through ``np.unique``. Nulls get their
    own code.
    """
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        t = values.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            values = values.to_numpy(zero_copy_only=False)
        else:
            enc = pc.dictionary_encode(values, null_encoding="encode")
            chunks = enc.chunks if isinstance(enc, pa.ChunkedArray) else [enc]
            if not chunks:
                return np.zeros(0, dtype=np.int64)
            return np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks]).astype(np.int64)
    values = np.asarray(values)
    if values.dtype.kind in "iub" and len(values):
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < 4 * len(values) + 1024:  # small range: no sort
            return _compact(values.astype(np.int64) - lo, hi - lo + 1)
    return np.unique(values, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _compact(key: np.ndarray, size: int) -> np.ndarray:
    """Dense codes for non-negative int keys < ``size``, in key order.

    A presence table and a cumulative sum (O(N + size), no sort) when the key
    range is small, ``np.unique`` otherwise.
    """
    if size <= 4 * len(key) + 1024:
        present = np.zeros(size, dtype=bool)
        present[key] = True
        return (np.cumsum(present) - 1)[key].astype(np.int64)
    return np.unique(key, return_inverse=True)[1].astype(np.int64).reshape(-1)


def group_ids(*keys: np.ndarray | pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Group id per row for a composite key, e.g. (iteration, policy, prompt_id).

    Returns ``(ids int64 (N,), G)``. Keys are combined pairwise by mixed radix
    and re-compacted after each step (codes stay < N, so never overflow). Ids are
    dense but their numbering carries no meaning.
    """
    if not keys:
        raise ValueError("group_ids needs at least one key")
    ids = encode(keys[0])
    for key in keys[1:]:
        code = encode(key)
        n_code = int(code.max(initial=-1)) + 1
        ids = _compact(ids * n_code + code, (int(ids.max(initial=-1)) + 1) * n_code)
    return ids, int(ids.max(initial=-1)) + 1


def group_mean_baseline(reward: np.ndarray, groups: np.ndarray, n_groups: int | None = None) -> np.ndarray:
    """Per-row baseline = mean reward of the row's group: ``c_i = (1/n_g) Σ_{j∈g} R_j``.

    ``reward``: float (N,); ``groups``: int64 (N,). Returns float64 (N,).
    A group of one gets c = R (advantage 0).
    """
    r = np.asarray(reward, dtype=np.float64)
    g = np.asarray(groups)
    G = n_groups if n_groups is not None else int(g.max(initial=-1)) + 1
    sums = np.bincount(g, weights=r, minlength=G)
    counts = np.bincount(g, minlength=G)
    return (sums / np.maximum(counts, 1))[g]


def leave_one_out_baseline(reward: np.ndarray, groups: np.ndarray, n_groups: int | None = None) -> np.ndarray:
    """Per-row baseline = mean reward of the *other* rows of its group.

    ``c_i = (Σ_{j∈g} R_j − R_i) / (n_g − 1)``; a group of one has no other
    rows and gets ``c_i = R_i`` (advantage 0). Note ``R_i − c_i =
    n_g/(n_g − 1) · (R_i − mean_g)``. Shapes as :func:`group_mean_baseline`.
    """
    r = np.asarray(reward, dtype=np.float64)
    g = np.asarray(groups)
    G = n_groups if n_groups is not None else int(g.max(initial=-1)) + 1
    sums = np.bincount(g, weights=r, minlength=G)[g]
    counts = np.bincount(g, minlength=G)[g]
    others = counts - 1
    return np.where(others > 0, (sums - r) / np.maximum(others, 1), r)


def reward_std(reward: np.ndarray) -> float:
    """Sample standard deviation of the rewards (Bessel-corrected, as ``torch.std``); 0 for < 2 rows."""
    r = np.asarray(reward, dtype=np.float64)
    return float(r.std(ddof=1)) if len(r) > 1 else 0.0


def group_reward_std(reward: np.ndarray, groups: np.ndarray, n_groups: int | None = None) -> np.ndarray:
    """Per-row sample standard deviation of the row's group (Bessel-corrected): float64 (N,).

    ``s_g = sqrt(Σ_{j∈g} (R_j − mean_g)² / (n_g − 1))``, two passes (no
    cancellation); a group of one row gets 0.
    """
    r = np.asarray(reward, dtype=np.float64)
    g = np.asarray(groups)
    G = n_groups if n_groups is not None else int(g.max(initial=-1)) + 1
    dev = r - group_mean_baseline(r, g, G)
    ss = np.bincount(g, weights=dev * dev, minlength=G)
    counts = np.bincount(g, minlength=G)
    return np.sqrt(ss / np.maximum(counts - 1, 1))[g]


def scale_advantages(
    adv: np.ndarray, std: float | np.ndarray | None = None, clip: float | None = None, eps: float = 1e-6
) -> np.ndarray:
    """``A / (std + eps)`` then clipped to ``[−clip, clip]``: float32 (N,) (ROLL's reward normalisation).

    ``std``: scalar or (N,), None = no scaling. Where ``std`` is 0 (every
    reward equal) A is left unscaled rather than divided by ``eps``: with a
    mean baseline A is 0 there anyway, and with any other baseline dividing
    by 1e-6 would blow A up by a million.
    """
    a = np.asarray(adv, dtype=np.float64)
    if std is not None:
        s = np.broadcast_to(np.asarray(std, dtype=np.float64), a.shape)
        a = np.where(s > 0, a / (s + eps), a)
    if clip is not None:
        a = np.clip(a, -clip, clip)
    return a.astype(np.float32)


def accuracy_range_mask(
    outcome: np.ndarray, groups: np.ndarray, low: float, high: float, n_groups: int | None = None
) -> np.ndarray:
    """Keep rows whose group's accuracy a (share of ``outcome``) satisfies ``low < a < high``.

    Strict on both sides, like ROLL's difficulty mask: ``(0, 1)`` keeps exactly
    the prompts with both outcomes (:func:`mixed_outcome_mask`).
    """
    o = np.asarray(outcome, dtype=bool)
    g = np.asarray(groups)
    G = n_groups if n_groups is not None else int(g.max(initial=-1)) + 1
    acc = np.bincount(g, weights=o, minlength=G) / np.maximum(np.bincount(g, minlength=G), 1)
    return ((acc > low) & (acc < high))[g]


# -- selection (each returns a keep mask, bool (N,)) ---------------------------


def rank_in_group(groups: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """0-based rank of each row within its group, by ``order`` then row position.

    ``groups``: int (N,); ``order``: sortable (N,) or None (row position
    only). Returns int64 (N,). A stable sort plus run starts: no Python loop.
    """
    g = np.asarray(groups)
    n = len(g)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    perm = np.lexsort((np.asarray(order), g)) if order is not None else np.argsort(g, kind="stable")
    gs = g[perm]
    new_run = np.empty(n, dtype=bool)
    new_run[0] = True
    np.not_equal(gs[1:], gs[:-1], out=new_run[1:])
    starts = np.maximum.accumulate(np.where(new_run, np.arange(n), 0))
    rank = np.empty(n, dtype=np.int64)
    rank[perm] = np.arange(n) - starts
    return rank


def mixed_outcome_mask(outcome: np.ndarray, groups: np.ndarray, n_groups: int | None = None) -> np.ndarray:
    """Keep rows whose group has both outcomes (drops all-correct / all-wrong prompts).

    ``outcome``: bool (N,) (the ``correct`` column); ``groups``: int (N,).
    """
    o = np.asarray(outcome, dtype=bool)
    g = np.asarray(groups)
    G = n_groups if n_groups is not None else int(g.max(initial=-1)) + 1
    pos = np.bincount(g, weights=o, minlength=G)
    n = np.bincount(g, minlength=G)
    return ((pos > 0) & (pos < n))[g]


def first_positive_mask(positive: np.ndarray, groups: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """"Anna Karenina" selection: per group, every negative and only the first positive.

    The paper's "Anna Karenina" curation: correct answers are alike, each
    wrong one is wrong in its own way, so one correct sample per prompt is
    kept. "First" is by ``order`` (e.g.
    ``sample_index``) then row position. ``positive``: bool (N,).
    """
    pos = np.asarray(positive, dtype=bool)
    keep = ~pos
    idx = np.flatnonzero(pos)
    sub_order = None if order is None else np.asarray(order)[idx]
    keep[idx] = rank_in_group(np.asarray(groups)[idx], sub_order) == 0
    return keep


def cap_per_group_mask(groups: np.ndarray, k: int, order: np.ndarray | None = None) -> np.ndarray:
    """Keep the first ``k`` rows of each group (by ``order`` then position)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return rank_in_group(groups, order) < k


def first_occurrence_mask(groups: np.ndarray, key: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Keep the first row of each (group, key) pair: exact dedupe on integer keys."""
    pair, _ = group_ids(np.asarray(groups), np.asarray(key))
    return rank_in_group(pair, order) == 0


def string_fingerprint(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A cheap uint64 fingerprint per string: byte length and bytes 0–7, the middle 8, the last 8.

    Equal strings always get equal fingerprints; unequal strings usually
    differ (and always do when shorter than 17 bytes), but not always, so use
    it to find *candidate* duplicates and confirm them exactly
    (:func:`dedupe_mask`). It reads 24 bytes per string through the Arrow
    offsets buffer, never the whole text. Nulls hash like the empty string.
    """
    if isinstance(values, pa.ChunkedArray):
        parts = [string_fingerprint(c) for c in values.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    if pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
        off_dtype = np.int64
    elif pa.types.is_string(values.type) or pa.types.is_binary(values.type):
        off_dtype = np.int32
    else:
        raise TypeError(f"string_fingerprint needs a string column, got {values.type}")
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    _, off_buf, data_buf = values.buffers()
    offsets = np.frombuffer(off_buf, dtype=off_dtype)[values.offset : values.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size else np.zeros(1, np.uint8)
    if values.null_count:
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        start = np.where(valid, offsets[:-1], 0)
        length = np.where(valid, offsets[1:] - offsets[:-1], 0)
    else:
        start, length = offsets[:-1], offsets[1:] - offsets[:-1]

    def word(begin: np.ndarray) -> np.ndarray:
        """8 bytes from ``begin`` (clipped to the string) packed into uint64 (N,)."""
        k = np.arange(8)
        inside = (begin[:, None] + k >= start[:, None]) & (begin[:, None] + k < (start + length)[:, None])
        idx = np.clip(begin[:, None] + k, 0, len(data) - 1)
        b = np.where(inside, data[idx], 0).astype(np.uint64)  # (N, 8)
        return (b << (np.arange(8, dtype=np.uint64) * np.uint64(8))).sum(axis=1, dtype=np.uint64)

    h = length.astype(np.uint64)
    for part in (word(start), word(start + length // 2 - 4), word(start + length - 8)):
        h = _mix64(h ^ part)
    return h


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (wrapping uint64 arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def duplicate_candidates(groups: np.ndarray, fingerprints: np.ndarray) -> np.ndarray:
    """Rows sharing (group, fingerprint) with another row: bool (N,).

    Only these can be duplicates; every other row is unique in its group.
    """
    pair, n_pairs = group_ids(np.asarray(groups), np.asarray(fingerprints))
    return (np.bincount(pair, minlength=n_pairs) > 1)[pair]


def dedupe_mask(
    groups: np.ndarray,
    completions: pa.Array | pa.ChunkedArray,
    order: np.ndarray | None = None,
    *,
    fingerprints: np.ndarray | None = None,
    candidates: np.ndarray | None = None,
) -> np.ndarray:
    """Keep the first of each set of identical strings within a group (exact).

    Cheap fingerprints find the candidate rows; only those are compared
    exactly (Arrow ``dictionary_encode`` on the candidate strings).
    ``completions`` holds either all N strings, or (when ``candidates`` is
    given) just the candidate rows' strings in row order — the stage passes
    those to avoid holding every completion in memory.
    """
    g = np.asarray(groups)
    if candidates is None:
        fp = string_fingerprint(completions) if fingerprints is None else fingerprints
        candidates = duplicate_candidates(g, fp)
        completions = completions.take(pa.array(np.flatnonzero(candidates)))
    idx = np.flatnonzero(candidates)
    if len(completions) != len(idx):
        raise ValueError(f"expected {len(idx)} candidate strings, got {len(completions)}")
    # Non-candidates are unique in their group: give each its own key past the exact codes.
    key = np.arange(len(g), dtype=np.int64) + len(idx)
    key[idx] = encode(completions)
    return first_occurrence_mask(g, key, order)


def subsample_indices(n: int, size: int, seed: int) -> np.ndarray:
    """``min(size, n)`` distinct row indices drawn uniformly without replacement, ascending."""
    if size >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)
