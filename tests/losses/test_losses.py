"""Hand-computed checks of toprcli.losses (aggregation, TOPR and its siblings)."""

from __future__ import annotations

import math

import pytest
import torch

from toprcli.losses import (
    AGGREGATIONS,
    LOSSES,
    aggregate,
    kl_penalty,
    list_losses,
    policy_loss,
    register_loss,
)

D = torch.float64


def t(x, grad=False):
    return torch.tensor(x, dtype=D, requires_grad=grad)


def grad_of(name, lp, blp, adv, mask, **kw):
    """(loss, metrics, d loss / d logprobs) for a fresh leaf copy of lp."""
    x = lp.detach().clone().requires_grad_(True)
    loss, metrics = policy_loss(name, x, blp, adv, mask, **kw)
    (g,) = torch.autograd.grad(loss, x)
    return loss, metrics, g


# --------------------------------------------------------------------------- #
# Aggregation on a 2×3 example
#   l = [[1, 2, 3], [4, 5, 6]], mask = [[1, 1, 0], [1, 1, 1]], w = [1, 3]
#   row sums 3 and 15, lengths 2 and 3
# --------------------------------------------------------------------------- #

L = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
W = t([1.0, 3.0])


@pytest.mark.parametrize(
    "mode, norm, expected",
    [
        ("token-mean", None, (1 * 3 + 3 * 15) / (1 * 2 + 3 * 3)),  # 48/11
        ("seq-mean-token-sum", None, (1 * 3 + 3 * 15) / 4),  # 12
        ("seq-mean-token-mean", None, (1 * 1.5 + 3 * 5) / 4),  # 4.125
        ("seq-mean-token-sum-norm", None, (1 * 3 / 3 + 3 * 15 / 3) / 4),  # N = T = 3 → 4
        ("seq-mean-token-sum-norm", 10, (1 * 0.3 + 3 * 1.5) / 4),  # 1.2
    ],
)
def test_aggregation_by_hand(mode, norm, expected):
    assert aggregate(L, M, mode, W, norm_length=norm).item() == pytest.approx(expected, abs=1e-12)


def test_aggregation_unweighted_and_default_mode():
    assert aggregate(L, M).item() == pytest.approx((1.5 + 5) / 2)
    assert aggregate(L, M, "token-mean").item() == pytest.approx(18 / 5)


def test_aggregation_guards_no_nan():
    # padding may hold inf/NaN: it must not leak into value or gradient
    x = t([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]], grad=True)
    x2 = t([[1.0, 2.0, float("-inf")], [4.0, 5.0, 6.0]])
    for mode in AGGREGATIONS:
        assert aggregate(x2, M, mode, W).item() == pytest.approx(aggregate(L, M, mode, W).item())
        v = aggregate(x, M, mode, W)
        (g,) = torch.autograd.grad(v, x)
        assert torch.isfinite(v) and torch.isfinite(g).all()
        assert g[0, 2] == 0
        # all-empty mask and all-zero weights → exactly 0, finite grads
        for mask, w in [(torch.zeros_like(M), W), (M, torch.zeros_like(W))]:
            y = L.clone().requires_grad_(True)
            v = aggregate(y, mask, mode, w)
            (g,) = torch.autograd.grad(v, y)
            assert v.item() == 0.0 and torch.isfinite(g).all()
    # a row without tokens is not a sequence: it leaves the denominator
    empty_first = t([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert aggregate(L, empty_first, "seq-mean-token-mean").item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(L, M, "mean")


# --------------------------------------------------------------------------- #
# TOPR
#   row 0: positive, A = 2, 3 tokens
#   row 1: negative, A = −1, 2 tokens (third is padding), s = −0.3 − 0.4 = −0.7
# --------------------------------------------------------------------------- #

LP = t([[-1.0, -2.0, -3.0], [-0.5, -1.0, -9.0]])
BLP = t([[-1.1, -2.0, -2.0], [-0.2, -0.6, 0.0]])
MASK = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = t([2.0, -1.0])
ALPHA = math.exp(-0.7)


def test_topr_value_and_gradients_by_hand():
    loss, metrics, g = grad_of("topr", LP, BLP, ADV, MASK)
    # loss = ½[−2·mean(−1,−2,−3) + α·mean(−0.5,−1)]
    assert loss.item() == pytest.approx(0.5 * (-2 * -2.0 + ALPHA * -0.75), abs=1e-12)
    expected = t([[-1 / 3, -1 / 3, -1 / 3], [ALPHA / 4, ALPHA / 4, 0.0]])
    torch.testing.assert_close(g, expected, rtol=0, atol=1e-15)
    assert metrics["n_pos"].item() == 1 and metrics["n_neg"].item() == 1
    assert metrics["neg_alpha_mean"].item() == pytest.approx(ALPHA)
    assert metrics["neg_alpha_lt1_frac"].item() == 1.0
    # sequence log-ratios: row 0 = 0.1 + 0 − 1 = −0.9, row 1 = −0.7
    assert metrics["log_ratio_min"].item() == pytest.approx(-0.9)
    assert metrics["log_ratio_max"].item() == pytest.approx(-0.7)
    assert metrics["log_ratio_mean"].item() == pytest.approx(-0.8)
    assert all(not v.requires_grad and v.dim() == 0 for v in metrics.values())


def test_topr_positives_equal_sft_negatives_equal_truncated_is():
    _, _, g_topr = grad_of("topr", LP, BLP, ADV, MASK)
    _, _, g_sft = grad_of("sft", LP, BLP, ADV, MASK)
    # positives: exactly the SFT gradient; SFT drops the negative entirely
    torch.testing.assert_close(g_topr[0], g_sft[0], rtol=0, atol=0)
    assert (g_sft[1] == 0).all()
    # negatives: truncated IS, coef clip(π/μ, 0, 1) = e^-0.7, with a python-float
    # constant α, so any dα/dθ term in TOPR would show up as a difference
    x = LP.clone().requires_grad_(True)
    neg_only = 0.5 * (-(-1.0) * ALPHA * (x[1, :2].sum() / 2))
    (g_hand,) = torch.autograd.grad(neg_only, x)
    torch.testing.assert_close(g_topr[1], g_hand[1], rtol=0, atol=1e-16)
    # and the library's own tis (all samples clipped to [0, 1]) agrees on negatives
    _, _, g_tis = grad_of("tis", LP, BLP, ADV, MASK)
    torch.testing.assert_close(g_topr[1], g_tis[1], rtol=0, atol=1e-16)


def test_topr_alpha_carries_no_gradient():
    # full hand loss with α a python float: gradients must match exactly
    x = LP.clone().requires_grad_(True)
    hand = 0.5 * (-2.0 * x[0].mean() - (-1.0) * ALPHA * x[1, :2].mean())
    (g_hand,) = torch.autograd.grad(hand, x)
    _, _, g = grad_of("topr", LP, BLP, ADV, MASK)
    torch.testing.assert_close(g, g_hand, rtol=0, atol=1e-16)


def test_topr_far_negative_has_no_gradient_and_negative_above_mu_gets_alpha_one():
    lp = t([[-1.0, -2.0], [-30.0, -30.0], [-1.0, -1.0]])
    blp = t([[-1.0, -2.0], [-5.0, -5.0], [-2.0, -2.0]])  # row 1: s = −50; row 2: s = +2
    adv = t([1.0, -1.0, -1.0])
    mask = torch.ones_like(lp)
    _, metrics, g = grad_of("topr", lp, blp, adv, mask)
    assert g[1].abs().max().item() < 1e-20  # e^-50/6 ≈ 3e-23
    _, _, g_naive = grad_of("reinforce", lp, blp, adv, mask)
    torch.testing.assert_close(g[2], g_naive[2], rtol=0, atol=0)  # α = 1 when π > μ
    torch.testing.assert_close(g[2], t([1 / 6, 1 / 6]), rtol=0, atol=1e-16)
    assert metrics["neg_alpha_lt1_frac"].item() == 0.5


def test_topr_token_level_differs_from_sequence_level():
    # token log-ratios +1 and −1: sequence ratio 1 (α = 1), token α = (1, e^-1)
    lp, blp = t([[-1.0, -2.0]]), t([[-2.0, -1.0]])
    adv, mask = t([-1.0]), t([[1.0, 1.0]])
    l_seq, _, g_seq = grad_of("topr", lp, blp, adv, mask)
    l_tok, m_tok, g_tok = grad_of("topr", lp, blp, adv, mask, ratio_level="token")
    assert l_seq.item() == pytest.approx(-1.5)
    assert l_tok.item() == pytest.approx((-1.0 + math.exp(-1) * -2.0) / 2)
    torch.testing.assert_close(g_seq, t([[0.5, 0.5]]))
    torch.testing.assert_close(g_tok, t([[0.5, math.exp(-1) / 2]]))
    assert m_tok["neg_token_alpha_mean"].item() == pytest.approx((1 + math.exp(-1)) / 2)


def test_topr_weights_by_hand():
    # l = ½[−w₊·2·mean(−1,−2,−3) + w₋·α·mean(−0.5,−1)]; the weights scale each side's
    # gradient and nothing else (α stays the same stop-gradient coefficient)
    wp, wn = 0.75, 0.5
    loss, metrics, g = grad_of("topr", LP, BLP, ADV, MASK, positive_weight=wp, negative_weight=wn)
    assert loss.item() == pytest.approx(0.5 * (wp * -2 * -2.0 + wn * ALPHA * -0.75), abs=1e-12)
    expected = t([[-wp / 3, -wp / 3, -wp / 3], [wn * ALPHA / 4, wn * ALPHA / 4, 0.0]])
    torch.testing.assert_close(g, expected, rtol=0, atol=1e-15)
    assert metrics["neg_alpha_mean"].item() == pytest.approx(ALPHA)  # reported α is unweighted
    # negative_weight 0 is positives-only: the SFT gradient exactly
    _, _, g0 = grad_of("topr", LP, BLP, ADV, MASK, negative_weight=0.0)
    _, _, g_sft = grad_of("sft", LP, BLP, ADV, MASK)
    torch.testing.assert_close(g0, g_sft, rtol=0, atol=0)
    # defaults (1, 1) are the paper's TOPR, bit for bit
    _, _, g1 = grad_of("topr", LP, BLP, ADV, MASK, positive_weight=1.0, negative_weight=1.0)
    _, _, g_default = grad_of("topr", LP, BLP, ADV, MASK)
    torch.testing.assert_close(g1, g_default, rtol=0, atol=0)


def test_topr_weights_split_by_advantage_sign_after_whitening():
    # the split is on the sign of A (not of the reward); with rewards +1, +1, −1 the
    # whitened A ≈ (0.707, 0.707, −1.414) keeps the signs and gets the same weights
    lp = t([[-1.0], [-1.0], [-1.0], [-1.0]])
    blp = lp.clone()
    mask = torch.ones_like(lp)
    adv = t([1.0, 1.0, -1.0, 0.0])
    _, _, g = grad_of("topr", lp, blp, adv, mask, positive_weight=2.0, negative_weight=0.25)
    torch.testing.assert_close(g[:, 0], t([-2.0, -2.0, 0.25, 0.0]) / 4, rtol=0, atol=1e-15)
    white = (adv[:3] - adv[:3].mean()) / adv[:3].std(unbiased=False)
    _, _, gw = grad_of("topr", lp[:3], blp[:3], t([1.0, 1.0, -1.0]), mask[:3],
                       whiten_advantages=True, negative_weight=0.25)
    torch.testing.assert_close(gw[:, 0], -white * t([1.0, 1.0, 0.25]) / 3, rtol=0, atol=1e-7)


def test_topr_weights_equal_a_baseline_only_for_two_rewards_without_whitening():
    # ±1 rewards, c = 0, (w₊, w₋) = (1, 0.5) ≡ c = (w₋ − w₊)/(w₋ + w₊) = −1/3 up to a
    # factor 2/(w₊ + w₋): the direction is the same ...
    lp, blp = t([[-1.0], [-2.0], [-0.5]]), t([[-1.0], [-1.5], [-1.0]])
    mask = torch.ones_like(lp)
    r = t([1.0, -1.0, -1.0])
    _, _, g_w = grad_of("topr", lp, blp, r, mask, negative_weight=0.5)
    _, _, g_c = grad_of("topr", lp, blp, r + 1 / 3, mask)
    torch.testing.assert_close(g_c, g_w * 4 / 3, rtol=0, atol=1e-15)
    # ... but whitening removes any constant c, and the weights survive it
    _, _, g_wc = grad_of("topr", lp, blp, r + 1 / 3, mask, whiten_advantages=True)
    _, _, g_w0 = grad_of("topr", lp, blp, r, mask, whiten_advantages=True)
    torch.testing.assert_close(g_wc, g_w0, rtol=0, atol=1e-7)
    _, _, g_ww = grad_of("topr", lp, blp, r, mask, whiten_advantages=True, negative_weight=0.5)
    assert not torch.allclose(g_ww, g_w0)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), "x_2", None, True])
def test_topr_weights_must_be_finite_and_non_negative(bad):
    with pytest.raises(ValueError, match="negative_weight"):
        policy_loss("topr", LP, BLP, ADV, MASK, negative_weight=bad)


def test_train_accepts_topr_weights_as_loss_options():
    # `topr train --loss-option negative_weight=0.5` validates options by running the loss once
    from toprcli.config import TrainConfig
    from toprcli.training.prepare import resolve_loss

    setup = resolve_loss(TrainConfig(loss="topr", loss_options={"negative_weight": 0.5, "ratio_level": "token"}))
    assert setup.options == {"negative_weight": 0.5, "ratio_level": "token"}
    from toprcli.errors import UserError  # the stage turns the loss's ValueError into the user's error

    with pytest.raises(UserError, match="positive_weight"):
        resolve_loss(TrainConfig(loss="topr", loss_options={"positive_weight": -1}))
    with pytest.raises(UserError, match="does not apply to loss 'ppo'"):
        resolve_loss(TrainConfig(loss="ppo", loss_options={"negative_weight": 0.5}))


# --------------------------------------------------------------------------- #
# Siblings by hand
# --------------------------------------------------------------------------- #


def test_is_and_tis_coefficients():
    lp = t([[math.log(5000.0)], [math.log(3.0)], [math.log(0.5)]])
    blp = torch.zeros_like(lp)
    adv, mask = t([1.0, 1.0, 1.0]), torch.ones_like(lp)
    # grad of −coef·A·log π per row, mean over 3 rows → −coef/3
    _, m_is, g = grad_of("is", lp, blp, adv, mask)
    torch.testing.assert_close(g[:, 0], t([-1000.0, -3.0, -0.5]) / 3)  # capped at max_weight=1e3
    assert m_is["clip_frac"].item() == pytest.approx(1 / 3)
    _, m_tis, g = grad_of("tis", lp, blp, adv, mask)
    torch.testing.assert_close(g[:, 0], t([-1.0, -1.0, -0.5]) / 3)
    assert m_tis["clip_frac"].item() == pytest.approx(2 / 3)
    _, _, g = grad_of("tis", lp, blp, adv, mask, lower=0.6, upper=2.0)
    torch.testing.assert_close(g[:, 0], t([-2.0, -2.0, -0.6]) / 3)


def _ppo(ratios, a, **kw):
    lp = t([[math.log(r) for r in ratios]])
    return grad_of("ppo", lp, torch.zeros_like(lp), t([a]), torch.ones_like(lp), **kw)


def test_ppo_clipping_by_hand():
    # A = +1, ε = 0.2: r=1.5 → −1.2 (clipped, no grad); r=0.5 → −0.5; r=1.1 → −1.1
    loss, m, g = _ppo([1.5, 0.5, 1.1], 1.0)
    assert loss.item() == pytest.approx(-2.8 / 3)
    # d(−r)/d log π = −r, mean over 3 tokens
    torch.testing.assert_close(g, t([[0.0, -0.5 / 3, -1.1 / 3]]))
    assert m["clip_frac"].item() == pytest.approx(1 / 3)
    # asymmetric (clip-higher): r=1.5 → −1.28
    loss, _, _ = _ppo([1.5], 1.0, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.28)


def test_ppo_dual_clip_by_hand():
    # A = −1: r=1.5 → 1.5; r=0.5 → max(0.5, 0.8) = 0.8 (clipped); r=4 → 4, dual c=3 → 3
    loss, m, _ = _ppo([1.5, 0.5, 4.0], -1.0)
    assert loss.item() == pytest.approx(6.3 / 3)
    loss, m, g = _ppo([1.5, 0.5, 4.0], -1.0, dual_clip=3.0)
    assert loss.item() == pytest.approx(5.3 / 3)
    torch.testing.assert_close(g, t([[1.5 / 3, 0.0, 0.0]]))
    assert m["clip_frac"].item() == pytest.approx(1 / 3)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 3)


def test_cispo_by_hand():
    lp = t([[math.log(1.5), math.log(0.5)]])
    blp, adv, mask = torch.zeros_like(lp), t([1.0]), torch.ones_like(lp)
    loss, m, g = grad_of("cispo", lp, blp, adv, mask)  # coef (1.28, 0.5): no lower bound
    assert loss.item() == pytest.approx(-(1.28 * math.log(1.5) + 0.5 * math.log(0.5)) / 2)
    torch.testing.assert_close(g, t([[-1.28 / 2, -0.5 / 2]]))
    assert m["clip_frac"].item() == 0.5
    _, m, g = grad_of("cispo", lp, blp, adv, mask, clip_low=0.2)  # coef (1.28, 0.8)
    torch.testing.assert_close(g, t([[-1.28 / 2, -0.8 / 2]]))
    assert m["clip_frac"].item() == 1.0


def test_kimi15_by_hand():
    lp, blp = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])  # d = (0.5, −1)
    adv, mask = t([2.0]), t([[1.0, 1.0]])
    loss, _, g = grad_of("kimi15", lp, blp, adv, mask, tau=0.4)
    # mean_t[−2·lp + 0.2·d²] = [(2 + 0.05) + (4 + 0.2)] / 2
    assert loss.item() == pytest.approx((2.05 + 4.2) / 2)
    # d/dlp = (−2 + 0.4·d)/2
    torch.testing.assert_close(g, t([[(-2 + 0.2) / 2, (-2 - 0.4) / 2]]))


def test_kl_estimators_by_hand():
    lp, ref = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])  # d = log π − log ref = (0.5, −1)
    k3 = ((math.exp(-0.5) - 1 + 0.5) + (math.exp(1.0) - 1 - 1.0)) / 2
    expected = {"k1": (0.5 - 1) / 2, "k2": (0.125 + 0.5) / 2, "k3": k3}
    for est, value in expected.items():
        assert kl_penalty(lp, ref, est).mean().item() == pytest.approx(value)
        # through policy_loss: A = 0 → pg_loss = 0, loss = kl_coef · kl
        loss, m, g = grad_of(
            "reinforce", lp, torch.zeros_like(lp), t([0.0]), torch.ones_like(lp),
            ref_logprobs=ref, kl_coef=0.5, kl_estimator=est,
        )
        assert m["kl"].item() == pytest.approx(value)
        assert loss.item() == pytest.approx(0.5 * value)
        if est == "k3":  # d k3 / d lp = 1 − e^−d
            torch.testing.assert_close(g, 0.5 * t([[1 - math.exp(-0.5), 1 - math.exp(1.0)]]) / 2)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(lp, ref, "k4")


def test_kl_k3_is_bounded_and_plus_estimators_keep_the_value_with_k2s_gradient():
    """k3 of a token π has pushed far below ref (d = −17.5): e^17.5 ≈ 4e7 as value and gradient before the bound; a
    clamp of the value alone gave that token no gradient, so the penalty let go of the tokens that drifted furthest."""
    lp, ref = t([[-18.0, -1.0]], grad=True), t([[-0.5, -1.5]])  # d = (−17.5, 0.5)
    k3 = kl_penalty(lp, ref, "k3")
    assert k3[0, 0].item() == 10.0 and k3[0, 1].item() == pytest.approx(math.exp(-0.5) - 0.5)
    k3.sum().backward()
    assert lp.grad[0, 0].item() == -10.0  # pulled back toward ref at the bounded rate
    assert lp.grad[0, 1].item() == pytest.approx(1 - math.exp(-0.5))  # inside the bound: k3's own slope
    for est in ("k1", "k3"):
        lp.grad = None
        plus = kl_penalty(lp, ref, est + "+")
        torch.testing.assert_close(plus, kl_penalty(lp, ref, est).detach())  # the value logged is k1's or k3's
        plus.sum().backward()
        torch.testing.assert_close(lp.grad, t([[-17.5, 0.5]]))  # ∇ d²/2 = d: toward ref, whatever the value


def test_whitening_equal_advantages_gives_zeros_not_a_sign():
    """float32 mean of seven 0.1s is 1 ulp off: divided by std + 1e-8 it once turned every A into −0.43, seven negatives."""
    lp, mask = t([[-1.0]] * 7).float(), torch.ones(7, 1, dtype=torch.float32)
    adv = torch.full((7,), 0.1, dtype=torch.float32)
    loss, m = policy_loss("topr", lp, lp, adv, mask, whiten_advantages=True)
    assert m["n_neg"].item() == 0 and abs(loss.item()) < 1e-6


def test_whitening_counts_each_row_by_its_weight():
    """A row of weight 0 (a replayed round that counts for nothing) moved the mean and std: the three weighted rows
    all came out negative, and TOPR tapered a positive. Curate's batch statistics count weights; so does whitening."""
    from toprcli.losses.core import sequence_log_ratio, whiten

    adv, valid = t([1.0, 0.2, -1.0, 5.0, 5.0]), torch.ones(5, dtype=torch.bool)
    w = t([1.0, 1.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(whiten(adv, valid, w)[:3], whiten(adv[:3], valid[:3]))  # weight 0: as if absent
    half = t([1.0, 1.0, 0.5, 0.5, 0.5])  # weight 0.5: counts as half a row (mean 1.7, population std by weight)
    mean = (1.0 + 0.2 + 0.5 * (-1.0 + 5.0 + 5.0)) / 3.5
    std = math.sqrt(((1.0 - mean) ** 2 + (0.2 - mean) ** 2 + 0.5 * ((-1.0 - mean) ** 2 + 2 * (5.0 - mean) ** 2)) / 3.5)
    torch.testing.assert_close(whiten(adv, valid, half), (adv - mean) / (std + 1e-8))
    torch.testing.assert_close(whiten(adv, valid, torch.ones(5, dtype=D)), whiten(adv, valid))  # equal weights: as before
    lp, mask = t([[-1.0]] * 5), torch.ones(5, 1, dtype=D)
    _, m = policy_loss("topr", lp, lp, adv, mask, weights=w, whiten_advantages=True)
    assert (m["n_pos"].item(), m["n_neg"].item()) == (2, 1)  # was 0 and 3
    pad = t([[-1.0, -math.inf]])  # a pad holding −inf: 0·inf was NaN in the public helper
    assert sequence_log_ratio(pad, t([[-0.5, 0.0]]), t([[1.0, 0.0]])).item() == pytest.approx(-0.5)


def test_entropy_bonus_and_advantage_options():
    lp, mask = t([[-1.0, -2.0], [-1.0, -1.0]]), torch.ones(2, 2, dtype=D)
    ent = t([[0.5, 1.5], [1.0, 1.0]], grad=True)
    loss, m = policy_loss("reinforce", lp, lp, t([0.0, 0.0]), mask, entropy=ent, entropy_coef=0.1)
    assert m["entropy"].item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(-0.1)
    # adv_clip: A = (2, −3) → (0.5, −0.5); loss = ½[−0.5·(−1.5) + 0.5·(−1)] = 0.125
    loss, m = policy_loss("reinforce", lp, lp, t([2.0, -3.0]), mask, adv_clip=0.5)
    assert loss.item() == pytest.approx(0.125)
    # whitening: A = (1, 3) → (−1, 1); loss = ½[1·(−1.5) − 1·(−1)] = −0.25
    loss, m = policy_loss("reinforce", lp, lp, t([1.0, 3.0]), mask, whiten_advantages=True)
    assert loss.item() == pytest.approx(-0.25, abs=1e-7)
    assert m["n_pos"].item() == 1 and m["n_neg"].item() == 1


def test_weights_scale_sequences():
    lp, mask = t([[-1.0], [-3.0]]), torch.ones(2, 1, dtype=D)
    loss, m = policy_loss("reinforce", lp, lp, t([1.0, 1.0]), mask, weights=t([3.0, 1.0]))
    assert loss.item() == pytest.approx((3 * 1 + 1 * 3) / 4)
    loss, m = policy_loss("reinforce", lp, lp, t([1.0, -1.0]), mask, weights=t([1.0, 0.0]))
    assert loss.item() == pytest.approx(1.0) and m["n_neg"].item() == 0


# --------------------------------------------------------------------------- #
# Robustness over every registered loss
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_extreme_log_ratios_are_finite(name):
    # sequence log-ratios −1e4 and +1e4 (float32), both signs of A, padding = −inf
    lp = torch.tensor([[-1e4, -1.0, float("-inf")], [0.0, -1.0, float("-inf")]], requires_grad=True)
    blp = torch.tensor([[0.0, -1.0, 0.0], [-1e4, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    ref = torch.tensor([[0.0, 0.0, 0.0], [-1e4, 0.0, 0.0]])
    for adv in ([1.0, -1.0], [-1.0, 1.0])[: 1 if LOSSES[name].pairwise else 2]:  # a pair is (chosen, rejected)
        for agg in AGGREGATIONS:
            for extra in ({}, {"ref_logprobs": ref, "kl_coef": 0.1, "kl_estimator": "k3"}):
                loss, metrics = policy_loss(name, lp, blp, torch.tensor(adv), mask, aggregation=agg, **extra)
                (g,) = torch.autograd.grad(loss, lp)
                assert torch.isfinite(loss), (name, adv, agg)
                assert torch.isfinite(g).all(), (name, adv, agg)
                assert (g[:, 2] == 0).all()
                assert all(torch.isfinite(v) for v in metrics.values()), metrics


@pytest.mark.parametrize("name", sorted(n for n in LOSSES if not LOSSES[n].pairwise))
def test_on_policy_losses_reduce_to_reinforce_gradient(name):
    # π = μ: every ratio is 1, so every loss has the REINFORCE gradient, except
    # that sft drops the negative
    lp = t([[-1.0, -2.0], [-0.5, -0.7]])
    adv, mask = t([1.0, -2.0]), torch.ones(2, 2, dtype=D)
    _, _, g = grad_of(name, lp, lp, adv, mask)
    expected = t([[-0.25, -0.25], [0.5, 0.5]])
    if name == "sft":
        expected[1] = 0
    torch.testing.assert_close(g, expected)


# --------------------------------------------------------------------------- #
# Registry and errors
# --------------------------------------------------------------------------- #


def test_registry_contents():
    assert list(list_losses()) == ["topr", "sft", "reinforce", "is", "tis", "ppo", "cispo", "kimi15", "dpo"]
    assert all(list_losses().values())
    assert LOSSES["topr"].options == {"ratio_level": "sequence", "positive_weight": 1.0, "negative_weight": 1.0}
    assert LOSSES["ppo"].options["clip_ratio"] == 0.2


def test_unknown_loss_and_inapplicable_option_raise_user_error():
    with pytest.raises(ValueError) as e:
        policy_loss("grpo", LP, BLP, ADV, MASK)
    assert "grpo" in str(e.value) and "topr" in str(e.value) and "cispo" in str(e.value)
    with pytest.raises(ValueError) as e:
        policy_loss("topr", LP, BLP, ADV, MASK, clip_high=0.2)
    msg = str(e.value)
    assert "clip_high" in msg and "'topr'" in msg and "ratio_level" in msg
    with pytest.raises(ValueError, match="reinforce.*none"):
        policy_loss("reinforce", LP, BLP, ADV, MASK, tau=1.0)
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss("topr", LP, BLP, ADV, MASK, ratio_level="batch")
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss("topr", LP, BLP, ADV, MASK, aggregation="sum")
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss("topr", LP, BLP, ADV, MASK, kl_coef=0.1)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss("ppo", LP, BLP, ADV, MASK, dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("topr", LP, BLP, t([1.0, 2.0, 3.0]), MASK)


def test_a_negative_kl_coef_or_weight_is_refused_not_trained_backwards():
    """Below 0 a KL coefficient pays the policy to leave the reference, a weight turns a sequence's gradient around,
    and a NaN weight makes the whole loss NaN: each was accepted in silence."""
    ref, n = LP.detach() - 0.1, ADV.shape[0]
    for coef in (-0.1, float("inf")):
        with pytest.raises(ValueError, match=f"kl_coef must be a finite number >= 0, got {coef}"):
            policy_loss("topr", LP, BLP, ADV, MASK, ref_logprobs=ref, kl_coef=coef)
    for bad in (-1.0, float("nan"), float("inf")):
        w = torch.ones(n)
        w[0] = bad
        with pytest.raises(ValueError, match="weights must be finite and >= 0"):
            policy_loss("topr", LP, BLP, ADV, MASK, weights=w)
    loss, _ = policy_loss("topr", LP, BLP, ADV, MASK, weights=torch.zeros(n).index_fill(0, torch.tensor([0]), 2.0), ref_logprobs=ref, kl_coef=0.0)
    assert torch.isfinite(loss)


def test_register_loss_decorator():
    @register_loss("_half", description="test only")
    def _half(logprobs, behavior_logprobs, advantages, mask, *, k=0.5):
        return -k * advantages.unsqueeze(-1) * logprobs, {"k": torch.tensor(k)}

    try:
        assert LOSSES["_half"].options == {"k": 0.5}  # the signature's default, declared once
        loss, m = policy_loss("_half", LP, BLP, ADV, MASK, k=1.0)
        ref, _ = policy_loss("reinforce", LP, BLP, ADV, MASK)
        assert loss.item() == pytest.approx(ref.item()) and m["k"].item() == 1.0
        with pytest.raises(ValueError):
            register_loss("_half")(_half)
        with pytest.raises(ValueError, match="needs a default"):
            register_loss("_nodefault")(lambda lp, b, a, m, *, k: (lp, {}))
    finally:
        LOSSES.pop("_half")


# --------------------------------------------------------------------------- #
# DPO (pairwise)
# --------------------------------------------------------------------------- #


def test_dpo_loss_and_gradient_by_hand():
    # Pair 1: chosen s = (−1 − −1.2) + 0 = 0.2, rejected s = −0.5 + 0 + 0 = −0.5 → z = β·0.7.
    # Pair 2: chosen s = −0.3, rejected s = 0.1 → z = β·(−0.4).
    lp = t([[-1.0, -2.0, 0.0], [-1.5, -0.5, -1.0], [-0.3, 0.0, 0.0], [-2.0, -1.0, 0.0]]).requires_grad_()
    ref = t([[-1.2, -2.0, 0.0], [-1.0, -0.5, -1.0], [0.0, 0.0, 0.0], [-2.1, -1.0, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    beta = 0.5
    loss, m = policy_loss("dpo", lp, ref, t([1.0, -1.0, 1.0, -1.0]), mask, beta=beta, aggregation="token-mean")
    z = torch.tensor([beta * 0.7, beta * -0.4], dtype=D)
    expected = (math.log1p(math.exp(-z[0].item())) + math.log1p(math.exp(-z[1].item()))) / 2  # mean over pairs
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    (g,) = torch.autograd.grad(loss, lp)
    # d ℓ_k / d log π of a chosen token = −β σ(−z_k) / P; of a rejected token the opposite.
    sig = torch.sigmoid(-z)
    want = torch.stack([-beta * sig[0] / 2 * mask[0], beta * sig[0] / 2 * mask[1],
                        -beta * sig[1] / 2 * mask[2], beta * sig[1] / 2 * mask[3]])
    torch.testing.assert_close(g, want)
    assert m["dpo_reward_accuracy"].item() == 0.5
    assert m["dpo_margin"].item() == pytest.approx(beta * (0.7 - 0.4) / 2)  # β-scaled, as the rewards
    assert m["dpo_margin"].item() == pytest.approx((m["dpo_chosen_reward"] - m["dpo_rejected_reward"]).item())


def test_dpo_label_smoothing_and_whole_pair_micro_batches():
    lp = t([[-1.0, -2.0], [-1.5, -0.5], [-0.3, -0.1], [-2.0, -1.0]])
    ref = lp + t([[0.1, 0.0], [-0.2, 0.0], [0.0, 0.3], [0.0, 0.0]])
    mask, adv = torch.ones(4, 2, dtype=D), t([1.0, -1.0, 1.0, -1.0])
    z = 1.0 * torch.tensor([-0.1 - 0.2, -0.3 - 0.0], dtype=D)
    eps = 0.1
    loss, _ = policy_loss("dpo", lp, ref, adv, mask, beta=1.0, label_smoothing=eps)
    want = (-(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    halves = [policy_loss("dpo", lp[k:k + 2], ref[k:k + 2], adv[k:k + 2], mask[k:k + 2], beta=1.0, label_smoothing=eps)[0] for k in (0, 2)]
    assert (halves[0] + halves[1]).item() / 2 == pytest.approx(loss.item(), rel=1e-12)


def test_dpo_refuses_what_is_not_a_pair():
    lp, mask = torch.zeros(3, 2, dtype=D), torch.ones(3, 2, dtype=D)
    with pytest.raises(ValueError, match="pairs"):
        policy_loss("dpo", lp, lp, t([1.0, -1.0, 1.0]), mask)
    with pytest.raises(ValueError, match="in that order"):
        policy_loss("dpo", lp[:2], lp[:2], t([-1.0, 1.0]), mask[:2])
    with pytest.raises(ValueError, match="beta"):
        policy_loss("dpo", lp[:2], lp[:2], t([1.0, -1.0]), mask[:2], beta=0)
    empty, _ = policy_loss("dpo", torch.zeros(1, 1, dtype=D), torch.zeros(1, 1, dtype=D), t([0.0]), torch.zeros(1, 1, dtype=D))
    assert empty.item() == 0.0  # a padding micro-batch
