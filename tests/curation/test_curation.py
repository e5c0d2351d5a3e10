"""Curation math (toprcli/curation.py) against hand-computed values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from toprcli import curation as cu

# -- the baseline ↔ composition identity ---------------------------------------


def test_closed_form_paper_example():
    # p = 0.5, P = 0.15: c = (0.5 - 0.15) / (0.5 + 0.15 * 0) = 0.7
    assert cu.closed_form_baseline(0.5, 0.15) == pytest.approx(0.7)
    # and back: 0.5 * 0.3 / (1 + 0.7 * 0) = 0.15
    assert cu.closed_form_share(0.5, 0.7) == pytest.approx(0.15)


def test_closed_form_limits():
    for p in (0.1, 0.5, 0.9):
        assert cu.closed_form_share(p, 0.0) == pytest.approx(p)  # no baseline: p̃ = p
        assert cu.closed_form_share(p, -1.0) == pytest.approx(1.0)  # c = -1: negatives carry nothing
        assert cu.closed_form_share(p, 1.0) == pytest.approx(0.0)
    # every A = 0 (all positive at c = 1, all negative at c = -1): once ZeroDivisionError
    assert cu.closed_form_share(1.0, 1.0) == 1.0 and cu.closed_form_share(0.0, -1.0) == 0.0
    # p = 0.1, P = 0.5: c = (0.1 - 0.5) / (0.1 + 0.5 * 0.8) = -0.8
    assert cu.closed_form_baseline(0.1, 0.5) == pytest.approx(-0.8)


def _pm1(n: int, p: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < p, 1.0, -1.0).astype(np.float32)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("target", [0.15, 0.5, 0.85])
def test_solve_hits_target_and_matches_closed_form(p, target):
    r = _pm1(20_000, p, seed=int(p * 10))
    p_hat = cu.positive_share(r > 0)
    c = cu.solve_baseline(r, target)
    assert c == pytest.approx(cu.closed_form_baseline(p_hat, target), abs=1e-9)
    a = cu.advantages(r, c)
    assert a.dtype == np.float32
    assert abs(cu.effective_positive_share(a) - target) < 0.005
    assert cu.effective_positive_share(a) == pytest.approx(cu.closed_form_share(p_hat, c), abs=1e-6)


def test_effective_share_hand_values():
    # A = [1, 1, -3]: positive mass 2 of 5
    assert cu.effective_positive_share(np.array([1.0, 1.0, -3.0])) == pytest.approx(0.4)
    # weights [1, 0, 1]: 1 of 4
    assert cu.effective_positive_share(np.array([1.0, 1.0, -3.0]), np.array([1.0, 0.0, 1.0])) == pytest.approx(0.25)
    # A = 0 counts positive but carries no mass
    assert cu.effective_positive_share(np.array([0.0, 2.0, -2.0])) == pytest.approx(0.5)
    assert np.isnan(cu.effective_positive_share(np.zeros(3)))


def test_solve_zero_one_rewards():
    # R ∈ {0, 1}, p = 0.5, P = 0.15: c = 1 - P = 0.85 (pos mass .5·.15, neg mass .5·.85)
    r = np.array([0.0, 1.0] * 50)
    assert cu.solve_baseline(r, 0.15) == pytest.approx(0.85)


def test_solve_three_valued_rewards():
    # R ∈ {-1, 0, 1} equally often, P = 0.25. Knot shares: c=-1 → 1, c=0 → 1/2, c=1 → 0.
    # Segment (0, 1]: S_hi = W_hi = 1/3, S_lo = -1/3, W_lo = 2/3:
    # c = (.75/3 - .25/3) / (.75/3 + .25·2/3) = (1/6) / (5/12) = 0.4
    r = np.array([-1.0, 0.0, 1.0] * 10)
    c = cu.solve_baseline(r, 0.25)
    assert c == pytest.approx(0.4)
    assert cu.effective_positive_share(r - c) == pytest.approx(0.25)
    # P = 0.5 lands exactly on the knot c = 0
    assert cu.solve_baseline(r, 0.5) == pytest.approx(0.0, abs=1e-12)


def test_solve_general_rewards_any_values():
    rng = np.random.default_rng(1)
    r = rng.normal(size=5000) ** 3  # heavy tails, all distinct
    w = rng.uniform(0, 2, size=5000)
    for target in (0.01, 0.1, 0.37, 0.5, 0.9, 0.99):
        c = cu.solve_baseline(r, target, w)
        assert cu.effective_positive_share(r - c, w) == pytest.approx(target, abs=1e-9)


def test_solve_weighted_pm1():
    # R = [+1, -1] with weights [1, 3]: weighted p = 0.25, so P = 0.25 needs c = 0
    assert cu.solve_baseline(np.array([1.0, -1.0]), 0.25, np.array([1.0, 3.0])) == pytest.approx(0.0, abs=1e-12)


def test_solve_unreachable_and_bad_target():
    with pytest.raises(ValueError, match="fewer than two distinct"):
        cu.solve_baseline(np.ones(10), 0.2)
    with pytest.raises(ValueError, match="fewer than two distinct"):  # the only negative has weight 0
        cu.solve_baseline(np.array([1.0, -1.0]), 0.2, np.array([1.0, 0.0]))
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="strictly between"):
            cu.solve_baseline(np.array([1.0, -1.0]), bad)


def test_positive_share():
    assert cu.positive_share(np.array([True, False, False, False])) == pytest.approx(0.25)
    assert cu.positive_share(np.array([True, False]), np.array([3.0, 1.0])) == pytest.approx(0.75)


# -- groups and group baselines --------------------------------------------------


def test_group_ids_composite_key():
    it = pa.array([0, 0, 1, 1, 0], pa.int32())
    pol = pa.array(["m0", "m0", "m1", "m1", "m0"])
    pid = pa.array(["a", "b", "a", "a", "a"])
    g, n = cu.group_ids(it, pol, pid)
    assert n == 3
    assert g[0] == g[4] and g[2] == g[3]
    assert len({g[0], g[1], g[2]}) == 3  # same prompt id in another round is another group


def test_group_ids_chunked_strings_share_codes():
    col = pa.chunked_array([["x", "y"], ["y", "x", "z"]])
    g, n = cu.group_ids(col)
    assert n == 3 and g[0] == g[3] and g[1] == g[2]


def test_group_mean_and_leave_one_out_hand_values():
    r = np.array([1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 0.5])
    g = np.array([0, 0, 0, 0, 1, 1, 2])
    # group 0: mean -0.5; group 1: mean 1; group 2 (singleton): its own reward
    np.testing.assert_allclose(cu.group_mean_baseline(r, g), [-0.5] * 4 + [1.0, 1.0, 0.5])
    np.testing.assert_allclose(r - cu.group_mean_baseline(r, g), [1.5, -0.5, -0.5, -0.5, 0, 0, 0])
    # leave-one-out: row 0 sees (-1-1-1)/3 = -1 → A = 2; rows 1-3 see (1-1-1)/3 = -1/3 → A = -2/3
    loo = cu.leave_one_out_baseline(r, g)
    np.testing.assert_allclose(loo, [-1.0, -1 / 3, -1 / 3, -1 / 3, 1.0, 1.0, 0.5])
    np.testing.assert_allclose(r - loo, [2.0, -2 / 3, -2 / 3, -2 / 3, 0, 0, 0], atol=1e-12)
    # the identity A_loo = n/(n-1) · A_mean on groups with n > 1
    np.testing.assert_allclose((r - loo)[:4], 4 / 3 * (r - cu.group_mean_baseline(r, g))[:4])


# -- selection -----------------------------------------------------------------


def test_rank_in_group_with_order():
    g = np.array([1, 0, 1, 0, 1])
    order = np.array([2, 5, 0, 1, 0])  # ties (rows 2 and 4) by row position
    np.testing.assert_array_equal(cu.rank_in_group(g, order), [2, 1, 0, 0, 1])
    np.testing.assert_array_equal(cu.rank_in_group(g), [0, 0, 1, 1, 2])
    assert len(cu.rank_in_group(np.array([], dtype=np.int64))) == 0


def test_mixed_outcome_mask():
    correct = np.array([True, True, False, False, False, True])
    g = np.array([0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(cu.mixed_outcome_mask(correct, g), [False, False, False, False, True, True])


def test_first_positive_mask():
    pos = np.array([True, True, False, True, False, True])
    g = np.array([0, 0, 0, 1, 1, 1])
    order = np.array([3, 1, 2, 0, 1, 2])  # in group 0 the positive with sample_index 1 is first
    np.testing.assert_array_equal(cu.first_positive_mask(pos, g, order), [False, True, True, True, True, False])
    np.testing.assert_array_equal(cu.first_positive_mask(pos, g), [True, False, True, True, True, False])


def test_cap_per_group_mask():
    g = np.array([0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(cu.cap_per_group_mask(g, 2), [True, True, False, True, True, False])
    with pytest.raises(ValueError):
        cu.cap_per_group_mask(g, 0)


def test_dedupe_exact_within_group():
    comp = pa.array(["a", "b", "a", "a", "long text " * 5, "long text " * 5, "b"])
    g = np.array([0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(cu.dedupe_mask(g, comp), [True, True, False, True, True, False, True])
    # order: the later row (sample_index 0) is the one kept
    order = np.array([5, 1, 0, 0, 0, 1, 2])
    np.testing.assert_array_equal(cu.dedupe_mask(g, comp, order), [False, True, True, True, True, False, True])


def test_dedupe_of_one_repeated_completion():
    """Every completion the same (a degenerate policy), or one row: the fingerprints span a tiny range of uint64
    values at or above 2^63, which must not be cast to int64 before their offset is taken (an OverflowError)."""
    assert int(cu.string_fingerprint(pa.array(["x"]))[0]) >= 2**63
    np.testing.assert_array_equal(cu.dedupe_mask(np.array([0, 0, 0]), pa.array(["x", "x", "x"])), [True, False, False])
    np.testing.assert_array_equal(cu.dedupe_mask(np.array([0]), pa.array(["x"])), [True])
    big = np.array([2**64 - 1, 2**63, 2**64 - 1], dtype=np.uint64)
    np.testing.assert_array_equal(cu.encode(big), [1, 0, 1])
    np.testing.assert_array_equal(cu.encode(np.array([True, False, True])), [1, 0, 1])


def test_encode_codes_dictionary_chunks_by_value():
    """Each dictionary chunk has its own dictionary: x and y of two chunks both got code 0."""
    chunks = pa.chunked_array([pa.array(["x", "y"]).dictionary_encode(), pa.array(["y", "z"]).dictionary_encode()])
    np.testing.assert_array_equal(cu.encode(chunks), [0, 1, 1, 2])


def test_dedupe_survives_fingerprint_collisions():
    # Same length, same first/middle/last 8 bytes, different in between: the
    # fingerprints collide and the exact check must keep both.
    a = "0123456789" + "X" * 20 + "mid-mid-" + "Y" * 20 + "abcdefgh"
    b = a[:12] + "Z" + a[13:]
    assert len(a) == len(b) and a != b
    fp = cu.string_fingerprint(pa.array([a, b]))
    assert fp[0] == fp[1]
    np.testing.assert_array_equal(cu.dedupe_mask(np.array([0, 0]), pa.array([a, b])), [True, True])
    # Forced total collision (all fingerprints zero): still exact.
    comp = pa.array(["x", "y", "x", "z"])
    np.testing.assert_array_equal(
        cu.dedupe_mask(np.zeros(4, np.int64), comp, fingerprints=np.zeros(4, np.uint64)), [True, True, False, True]
    )


def test_string_fingerprint_buffers():
    base = pa.array(["", "a", None, "hello world, this is long", "a", "hello world, this is long"])
    fp = cu.string_fingerprint(base)
    assert fp.dtype == np.uint64 and len(fp) == 6
    assert fp[1] == fp[4] and fp[3] == fp[5] and fp[0] != fp[1] and fp[0] == fp[2]  # null ≡ ""
    # slices (non-zero array offset), large_string and chunked arrays agree
    np.testing.assert_array_equal(cu.string_fingerprint(base.slice(3)), fp[3:])
    np.testing.assert_array_equal(cu.string_fingerprint(base.cast(pa.large_string())), fp)
    np.testing.assert_array_equal(cu.string_fingerprint(pa.chunked_array([base.slice(0, 2), base.slice(2)])), fp)
    # every string shorter than 17 bytes is exact
    short = pa.array([f"{i:x}" * (1 + i % 3) for i in range(2000)])
    assert len(np.unique(cu.string_fingerprint(short))) == len(set(short.to_pylist()))


def test_duplicate_candidates():
    g = np.array([0, 0, 1, 1])
    fp = np.array([7, 7, 7, 8], dtype=np.uint64)
    np.testing.assert_array_equal(cu.duplicate_candidates(g, fp), [True, True, False, False])


def test_subsample_indices():
    idx = cu.subsample_indices(100, 10, seed=3)
    assert len(idx) == 10 and len(set(idx.tolist())) == 10 and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(idx, cu.subsample_indices(100, 10, seed=3))
    np.testing.assert_array_equal(cu.subsample_indices(5, 10, seed=0), np.arange(5))


def test_no_python_row_loops_at_scale():
    # 200k rows through every function well under a second each (vectorised).
    import time

    n = 200_000
    rng = np.random.default_rng(0)
    r = np.where(rng.random(n) < 0.3, 1.0, -1.0)
    g = rng.integers(0, n // 16, size=n)
    t = time.perf_counter()
    cu.solve_baseline(r, 0.15)
    cu.group_mean_baseline(r, g)
    cu.leave_one_out_baseline(r, g)
    cu.first_positive_mask(r > 0, g, rng.integers(0, 16, size=n))
    cu.mixed_outcome_mask(r > 0, g)
    cu.dedupe_mask(g, pa.array([f"completion {i % 5000}" for i in range(n)]))
    assert time.perf_counter() - t < 5.0


def test_group_ids_small_and_large_ranges_agree():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, size=1000)
    b = rng.integers(0, 50, size=1000)
    big = b.astype(np.int64) * 10**15  # forces the np.unique path
    g1, n1 = cu.group_ids(a, b)
    g2, n2 = cu.group_ids(a, big)
    assert n1 == n2 == len(set(zip(a.tolist(), b.tolist())))
    np.testing.assert_array_equal(g1, g2)
    fp = cu.string_fingerprint(pa.array([str(x) for x in b]))  # uint64 keys
    g3, n3 = cu.group_ids(a, fp)
    assert n3 == n1 and len(set(zip(g1.tolist(), g3.tolist()))) == n1


def test_weighted_batch_statistics_by_hand():
    r, w = np.array([1.0, -1.0, 0.0, 2.0]), np.array([2.0, 1.0, 1.0, 0.0])
    assert cu.batch_mean(r, w) == pytest.approx((2 - 1 + 0) / 4) and cu.batch_mean(r, np.ones(4)) == cu.batch_mean(r) == 0.5
    # reliability weights (scale-free: weights 2,1,1 as 1,0.5,0.5): m = 0.25, Σw(r−m)² = 2.75, Σw − Σw²/Σw = 4 − 6/4
    assert cu.reward_std(r, w) == pytest.approx((2.75 / 2.5) ** 0.5) == cu.reward_std(r, w / 2)
    assert cu.reward_std(r, np.full(4, 3.0)) == cu.reward_std(r)  # equal weights: the plain value, bit for bit
    assert cu.reward_std(r, np.array([1.0, 0.0, 0.0, 0.0])) == 0.0  # one row of weight > 0


def test_reward_std_and_scaling_hand_values():
    r = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 5.0])
    g = np.array([0, 0, 0, 0, 1, 1, 2])
    assert cu.reward_std(r) == pytest.approx(np.std(r, ddof=1))
    assert cu.reward_std(r[:1]) == 0.0
    # group 0: mean 1/4, Σdev² = 0.75, /3 → std 0.5; group 1 constant → 0; singleton → 0
    np.testing.assert_allclose(cu.group_reward_std(r, g), [0.5] * 4 + [0.0, 0.0, 0.0])
    a = np.array([0.75, -0.25, 2.0, 3.0])
    np.testing.assert_allclose(cu.scale_advantages(a, np.array([0.5, 0.5, 0.0, 2.0])), [1.5, -0.5, 2.0, 1.5], rtol=1e-5)
    np.testing.assert_allclose(cu.scale_advantages(a, 0.5, clip=1.0), [1.0, -0.5, 1.0, 1.0], rtol=1e-5)
    assert cu.scale_advantages(a).dtype == np.float32


def test_equal_rewards_not_exact_in_binary_have_std_zero_and_leave_advantages_as_they_are():
    """Eight samples of one prompt all failing at reward -0.1: numpy's std is ~1.5e-17 from rounding, and A / (std + 1e-6)
    once turned -0.1 into -100000."""
    r = np.full(8, -0.1)
    assert np.std(np.full(3, -0.1), ddof=1) > 0  # the rounding this guards against
    assert cu.reward_std(np.full(3, -0.1)) == 0.0
    std = cu.group_reward_std(np.concatenate([r, [1.0, -0.1]]), np.array([0] * 8 + [1, 1]))
    assert (std[:8] == 0).all() and std[8] > 0
    np.testing.assert_allclose(cu.scale_advantages(r, std[:8]), r, rtol=1e-6)


def test_accuracy_range_mask_is_strict():
    o = np.array([True, False, False, False, True, True, False, False])
    g = np.array([0, 0, 0, 0, 1, 1, 2, 2])  # accuracies 0.25, 1, 0
    np.testing.assert_array_equal(cu.accuracy_range_mask(o, g, 0.25, 1.0), [False] * 8)
    np.testing.assert_array_equal(cu.accuracy_range_mask(o, g, 0.1, 0.95), [True] * 4 + [False] * 4)
    np.testing.assert_array_equal(cu.accuracy_range_mask(o, g, 0.0, 1.0), cu.mixed_outcome_mask(o, g))
