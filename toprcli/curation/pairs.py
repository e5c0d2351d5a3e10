"""Preference pairs for pairwise losses (DPO): a correct and an incorrect sample of one prompt.

Pure NumPy, vectorised like the rest of :mod:`toprcli.curation`. Rows are
indices into the arrays passed in; a pair is (chosen, rejected).

Modes (``CurateConfig.pairs``):

* ``matched`` — per prompt, the i-th correct sample with the i-th incorrect one
  (both by ``order``, e.g. ``sample_index``): min(#correct, #incorrect) pairs,
  each sample in at most one pair;
* ``all`` — every correct × incorrect combination of the prompt (a sample
  appears in several pairs).

``max_per_group`` caps a prompt's pairs: the first ones for ``matched``, a
seeded uniform choice for ``all`` (so a cap does not favour the first samples).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

from toprcli.curation.selection import mixed_outcome_mask, rank_in_group

PAIR_MODES = ("matched", "all")
# The columns a paired training set adds: rows 2k and 2k+1 are pair k, the chosen (correct) one first.
PAIR_FIELDS = [pa.field("pair_id", pa.int64(), nullable=False), pa.field("chosen", pa.bool_(), nullable=False)]


def preference_pairs(
    correct: np.ndarray,
    groups: np.ndarray,
    order: np.ndarray | None = None,
    *,
    mode: str = "matched",
    max_per_group: int | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(chosen (P,), rejected (P,)) row indices, pairs sorted by group.

    ``correct``: bool (N,); ``groups``: int (N,); ``order``: sortable (N,) or None.
    """
    if mode not in PAIR_MODES:
        raise ValueError(f"unknown pairs mode {mode!r} — choose one of: {', '.join(PAIR_MODES)}")
    if max_per_group is not None and max_per_group < 1:
        raise ValueError(f"max_per_group must be >= 1, got {max_per_group}")
    c = np.asarray(correct, dtype=bool)
    g = np.asarray(groups, dtype=np.int64)
    order = np.arange(len(g)) if order is None else np.asarray(order)
    pos, neg = np.flatnonzero(c), np.flatnonzero(~c)
    pos = pos[np.lexsort((order[pos], g[pos]))]  # by group, then order
    neg = neg[np.lexsort((order[neg], g[neg]))]
    if mode == "matched":
        chosen, rejected = _matched(pos, neg, g)
    else:
        chosen, rejected = _all(pos, neg, g)
    if max_per_group is not None and len(chosen):
        pg = g[chosen]
        key = None if mode == "matched" else np.random.default_rng(seed).random(len(chosen))
        keep = rank_in_group(pg, key) < max_per_group
        chosen, rejected = chosen[keep], rejected[keep]
    return chosen, rejected


def _matched(pos: np.ndarray, neg: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair positives and negatives of equal rank within their group."""
    if len(pos) == 0 or len(neg) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    width = max(len(pos), len(neg)) + 1
    pos_key = g[pos] * width + rank_in_group(g[pos])  # pos is sorted, so the rank follows order
    neg_key = g[neg] * width + rank_in_group(g[neg])
    _, i, j = np.intersect1d(pos_key, neg_key, assume_unique=True, return_indices=True)
    return pos[i].astype(np.int64), neg[j].astype(np.int64)


def _all(pos: np.ndarray, neg: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every positive with every negative of its group."""
    if len(pos) == 0 or len(neg) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    n_groups = int(max(g[pos].max(), g[neg].max())) + 1
    neg_count = np.bincount(g[neg], minlength=n_groups)
    neg_start = np.concatenate([[0], np.cumsum(neg_count)[:-1]])
    reps = neg_count[g[pos]]  # (n_pos,) partners of each positive
    chosen = np.repeat(pos, reps)
    block_start = np.repeat(np.cumsum(reps) - reps, reps)
    k = np.arange(len(chosen)) - block_start  # rank of the partner within its group's negatives
    rejected = neg[np.repeat(neg_start[g[pos]], reps) + k]
    return chosen.astype(np.int64), rejected.astype(np.int64)


def groups_without_pair(correct: np.ndarray, groups: np.ndarray) -> int:
    """Groups that yield no pair: every sample correct, or every sample incorrect."""
    g = np.asarray(groups, dtype=np.int64)
    both = mixed_outcome_mask(correct, g)  # rows whose group has both outcomes
    return len(np.unique(g)) - len(np.unique(g[both]))


def as_pair_rows(schema: pa.Schema, tables: Iterable[pa.Table], order: np.ndarray, row_group: int) -> tuple[pa.Schema, Iterator[pa.Table]]:
    """The kept rows (``tables``, in order) reordered — and repeated — by ``order`` (chosen, rejected, ...),
    with ``pair_id`` and ``chosen`` added; tables of ``row_group`` rows. The kept rows are read whole
    into memory: a training set is small next to the scored inputs it comes from."""
    for f in PAIR_FIELDS:
        schema = schema.append(f)

    def pairs() -> Iterator[pa.Table]:
        table = pa.concat_tables(list(tables)).take(pa.array(order))
        n = len(order)
        table = table.append_column(PAIR_FIELDS[0], pa.array(np.arange(n) // 2, pa.int64()))
        table = table.append_column(PAIR_FIELDS[1], pa.array(np.arange(n) % 2 == 0))
        for k in range(0, n, row_group):
            yield table.slice(k, row_group).cast(schema)

    return schema, pairs()
