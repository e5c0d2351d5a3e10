"""The processed sampling distribution (toprcli/sampling.py): hand-made cases and vLLM's own code."""

from __future__ import annotations

import math

import pytest
import torch

from toprcli.sampling import Processing, kept_mask, processed_logits, token_logprobs


def _kept(logits, **kw) -> list[list[bool]]:
    return kept_mask(torch.tensor(logits, dtype=torch.float32), Processing(**kw)).tolist()


def test_top_k_keeps_ties_at_the_threshold():
    assert _kept([[3.0, 1.0, 2.0, 2.0, 0.0]], top_k=2) == [[True, False, True, True, False]]
    assert _kept([[3.0, 1.0, 2.0, 0.5]], top_k=1) == [[True, False, False, False]]


def test_top_p_drops_the_least_likely_tail_and_keeps_the_top_token():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    z = probs.log()
    # ascending cumulative mass: 0.05, 0.20, 0.50, 1.0; dropped while <= 1 - p
    assert kept_mask(z, Processing(top_p=0.8)).tolist() == [[True, True, False, False]]
    assert kept_mask(z, Processing(top_p=0.85)).tolist() == [[True, True, True, False]]
    assert kept_mask(z, Processing(top_p=0.01)).tolist() == [[True, False, False, False]]


def test_min_p_is_relative_to_the_most_likely_token():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert kept_mask(probs.log(), Processing(min_p=0.2)).tolist() == [[True, True, True, False]]  # 0.1 threshold
    assert kept_mask(probs.log(), Processing(min_p=0.7)).tolist() == [[True, False, False, False]]


def test_no_truncation_means_no_mask_and_temperature_scales():
    z = torch.randn(3, 11)
    assert kept_mask(z, Processing(temperature=0.5)) is None
    torch.testing.assert_close(processed_logits(z, Processing(temperature=0.5)), z / 0.5)
    torch.testing.assert_close(processed_logits(z, Processing(temperature=0.0)), z)  # greedy: T = 1, untruncated


def test_always_keep_gives_a_dropped_token_a_finite_logprob():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]])
    lp_dropped, _ = token_logprobs(logits, torch.tensor([3]), Processing(top_k=2))
    assert math.isfinite(lp_dropped.item())
    # its kept set is {0, 1} ∪ {3}: the log-prob is renormalised over those three
    ref = logits[0, 3] - torch.logsumexp(logits[0, [0, 1, 3]], 0)
    assert lp_dropped.item() == pytest.approx(ref.item(), abs=1e-6)
    lp_kept, ent = token_logprobs(logits, torch.tensor([1]), Processing(top_k=2), with_entropy=True)
    q = torch.softmax(logits[0, :2], 0)
    assert lp_kept.item() == pytest.approx(q[1].log().item(), abs=1e-6)
    assert ent.item() == pytest.approx(-(q * q.log()).sum().item(), abs=1e-6)


def test_processed_distribution_sums_to_one():
    torch.manual_seed(0)
    z = torch.randn(16, 50) * 3
    p = Processing(temperature=0.7, top_k=12, top_p=0.8, min_p=0.01)
    q = torch.softmax(processed_logits(z, p), -1)
    torch.testing.assert_close(q.sum(-1), torch.ones(16))
    assert ((q > 0).sum(-1) <= 12).all() and ((q > 0).sum(-1) >= 1).all()


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0)])
def test_bad_parameters_are_a_value_error(bad):
    with pytest.raises(ValueError):
        Processing(**bad)


def test_from_mapping_reads_records_and_off_values():
    assert Processing.from_mapping({"temperature": 0.7, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "seed": 3}) == Processing(temperature=0.7)
    assert Processing.from_mapping({"top_k": 0, "top_p": None}) == Processing()
    assert Processing.from_mapping({}) == Processing()


@pytest.mark.parametrize("k, p", [(20, None), (None, 0.9), (20, 0.9), (5, 0.5)])
def test_same_kept_set_as_vllms_sampler(k, p):
    """vLLM's own top-k/top-p code (the CPU/PyTorch path its sampler runs) keeps the same tokens."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    torch.manual_seed(1)
    z = torch.randn(64, 300) * 2.5
    theirs = apply_top_k_top_p_pytorch(
        z.clone(), None if k is None else torch.full((64,), k), None if p is None else torch.full((64,), p), allow_cpu_sync=True
    )
    ours = processed_logits(z, Processing(top_k=k or -1, top_p=p or 1.0))
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(torch.log_softmax(ours, -1)[torch.isfinite(ours)], torch.log_softmax(theirs, -1)[torch.isfinite(theirs)])


def test_same_min_p_as_vllms_processor():
    """vLLM applies min-p (after temperature, before top-k/top-p) with this rule; ours must agree."""
    torch.manual_seed(2)
    z = torch.randn(32, 200) * 2
    probs = torch.softmax(z, -1)
    theirs = ~(probs < probs.amax(-1, keepdim=True) * 0.1)  # vLLM's MinPLogitsProcessor: invalid = p < max·min_p
    assert torch.equal(kept_mask(z, Processing(min_p=0.1)), theirs)


@pytest.mark.parametrize("scale", [0.3, 2.5, 8.0], ids=["flat: the full-sort rows", "typical", "peaked"])
def test_top_p_candidates_give_the_full_sorts_kept_set(scale):
    """The top-k shortcut keeps exactly what sorting the whole vocabulary keeps (vLLM's rule)."""
    from toprcli.sampling import _top_p_keep

    torch.manual_seed(3)
    z = torch.randn(200, 6000) * scale  # more than 4096 tokens: every tier of candidates is used
    z[::7, ::3] = float("-inf")  # some tokens already dropped by min-p / top-k
    for top_p in (0.5, 0.9, 0.99):
        sorted_z, order = z.sort(dim=-1)
        cum_sorted = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
        drop = cum_sorted <= 1 - top_p
        drop[:, -1] = False
        full = ~torch.zeros_like(drop).scatter_(-1, order, drop)
        cum = torch.zeros_like(cum_sorted).scatter_(-1, order, cum_sorted)  # each token's cumulative mass
        ours = _top_p_keep(z, top_p)
        differ = ours != full
        # Only where float32 rounding of the two cumulative sums decides (the token sits on the cut).
        assert differ.sum() <= 2 and float(torch.cat([(cum[differ] - (1 - top_p)).abs(), torch.zeros(1)]).max()) < 1e-5, top_p


def test_a_temperature_vllm_decodes_greedily_is_greedy_here_too():
    """vLLM samples below 1e-5 greedily and reports log-probs at T = 1: dividing by 1e-6 here described another μ."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    tiny = Processing(temperature=1e-6, top_k=2)
    assert tiny.greedy and not tiny.truncates
    torch.testing.assert_close(processed_logits(logits, tiny), processed_logits(logits, Processing(temperature=0.0)))
    assert not Processing(temperature=1e-5).greedy


def test_logits_tied_at_the_top_p_cut_keep_vllms_count_with_the_sampled_token_among_them():
    """The shortcut kept every logit tied at the cut; vLLM keeps as many as its sort's positions allow. With bf16
    logits (ties are common) the normaliser was too large and log π biased low at step 0."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    z = torch.zeros(2, 300)
    z[:, 0] = 3.0  # one likely token, then 299 tied ones straddling the cut
    torch.manual_seed(4)
    z[1] = (torch.randn(300) * 2).to(torch.bfloat16).float()  # bf16-rounded logits: many small ties
    for top_p in (0.5, 0.9):
        theirs = torch.isfinite(apply_top_k_top_p_pytorch(z.clone(), None, torch.full((2,), top_p), allow_cpu_sync=True))
        ours = kept_mask(z, Processing(top_p=top_p))
        assert torch.equal(ours.sum(-1), theirs.sum(-1)), top_p  # the count sets the normaliser
        for row in range(2):  # a token vLLM sampled, tied at the cut, is kept and the count stays vLLM's
            sampled = int(torch.nonzero(theirs[row]).flatten()[-1])
            lp, _ = token_logprobs(z[row:row + 1], torch.tensor([sampled]), Processing(top_p=top_p))
            assert lp.item() == pytest.approx(torch.log_softmax(z[row].masked_fill(~theirs[row], float("-inf")), -1)[sampled].item(), abs=1e-6)
    assert kept_mask(z[:1], Processing(top_p=0.5)).sum().item() == 141
