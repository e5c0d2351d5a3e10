"""A step's statistics reduced over ranks (training/stats.py), with two real gloo processes on this machine."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from toprcli.losses import policy_loss
from toprcli.training.distributed import DistContext
from toprcli.training.stats import StepStats


def _step_stats(empty: bool) -> StepStats:
    """One rank's micro-batch of a DPO step on the first step (the gap measured): two pairs, or the padding
    micro-batch ``batching.collate`` makes of no rows (one row, no completion token, weight 0)."""
    torch.manual_seed(0)
    rows, T = 4, 3
    lp, ref = torch.randn(rows, T) - 2, torch.randn(rows, T) - 2
    adv, mask, weights = torch.tensor([1.0, -1.0] * (rows // 2)), torch.ones(rows, T), torch.ones(rows)
    if empty:
        lp, ref, adv, mask, weights = torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, 1), torch.zeros(1)
        rows = 0
    _, metrics = policy_loss("dpo", lp, ref, adv, mask, weights=weights)
    stats = StepStats()
    stats.add({k: float(v) for k, v in metrics.items()}, share=0.0 if empty else 1.0, n_active=rows, tokens=rows * T, completion_tokens=rows * T)
    if not empty:  # what add_gap adds; it adds nothing for a micro-batch without rows
        d = lp - ref
        stats.add_gap(float(d.abs().sum()), float(d.sum()), rows * T, float(d.abs().max()))
    return stats


def _rank(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        reduced = _step_stats(empty=rank == 1).reduce(DistContext(rank=rank, world_size=2))
        with open(f"{out}.{rank}", "w") as f:
            json.dump(reduced, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_a_rank_with_only_padding_reduces_with_the_others(tmp_path):
    """A step with fewer units than ranks leaves a rank only a padding micro-batch: no DPO metrics, no gap.
    The ranks still reduce one vector (before, their differently long vectors aborted the all-reduce) and
    agree with one process that saw the whole batch."""
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path / "out")), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in (0, 1)]
    alone = _step_stats(empty=False).reduce(DistContext())
    assert ranks[0] == ranks[1] == pytest.approx(alone)
    assert {"dpo_margin", "behavior_gap_mean", "loss"} <= set(alone)


def test_token_level_fractions_average_over_tokens_not_sequences():
    """A micro-batch of 1 sequence × 90 tokens with clip_frac 0 and one of 10 sequences × 1 token with clip_frac 1:
    10 of the step's 100 tokens are clipped. By sequences it read 10/11."""
    stats = StepStats()
    base = {"loss": 0.0, "n_pos": 1.0, "n_neg": 1.0}
    stats.add({**base, "clip_frac": 0.0}, share=0.5, n_active=1, tokens=100, completion_tokens=90)
    stats.add({**base, "clip_frac": 1.0}, share=0.5, n_active=10, tokens=30, completion_tokens=10)
    stats.add({**base, "neg_token_alpha_mean": 0.5, "neg_tokens": 3.0}, share=0.0, n_active=2, tokens=9, completion_tokens=6)
    stats.add({**base, "neg_token_alpha_mean": 1.0, "neg_tokens": 1.0}, share=0.0, n_active=9, tokens=9, completion_tokens=6)
    out = stats.reduce(DistContext())
    assert out["clip_frac"] == pytest.approx(0.1) and out["neg_token_alpha_mean"] == pytest.approx(0.625) and out["neg_tokens"] == 4
    assert not [k for k in out if k.endswith("/over")]


@pytest.mark.parametrize("loss, options", [("tis", {}), ("is", {"max_weight": 1.5}), ("ppo", {"dual_clip": 3.0})])
def test_clip_fractions_over_micro_batches_are_the_single_passs(loss, options):
    """tis and is clip whole sequences (ratio_level sequence): a step cut as [one long clipped row] + [three short
    ones] logged 0.77 where one pass over the step gives 0.25, since each share was weighed by completion tokens."""
    import torch

    from toprcli.losses import policy_loss

    lengths = [100, 10, 10, 10]
    mask = torch.zeros(4, 100)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    lp = torch.full((4, 100), -1.0)
    mu = lp.clone()
    mu[0] -= 1.5  # row 0: π/μ = e^1.5 per token: its sequence ratio is clipped (tis, is), and ppo dual-clips its tokens
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0]) if loss == "ppo" else torch.tensor([1.0, 1.0, -1.0, -1.0])

    def metrics(rows):
        return {k: float(v) for k, v in policy_loss(loss, lp[rows], mu[rows], adv[rows], mask[rows], **options)[1].items()}

    whole = metrics([0, 1, 2, 3])
    stats = StepStats()
    for rows in ([0], [1, 2, 3]):
        tokens = int(mask[rows].sum())
        stats.add(metrics(rows), share=tokens / mask.sum().item(), n_active=len(rows), tokens=tokens, completion_tokens=tokens)
    out = stats.reduce(DistContext())
    keys = [k for k in whole if k.endswith("clip_frac")]
    assert any(whole[k] > 0 for k in keys)
    for key in keys:
        assert out[key] == pytest.approx(whole[key]), key
    assert not [k for k in out if k.endswith("_units")]
