"""Everything `topr train` checks before it writes anything.

Reads the training set (its columns and its ``sampling`` metadata) and the
starting model's config; writes nothing. :func:`prepare` returns a
:class:`Prepared` run or raises :class:`UserError` with one line: an unknown
loss or option, a missing column, token ids outside the vocabulary, rows past
the context, NaN advantages, a sampling setting that contradicts the data,
greedy data for a loss that needs μ, an existing ``--out``.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow.compute as pc
import torch

from toprcli.config import TrainConfig, config_to_dict, from_dict
from toprcli.errors import UserError
from toprcli.generation.model_info import check_model, config_context_length, load_config
from toprcli.losses import LOSSES, policy_loss, resolve_options
from toprcli.sampling import Processing
from toprcli.shards import (check_nulls, check_writable, fingerprint, model_identity, models_of, parquet_files, read_file_metadata,
                            read_schema, read_table, same_model, sampling_of, through_link, validate_columns)
from toprcli.curation import group_ids
from toprcli.training.batching import LIST_COLUMNS, TOKEN_COLUMNS, StepPlan, TokenData, Units, step_plan, unit_longest
from toprcli.training import node_data
from toprcli.training.distributed import local_cuda_index
from toprcli.training.prefix import unsupported as unsupported_prefix

# Options of ``policy_loss`` that apply to every loss; also taken from ``loss_options`` (overriding the TrainConfig field).
GENERIC_LOSS_OPTIONS = ("adv_clip", "whiten_advantages", "kl_coef", "kl_estimator", "entropy_coef", "norm_length")
# Config keys that do not change the trained weights (a checkpoint may be resumed under other values): where and how
# often it saves and logs, and how a step is cut into forward passes (the micro-batches' losses add up by exact shares):
# after an out-of-memory error the advice is to lower micro_batch_tokens or turn on checkpointing, then --resume.
NON_SEMANTIC_KEYS = ("out", "resume", "overwrite", "save_every", "save_every_minutes", "log_every", "tracking", "threads", "save_dtype",
                     "nproc_per_node", "launcher", "micro_batch_tokens", "gradient_checkpointing", "logprob_chunk_size")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")
PARTIAL_SUFFIX = ".partial"
SUMMARY_NAME = "train_summary.json"


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

    def loss_kwargs(self) -> dict[str, Any]:
        """The keywords of ``policy_loss`` this setup fixes (the trainer adds the batch's tensors)."""
        return dict(aggregation=self.aggregation, norm_length=self.norm_length, adv_clip=self.adv_clip,
                    kl_coef=self.kl_coef, kl_estimator=self.kl_estimator, entropy_coef=self.entropy_coef, **self.options)


@dataclass
class Prepared:
    """Everything validated before any output exists."""

    cfg: TrainConfig
    loss: LossSetup
    data: TokenData
    out: Path
    partial: Path
    vocab_size: int
    context: Optional[int]
    units: Units  # what batching keeps together (rows, prompt groups, pairs)
    plan: StepPlan  # the units of every step
    data_fingerprint: str
    config_fingerprint: str
    processing: Processing  # the sampling distribution of the data; log π is computed under it
    sampling_source: str  # "data", "config" or "assumed"
    gradient_checkpointing: bool
    policies: dict[str, str | None] = field(default_factory=dict)  # the data's policies (paths) → their files when they generated
    reference: Optional[str] = None  # pairwise losses: "stored" μ or "recomputed" (unprocessed, T = 1)

    steps = property(lambda self: self.plan.steps)

    @property
    def samples(self) -> int:
        """Rows the run consumes (with repeats over epochs)."""
        return int(self.plan.rows_done[-1])

    @cached_property
    def unit_longest(self) -> np.ndarray:
        """(n_units,) each unit's longest row, prompt + completion, as packing counts it in either layout (the shared
        prefix's cost adds the prompt to the completion): read by every step's plan, computed once."""
        return unit_longest(self.units, self.data.seq_lens)

    @property
    def recomputes_behavior(self) -> bool:
        """Whether a pass of the starting policy replaces the stored μ before step 1."""
        return self.cfg.recompute_behavior or self.reference == "recomputed"

    @property
    def logprob_processing(self) -> Processing:
        """The distribution log π is computed under: the data's, or the unprocessed one for a pairwise loss."""
        return Processing() if self.reference else self.processing


# -- the loss -------------------------------------------------------------------------


def resolve_loss(cfg: TrainConfig) -> LossSetup:
    """Split ``loss_options`` into generic and loss-specific options and validate both
    (unknown loss, option that does not apply, bad value) by running the loss once
    on a one-token batch. The loss functions raise ValueError; here it is the user's."""
    try:
        return _resolve_loss(cfg)
    except ValueError as e:  # the loss's own words name it; a bare conversion error ('could not convert ...') does not
        raise UserError(str(e) if str(e).startswith("loss ") else f"loss {cfg.loss!r}, options {cfg.loss_options}: {e}") from None


def _resolve_loss(cfg: TrainConfig) -> LossSetup:
    opts = dict(cfg.loss_options or {})
    given = {k: opts.pop(k) for k in GENERIC_LOSS_OPTIONS if k in opts}
    checked = from_dict(TrainConfig, given, prefix="loss_options.")  # as their flags are checked: kl_coef >= 0, a bool a bool
    generic = {k: getattr(checked, k) for k in given}
    default = TrainConfig()
    for k in (k for k in generic if getattr(cfg, k) not in (getattr(default, k), generic[k])):  # one value, two places: which wins?
        raise UserError(f"{k} is set twice, to {getattr(cfg, k)!r} (--{k.replace('_', '-')}) and to {generic[k]!r} (loss_options) — keep one")
    resolve_options(cfg.loss, opts)
    setup = LossSetup(
        name=cfg.loss,
        aggregation=LOSSES[cfg.loss].aggregation or cfg.aggregation,
        options=opts,
        adv_clip=generic.get("adv_clip", cfg.adv_clip),
        whiten_advantages=bool(generic.get("whiten_advantages", cfg.whiten_advantages)),
        kl_coef=float(generic.get("kl_coef", cfg.kl_coef) or 0.0),
        kl_estimator=str(generic.get("kl_estimator", cfg.kl_estimator)),
        entropy_coef=float(generic.get("entropy_coef", cfg.entropy_coef) or 0.0),
        norm_length=generic.get("norm_length", cfg.norm_length),
        ref_model=cfg.ref_model,
    )
    if setup.ref_model and not setup.kl_coef:
        raise UserError("ref_model is set but kl_coef is 0 — set --kl-coef > 0 or drop --ref-model")
    if LOSSES[cfg.loss].pairwise and (setup.whiten_advantages or setup.adv_clip):  # ±1 marks chosen/rejected: not advantages
        raise UserError(f"--loss {cfg.loss} is pairwise (its ±1 marks chosen and rejected): whiten_advantages and adv_clip do not "
                        "apply — turn them off")
    two = torch.zeros(2, 1)  # one (chosen, rejected) pair, so pairwise losses run too
    # One dry run validates everything the loss reads (names, aggregation, KL estimator, option values).
    policy_loss(  # raises ValueError for what the loss rejects
        setup.name, two.clone().requires_grad_(), two, torch.tensor([1.0, -1.0]), torch.ones(2, 1),
        ref_logprobs=two, entropy=two if setup.entropy_coef else None, **setup.loss_kwargs(),
    )
    return setup


# -- the data -------------------------------------------------------------------------


def load_training_data(path: str, *, need_policy: bool, extra: tuple[str, ...] = (), shared: Optional[Path] = None,
                       ) -> tuple[TokenData, dict[str, str | None], Optional[dict[str, Any]], Any]:
    """The columns training needs, the policies that generated the rows (if asked: path → its files as recorded,
    ``shards.models_of``), the data's sampling record and the ``extra`` columns (a table); UserError naming the
    file for a missing column or mixed sampling records. ``shared``: under torchrun, the token arrays are read by local
    rank 0 alone and mapped by every local rank from there (:mod:`toprcli.training.node_data`)."""
    files = parquet_files(path)
    columns = list(dict.fromkeys(list(TOKEN_COLUMNS) + (["policy"] if need_policy else []) + list(extra)))
    records, recorded = [], {}
    for f in files:
        validate_columns(read_schema(f), "curated", f, required=columns)
        meta = read_file_metadata(f)
        records.append((f, sampling_of(meta)))
        recorded.update(models_of(meta))
    first_file, sampling = records[0]
    for f, other in records[1:]:
        if (other is None) != (sampling is None) or (other is not None and Processing.from_mapping(other) != Processing.from_mapping(sampling)):
            raise UserError(f"{f} and {first_file} record different sampling settings — one training set holds one sampling "
                            "distribution; curate them into one file with `topr curate`")
    table = read_table(files, columns=[c for c in columns if c not in LIST_COLUMNS])
    if table.num_rows == 0:
        raise UserError(f"{path}: the training set has no rows — check the curation step (its filters may drop everything)")
    check_nulls(table, "curated", path)

    def column(name: str) -> Any:  # the heavy list columns one at a time: peak memory is one of them, not the table
        if name in table.column_names:
            return table.column(name)
        part = read_table(files, columns=[name])
        check_nulls(part, "curated", path)
        return part.column(name)

    policies = {str(p): recorded.get(str(p)) for p in pc.unique(table.column("policy")).to_pylist()} if need_policy else {}
    data = node_data.shared_on_node(lambda: TokenData.from_columns(column), shared) if shared else TokenData.from_columns(column)
    return data, policies, sampling, table.select(list(extra))


def batch_units(table, path: str, *, pairwise: bool, group_by_prompt: bool) -> Units:
    """The rows batching keeps together: (chosen, rejected) pairs for a pairwise loss, a prompt's
    rows with ``group_by_prompt`` (both: a prompt's pairs), else single rows."""
    if not (pairwise or group_by_prompt):
        return Units.singletons(table.num_rows)
    if not pairwise:
        return Units.from_labels(group_ids(table.column("iteration"), table.column("policy"), table.column("prompt_id"))[0])
    pair = table.column("pair_id").to_numpy()
    chosen = table.column("chosen").to_numpy(zero_copy_only=False).astype(bool)
    units = Units.from_labels(pair, piece=2)
    sizes = units.sizes
    if (sizes != 2).any():
        unit = int(np.flatnonzero(sizes != 2)[0])
        bad = int(pair[units.rows[units.off[unit]]])  # a row of that unit: units are numbered in their own order
        raise UserError(f"{path}: pair_id {bad} has {int(sizes[unit])} row(s), not 2 — re-run `topr curate --pairs matched`")
    first, second = units.rows[units.off[:-1]], units.rows[units.off[:-1] + 1]
    if (chosen[first] == chosen[second]).any():
        raise UserError(f"{path}: a pair needs one chosen and one rejected row — re-run `topr curate --pairs matched`")
    units.rows[units.off[:-1]] = np.where(chosen[first], first, second)  # chosen first
    units.rows[units.off[:-1] + 1] = np.where(chosen[first], second, first)
    if group_by_prompt:  # whole pairs, grouped by prompt
        labels = group_ids(table.column("iteration"), table.column("policy"), table.column("prompt_id"))[0]
        by_pair = Units.from_labels(labels[units.rows[units.off[:-1]]])
        units = Units(units.rows.reshape(-1, 2)[by_pair.rows].reshape(-1), by_pair.off * 2, piece=2)
    return units


def resolve_processing(cfg: TrainConfig, sampling: Optional[dict[str, Any]], path: str) -> tuple[Processing, str]:
    """The distribution log π is computed under: the data's, checked against the config's settings.

    A setting given in the config (``--temperature`` ...) that differs from the
    data's is refused. Data without a sampling record (hand-made files) takes
    the config's settings, else temperature 1 without truncation.
    """
    given = {k: getattr(cfg, k) for k in SAMPLING_KEYS if getattr(cfg, k) is not None}
    if sampling is None:
        return Processing.from_mapping(given), ("config" if given else "assumed")
    data = Processing.from_mapping(sampling)
    wanted = Processing.from_mapping({**data.as_dict(), **given})
    for key in SAMPLING_KEYS:
        if getattr(wanted, key) != getattr(data, key):
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{flag} {given[key]} contradicts the data: {path} was sampled with {key} {getattr(data, key)} — "
                f"drop {flag} (training computes log π under the data's sampling settings)"
            )
    return data, "data"


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


# -- memory -----------------------------------------------------------------------------


def activation_bytes(model_cfg: Any, tokens: int, bytes_per_value: int) -> int:
    """A generous estimate of one micro-batch's saved activations without checkpointing.

    Per token and decoder layer a transformer block keeps roughly 16 hidden-size
    and 4 intermediate-size values for backward (norms, q/k/v, attention output,
    the MLP's gate/up/activation/product); measured on SmolLM2 it is ~0.8 of this.
    """
    hidden = int(getattr(model_cfg, "hidden_size", 0) or 0)
    inter = int(getattr(model_cfg, "intermediate_size", 0) or 4 * hidden)
    layers = int(getattr(model_cfg, "num_hidden_layers", 0) or 0)
    return layers * tokens * (16 * hidden + 4 * inter) * bytes_per_value


def device_memory_bytes() -> int:
    """Memory one rank may use: the GPU's, or this machine's RAM shared by its local ranks."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(local_cuda_index()).total_memory)
    import psutil

    return int(psutil.virtual_memory().total) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def micro_batch_tokens(cfg: TrainConfig, data: TokenData, units: Units, plan: StepPlan) -> int:
    """A bound on one micro-batch's tokens as the trainer lays them out: the budget, or the largest step
    when that is smaller (rows × longest row; with a shared prefix, each unit's prompt once plus rows ×
    longest completion)."""
    largest = 0
    for step in range(plan.steps):
        step_units = plan.step_units(step)
        rows = units.rows_of(step_units)
        if len(rows) == 0:
            continue
        if cfg.shared_prefix:
            tokens = len(step_units) * int(data.prompt_lens[rows].max()) + len(rows) * int(data.completion_lens[rows].max())
            uncut = int(data.prompt_lens[rows].max()) + units.piece * int(data.completion_lens[rows].max())
        else:
            tokens = len(rows) * int(data.seq_lens[rows].max())
            uncut = units.piece * int(data.seq_lens[rows].max())
        # A piece packing cannot cut (a row, a pair) may pass the budget: it gets a micro-batch of its own.
        largest = max(largest, min(tokens, max(cfg.micro_batch_tokens, uncut)))
    return largest


def choose_gradient_checkpointing(cfg: TrainConfig, model_cfg: Any, tokens: int) -> bool:
    """``auto``: on when one micro-batch's activations (``tokens``: :func:`micro_batch_tokens`) would need
    more than 1/8 of the device memory."""
    if isinstance(cfg.gradient_checkpointing, bool):
        return cfg.gradient_checkpointing
    bytes_per_value = 2 if cfg.dtype in ("bfloat16", "bfloat16-pure") or (cfg.dtype == "auto" and torch.cuda.is_available()) else 4
    return activation_bytes(model_cfg, tokens, bytes_per_value) > device_memory_bytes() // 8


# -- the run ----------------------------------------------------------------------------


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prepare(cfg: TrainConfig) -> Prepared:
    """Validate config, data and model config; decide what the output dirs mean. Creates nothing."""
    for key in ("model", "data", "out"):
        if not getattr(cfg, key):
            raise UserError(f"no --{key} given — `topr train --model M --data FILE --out DIR`")
    loss = resolve_loss(cfg)

    out = through_link(cfg.out)  # a symlink: the policy is built and swapped in where it points
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    if out.exists() and not out.is_dir():  # --overwrite replaced it, the training data (-o = -d) too
        raise UserError(f"--out {out} is a file{' (the training data)' if out.resolve() == Path(cfg.data).resolve() else ''} — the policy "
                        "is a directory: choose another --out")
    if out.exists() and not cfg.overwrite and any(out.iterdir()):
        raise UserError(f"{out} already exists and is not a finished training output (no train_summary.json) — pass --overwrite to "
                        "replace it, or choose another --out")
    check_writable(partial)

    check_model(cfg.model)  # a mistyped path is no hub id to retry for half a minute
    if loss.ref_model:
        check_model(loss.ref_model, tokenizer=False)  # its weights alone are read
    mcfg = load_config(cfg.model)
    vocab_size = int(mcfg.vocab_size)
    context = config_context_length(mcfg)
    if loss.ref_model and int(load_config(loss.ref_model).vocab_size) != vocab_size:  # its log-probs of these token ids
        raise UserError(f"--ref-model {loss.ref_model} has another vocabulary than --model {cfg.model} — the KL reference must share the policy's tokenizer")

    pairwise = LOSSES[loss.name].pairwise
    extra = _extra_columns(cfg, pairwise)
    data_fingerprint = fingerprint(cfg.data)
    data, policies, sampling, extra_table = load_training_data(cfg.data, need_policy=cfg.recompute_behavior or pairwise, extra=extra,
                                                               shared=node_data.directory(out, data_fingerprint))
    if loss.name == "sft" and not (loss.kl_coef or loss.entropy_coef or loss.whiten_advantages) and not ((data.advantages > 0) & (data.weights > 0)).any():
        warnings.warn(f"{cfg.data}: loss sft trains on the rows with A > 0 and this set has none: the policy will not change — curate a set "
                      "with positives (a lower --baseline), or train with a loss that learns from negatives (topr)", stacklevel=2)
    processing, sampling_source = resolve_processing(cfg, sampling, cfg.data)
    if processing.greedy and LOSSES[loss.name].uses_behavior:
        raise UserError(
            f"loss {loss.name!r} needs μ, but {cfg.data} has no sampling distribution (greedy decoding, temperature 0, "
            "or gold solutions) — regenerate with temperature > 0, or train with --loss sft"
        )
    units = batch_units(extra_table, cfg.data, pairwise=pairwise, group_by_prompt=cfg.group_by_prompt or cfg.shared_prefix)
    reference = None
    if pairwise and (empty := np.flatnonzero(data.completion_lens == 0)).size:  # its pair would weigh half (a row of L = 0 counts 0)
        raise UserError(f"{cfg.data}: row {int(empty[0])} has no completion tokens — a preference pair compares two completions; "
                        "drop that pair (topr curate never writes one)")
    if pairwise:  # ±1 marks chosen/rejected for the loss; the reference rides in the μ slot
        data.advantages = np.where(extra_table.column("chosen").to_numpy(zero_copy_only=False), 1.0, -1.0).astype(np.float32)
        reference = pairwise_reference(cfg, sampling, processing, policies)
    recompute = cfg.recompute_behavior or reference == "recomputed"
    check_data(data, path=cfg.data, vocab_size=vocab_size, context=context, check_behavior=not recompute)
    if cfg.recompute_behavior and not pairwise:
        other = [p for p, files in policies.items() if not same_model(p, cfg.model, files)]
        if other:
            raise UserError(f"--recompute-behavior: rows of {cfg.data} were generated by {other[0]!r}, not by --model {cfg.model!r} — "
                            "μ can only be recomputed with the policy that sampled the data; drop --recompute-behavior")
    if loss.aggregation == "seq-mean-token-sum-norm" and loss.norm_length is None:
        # A constant N for the whole run (the default T of `aggregate` would vary per micro-batch).
        loss.norm_length = int(max(1, data.completion_lens.max()))

    plan = step_plan(units, cfg.batch_size, cfg.epochs, cfg.max_steps, cfg.seed)
    if plan.steps == 0:  # else the starting policy would be saved as the trained one
        raise UserError(f"--epochs {cfg.epochs} of {units.n_units} training units is no step — raise --epochs or pass --max-steps")
    checkpointing = choose_gradient_checkpointing(cfg, mcfg, micro_batch_tokens(cfg, data, units, plan))
    if cfg.shared_prefix and (why := unsupported_prefix(mcfg, int(data.seq_lens.max()), checkpointing)):
        raise UserError(f"--shared-prefix: {cfg.model}: {why} — its log-probs would not be the one-pass layout's; drop --shared-prefix")
    semantic = {k: v for k, v in config_to_dict(cfg).items() if k not in NON_SEMANTIC_KEYS and k != "data"}  # data: its own fingerprint
    # A model by what it is, not where: a run dir that moved (or is spelt another way) resumes its checkpoint.
    semantic.update({k: model_identity(semantic[k]) if semantic[k] else semantic[k] for k in ("model", "ref_model")})
    return Prepared(
        cfg=cfg, loss=loss, data=data, out=out, partial=partial, units=units, plan=plan, reference=reference, vocab_size=vocab_size,
        context=context, data_fingerprint=data_fingerprint, config_fingerprint=_fingerprint({**semantic, "processing": processing.as_dict()}),
        processing=processing, sampling_source=sampling_source, gradient_checkpointing=checkpointing, policies=policies)


def _extra_columns(cfg: TrainConfig, pairwise: bool) -> tuple[str, ...]:
    """Columns beyond the token data that batching needs; UserError when the data lacks them."""
    grouped = cfg.group_by_prompt or cfg.shared_prefix
    extra = (("prompt_id", "iteration", "policy") if grouped else ()) + (("pair_id", "chosen") if pairwise else ())
    names = set(read_schema(parquet_files(cfg.data)[0]).names)
    for name in extra:
        if name not in names:
            fix = (f"curate it with `topr curate --pairs matched` for --loss {cfg.loss}" if name in ("pair_id", "chosen")
                   else "drop --group-by-prompt and --shared-prefix")
            raise UserError(f"{cfg.data} has no {name!r} column — {fix}")
    return extra


def pairwise_reference(cfg: TrainConfig, sampling: Optional[dict[str, Any]], processing: Processing, policies: dict[str, str | None]) -> str:
    """Where a pairwise loss's reference log-probs come from: ``stored`` μ or a ``recomputed`` pass.

    The reference is the starting policy's *unprocessed* distribution (temperature 1, no
    truncation). The stored μ is that only when the data was sampled from --model at
    temperature 1 without top-k/top-p/min-p; otherwise one scoring pass computes it.
    """
    unprocessed = sampling is not None and processing == Processing()
    from_model = bool(policies) and all(same_model(p, cfg.model, files) for p, files in policies.items())
    return "stored" if unprocessed and from_model and not cfg.recompute_behavior else "recomputed"
