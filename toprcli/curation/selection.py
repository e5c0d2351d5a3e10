"""Row selection for curation: each function returns a keep mask, bool (N,).

Pure NumPy/Arrow; see :mod:`toprcli.curation` for the conventions.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from toprcli.curation.baselines import encode, group_ids


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
