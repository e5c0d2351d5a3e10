"""The training loop: batch → log π → loss → step → log, read top to bottom.

:func:`train_loop` trains a prepared run (:mod:`toprcli.training.prepare`: every
check done, the data loaded) in one process or as one rank under ``torchrun``
(FSDP2), and leaves the new policy in ``<out>.partial/``; the train stage
(:mod:`toprcli.stages.train`) owns the run's files around it (the lock, the
summary and manifest, the rename to ``<out>``).

log π is computed under the data's sampling distribution (temperature,
min-p, top-k, top-p; :mod:`toprcli.sampling`), so at step 0 π/μ = 1 for every
token. The gap between stored μ and the trainer's log π of the starting
policy is measured on the first step's batch (``behavior_gap_mean``), or over
the whole data set when a full pass runs anyway (``recompute_behavior``, or a
KL reference equal to the starting policy).

Aggregation: ``policy_loss`` normalises within a micro-batch (by Σw or Σw·L);
each micro-batch loss is scaled by its normaliser over the step's, so the
gradients accumulated over micro-batches and summed over ranks are exactly
those of the whole step batch at once (``batching.loss_denominator``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from toprcli import interrupt
from toprcli.config import TrainConfig, config_to_dict
from toprcli.errors import RESUME_REFUSED, MadeOtherwise, UserError
from toprcli.losses import LOSSES, policy_loss, whiten
from toprcli.progress import ProgressFn, report
from toprcli.shards import changed_keys, json_safe, write_text_atomic
from toprcli.tracking import TRACKER_FILES
from toprcli.training import checkpoint as ckpt
from toprcli.training.batching import collate, collate_shared, loss_denominator
from toprcli.training.distributed import DistContext, all_reduce, barrier, broadcast_object
from toprcli.training.model import PolicyLogprobs, Precision, check_chunked_head, load_policy, warn_pure_bf16
from toprcli.training.optim import build_optimizer, build_scheduler
from toprcli.training.prefix_packed import attention_for
from toprcli.training.precompute import PAD_ID, PRECOMPUTED_NAME, load_precomputed, micro_batches, precompute, stop_and, stop_requested
from toprcli.training.prepare import NON_SEMANTIC_KEYS, Prepared
from toprcli.training.stats import StepStats, add_gap

METRICS_NAME = "metrics.jsonl"


@dataclass
class _Learner:
    """The policy being trained and what updates it: its optimizer and learning-rate schedule."""

    policy: PolicyLogprobs
    lora_config: Any  # peft's, to save the merged policy
    precision: Precision
    params: list[torch.nn.Parameter]  # the trainable ones
    optimizer: torch.optim.Optimizer
    scheduler: Any
    autocast: Callable[[], Any]


@contextlib.contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """torch's and numpy's global generators seeded for a training, and the caller's given back after it (a notebook's
    were reset to the training's seed by every run)."""
    saved = np.random.get_state()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(saved)


def train_loop(prep: Prepared, ctx: DistContext, progress: ProgressFn | None,
               on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train ``prep`` (this rank's part under torchrun); returns the run's summary.

    Writes into ``prep.partial``: checkpoints (``save_every``, ``save_every_minutes``), ``metrics.jsonl``
    and, at the end, the policy. Resumes from the latest checkpoint with ``resume``.
    ``on_record`` (rank 0) gets each line of ``metrics.jsonl`` as it is written (the trackers).
    """
    cfg, partial = prep.cfg, prep.partial
    t_start = time.perf_counter()
    if ctx.device.type == "cuda":  # this training's peak, not the process's (an in-process iterate's earlier rounds and evals)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    model = _build_model(prep, ctx)  # under seeded_rng(cfg.seed): the same on every rank, identical LoRA init before sharding

    ckpt_root = partial / "checkpoints"  # <out>.partial/ holds everything until the policy is complete
    state, behavior, ref = _start(prep, ctx, model)
    state.update(config_fingerprint=prep.config_fingerprint, data_fingerprint=prep.data_fingerprint,
                 config=config_to_dict(prep.cfg))  # what a refused resume names as changed
    start_step = int(state["step"])
    stop = stop_requested(ctx)  # asked while the model loaded: before a step's work
    if stop:
        raise interrupt.Interrupted(stop, f"stopped before step {start_step + 1} of {prep.steps}")

    metrics_file = _open_logs(prep, ctx, start_step)
    measure_gap = state["gap"] is None and start_step == 0 and not prep.processing.greedy  # greedy data: no μ to compare with
    last: dict[str, Any] = state.get("last_record") or {}  # resumed from the last step's checkpoint: no step runs
    report(progress, "train", start_step, prep.steps)
    last_save = time.monotonic()
    try:
        for step in range(start_step, prep.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            # 1–4. Each micro-batch's log π, loss and backward.
            stats = _accumulate_gradients(prep, ctx, model, step, behavior, ref, measure_gap=measure_gap and step == 0)
            # 5. Step: clip, update, schedule.
            grad_norm, lr = _optimizer_step(model, cfg.grad_clip, state)
            # 6. Log.
            last = _step_record(prep, state, stats.reduce(ctx), step, grad_norm, lr, time.perf_counter() - t0, time.process_time() - c0)
            if ctx.is_main:
                if step == 0:
                    _warn_behavior_gap(prep, {**(state["gap"] or {}), **last})  # a full pass before step 1 measured it there
                if (step + 1) % cfg.log_every == 0 or step + 1 == prep.steps:
                    metrics_file.write(json.dumps(json_safe(last)) + "\n")  # a diverged step's NaN as null: strict JSON
                    metrics_file.flush()
                    if on_record is not None:
                        on_record(last)
                report(progress, "train", step + 1, prep.steps, loss=f"{last['loss']:.4g}")
            # Checkpoint every save_every steps and after the last one (saving the policy next is the run's memory
            # peak under FSDP: a kill there must not lose the steps since the last checkpoint); on a stop request too.
            # save_every_minutes passed on any rank: every rank saves here (clocks differ by a little; a rank alone in the
            # save's collectives would wait for the others for good).
            due = cfg.save_every_minutes is not None and time.monotonic() - last_save >= 60.0 * cfg.save_every_minutes
            (stop, due), final = stop_and(due, ctx), step + 1 == prep.steps
            by_steps = cfg.save_every and ((step + 1) % cfg.save_every == 0 or final)
            if (stop and not final) or by_steps or due:
                if metrics_file is not None:
                    os.fsync(metrics_file.fileno())
                state["last_record"] = last
                ckpt.save_checkpoint(ckpt_root, step + 1, model.policy, model.optimizer, model.scheduler, state, ctx)
                last_save = time.monotonic()
                if stop and not final:
                    raise interrupt.Interrupted(stop, f"training stopped after step {step + 1} of {prep.steps}, checkpoint saved")
    finally:
        if metrics_file is not None:
            metrics_file.close()

    # The policy, then the run's record, then the rename that makes <out> exist.
    state["parameters"] = int(sum(p.numel() for p in model.policy.parameters()))  # before a LoRA merge (one process) changes it
    ckpt.save_policy(partial, model.policy, ctx, source=cfg.model, save_dtype=getattr(torch, cfg.save_dtype),
                     lora=bool(cfg.lora_rank), lora_config=model.lora_config)
    resumed = start_step or None  # a checkpoint's step (checkpoints come after a step: never 0)
    state["peak_memory"] = _peak_memory(ctx)
    return _summary(prep, ctx, state, last, model.params, model.precision, resumed_from=resumed, wall=time.perf_counter() - t_start)


def _build_model(prep: Prepared, ctx: DistContext) -> _Learner:
    """The policy: float32 master weights (bf16 compute with dtype bfloat16), log π under the data's sampling; its optimizer."""
    cfg = prep.cfg
    precision = Precision.resolve(cfg.dtype, ctx.device)
    if precision.name == "bfloat16-pure" and ctx.is_main:
        warn_pure_bf16(cfg.lr)
    lora = dict(rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, target_modules=cfg.lora_target_modules) if cfg.lora_rank else None
    policy, lora_config = load_policy(
        cfg.model, ctx, precision, prep.logprob_processing,
        gradient_checkpointing=prep.gradient_checkpointing, lora=lora, chunk_size=cfg.logprob_chunk_size,
        attention=attention_for(ctx.device) if cfg.shared_prefix else None,
    )
    if not ctx.distributed:
        check_chunked_head(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = build_optimizer(cfg.optimizer, params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)
    scheduler = build_scheduler(optimizer, schedule=cfg.schedule, warmup_steps=cfg.warmup_steps, total_steps=prep.steps)
    if cfg.warmup_steps > prep.steps and ctx.is_main:  # the warm-up never ends: --lr is never reached
        warnings.warn(f"warmup_steps {cfg.warmup_steps} > the run's {prep.steps} steps: the lr peaks at {prep.steps / cfg.warmup_steps:.2f} × "
                      "--lr — lower --warmup-steps", stacklevel=2)
    return _Learner(policy, lora_config, precision, params, optimizer, scheduler, lambda: precision.autocast(ctx.distributed))


def _accumulate_gradients(prep: Prepared, ctx: DistContext, model: _Learner, step: int, behavior: np.ndarray,
                          ref: np.ndarray | None, *, measure_gap: bool) -> StepStats:
    """Steps 1–4 of optimizer step ``step``: this rank's micro-batches, each backward scaled by its share of the step's
    loss, so the gradients accumulated here (and summed over ranks) are those of the whole step batch."""
    cfg, loss, data = prep.cfg, prep.loss, prep.data
    # 1. Batch: this step's units and their rows (same on every rank); whitening over the whole step batch.
    units = prep.plan.step_units(step)
    rows = prep.units.rows_of(units)
    advantages = None
    if loss.whiten_advantages:
        advantages = data.advantages.copy()
        has_tokens = torch.from_numpy(data.completion_lens[rows] > 0)
        weights = torch.from_numpy(data.weights[rows]).double()
        advantages[rows] = whiten(torch.from_numpy(data.advantages[rows]).double(), has_tokens, weights).float().numpy()
    denominator = loss_denominator(data, rows, loss.aggregation)
    make_batch = collate_shared if cfg.shared_prefix else collate
    stats = StepStats()
    for mb_rows in micro_batches(prep, units, ctx):
        mb = make_batch(data, mb_rows, pad_id=PAD_ID, behavior=behavior, ref=ref, advantages=advantages).to(ctx.device)
        with _out_of_memory_hint(cfg, mb.n_tokens):
            # 2. log π of the completion tokens, under the data's sampling processing.
            with model.autocast():
                logprobs, entropy = model.policy(mb.input_ids, mb.prompt_lens, mb.completion_lens, with_entropy=loss.entropy_coef != 0, **mb.prefix())
            # 3. Loss: the micro-batch's share of the step's loss, so gradients sum to the step's.
            mb_loss, metrics = policy_loss(loss.name, logprobs, mb.behavior, mb.advantages, mb.mask, weights=mb.weights,
                                           ref_logprobs=mb.ref, entropy=entropy, **loss.loss_kwargs())
            share = loss_denominator(data, mb_rows, loss.aggregation) / denominator if denominator > 0 else 0.0
            # 4. Backward (FSDP2 sums gradients over ranks; see distributed.shard_model).
            (mb_loss * share).backward()
        keys = sorted(metrics)
        values = torch.stack([metrics[k].float() for k in keys]).tolist()
        n_active = int(((mb.completion_lens > 0) & (mb.weights > 0)).sum())
        stats.add(dict(zip(keys, values)), share, n_active, mb.n_tokens, mb.n_completion_tokens)
        if measure_gap:
            add_gap(stats, logprobs.detach(), mb)
    return stats


def _optimizer_step(model: _Learner, grad_clip: float | None, state: dict[str, Any]) -> tuple[float, float]:
    """Step 5: clip, update (skipped, and counted, when the gradient is not finite), schedule. Returns (grad norm, lr)."""
    grad_norm = _clip_grad_norm(model.params, grad_clip)
    lr = model.scheduler.get_last_lr()[0]
    if math.isfinite(grad_norm):
        model.optimizer.step()
    else:
        state["skipped_steps"] += 1
    model.scheduler.step()
    model.optimizer.zero_grad(set_to_none=True)
    return grad_norm, lr


# -- before the first step ------------------------------------------------------------


def _resume(prep: Prepared, path, policy, optimizer, scheduler, ctx: DistContext) -> dict[str, Any]:
    saved = json.loads((path / ckpt.STATE_NAME).read_text())
    for key, fp in (("config_fingerprint", prep.config_fingerprint), ("data_fingerprint", prep.data_fingerprint)):
        if saved.get(key) != fp:
            what = "config" if key.startswith("config") else f"data ({prep.cfg.data})"
            if key.startswith("config") and "config" in saved:
                changed = sorted(k for k in changed_keys(saved["config"], config_to_dict(prep.cfg)) if k.split(".")[0] not in (*NON_SEMANTIC_KEYS, "data"))
                what += f" (changed: {', '.join(changed[:4]) or 'the model files (copied without their times?) or the data processing'})"
            raise MadeOtherwise(f"the checkpoint in {path.parent} {RESUME_REFUSED} {what} — run without --resume to start over", prep.partial)
    return ckpt.load_checkpoint(path, policy, optimizer, scheduler, ctx)


def _start(prep: Prepared, ctx: DistContext, model: _Learner) -> tuple[dict[str, Any], np.ndarray, np.ndarray | None]:
    """Where training starts: the latest checkpoint (``resume``), else step 0 in a cleared ``<out>.partial/`` (which holds
    everything until the policy is complete) after the pass before step 1. Returns (run state, μ, the reference's log-probs)."""
    cfg, partial = prep.cfg, prep.partial
    ckpt_root = partial / "checkpoints"
    # Rank 0's view of the checkpoints for every rank (a stale listing elsewhere must not skip the load's collectives).
    resume_from = broadcast_object(ckpt.latest_checkpoint(ckpt_root) if ctx.is_main else None, ctx) if cfg.resume else None
    if ctx.is_main and resume_from is None:
        if (dropped := ckpt.latest_checkpoint(ckpt_root)) is not None:  # a requeued job's rerun without --resume: its steps go
            warnings.warn(f"starting over: the checkpoint of an earlier run ({dropped.name} in {ckpt_root}) is removed — pass --resume "
                          "to continue from it", stacklevel=3)
        _clear(partial, keep=PRECOMPUTED_NAME if cfg.resume else None)  # a pass saved before a kill with no checkpoint
        partial.mkdir(parents=True, exist_ok=True)
    barrier(ctx)
    if resume_from is not None:
        return (_resume(prep, resume_from, model.policy, model.optimizer, model.scheduler, ctx), *load_precomputed(prep))
    state: dict[str, Any] = {"step": 0, "tokens": 0, "train_time_s": 0.0, "skipped_steps": 0, "gap": None, "first_loss": None}
    try:
        return (state, *precompute(prep, model.policy, ctx, model.autocast, state))
    except UserError:  # a --ref-model that does not load: refused before any work, nothing left behind
        if ctx.is_main and partial.is_dir() and not any(partial.iterdir()):
            partial.rmdir()
        raise


def _clear(partial, keep: str | None = None) -> None:
    """Start ``partial`` over, keeping the trackers' files (the same tracked run continues: its steps were logged) and ``keep``."""
    if partial.exists():
        for entry in partial.iterdir():
            if entry.name not in (*TRACKER_FILES, keep):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _open_logs(prep: Prepared, ctx: DistContext, start_step: int):
    """metrics.jsonl (a resumed run drops lines past its checkpoint); rank 0 only."""
    if not ctx.is_main:
        return None
    path = prep.partial / METRICS_NAME
    kept = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= start_step] if path.exists() else []
    write_text_atomic(path, "".join(ln + "\n" for ln in kept))  # a kill here must not lose the kept lines
    return open(path, "a")


def _step_of(line: str) -> float:
    """The step of a metrics line; a line a kill cut short (or a blank one) counts as past every step."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf


# -- inside the loop ----------------------------------------------------------------


@contextlib.contextmanager
def _out_of_memory_hint(cfg: TrainConfig, tokens: int):
    """A CUDA out-of-memory error in a micro-batch becomes one line saying what to lower."""
    try:
        yield
    except torch.OutOfMemoryError:
        ckpt_hint = "" if cfg.gradient_checkpointing is True else ", or pass --gradient-checkpointing"
        raise UserError(
            f"out of device memory in a micro-batch of {tokens} tokens — lower --micro-batch-tokens "
            f"(now {cfg.micro_batch_tokens}){ckpt_hint}"
        ) from None


def _peak_memory(ctx: DistContext) -> dict[str, float]:
    """Peak host RSS (and device memory on CUDA) of the largest rank, MiB."""
    import resource

    peaks = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]  # Linux: KiB
    if ctx.device.type == "cuda":
        peaks.append(torch.cuda.max_memory_allocated(ctx.device) / 2**20)
    peaks_t = all_reduce(torch.tensor(peaks, dtype=torch.float64), ctx, op="max").tolist()
    out = {"peak_host_rss_mib": round(peaks_t[0], 1)}
    if len(peaks_t) > 1:
        out["peak_device_memory_mib"] = round(peaks_t[1], 1)
    return out


def _clip_grad_norm(params, max_norm: Optional[float]) -> float:
    """Total gradient norm before clipping (clips to ``max_norm`` when set); works on FSDP2 DTensors."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _step_record(prep: Prepared, state: dict[str, Any], record: dict[str, Any], step: int, grad_norm: float, lr: float, elapsed: float, cpu_s: float) -> dict[str, Any]:
    """One line of metrics.jsonl; updates the run state (step, tokens, time, μ gap, first loss)."""
    if prep.processing.greedy:  # no distribution: the stored "μ" is a placeholder (the warm start's gold rows: zeros)
        record = {k: v for k, v in record.items() if not k.startswith(RATIO_METRICS)}
    if "behavior_gap_mean" in record:
        state["gap"] = {k: record[k] for k in record if k.startswith("behavior_gap_")}
        state["gap"]["behavior_gap_source"] = "first step batch"
    state["step"] = step + 1
    state["tokens"] += int(record["tokens"])
    state["train_time_s"] += elapsed
    out = {
        "step": step + 1,
        "epoch": int(prep.plan.rows_done[step + 1]) / prep.data.n_rows,
        **record,
        "grad_norm": grad_norm,
        "lr": lr,
        "tokens_per_s": record["tokens"] / elapsed if elapsed > 0 else 0.0,
        "step_time_s": elapsed,
        "step_cpu_s": cpu_s,  # CPU seconds of this process (all threads)
    }
    if step + 1 == min(prep.cfg.log_every, prep.steps) and state["gap"] is not None:  # on the first line written (measured at step 1)
        out.update({k: v for k, v in state["gap"].items() if k != "behavior_gap_source"})
    if state["first_loss"] is None:
        state["first_loss"] = out["loss"]
    return out


GAP_WARN = 1e-3  # |log π − log μ| per token at step 0: float32 numerics agree to ~1e-6; a bfloat16 engine's μ is off by ~3e-2
RATIO_METRICS = ("log_ratio", "neg_alpha", "neg_token_alpha", "behavior_gap")  # metrics of π against the stored μ


def _warn_behavior_gap(prep: Prepared, record: dict[str, Any]) -> None:
    """At step 1 π is the starting policy, so π/μ away from 1 is the sampler's and this trainer's numerics (a bfloat16
    engine: docs/sampling.md), and a loss weighing by it (TOPR's α = min(1, π/μ)) tapers negatives for no reason."""
    gap = record.get("behavior_gap_mean")
    if gap is None or gap <= GAP_WARN or prep.recomputes_behavior or not LOSSES[prep.loss.name].uses_behavior:
        return
    tapered = (f"; {record['neg_alpha_lt1_frac']:.0%} of the step's negatives are tapered by it (mean α {record['neg_alpha_mean']:.2f})"
               if record.get("n_neg") and "neg_alpha_mean" in record else "")
    warnings.warn(f"|log π − log μ| is {gap:.2g} per token (max {record['behavior_gap_max']:.2g}) before any update: the sampler's and "
                  f"this trainer's numerics differ (a bfloat16 engine?){tapered} — --recompute-behavior takes μ from this trainer "
                  "(iterate: train.recompute_behavior: true), or sample in float32 (--dtype float32)")


# -- after the last step -----------------------------------------------------------------


def _summary(prep: Prepared, ctx: DistContext, state: dict[str, Any], last: dict[str, Any], params, precision: Precision, *, resumed_from, wall: float) -> dict[str, Any]:
    cfg = prep.cfg
    n_train = sum(p.numel() for p in params)
    train_time = state["train_time_s"]
    gap = state.get("gap") or {}
    return {
        "out": str(prep.out),
        "model": cfg.model,
        "data": cfg.data,
        "loss": cfg.loss,
        "optimizer": cfg.optimizer,
        "rows": prep.data.n_rows,
        "steps": int(state["step"]),
        "epochs": int(prep.plan.rows_done[int(state["step"])]) / prep.data.n_rows,
        "tokens": int(state["tokens"]),
        "train_time_s": train_time,
        "wall_time_s": wall,
        "tokens_per_s": state["tokens"] / train_time if train_time > 0 else 0.0,
        "steps_per_s": state["step"] / train_time if train_time > 0 else 0.0,
        "first_loss": state.get("first_loss"),
        "final_loss": last.get("loss"),
        "final_grad_norm": last.get("grad_norm"),
        "final_lr": last.get("lr"),
        "skipped_steps": int(state.get("skipped_steps", 0)),
        **{k: v for k, v in gap.items()},
        "sampling": {**prep.processing.as_dict(), "source": prep.sampling_source},
        "reference_logprobs": prep.reference,
        "batch_units": ("pairs" if prep.reference else "rows") + (" by prompt" if cfg.group_by_prompt or cfg.shared_prefix else ""),
        "shared_prefix": cfg.shared_prefix,
        "precision": precision.name,
        "save_dtype": cfg.save_dtype,
        "gradient_checkpointing": prep.gradient_checkpointing,
        **state.get("peak_memory", {}),
        "resumed_from_step": resumed_from,
        "world_size": ctx.world_size,
        "parameters": state["parameters"],  # with LoRA adapters; DTensor.numel() is the global size under FSDP
        "trainable_parameters": int(n_train),
        "lora_rank": cfg.lora_rank,
    }
