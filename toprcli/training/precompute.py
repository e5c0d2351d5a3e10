"""The pass before step 1: the starting policy's log-probs of every completion token, where a run needs them
(``recompute_behavior``: μ by this trainer's numerics; a KL reference), and the micro-batch plan it shares
with the steps.

The pass is saved in ``<out>.partial/precomputed.npz`` with the fingerprints of the config and data it was made
for, so ``--resume`` reuses it even when the run was stopped before its first checkpoint (the starting policy
is gone from memory once a step has run: a resume from a checkpoint must find it). A stop request ends the
pass at the next micro-batch, on every rank together.
"""

from __future__ import annotations

import gc
import json
from typing import Any, Optional

import numpy as np
import torch

from toprcli import interrupt
from toprcli.shards import same_model, write_atomic
from toprcli.training.batching import collate, collate_shared, plan_micro_batches
from toprcli.training.distributed import DistContext, all_reduce, every_rank
from toprcli.training.model import PolicyLogprobs, Precision, load_policy
from toprcli.training.prefix_packed import attention_for
from toprcli.training.prepare import Prepared
from toprcli.training.stats import behavior_gap

PRECOMPUTED_NAME = "precomputed.npz"
PAD_ID = 0  # padding is never attended to (causal attention, right padding) nor scored


def micro_batches(prep: Prepared, units: np.ndarray, ctx: DistContext) -> list[np.ndarray]:
    """This rank's micro-batches (rows) of a step; with a shared prefix each prompt's tokens are counted once."""
    data = prep.data
    if prep.cfg.shared_prefix:
        return plan_micro_batches(units, prep.units, data.completion_lens, ctx.world_size, prep.cfg.micro_batch_tokens,
                                  prompt_lens=data.prompt_lens, longest=prep.unit_longest)[ctx.rank]
    return plan_micro_batches(units, prep.units, data.seq_lens, ctx.world_size, prep.cfg.micro_batch_tokens, longest=prep.unit_longest)[ctx.rank]


def stop_requested(ctx: DistContext) -> int:
    """The signal asking to stop (0: none), agreed by every rank so that all stop at the same point."""
    return stop_and(False, ctx)[0]


def stop_and(flag: bool, ctx: DistContext) -> tuple[int, bool]:
    """:func:`stop_requested`, and whether ``flag`` holds on any rank, in one all-reduce (a step's one collective)."""
    flags = all_reduce(torch.tensor([float(interrupt.requested() or 0), float(flag)]), ctx, op="max").tolist()
    return int(flags[0]), bool(flags[1])


def precompute(prep: Prepared, policy: PolicyLogprobs, ctx: DistContext, autocast, state: dict[str, Any]) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(μ, the KL reference's log-probs or None) for every completion token; ``policy`` is the *starting* policy.
    A pass saved for this config and data is read instead of run again (with its ``state["gap"]``)."""
    cfg, loss, data = prep.cfg, prep.loss, prep.data
    saved = _saved_pass(prep)
    if not every_rank(saved is not None, ctx):  # read on every rank, or run on every rank (its collectives)
        saved = None
    if saved is not None:
        state["gap"] = saved.pop("gap")
        return saved.get("behavior", data.behavior), saved.get("ref")
    if ctx.is_main:  # one made for other settings: a checkpoint resume must never read it
        (prep.partial / PRECOMPUTED_NAME).unlink(missing_ok=True)
    behavior, ref, precomputed = data.behavior, None, {}
    need_ref_from_policy = loss.kl_coef > 0 and (loss.ref_model is None or same_model(loss.ref_model, cfg.model))
    if prep.recomputes_behavior or need_ref_from_policy:
        policy.eval()
        own = score_dataset(policy, prep, ctx, autocast=autocast)
        policy.train()
        if not prep.processing.greedy:  # greedy data has no μ to compare with (the warm start's: zeros)
            state["gap"] = {**behavior_gap(data.behavior, own), "behavior_gap_source": "full pass"}
        if prep.recomputes_behavior:  # μ under log π's distribution (a pairwise loss: its unprocessed reference), by this trainer's numerics
            behavior = precomputed["behavior"] = own
        if need_ref_from_policy:
            ref = precomputed["ref"] = own
    if loss.kl_coef > 0 and ref is None:
        ref_policy, _ = load_policy(loss.ref_model, ctx, Precision.resolve(cfg.dtype, ctx.device), prep.logprob_processing,
                                    trainable=False, chunk_size=cfg.logprob_chunk_size,
                                    attention=attention_for(ctx.device) if cfg.shared_prefix else None)  # the policy's kernels
        ref = precomputed["ref"] = score_dataset(ref_policy, prep, ctx, autocast=autocast)
        del ref_policy
        gc.collect()  # FSDP2's state and its module point at each other: only the collector frees the reference's shards
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    if precomputed and ctx.is_main:
        made_for = {"fingerprint": _fingerprint(prep), "gap": json.dumps(state["gap"])}

        def save(tmp) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a path
                np.savez(f, **precomputed, **{k: np.array(v) for k, v in made_for.items()})

        write_atomic(prep.partial / PRECOMPUTED_NAME, save)
    return behavior, ref


def load_precomputed(prep: Prepared) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(μ, the reference's log-probs) of a run resumed from a checkpoint (which has checked config and data)."""
    path = prep.partial / PRECOMPUTED_NAME
    if not path.is_file():
        return prep.data.behavior, None
    with np.load(path) as pre:
        return (pre["behavior"] if "behavior" in pre else prep.data.behavior), (pre["ref"] if "ref" in pre else None)


def _fingerprint(prep: Prepared) -> str:
    return f"{prep.config_fingerprint} {prep.data_fingerprint}"


def _saved_pass(prep: Prepared) -> dict[str, Any] | None:
    """The saved pass's arrays and gap when it was made for this config and data, else None."""
    path = prep.partial / PRECOMPUTED_NAME
    if not (prep.cfg.resume and path.is_file()):
        return None
    try:
        with np.load(path) as pre:
            if "fingerprint" not in pre or str(pre["fingerprint"]) != _fingerprint(prep):
                return None
            return {**{k: pre[k] for k in ("behavior", "ref") if k in pre}, "gap": json.loads(str(pre["gap"]))}
    except (OSError, ValueError, KeyError):  # a damaged file is made again
        return None


def score_dataset(policy: PolicyLogprobs, prep: Prepared, ctx: DistContext, *, autocast) -> np.ndarray:
    """log π of every completion token of every row (flat, aligned with ``completion_off``), in the layout training
    computes log π in (a shared prefix too: in bf16 the layouts differ by up to ~1 in a sequence's log-prob).

    Rows are split over ranks; each token is written by one rank and the
    ranks' arrays are summed, so every rank ends with all of them.
    """
    data = prep.data
    make_batch = collate_shared if prep.cfg.shared_prefix else collate
    flat = torch.zeros(len(data.completion_ids), dtype=torch.float32)
    off = data.completion_off
    with torch.no_grad():
        for rows in micro_batches(prep, np.arange(prep.units.n_units), ctx):
            stop = stop_requested(ctx)  # every rank has as many micro-batches: all agree at the same one
            if stop:
                raise interrupt.Interrupted(stop, "stopped before step 1, in the pass over the data with the starting policy")
            mb = make_batch(data, rows, pad_id=PAD_ID).to(ctx.device)
            with autocast():
                lp, _ = policy(mb.input_ids, mb.prompt_lens, mb.completion_lens, **mb.prefix())
            lp = lp.float().cpu()
            for i, r in enumerate(rows):
                flat[off[r] : off[r + 1]] = lp[i, : off[r + 1] - off[r]]
    all_reduce(flat, ctx)
    return flat.numpy()
