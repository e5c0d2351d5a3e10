"""Baselines and the effective positive share (the paper's §4.3 identity); prompt groups.

Pure NumPy/Arrow; see :mod:`toprcli.curation` for the conventions.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# -- the baseline ↔ composition identity --------------------------------------


def closed_form_share(p: float, c: float) -> float:
    """Effective positive share for ±1 rewards: ``p̃ = p(1 − c) / (1 + c(1 − 2p))``.

    ``p`` is the raw share of R = +1 rows, ``c ∈ [−1, 1]`` the constant
    baseline. c = 0 gives p̃ = p; c = −1 gives p̃ = 1 (negatives drop out);
    c = 1 gives p̃ = 0. Where every A is 0 (p = 1 with c = 1, p = 0 with c = −1) nothing
    weighs anything: p̃ is taken as p.
    """
    den = 1.0 + c * (1.0 - 2.0 * p)
    return p if den == 0 else p * (1.0 - c) / den


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
            if pa.types.is_dictionary(t):  # each chunk has its own dictionary: codes by value, not by chunk
                values = values.cast(t.value_type)
            enc = pc.dictionary_encode(values, null_encoding="encode")
            chunks = enc.chunks if isinstance(enc, pa.ChunkedArray) else [enc]
            if not chunks:
                return np.zeros(0, dtype=np.int64)
            return np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks]).astype(np.int64)
    values = np.asarray(values)
    if values.dtype.kind == "b":
        values = values.astype(np.int64)
    if values.dtype.kind in "iu" and len(values):
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < 4 * len(values) + 1024:  # small range: no sort
            # Offsets in the values' own dtype: a uint64 (a fingerprint) may not fit in int64, its offset does.
            return _compact((values - values.min()).astype(np.int64), hi - lo + 1)
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


def batch_mean(reward: np.ndarray, weight: np.ndarray | None = None) -> float:
    """Mean reward (N,) → float; with ``weight`` (N,) ≥ 0, each row counted by its weight (a replayed round by its
    replay weight, weight 0 not at all). Equal weights are the plain mean."""
    r = np.asarray(reward, dtype=np.float64)
    w = None if weight is None else np.asarray(weight, dtype=np.float64)
    if w is None or w.sum() <= 0 or w.min() == w.max():
        return float(r.mean())
    return float((w * r).sum() / w.sum())


def reward_std(reward: np.ndarray, weight: np.ndarray | None = None) -> float:
    """Sample standard deviation of the rewards (N,) (Bessel-corrected, as ``torch.std``); 0 for < 2 rows. With
    ``weight`` (N,) ≥ 0, the rows of weight > 0, each counted by its weight (reliability weights: equal weights
    give the unweighted value)."""
    r = np.asarray(reward, dtype=np.float64)
    w = None if weight is None else np.asarray(weight, dtype=np.float64)
    if w is not None and w.sum() > 0:
        r, w = r[w > 0], w[w > 0]
    if len(r) < 2 or r.min() == r.max():  # equal rewards: exactly 0 (np.std of [0.1] * 8 is 1.5e-17, not 0)
        return 0.0
    if w is None or w.min() == w.max():
        return float(r.std(ddof=1))
    m = (w * r).sum() / w.sum()
    return float(np.sqrt((w * (r - m) ** 2).sum() / (w.sum() - (w**2).sum() / w.sum())))


def group_reward_std(reward: np.ndarray, groups: np.ndarray, n_groups: int | None = None) -> np.ndarray:
    """Per-row sample standard deviation of the row's group (Bessel-corrected): float64 (N,).

    ``s_g = sqrt(Σ_{j∈g} (R_j − mean_g)² / (n_g − 1))``, two passes (no
    cancellation); a group of one row, or of equal rewards, gets exactly 0.
    """
    r = np.asarray(reward, dtype=np.float64)
    g = np.asarray(groups)
    G = n_groups if n_groups is not None else int(g.max(initial=-1)) + 1
    dev = r - group_mean_baseline(r, g, G)
    ss = np.bincount(g, weights=dev * dev, minlength=G)
    counts = np.bincount(g, minlength=G)
    high, low = np.full(G, -np.inf), np.full(G, np.inf)
    np.maximum.at(high, g, r)
    np.minimum.at(low, g, r)
    # Equal rewards whose mean is not exact in binary (0.1) leave ~1e-17 of rounding in dev:
    # that std is 0, or scale_advantages would divide A by it.
    return np.where(high == low, 0.0, np.sqrt(ss / np.maximum(counts - 1, 1)))[g]


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
