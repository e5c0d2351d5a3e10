"""Preference pairs (toprcli/curation/pairs.py) against a per-group enumeration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from toprcli.curation import groups_without_pair, preference_pairs


def brute_force(correct, groups, order, mode):
    pairs = []
    for g in sorted(set(groups)):
        rows = sorted((i for i in range(len(groups)) if groups[i] == g), key=lambda i: (order[i], i))
        pos = [i for i in rows if correct[i]]
        neg = [i for i in rows if not correct[i]]
        pairs += list(zip(pos, neg)) if mode == "matched" else list(itertools.product(pos, neg))
    return pairs


@pytest.mark.parametrize("mode", ["matched", "all"])
@pytest.mark.parametrize("seed", range(5))
def test_pairs_match_an_enumeration(mode, seed):
    rng = np.random.default_rng(seed)
    n = 60
    groups = rng.integers(0, 9, n)
    correct = rng.random(n) < 0.4
    order = rng.permutation(n)
    chosen, rejected = preference_pairs(correct, groups, order, mode=mode)
    assert sorted(zip(chosen.tolist(), rejected.tolist())) == sorted(brute_force(correct, groups, order, mode))
    assert correct[chosen].all() and not correct[rejected].any()
    assert (groups[chosen] == groups[rejected]).all()


def test_cap_and_groups_without_pair():
    groups = np.array([0, 0, 0, 0, 1, 1, 2])
    correct = np.array([True, True, False, False, True, True, False])
    chosen, _ = preference_pairs(correct, groups, mode="all", max_per_group=3, seed=1)
    assert len(chosen) == 3
    chosen, rejected = preference_pairs(correct, groups, mode="matched", max_per_group=1)
    assert chosen.tolist() == [0] and rejected.tolist() == [2]
    assert groups_without_pair(correct, groups) == 2
    with pytest.raises(ValueError, match="pairs mode"):
        preference_pairs(correct, groups, mode="some")
