"""`topr train`: off-policy training of a policy on a curated training set.

Reads: a policy (HF model dir or hub id) and a curated training set (a Parquet
file or shard dir with ``CURATED_SCHEMA`` columns: token ids, ``behavior_logprobs``
= log μ, ``advantage``, ``weight``).

Writes ``<out>/``: the new policy in HF format (safetensors + tokenizer,
loadable by transformers and vLLM; LoRA merged), ``metrics.jsonl`` (one line
per optimizer step), ``train_summary.json``, ``_manifest.json`` and ``tb/``
with ``--tensorboard``. While running, everything lives in ``<out>.partial/``
(with ``checkpoints/`` and, when μ or a reference is recomputed,
``precomputed.npz``); the directory is renamed to ``<out>`` only when the
policy is complete, so ``<out>`` never holds a partial policy.

Re-running:
* ``<out>`` complete: error, unless ``overwrite`` (train again, replace it at
  the end) or ``resume`` (nothing to do; the saved summary is returned).
* ``<out>.partial`` left by a killed run: ``resume`` continues from its latest
  checkpoint (same config and data required) and ends with the same weights as
  an uninterrupted run; without ``resume`` it is discarded and training starts over.

The loop (:func:`_train`) reads top to bottom: batch → log π → loss → backward
→ step → log. Every check a user can fail runs in :func:`prepare`, before any
output directory is created.

Aggregation: ``policy_loss`` normalises within a micro-batch (by Σw or Σw·L);
each micro-batch loss is scaled by its normaliser over the step's, so the
gradients accumulated over micro-batches and summed over ranks are exactly
those of the whole step batch at once (``batching.loss_denominator``).

μ: the gap between stored μ and the trainer's log-probs of the starting policy
is measured on the first step's batch (free: those forwards happen before the
first update), or over the whole data set when a full pass runs anyway
(``recompute_behavior``, or a KL reference equal to the starting policy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from toprcli.config import TrainConfig, config_to_dict
from toprcli.errors import UserError
from toprcli.training.batching import (
    TOKEN_COLUMNS,
    TokenData,
    collate,
    data_order,
    loss_denominator,
    plan_micro_batches,
    step_rows,
    total_steps,
    whiten,
)

# Options of ``policy_loss`` that apply to every loss; they may also be given in
# ``loss_options`` (which then overrides the TrainConfig field of the same name).
GENERIC_LOSS_OPTIONS = ("adv_clip", "whiten_advantages", "kl_coef", "kl_estimator", "entropy_coef", "norm_length")
# Config keys that do not change the trained weights (a checkpoint may be resumed under other values).
NON_SEMANTIC_KEYS = ("out", "resume", "overwrite", "save_every", "log_every", "tensorboard", "threads")
PARTIAL_SUFFIX = ".partial"
SUMMARY_NAME = "train_summary.json"
METRICS_NAME = "metrics.jsonl"
PRECOMPUTED_NAME = "precomputed.npz"
KILL_ENV = "TOPRCLI_TEST_KILL_AFTER_STEP"  # tests: SIGKILL this process after that step's checkpoint


class SimulatedKill(RuntimeError):
    """Raised by ``train_policy(..., _stop_after_step=k)`` after step k (tests of resume)."""


# -- what the user asked for, checked ------------------------------------------------


@dataclass
class LossSetup:
    name: str
    aggregation: str
    options: dict[str, Any]  # loss-specific, validated against the registry
    adv_clip: Optional[float]
    whiten_advantages: bool
    kl_coef: float
    kl_estimator: str
    entropy_coef: float
    norm_length: Optional[int]
    ref_model: Optional[str]  # None: the starting policy (when kl_coef > 0)


@dataclass
class Prepared:
    """Everything validated before any output exists."""

    cfg: TrainConfig
    loss: LossSetup
    data: TokenData
    out: Path
    partial: Path
    steps: int
    vocab_size: int
    context: Optional[int]
    samples: int  # rows the run consumes (with repeats over epochs)
    data_fingerprint: str
    config_fingerprint: str
    save_dtype_name: str
    policies: list[str] = field(default_factory=list)


def resolve_loss(cfg: TrainConfig) -> LossSetup:
    """Split ``loss_options`` into generic and loss-specific options and validate both
    (unknown loss, option that does not apply, bad value) by running the loss once
    on a one-token batch."""
    import torch

    from toprcli.losses import AGGREGATIONS, KL_ESTIMATORS, policy_loss, resolve_options

    opts = dict(cfg.loss_options or {})
    generic = {k: opts.pop(k) for k in GENERIC_LOSS_OPTIONS if k in opts}
    resolve_options(cfg.loss, opts)
    if cfg.aggregation not in AGGREGATIONS:
        raise UserError(f"unknown aggregation {cfg.aggregation!r} — choose one of: {', '.join(AGGREGATIONS)}")
    setup = LossSetup(
        name=cfg.loss,
        aggregation=cfg.aggregation,
        options=opts,
        adv_clip=generic.get("adv_clip", cfg.adv_clip),
        whiten_advantages=bool(generic.get("whiten_advantages", cfg.whiten_advantages)),
        kl_coef=float(generic.get("kl_coef", cfg.kl_coef) or 0.0),
        kl_estimator=str(generic.get("kl_estimator", cfg.kl_estimator)),
        entropy_coef=float(generic.get("entropy_coef", cfg.entropy_coef) or 0.0),
        norm_length=generic.get("norm_length", cfg.norm_length),
        ref_model=cfg.ref_model,
    )
    if setup.kl_estimator not in KL_ESTIMATORS:
        raise UserError(f"unknown kl_estimator {setup.kl_estimator!r} — choose one of: {', '.join(KL_ESTIMATORS)}")
    if setup.ref_model and not setup.kl_coef:
        raise UserError("ref_model is set but kl_coef is 0 — set --kl-coef > 0 or drop --ref-model")
    one = torch.zeros(1, 1)
    policy_loss(  # raises UserError for option values the loss rejects
        setup.name, one.clone().requires_grad_(), one, torch.ones(1), torch.ones(1, 1),
        aggregation=setup.aggregation, norm_length=setup.norm_length, adv_clip=setup.adv_clip,
        ref_logprobs=one if setup.kl_coef else None, kl_coef=setup.kl_coef, kl_estimator=setup.kl_estimator,
        entropy=one if setup.entropy_coef else None, entropy_coef=setup.entropy_coef, **setup.options,
    )
    return setup


def load_training_data(path: str, *, need_policy: bool) -> tuple[TokenData, list[str]]:
    """Read the columns training needs; UserError naming the file for a missing column."""
    import pyarrow.compute as pc

    from toprcli.shards import parquet_files, read_schema, read_table, validate_columns

    files = parquet_files(path)
    columns = list(TOKEN_COLUMNS) + (["policy"] if need_policy else [])
    for f in files:
        validate_columns(read_schema(f), "curated", f, required=columns)
    table = read_table(files, columns=columns)
    if table.num_rows == 0:
        raise UserError(f"{path}: the training set has no rows — check the curation step (its filters may drop everything)")
    policies = [str(p) for p in pc.unique(table.column("policy")).to_pylist()] if need_policy else []
    return TokenData.from_table(table), policies


def check_data(data: TokenData, *, path: str, vocab_size: int, context: Optional[int], check_behavior: bool) -> None:
    """Per-row checks of the token data against the model (one line per problem)."""

    def rows_msg(bad: np.ndarray) -> str:
        idx = np.flatnonzero(bad)
        return f"{len(idx)} row(s) (first: row {idx[0]})"

    p_len, c_len = data.prompt_lens, data.completion_lens
    if (p_len == 0).any():
        raise UserError(f"{path}: {rows_msg(p_len == 0)} have empty prompt_token_ids — every prompt needs at least one token (e.g. bos)")
    if not np.array_equal(np.diff(data.behavior_off), c_len):
        bad = np.diff(data.behavior_off) != c_len
        raise UserError(f"{path}: {rows_msg(bad)} have behavior_logprobs of a different length than completion_token_ids — regenerate the samples")
    for name, ids, off in (("prompt_token_ids", data.prompt_ids, data.prompt_off), ("completion_token_ids", data.completion_ids, data.completion_off)):
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            bad_tok = (ids < 0) | (ids >= vocab_size)
            first = int(np.flatnonzero(bad_tok)[0])
            row = int(np.searchsorted(off, first, side="right") - 1)
            raise UserError(
                f"{path}: {name} holds token id {int(ids[first])} (row {row}) outside the model's vocabulary "
                f"[0, {vocab_size}) — the data was tokenized for another model; regenerate it with this model"
            )
    if context is not None:
        too_long = data.seq_lens > context
        if too_long.any():
            raise UserError(
                f"{path}: {rows_msg(too_long)} are longer than the model's context ({int(data.seq_lens.max())} > {context} tokens) "
                f"— regenerate with a smaller max_new_tokens or drop those rows"
            )
    if not np.isfinite(data.advantages).all():
        raise UserError(f"{path}: {rows_msg(~np.isfinite(data.advantages))} have a NaN/inf advantage — re-run `topr curate`")
    if not np.isfinite(data.weights).all() or (data.weights < 0).any():
        raise UserError(f"{path}: {rows_msg(~(np.isfinite(data.weights) & (data.weights >= 0)))} have a weight that is not a finite number >= 0 — re-run `topr curate`")
    if check_behavior and not np.isfinite(data.behavior).all():
        bad_tok = ~np.isfinite(data.behavior)
        row = int(np.searchsorted(data.completion_off, int(np.flatnonzero(bad_tok)[0]), side="right") - 1)
        raise UserError(f"{path}: behavior_logprobs hold NaN/inf (first in row {row}) — regenerate the samples or pass --recompute-behavior")
    if not ((data.weights > 0) & (c_len > 0)).any():
        raise UserError(f"{path}: no row has both a completion token and a weight > 0 — nothing to train on; check the curation")


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _same_model(a: str, b: str) -> bool:
    pa_, pb = Path(a), Path(b)
    if pa_.exists() and pb.exists():
        return pa_.resolve() == pb.resolve()
    return a.rstrip("/") == b.rstrip("/")


def prepare(cfg: TrainConfig) -> Prepared:
    """Validate config, data and model config; decide what the output dirs mean. Creates nothing."""
    from toprcli.shards import fingerprint

    for key in ("model", "data", "out"):
        if not getattr(cfg, key):
            raise UserError(f"no --{key} given — `topr train --model M --data FILE --out DIR`")
    loss = resolve_loss(cfg)
    if cfg.tensorboard:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            raise UserError("--tensorboard needs the tensorboard package — `pip install tensorboard` or drop --tensorboard") from None

    out = Path(cfg.out)
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    if out.exists() and not cfg.overwrite and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists — pass --overwrite to replace it (or --resume to keep a finished run)")

    model_cfg = _model_config(cfg.model)
    text_cfg = model_cfg.get_text_config() if hasattr(model_cfg, "get_text_config") else model_cfg
    vocab_size = int(text_cfg.vocab_size)
    context = getattr(text_cfg, "max_position_embeddings", None)
    # The policy is saved in the starting model's dtype (bf16 when trained in pure bf16).
    save_dtype_name = str(getattr(model_cfg, "dtype", None) or getattr(model_cfg, "torch_dtype", None) or "float32").replace("torch.", "")
    if save_dtype_name not in ("float32", "bfloat16", "float16"):
        save_dtype_name = "float32"
    if cfg.dtype == "bfloat16":
        save_dtype_name = "bfloat16"
    if loss.ref_model:
        _model_config(loss.ref_model)

    data, policies = load_training_data(cfg.data, need_policy=cfg.recompute_behavior)
    check_data(data, path=cfg.data, vocab_size=vocab_size, context=context, check_behavior=not cfg.recompute_behavior)
    if cfg.recompute_behavior:
        other = [p for p in policies if not _same_model(p, cfg.model)]
        if other:
            raise UserError(
                f"--recompute-behavior: rows of {cfg.data} were generated by {other[0]!r}, not by --model {cfg.model!r} — "
                "μ can only be recomputed with the policy that sampled the data; drop --recompute-behavior"
            )
    if loss.aggregation == "seq-mean-token-sum-norm" and loss.norm_length is None:
        # A constant N for the whole run (the default T of `aggregate` would vary per micro-batch).
        loss.norm_length = int(max(1, data.completion_lens.max()))

    steps = total_steps(data.n_rows, cfg.batch_size, cfg.epochs, cfg.max_steps)
    samples = steps * cfg.batch_size if cfg.max_steps is not None else round(cfg.epochs * data.n_rows)
    semantic = {k: v for k, v in config_to_dict(cfg).items() if k not in NON_SEMANTIC_KEYS}
    return Prepared(
        cfg=cfg, loss=loss, data=data, out=out, partial=partial, steps=steps, samples=samples, vocab_size=vocab_size, context=context,
        data_fingerprint=fingerprint(cfg.data), config_fingerprint=_fingerprint(semantic),
        save_dtype_name=save_dtype_name, policies=policies,
    )


def finished_summary(cfg: TrainConfig) -> Optional[dict[str, Any]]:
    """With ``resume`` (and not ``overwrite``): the summary of a complete ``<out>``, else None."""
    out = Path(cfg.out) if cfg.out else None
    if out is None or not cfg.resume or cfg.overwrite:
        return None
    if (out / SUMMARY_NAME).is_file() and (out / "config.json").is_file():
        return json.loads((out / SUMMARY_NAME).read_text())
    return None


def _model_config(model: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load model config from {model!r} ({first}) — pass an HF model dir or hub id") from None


# -- the model -----------------------------------------------------------------------


def load_policy(cfg: TrainConfig, ctx, *, gpu_bf16: bool, trainable: bool = True):
    """The starting policy: float32 master weights (bf16 with --dtype bfloat16), dropout off,
    optional gradient checkpointing and LoRA, sharded with FSDP2 under torchrun."""
    import torch
    from transformers import AutoModelForCausalLM

    from toprcli.training.distributed import shard_model
    from toprcli.training.lora import apply_lora, check_lora_targets, lora_config

    from toprcli.training.checkpoint import quiet_hf

    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    with quiet_hf():
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
    # π must be a deterministic function of the weights: the ratio π/μ compares it with the sampler.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    lcfg = None
    if trainable:
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora_rank:
            check_lora_targets(model, cfg.lora_target_modules)
            lcfg = lora_config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
            model = apply_lora(model, lcfg)
        model.train()
    else:
        model.requires_grad_(False)
        model.eval()
    if ctx.distributed:
        model = shard_model(model, ctx, bf16=gpu_bf16)
    else:
        model = model.to(ctx.device)
    return model, lcfg


# -- a full pass with the starting policy ---------------------------------------------


def score_dataset(model, data: TokenData, ctx, *, temperature: float, token_budget: int, autocast, pad_id: int) -> np.ndarray:
    """log π of every completion token of every row (flat, aligned with ``completion_off``).

    Rows are split over ranks; each token is written by one rank and the
    ranks' arrays are summed, so every rank ends with all of them.
    """
    import torch

    from toprcli.training.distributed import all_reduce
    from toprcli.training.logprobs import completion_logprobs

    plan = plan_micro_batches(np.arange(data.n_rows), data.seq_lens, ctx.world_size, token_budget)[ctx.rank]
    flat = torch.zeros(len(data.completion_ids), dtype=torch.float32)
    off = data.completion_off
    with torch.no_grad():
        for rows in plan:
            mb = collate(data, rows, pad_id=pad_id).to(ctx.device)
            with autocast():
                lp, _ = completion_logprobs(model, mb.input_ids, mb.prompt_lens, mb.completion_lens, temperature=temperature)
            lp = lp.float().cpu()
            for i, r in enumerate(rows):
                flat[off[r] : off[r + 1]] = lp[i, : off[r + 1] - off[r]]
    all_reduce(flat, ctx)
    return flat.numpy()


def behavior_gap(stored: np.ndarray, own: np.ndarray) -> dict[str, float]:
    """Per-token gap between stored μ and the trainer's own log-probs of the starting policy."""
    if len(stored) == 0:
        return {"behavior_gap_mean": 0.0, "behavior_gap_max": 0.0, "behavior_gap_signed_mean": 0.0, "behavior_gap_tokens": 0}
    d = own.astype(np.float64) - stored.astype(np.float64)
    d = d[np.isfinite(d)]
    return {
        "behavior_gap_mean": float(np.abs(d).mean()) if len(d) else float("nan"),
        "behavior_gap_max": float(np.abs(d).max()) if len(d) else float("nan"),
        "behavior_gap_signed_mean": float(d.mean()) if len(d) else float("nan"),
        "behavior_gap_tokens": int(len(stored)),
    }


# -- per-step statistics ------------------------------------------------------------


class StepStats:
    """Sums of one step's micro-batch metrics on this rank, reduced over ranks at the end.

    ``loss``-like metrics (already normalised per micro-batch by ``aggregate``)
    are weighted by the micro-batch's share of the step's normaliser, which
    makes them exact; TOPR α statistics are weighted by the negatives they
    average over; other loss metrics by the active sequences.
    """

    EXACT = ("loss", "pg_loss", "kl", "kl_loss", "entropy")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes = {"log_ratio_max": -math.inf, "log_ratio_min_neg": -math.inf, "behavior_gap_max": -math.inf}

    def _add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def add(self, metrics: dict[str, float], share: float, n_active: int, tokens: int, completion_tokens: int) -> None:
        n_neg = metrics["n_neg"]
        for k, v in metrics.items():
            if k in self.EXACT:
                self._add(k, v * share)
            elif k in ("n_pos", "n_neg"):
                self._add(k, v)
            elif k in ("neg_alpha_mean", "neg_alpha_lt1_frac"):
                self._add(k, v * n_neg)
            elif k == "log_ratio_max":
                if n_active:
                    self.maxes["log_ratio_max"] = max(self.maxes["log_ratio_max"], v)
            elif k == "log_ratio_min":
                if n_active:
                    self.maxes["log_ratio_min_neg"] = max(self.maxes["log_ratio_min_neg"], -v)
            else:
                self._add(k, v * n_active)
        self._add("n_active", n_active)
        self._add("tokens", tokens)
        self._add("completion_tokens", completion_tokens)

    def add_gap(self, abs_sum: float, signed_sum: float, count: int, max_abs: float) -> None:
        self._add("gap_abs", abs_sum)
        self._add("gap_signed", signed_sum)
        self._add("gap_count", count)
        if count:
            self.maxes["behavior_gap_max"] = max(self.maxes["behavior_gap_max"], max_abs)

    def reduce(self, ctx) -> dict[str, float]:
        import torch

        from toprcli.training.distributed import all_reduce

        keys = sorted(self.sums)
        sums = all_reduce(torch.tensor([self.sums[k] for k in keys], dtype=torch.float64), ctx).tolist()
        s = dict(zip(keys, sums))
        mkeys = sorted(self.maxes)
        maxes = dict(zip(mkeys, all_reduce(torch.tensor([self.maxes[k] for k in mkeys], dtype=torch.float64), ctx, op="max").tolist()))
        n_neg, n_active = s.pop("n_neg", 0.0), s.pop("n_active", 0.0)
        out: dict[str, float] = {}
        for k, v in s.items():
            if k in self.EXACT or k in ("n_pos", "tokens", "completion_tokens"):
                out[k] = v
            elif k in ("neg_alpha_mean", "neg_alpha_lt1_frac"):
                out[k] = v / n_neg if n_neg else 0.0
            elif k.startswith("gap_"):
                continue
            else:
                out[k] = v / n_active if n_active else 0.0
        out["n_neg"] = n_neg
        for k in ("n_pos", "n_neg", "tokens", "completion_tokens"):
            out[k] = int(round(out.get(k, 0.0)))
        out["log_ratio_max"] = maxes["log_ratio_max"] if n_active else 0.0
        out["log_ratio_min"] = -maxes["log_ratio_min_neg"] if n_active else 0.0
        if s.get("gap_count"):
            out["behavior_gap_mean"] = s["gap_abs"] / s["gap_count"]
            out["behavior_gap_signed_mean"] = s["gap_signed"] / s["gap_count"]
            out["behavior_gap_max"] = maxes["behavior_gap_max"]
            out["behavior_gap_tokens"] = int(s["gap_count"])
        return out


# -- the entry point ----------------------------------------------------------------


def train_policy(cfg: TrainConfig, *, progress: bool = True, _stop_after_step: Optional[int] = None) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data`` with loss ``cfg.loss``; write the policy to ``cfg.out``.

    Works as one process or under ``torchrun`` (FSDP2; every rank calls this).
    Returns the summary (also ``<out>/train_summary.json``). Raises
    :class:`UserError` for bad input before any output directory exists.
    """
    import torch

    from toprcli.training.distributed import init_distributed, shutdown

    done = finished_summary(cfg)
    if done is not None:  # resume of a finished run: nothing to do
        return done
    prep = prepare(cfg)
    threads_before = torch.get_num_threads()
    ctx = init_distributed()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        elif ctx.distributed and ctx.device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.local_world_size))
        return _train(prep, ctx, progress=progress and ctx.is_main, stop_after=_stop_after_step)
    finally:
        torch.set_num_threads(threads_before)
        shutdown(ctx)


def _train(prep: Prepared, ctx, *, progress: bool, stop_after: Optional[int]) -> dict[str, Any]:
    import torch

    from toprcli.losses import policy_loss
    from toprcli.training.checkpoint import STATE_NAME, latest_checkpoint, load_checkpoint, save_checkpoint, save_policy
    from toprcli.training.distributed import barrier
    from toprcli.training.logprobs import completion_logprobs
    from toprcli.training.optim import build_optimizer, build_scheduler

    cfg, loss, data, partial = prep.cfg, prep.loss, prep.data, prep.partial
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)  # same on every rank: identical LoRA init before sharding
    np.random.seed(cfg.seed)

    # Precision: float32 on CPU; on GPU float32 master weights with bf16 compute.
    on_gpu = ctx.device.type == "cuda"
    gpu_bf16 = on_gpu and cfg.dtype == "auto"
    if gpu_bf16 and not ctx.distributed:
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext  # FSDP2's MixedPrecisionPolicy casts instead

    model, lcfg = load_policy(cfg, ctx, gpu_bf16=gpu_bf16)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(cfg.optimizer, params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = build_scheduler(optimizer, schedule=cfg.schedule, warmup_steps=cfg.warmup_steps, total_steps=prep.steps)
    pad_id = 0

    # Output: <out>.partial/ holds everything until the policy is complete.
    ckpt_root = partial / "checkpoints"
    resume_from = latest_checkpoint(ckpt_root) if cfg.resume else None
    if ctx.is_main and resume_from is None:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
    barrier(ctx)

    state: dict[str, Any] = {"step": 0, "tokens": 0, "train_time_s": 0.0, "skipped_steps": 0, "gap": None, "first_loss": None}
    behavior, ref = data.behavior, None
    if resume_from is not None:
        saved = json.loads((resume_from / STATE_NAME).read_text())
        for key, fp in (("config_fingerprint", prep.config_fingerprint), ("data_fingerprint", prep.data_fingerprint)):
            if saved.get(key) != fp:
                what = "config" if key.startswith("config") else f"data ({cfg.data})"
                raise UserError(
                    f"the checkpoint in {ckpt_root} was made with a different {what} — run without --resume to start over"
                )
        state = load_checkpoint(resume_from, model, optimizer, scheduler, ctx)
        if (partial / PRECOMPUTED_NAME).is_file():
            pre = np.load(partial / PRECOMPUTED_NAME)
            behavior = pre["behavior"] if "behavior" in pre else behavior
            ref = pre["ref"] if "ref" in pre else None
    else:
        # μ check / recompute and the KL reference need the *starting* policy: one pass before step 1.
        precomputed: dict[str, np.ndarray] = {}
        need_ref_from_policy = loss.kl_coef > 0 and (loss.ref_model is None or _same_model(loss.ref_model, cfg.model))
        if cfg.recompute_behavior or need_ref_from_policy:
            model.eval()
            own = score_dataset(model, data, ctx, temperature=cfg.temperature, token_budget=cfg.micro_batch_tokens, autocast=autocast, pad_id=pad_id)
            model.train()
            state["gap"] = {**behavior_gap(data.behavior, own), "behavior_gap_source": "full pass"}
            if cfg.recompute_behavior:
                behavior = precomputed["behavior"] = own
            if need_ref_from_policy:
                ref = precomputed["ref"] = own
        if loss.kl_coef > 0 and ref is None:
            ref_cfg = dataclasses.replace(cfg, model=loss.ref_model, lora_rank=0, gradient_checkpointing=False)
            ref_model, _ = load_policy(ref_cfg, ctx, gpu_bf16=gpu_bf16, trainable=False)
            ref = precomputed["ref"] = score_dataset(ref_model, data, ctx, temperature=cfg.temperature, token_budget=cfg.micro_batch_tokens, autocast=autocast, pad_id=pad_id)
            del ref_model
        if precomputed and ctx.is_main:
            tmp = partial / f".{PRECOMPUTED_NAME}.tmp.npz"
            np.savez(tmp, **precomputed)
            os.replace(tmp, partial / PRECOMPUTED_NAME)
    state.update(config_fingerprint=prep.config_fingerprint, data_fingerprint=prep.data_fingerprint)
    start_step = int(state["step"])

    # Metrics: one JSON line per step (a resumed run drops lines past its checkpoint).
    metrics_path = partial / METRICS_NAME
    metrics_file = tb = None
    if ctx.is_main:
        kept = []
        if metrics_path.exists():
            kept = [ln for ln in metrics_path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= start_step]
        metrics_path.write_text("".join(ln + "\n" for ln in kept))
        metrics_file = open(metrics_path, "a")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(partial / "tb"))

    order = data_order(data.n_rows, cfg.batch_size, prep.steps, cfg.epochs, cfg.max_steps, cfg.seed)
    seq_lens, has_tokens = data.seq_lens, data.completion_lens > 0
    need_entropy = loss.entropy_coef > 0
    measure_gap = state["gap"] is None and start_step == 0
    kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
    last: dict[str, Any] = {}
    bar = _progress_bar(progress, prep.steps, start_step)

    try:
        for step in range(start_step, prep.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            # 1. Batch: this step's rows (same on every rank), this rank's micro-batches.
            rows = step_rows(order, step, cfg.batch_size)
            advantages = None
            if loss.whiten_advantages:  # over the whole step batch, so it does not depend on micro-batching
                advantages = data.advantages.copy()
                advantages[rows] = whiten(data.advantages[rows], has_tokens[rows])
            denominator = loss_denominator(data, rows, loss.aggregation)
            stats = StepStats()
            for mb_rows in plan_micro_batches(rows, seq_lens, ctx.world_size, cfg.micro_batch_tokens)[ctx.rank]:
                mb = collate(data, mb_rows, pad_id=pad_id, behavior=behavior, ref=ref, advantages=advantages).to(ctx.device)
                # 2. log π of the completion tokens (logits / sampling temperature).
                with autocast():
                    logprobs, entropy = completion_logprobs(
                        model, mb.input_ids, mb.prompt_lens, mb.completion_lens, temperature=cfg.temperature, with_entropy=need_entropy
                    )
                # 3. Loss: the micro-batch's share of the step's loss, so gradients sum to the step's.
                mb_loss, metrics = policy_loss(
                    loss.name, logprobs, mb.behavior, mb.advantages, mb.mask, weights=mb.weights,
                    aggregation=loss.aggregation, norm_length=loss.norm_length, adv_clip=loss.adv_clip,
                    ref_logprobs=mb.ref, kl_coef=loss.kl_coef, kl_estimator=loss.kl_estimator,
                    entropy=entropy, entropy_coef=loss.entropy_coef, **loss.options,
                )
                share = loss_denominator(data, mb_rows, loss.aggregation) / denominator if denominator > 0 else 0.0
                # 4. Backward (FSDP2 sums gradients over ranks; see distributed.shard_model).
                (mb_loss * share).backward()
                keys = sorted(metrics)
                values = torch.stack([metrics[k].float() for k in keys]).tolist()
                n_active = int(((mb.completion_lens > 0) & (mb.weights > 0)).sum())
                stats.add(dict(zip(keys, values)), share, n_active, mb.n_tokens, mb.n_completion_tokens)
                if measure_gap and step == 0:
                    _add_gap(stats, logprobs.detach(), mb)
            # 5. Step: clip, update, schedule.
            grad_norm = _clip_grad_norm(params, cfg.grad_clip)
            lr = scheduler.get_last_lr()[0]
            if math.isfinite(grad_norm):
                optimizer.step()
            else:
                state["skipped_steps"] += 1
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            # 6. Log.
            record = stats.reduce(ctx)
            if "behavior_gap_mean" in record:
                state["gap"] = {k: record[k] for k in record if k.startswith("behavior_gap_")}
                state["gap"]["behavior_gap_source"] = "first step batch"
            elapsed = time.perf_counter() - t0
            state["step"] = step + 1
            state["tokens"] += int(record["tokens"])
            state["train_time_s"] += elapsed
            record = {
                "step": step + 1,
                "epoch": min(prep.samples, (step + 1) * cfg.batch_size) / data.n_rows,
                **record,
                "grad_norm": grad_norm,
                "lr": lr,
                "tokens_per_s": record["tokens"] / elapsed if elapsed > 0 else 0.0,
                "step_time_s": elapsed,
                "step_cpu_s": time.process_time() - c0,  # CPU seconds of this process (all threads)
            }
            if step == 0 and state["gap"] is not None:
                record.update({k: v for k, v in state["gap"].items() if k != "behavior_gap_source"})
            if state["first_loss"] is None:
                state["first_loss"] = record["loss"]
            last = record
            if ctx.is_main:
                if (step + 1) % cfg.log_every == 0 or step + 1 == prep.steps:
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                    if tb is not None:
                        for k, v in record.items():
                            if k != "step" and isinstance(v, (int, float)):
                                tb.add_scalar(f"train/{k}", v, step + 1)
                if bar is not None:
                    bar.update(bar.task_ids[0], advance=1, loss=f"{record['loss']:.4g}")
            # Checkpoint (not after the last step: the policy itself is saved next).
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < prep.steps:
                if metrics_file is not None:
                    os.fsync(metrics_file.fileno())
                save_checkpoint(ckpt_root, step + 1, model, optimizer, scheduler, state, ctx)
                if kill_after and step + 1 >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            if stop_after is not None and step + 1 >= stop_after and step + 1 < prep.steps:
                raise SimulatedKill(f"stopped after step {step + 1}")
    finally:
        if bar is not None:
            bar.stop()
        if metrics_file is not None:
            metrics_file.close()
        if tb is not None:
            tb.close()

    # The policy, then the run's record, then the rename that makes <out> exist.
    save_policy(
        partial, model, ctx, source=cfg.model, save_dtype=getattr(torch, prep.save_dtype_name),
        lora=bool(cfg.lora_rank), lora_config=lcfg,
    )
    summary = _summary(prep, ctx, state, last, model, params, resumed_from=None if resume_from is None else int(resume_from.name.split("-")[1]), wall=time.perf_counter() - t_start)
    if ctx.is_main:
        _finish(prep, summary)
    barrier(ctx)
    return summary


def _add_gap(stats: StepStats, logprobs, mb) -> None:
    """Accumulate |log π − stored log μ| over a first-step micro-batch (π is still the starting policy)."""
    if len(mb.rows) == 0:
        return
    d = (logprobs.float() - mb.behavior) * mb.mask
    absd = d.abs()
    stats.add_gap(float(absd.sum()), float(d.sum()), int(mb.mask.sum()), float(absd.max()))


def _clip_grad_norm(params, max_norm: Optional[float]) -> float:
    """Total gradient norm before clipping (clips to ``max_norm`` when set); works on FSDP2 DTensors."""
    import torch

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _progress_bar(enabled: bool, total: int, done: int):
    if not enabled:
        return None
    from rich.progress import TextColumn

    from toprcli.cli.common import make_progress

    bar = make_progress(TextColumn("loss {task.fields[loss]}"))
    bar.add_task("train", total=total, completed=done, loss="-")
    bar.start()
    return bar


def _summary(prep: Prepared, ctx, state: dict[str, Any], last: dict[str, Any], model, params, *, resumed_from, wall: float) -> dict[str, Any]:
    cfg = prep.cfg
    n_params = sum(p.numel() for p in model.parameters())
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
        "epochs": min(state["step"] * cfg.batch_size, prep.samples) / prep.data.n_rows,
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
        "resumed_from_step": resumed_from,
        "world_size": ctx.world_size,
        "parameters": int(n_params),  # DTensor.numel() is the global size under FSDP
        "trainable_parameters": int(n_train),
        "lora_rank": cfg.lora_rank,
    }


def _finish(prep: Prepared, summary: dict[str, Any]) -> None:
    """Record the run in <out>.partial, drop training state, rename it to <out>."""
    from toprcli.shards import write_json_atomic, write_manifest

    partial, out = prep.partial, prep.out
    write_json_atomic(partial / SUMMARY_NAME, summary)
    write_manifest(
        partial,
        stage="train",
        config=config_to_dict(prep.cfg),
        inputs={"model": prep.cfg.model, "data": prep.cfg.data, "data_fingerprint": prep.data_fingerprint},
        counts={"rows": summary["rows"], "steps": summary["steps"], "tokens": summary["tokens"]},
        wall_time_s=summary["wall_time_s"],
    )
    shutil.rmtree(partial / "checkpoints", ignore_errors=True)
    (partial / PRECOMPUTED_NAME).unlink(missing_ok=True)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(partial, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
