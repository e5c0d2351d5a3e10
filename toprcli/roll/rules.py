"""The ROLL → topr mapping rules of `topr config import-roll` (see importer.py, docs/from-roll.md).

Each rule reads resolved ROLL keys through the mapper (``m.get``/``number``/
``flag``), sets topr keys and marks the ROLL keys mapped or left out (with the
reason); every other ROLL key gets a reason from :func:`toprcli.roll.keys.reason_for`. ROLL
semantics are those of alibaba/ROLL (Apache-2.0) at commit 8eb27cc.
"""

from __future__ import annotations

import re
from typing import Any

from toprcli.config.schema import TRACKERS
from toprcli.errors import UserError
from toprcli.roll.loss_rules import loss_generic, select_loss, topr_doc_keys
from toprcli.roll.placement import data_parallel

TRAIN_ARGS = "actor_train.training_args"
GEN_ARGS = "actor_infer.generating_args"
VAL_ARGS = "validation.generating_args"
DTYPES_TRAIN = {"bf16": "bfloat16", "fp32": "float32"}
DTYPES_ENGINE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# ROLL's GeneratingArguments defaults: what ROLL samples with where a file is silent.
ROLL_SAMPLING = {"temperature": 0.95, "top_p": 0.7, "top_k": 50}
# ROLL's (and Hugging Face TrainingArguments') defaults where a file is silent; topr's own differ.
ROLL_LR, ROLL_PER_DEVICE_BATCH, ROLL_GROUP, ROLL_LORA_RANK = 5e-5, 8, 1, 8


def apply_rules(m: Any) -> None:
    reference = _model_and_run(m)
    sequence_length = _lengths(m)
    loss = select_loss(m)
    loss_generic(m, reference, sequence_length)
    _optimizer(m)
    _sampling(m, GEN_ARGS, "generate", loss)
    _sampling(m, VAL_ARGS, "eval", loss)
    _engine(m)
    _rewards(m)
    _advantages(m)
    _selection(m)
    topr_doc_keys(m)


# -- model, run, lengths ----------------------------------------------------------------------


WORKERS = ("actor_train", "actor_infer", "reference")


def _model_and_run(m: Any) -> str | None:
    """The policy (``model``); returns the reference model (the KL penalty's). ROLL gives each worker
    ``pretrain`` unless all three set their own ``model_name_or_path``."""
    model, ref = _models(m)
    if m.get("exp_name") is not None:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(m.get("exp_name"))).strip("-") or "topr"
        m.mapped("exp_name", ("run_dir", f"runs/{name}"))
    if m.get("seed") is not None:
        seed = m.number("seed", integer=True)
        m.mapped("seed", ("train.seed", seed), ("generate.sampling.seed", seed))
    _tracking(m)
    return ref


def _models(m: Any) -> tuple[str | None, str | None]:
    """(policy, reference) as ROLL resolves them."""
    own = {w: m.get(f"{w}.model_args.model_name_or_path") for w in WORKERS}
    if all(v is not None for v in own.values()):
        train, infer, ref = (f"{w}.model_args.model_name_or_path" for w in WORKERS)
        m.mapped(train, ("model", str(own["actor_train"])))
        if own["actor_infer"] == own["actor_train"]:
            m.mapped(infer, note="the same model generates")
        else:
            m.left_out(infer, "topr generates with the policy it trains (actor_train's model)")
        m.mapped(ref, note="the KL penalty's reference (train.ref_model, with use_kl_loss)")
        if m.get("pretrain") is not None:
            m.left_out("pretrain", "actor_train, actor_infer and reference all set model_name_or_path: ROLL uses theirs")
        return str(own["actor_train"]), str(own["reference"])
    model = m.get("pretrain")
    if model is not None:
        m.mapped("pretrain", ("model", str(model)))
        for w in WORKERS:
            if own[w] is not None:
                m.left_out(f"{w}.model_args.model_name_or_path",
                           "ROLL uses pretrain unless actor_train, actor_infer and reference all set model_name_or_path")
    elif own["actor_train"] is not None:
        model = own["actor_train"]
        m.mapped("actor_train.model_args.model_name_or_path", ("model", str(model)))
    return (None, None) if model is None else (str(model), str(model))




def _tracking(m: Any) -> None:
    """ROLL's ``track_with`` where topr has that backend (tensorboard, wandb); its W&B project."""
    tracker = m.get("track_with")
    if tracker in TRACKERS:
        m.mapped("track_with", ("tracking.report_to", [tracker]))
        if tracker == "wandb" and m.get("tracker_kwargs.project") is not None:
            m.mapped("tracker_kwargs.project", ("tracking.project", str(m.get("tracker_kwargs.project"))))
    elif tracker is not None:
        m.left_out("track_with", f"topr has no {tracker} tracker — tracking.report_to takes {', '.join(TRACKERS)}")


def _lengths(m: Any) -> int:
    """max_new_tokens as ROLL computes it: sequence_length − prompt_length (sequence_length
    defaults to response_length + prompt_length); validation likewise with the val_ lengths.
    Returns sequence_length, the width ROLL pads every sequence to."""
    prompt = m.number("prompt_length", 1024, integer=True)
    if prompt is None:
        raise UserError("prompt_length is null — ROLL adds it to response_length; give a number (ROLL's default is 1024)")
    seq = m.number("sequence_length", integer=True)
    resp = m.number("response_length", integer=True)
    if seq is None and resp is None:
        raise UserError("neither response_length nor sequence_length is set — ROLL needs one; add response_length")
    mnt = (seq if seq is not None else resp + prompt) - prompt
    if mnt < 1:
        raise UserError(f"sequence_length − prompt_length is {mnt} — ROLL would generate nothing; fix the lengths")
    source = "response_length" if seq is None else "sequence_length"
    m.mapped(source, ("generate.sampling.max_new_tokens", mnt), note="ROLL's max_new_tokens" if seq is None else "minus prompt_length")
    if seq is not None:
        m.mapped("prompt_length", note="max_new_tokens = sequence_length − prompt_length")
        if resp is not None:
            m.left_out("response_length", "sequence_length is set: ROLL ignores response_length")
    vp, vs = m.number("val_prompt_length", integer=True), m.number("val_sequence_length", integer=True)
    if (vp is None) != (vs is None):  # ROLL asserts both or neither
        given = "val_prompt_length" if vp is not None else "val_sequence_length"
        raise UserError(f"{given} is set without {'val_sequence_length' if vp is not None else 'val_prompt_length'} — ROLL "
                        "refuses one without the other; set both (or neither: validation then uses the training lengths)")
    val = vs - vp if vp is not None and vs is not None else mnt
    m.set("eval.sampling.max_new_tokens", val)
    if vp is not None and vs is not None:
        m.mapped("val_sequence_length", ("eval.sampling.max_new_tokens", val), note="minus val_prompt_length")
        m.mapped("val_prompt_length", note="eval max_new_tokens = val_sequence_length − val_prompt_length")
    return mnt + prompt


# -- optimizer and training model ---------------------------------------------------------------


def _optimizer(m: Any) -> None:
    m.set("train.optimizer", "adamw")
    if m.has(f"{TRAIN_ARGS}.learning_rate"):
        m.mapped(f"{TRAIN_ARGS}.learning_rate", ("train.lr", m.number(f"{TRAIN_ARGS}.learning_rate")),
                 ("train.optimizer", "adamw"), note="ROLL trains with AdamW")
    else:
        m.set("train.lr", ROLL_LR)
        m.callout(f"{TRAIN_ARGS}.learning_rate is not set: imported ROLL's default {ROLL_LR} (train.lr; topr's own is 5e-7)")
    if m.has(f"{TRAIN_ARGS}.weight_decay"):
        m.mapped(f"{TRAIN_ARGS}.weight_decay", ("train.weight_decay", m.number(f"{TRAIN_ARGS}.weight_decay")))
    betas = [m.number(f"{TRAIN_ARGS}.adam_beta{i}") if m.has(f"{TRAIN_ARGS}.adam_beta{i}") else d for i, d in ((1, 0.9), (2, 0.999))]
    for i in (1, 2):
        if m.has(f"{TRAIN_ARGS}.adam_beta{i}"):
            m.mapped(f"{TRAIN_ARGS}.adam_beta{i}", ("train.adam_betas", betas))
    if m.has(f"{TRAIN_ARGS}.warmup_steps"):
        m.mapped(f"{TRAIN_ARGS}.warmup_steps", ("train.warmup_steps", m.number(f"{TRAIN_ARGS}.warmup_steps", integer=True)))
    if m.number(f"{TRAIN_ARGS}.warmup_ratio"):
        m.left_out(f"{TRAIN_ARGS}.warmup_ratio", "topr takes warm-up in steps: set train.warmup_steps")
    sched = m.get(f"{TRAIN_ARGS}.lr_scheduler_type")
    if sched is None:  # transformers' TrainingArguments default
        m.callout(f"{TRAIN_ARGS}.lr_scheduler_type is not set: ROLL's default is linear (decay to 0 over the run); "
                  "topr trains each round at a constant rate unless train.schedule says otherwise")
    else:
        kind = next((k for k in ("constant", "cosine") if str(sched).startswith(k)), "linear" if str(sched) == "linear" else None)
        if kind:
            m.mapped(f"{TRAIN_ARGS}.lr_scheduler_type", ("train.schedule", kind))
        else:
            m.left_out(f"{TRAIN_ARGS}.lr_scheduler_type", f"no {sched} schedule here (constant, linear or cosine, with linear warm-up)")
    if m.config.get("train", {}).get("schedule") in ("cosine", "linear") or m.number(f"{TRAIN_ARGS}.warmup_steps"):
        m.callout("the learning-rate schedule restarts every round here (each round's training has its own warm-up "
                  "and decay); ROLL's spans the whole run — consider train.schedule: constant")
    _batch_size(m)
    _training_model(m)


def _batch_size(m: Any) -> None:
    """Sequences per optimizer step: per device × accumulation × data-parallel ranks, ROLL's defaults where unset."""
    per_device = m.number(f"{TRAIN_ARGS}.per_device_train_batch_size", ROLL_PER_DEVICE_BATCH, integer=True)
    accum = m.number(f"{TRAIN_ARGS}.gradient_accumulation_steps", 1, integer=True)
    dp, how = data_parallel(m)
    size = per_device * accum * dp
    note = f"{per_device} per device × {accum} accumulation × {dp} data-parallel ranks ({how}): sequences per step"
    given = [k for k in ("per_device_train_batch_size", "gradient_accumulation_steps") if m.has(f"{TRAIN_ARGS}.{k}")]
    for key in given:
        m.mapped(f"{TRAIN_ARGS}.{key}", ("train.batch_size", size), note=note)
    if not given:
        m.set("train.batch_size", size)
        m.callout(f"{TRAIN_ARGS}.per_device_train_batch_size is not set: train.batch_size {size} from ROLL's defaults ({note})")


def _training_model(m: Any) -> None:
    args = "actor_train.model_args"
    dtype = m.get(f"{args}.dtype")
    if dtype is not None:
        if dtype in DTYPES_TRAIN:
            m.mapped(f"{args}.dtype", ("train.dtype", DTYPES_TRAIN[dtype]), note="bf16 compute, fp32 master weights" if dtype == "bf16" else "")
        else:
            m.left_out(f"{args}.dtype", f"{dtype}: topr trains in float32 or bfloat16")
    if m.has(f"{args}.disable_gradient_checkpointing"):
        m.mapped(f"{args}.disable_gradient_checkpointing",
                 ("train.gradient_checkpointing", not m.flag(f"{args}.disable_gradient_checkpointing")))
    _lora(m, args)


def _lora(m: Any, args: str) -> None:
    """ROLL trains LoRA when ``lora_target`` is set (rank 8 and alpha 2 × rank unless given), else the full model."""
    target = m.get(f"{args}.lora_target")
    if target is None:
        for key in ("lora_rank", "lora_alpha", "lora_dropout"):
            if m.has(f"{args}.{key}"):
                m.left_out(f"{args}.{key}", "lora_target is not set: ROLL trains the full model")
        return
    names = [t.strip() for t in str(target).split(",") if t.strip()]
    if any(re.search(r"[|*()\[\]^$\\?+]", n) or len(names) > 1 and n.startswith("all") for n in names):  # a regex, or all-* among names
        raise UserError(f"{args}.lora_target {target!r}: ROLL reads it as a regular expression — write module names (q_proj,v_proj) or all-linear")
    m.mapped(f"{args}.lora_target", ("train.lora_target_modules", None if names in (["all"], ["all-linear"]) else names))
    rank = m.number(f"{args}.lora_rank", ROLL_LORA_RANK, integer=True)
    if rank is None:
        raise UserError(f"{args}.lora_rank is null — give the LoRA rank (ROLL's default is {ROLL_LORA_RANK})")
    alpha = m.number(f"{args}.lora_alpha") or 2 * rank  # null or 0: ROLL's `lora_alpha or 2 * lora_rank`
    for key, target_key, value in (("lora_rank", "train.lora_rank", rank), ("lora_alpha", "train.lora_alpha", alpha)):
        if m.has(f"{args}.{key}"):
            m.mapped(f"{args}.{key}", (target_key, value))
        else:
            m.set(target_key, value)
            m.callout(f"{args}.{key} is not set: imported ROLL's default {value} ({target_key})")
    if m.get(f"{args}.lora_dropout") is not None:
        dropout = m.number(f"{args}.lora_dropout")
        if dropout:  # topr refuses it for losses that read μ: π must be a function of the weights
            m.left_out(f"{args}.lora_dropout", "dropout makes π random and its ratio to μ noise: topr trains LoRA without it")
        else:
            m.mapped(f"{args}.lora_dropout", ("train.lora_dropout", dropout))


# -- sampling, engine, data, rewards ------------------------------------------------------------


def _sampling(m: Any, section: str, stage: str, loss: str) -> None:
    if stage == "generate" and m.has("num_return_sequences_in_group"):
        m.mapped("num_return_sequences_in_group", ("generate.n", m.number("num_return_sequences_in_group", integer=True)))
    elif stage == "generate":
        m.set("generate.n", ROLL_GROUP)
        m.callout(f"num_return_sequences_in_group is not set: imported ROLL's default {ROLL_GROUP} (generate.n; topr's own is 16)")
    if not m.has(section):
        return
    # Only ROLL's hf_infer reads do_sample; vLLM and SGLang sample at the temperature given.
    reads_do_sample = m.get("actor_infer.strategy_args.strategy_name") == "hf_infer"
    if m.get(f"{section}.do_sample") is False and not reads_do_sample:
        m.left_out(f"{section}.do_sample", "only ROLL's hf_infer reads do_sample: vLLM and SGLang sample at the temperature given")
    greedy = (m.get(f"{section}.do_sample") is False and reads_do_sample) or m.number(f"{section}.temperature", 1.0) == 0
    if greedy and stage == "generate":
        raise UserError(
            f"{section}: greedy rollouts (do_sample false or temperature 0) have no behaviour policy μ for {loss} — sample"
        )
    if greedy:
        m.mapped(f"{section}.do_sample" if m.get(f"{section}.do_sample") is False else f"{section}.temperature",
                 ("eval.greedy", True), note="ROLL validates greedily; topr's greedy pass is eval.greedy")
    for name in ("temperature", "top_p", "top_k"):
        key = f"{section}.{name}"
        if greedy and name == "temperature":
            continue
        value = m.number(key, integer=name == "top_k")
        if value is None:
            value = ROLL_SAMPLING[name]
            m.callout(f"{section}.{name} is not set: imported ROLL's default {value} ({stage}.sampling.{name})")
        elif name == "top_k" and value <= 0:
            value = -1  # ROLL (HF, vLLM): 0 or −1 = off
        m.mapped(key, (f"{stage}.sampling.{name}", value))
    count = m.number(f"{section}.num_return_sequences", integer=True)
    if stage == "eval" and count is not None:
        m.mapped(f"{section}.num_return_sequences", ("eval.k", count))
    elif stage == "eval":  # ROLL validates with generating_args as given: one sample per prompt unless it says more
        m.set("eval.k", 1)
        m.callout(f"{section}.num_return_sequences is not set: imported ROLL's default 1 (eval.k; topr's own is 16)")
    elif count is not None:
        m.left_out(f"{section}.num_return_sequences", "ROLL overwrites it with num_return_sequences_in_group")
    if m.has(f"{section}.max_new_tokens"):
        m.left_out(f"{section}.max_new_tokens", "ROLL overwrites it with (val_)sequence_length − (val_)prompt_length")
    if m.number(f"{section}.num_beams", 1) == 1 and m.has(f"{section}.num_beams"):
        m.mapped(f"{section}.num_beams", note="1: sampling, as here")
    for name in ("repetition_penalty", "length_penalty"):
        if m.number(f"{section}.{name}", 1.0) == 1.0 and m.has(f"{section}.{name}"):
            m.mapped(f"{section}.{name}", note="1.0: off, as here")
    if m.get(f"{section}.do_sample") is True:
        m.mapped(f"{section}.do_sample", note="sampling, as here")
    data = "validation.data_args.template" if stage == "eval" else None
    for key in (data,) if data else ("actor_train.data_args.template", "actor_infer.data_args.template"):
        if m.get(key) is not None:
            m.mapped(key, (f"{stage}.dataset.chat_template", True), note="ROLL's chat template; here the tokenizer's")


def _engine(m: Any) -> None:
    dtype = m.get("actor_infer.model_args.dtype")
    if dtype is not None:
        if dtype in DTYPES_ENGINE:
            d = DTYPES_ENGINE[dtype]
            m.mapped("actor_infer.model_args.dtype", ("generate.engine.dtype", d), ("eval.engine.dtype", d))
        else:
            m.left_out("actor_infer.model_args.dtype", f"{dtype}: not an engine dtype here")
    if m.get("actor_infer.strategy_args.strategy_name") != "vllm":
        return
    base = "actor_infer.strategy_args.strategy_config"
    for name in ("gpu_memory_utilization", "tensor_parallel_size", "max_model_len"):
        if m.has(f"{base}.{name}"):
            value = m.number(f"{base}.{name}", integer=name != "gpu_memory_utilization")
            m.mapped(f"{base}.{name}", (f"generate.engine.{name}", value), (f"eval.engine.{name}", value))


def _rewards(m: Any) -> None:
    rewards = m.get("rewards") or {}
    if m.has("reward_pretrain"):
        m.left_out("reward_pretrain", "a reward model for ROLL's reward workers; topr scores with verifiers")
    if not isinstance(rewards, dict) or not rewards:
        return
    if len(rewards) > 1:
        m.left_out("rewards", f"{len(rewards)} reward domains ({', '.join(rewards)}): topr scores a run with one verifier — set score.verifier")
        return
    (domain, cfg), = rewards.items()
    if cfg is not None and not isinstance(cfg, dict):
        raise UserError(f"rewards.{domain}: {cfg!r} is not a mapping of reward worker settings — fix it in the file")
    worker = (cfg or {}).get("worker_cls") or ""
    m.left_out(f"rewards.{domain}", "ROLL reward worker settings (model, template, tags, placement)")
    if str(worker).endswith("MathRuleRewardWorker"):
        m.mapped(f"rewards.{domain}.worker_cls", ("score.verifier", "math"), ("score.reward_correct", 1.0),
                 ("score.reward_incorrect", 0.0), ("score.reward_no_answer", 0.0), ("eval.verifier", "math"),
                 note="ROLL's math_rule scores 1 or 0 with math-verify")
    else:
        m.left_out(f"rewards.{domain}.worker_cls", "no built-in verifier for this ROLL worker: set score.verifier (e.g. python:MODULE:FUNCTION)")


# -- advantages and selection -----------------------------------------------------------------

_MEAN = {"batch": "batch-mean", "group": "group-mean", "running": "batch-mean"}


def _advantages(m: Any) -> None:
    est = m.get("adv_estimator")
    grpo = est == "grpo"
    if est == "reinforce":
        m.mapped("adv_estimator", note="A = the normalised reward, as topr's A = R − c")
    elif grpo:
        m.mapped("adv_estimator", ("curate.baseline", "group-mean"), ("curate.std_normalize", "group"),
                 note="ROLL's grpo forces norm_mean_type and norm_std_type to group")
    elif est is not None:
        m.left_out("adv_estimator", f"{est} needs a critic or steps topr does not have; advantages here are A = R − c")
    if est not in ("reinforce", "grpo"):  # ROLL's default is gae
        m.callout(
            f"adv_estimator: {est or 'not set, ROLL default gae'} — ROLL estimates advantages with "
            f"{'a critic (value model)' if est in (None, 'gae') else est}; topr has no critic: A = R − c (curate's baseline), as ROLL's reinforce"
        )
    if (gamma := m.number("gamma", 1.0)) != 1.0 and est in ("reinforce", "grpo"):  # ROLL's reinforce return discounts by it
        m.callout(f"gamma {gamma:g}: ROLL's {est} discounts each token's return by it; topr does not (every token gets the advantage)")
    mean_key = "norm_mean_type" if m.has("norm_mean_type") else None
    std_key = "norm_std_type" if m.has("norm_std_type") else None
    mean, std = m.get("norm_mean_type"), m.get("norm_std_type")
    legacy = ""
    if mean_key is None and std_key is None and m.get("reward_norm") is not None:
        norm = m.get("reward_norm")
        shift, scale = m.flag("reward_shift"), m.flag("reward_scale")
        mean, std = (None if scale else norm), (None if shift else norm)
        mean_key = std_key = "reward_norm"
        legacy = "an older ROLL key (now norm_mean_type / norm_std_type; ROLL at 8eb27cc ignores it)"
        for key in ("reward_shift", "reward_scale"):
            if m.has(key):
                m.mapped(key, note=legacy)
    targets: list[tuple[str, Any]] = []
    if grpo:
        for key in (mean_key, std_key):
            if key:
                m.left_out(key, "adv_estimator grpo overrides it with group")
    else:
        if mean in _MEAN:
            targets.append(("curate.baseline", _MEAN[mean]))
        if std in ("batch", "group", "running"):
            targets.append(("curate.std_normalize", "batch" if std == "running" else std))
        approx = "running" in (mean, std)
        note = "ROLL's running statistics span all steps; here each round's data (approximation)" if approx else ""
        if mean_key == std_key and mean_key:
            m.mapped(mean_key, *targets, note=legacy or note)
        else:
            if mean_key:
                m.mapped(mean_key, *[t for t in targets if t[0] == "curate.baseline"],
                         note=note or ("" if mean else "no mean subtracted: curate.baseline 0"))
            if std_key:
                m.mapped(std_key, *[t for t in targets if t[0] == "curate.std_normalize"], note=note or ("" if std else "off"))
    clip = m.number("reward_clip")
    if clip:
        m.mapped("reward_clip", ("curate.reward_clip", clip), note="clips the normalised reward, i.e. curate's A")
    elif m.has("reward_clip"):
        m.mapped("reward_clip", note="off, as topr's default")


def _selection(m: Any) -> None:
    if m.has("max_len_mask"):
        on = m.flag("max_len_mask")
        m.mapped("max_len_mask", *([("curate.drop_truncated", True)] if on else []),
                 note="ROLL masks responses that fill the response length" if on else "off, as topr's default")
    thresholds = ("difficulty_low_threshold", "difficulty_high_threshold")
    if m.flag("difficulty_mask"):
        n = m.number("num_return_sequences_in_group", 1, integer=True)
        if n > 1:
            low, high = m.number(thresholds[0], 0.0), m.number(thresholds[1], 1.0)
            note = "ROLL keeps prompts whose mean score is strictly inside; with 0/1 scores that is the accuracy"
            for key in ("difficulty_mask", *thresholds):
                m.mapped(key, ("curate.keep_accuracy", [low, high]), note=note)
        else:
            for key in ("difficulty_mask", *thresholds):
                m.left_out(key, "ROLL applies the difficulty mask only with num_return_sequences_in_group > 1")
    else:
        if m.has("difficulty_mask"):
            m.mapped("difficulty_mask", note="off, as topr's default")
        for key in thresholds:
            if m.has(key):
                m.left_out(key, "difficulty_mask is off")
    for key, what in (
        ("error_max_len_clip", "drops wrong answers longer than error_max_len_threshold"),
        ("difficulty_loss_weight", "weights samples by prompt difficulty"),
        ("length_loss_weight", "weights samples by length"),
        ("whiten_rewards", "whitens token-level rewards"),
    ):
        if m.flag(key):
            m.left_out(key, f"no topr equivalent: ROLL {what}")
        elif m.has(key):
            m.mapped(key, note="off, as here")
