"""The keys of a ROLL RLVR config, so `topr config import-roll` can tell a ROLL key from a typo.

Facts about alibaba/ROLL (Apache-2.0) at commit 8eb27cc, written down as key
names: the fields of its config dataclasses (``RLVRConfig`` and its bases in
``roll/configs/base_config.py`` and ``roll/pipeline/rlvr/rlvr_config.py``,
``WorkerConfig``, ``ModelArguments``, ``TrainingArguments``,
``GeneratingArguments``, ``DataArguments``, ``RewardConfig``), the loss knobs
``ActorPGWorker`` reads with ``getattr`` from ``actor_train``, and keys that
ROLL's own example configs and docs use although no dataclass declares them
(ROLL loads YAML with ``dacite.from_dict`` in its default, non-strict mode, so
such keys are dropped silently; a typo is dropped the same way, which is why
the importer refuses keys outside this catalogue).

A schema maps a key to ``None`` (a value), :data:`FREE` (a mapping whose keys
are the user's, e.g. ``system_envs``) or another schema (a nested dataclass).
:func:`reason_for` says why a ROLL key the rules do not map has no topr
counterpart.
"""

from __future__ import annotations

import fnmatch
from typing import Any

FREE = "free"  # a mapping with user-chosen keys: everything below it is accepted


def _leaves(names: str) -> dict[str, Any]:
    return {n: None for n in names.split()}


MODEL_ARGS = _leaves(
    "additional_target autocast_adapter_dtype lora_alpha lora_dropout lora_rank lora_target model_name_or_path "
    "adapter_name_or_path attn_implementation moe_aux_loss_coef disable_gradient_checkpointing "
    "gradient_checkpointing_use_reentrant device_map dtype model_type num_labels freeze_module_prefix ulysses_size"
) | {"model_config_kwargs": FREE}

TRAINING_ARGS = _leaves(
    "output_dir max_steps num_train_epochs learning_rate lr_scheduler_type weight_decay adam_beta1 adam_beta2 "
    "per_device_train_batch_size gradient_accumulation_steps seed data_seed dataloader_num_workers fp16 bf16 tf32 "
    "warmup_ratio warmup_steps save_hf_model"
)

GENERATING_ARGS = _leaves(
    "do_sample temperature top_p top_k num_beams max_length max_new_tokens repetition_penalty length_penalty "
    "num_return_sequences stop_strings include_stop_str_in_output logprobs"
)

DATA_ARGS = _leaves(
    "template preprocessing_num_workers file_name eval_file_name dataset_type tag id prompt response messages "
    "image_max_pixels image_min_pixels video_max_pixels video_min_pixels video_total_pixels video_fps "
    "video_max_frames video_resize_chunk_frames image_folder video_folder audio_folder custom_data_kwargs_func"
) | {"domain_interleave_probs": FREE}

WORKER = _leaves(
    "name worker_cls pg_variant world_size device_mapping num_gpus_per_worker model_update_frequency infer_batch_size "
    "backend_timeout topr_positive_weight topr_negative_weight max_concurrency use_dynamic_batching_in_train "
    "max_tokens_per_microbatch_in_train sequence_length_round_in_train use_dynamic_batching_in_infer "
    "max_tokens_per_microbatch_in_infer sequence_length_round_in_infer offload_nccl use_sequence_packing "
    "logits_in_fp32 apply_loss_scale mtp_training_mode opd_kl_coef tag_included"
) | {
    "model_args": MODEL_ARGS,
    "training_args": TRAINING_ARGS,
    "data_args": DATA_ARGS,
    "generating_args": GENERATING_ARGS,
    "strategy_args": {"strategy_name": None, "strategy_config": FREE},
    "system_envs": FREE,
    "sequence_packing_args": _leaves(
        "algorithm max_packed_sequence_length_forward max_packed_sequence_length_train "
        "min_num_micro_batches_forward min_num_micro_batches_train"
    ),
    "router_replay": _leaves("mode"),
}

_FILTER = {"type": None, "filter_args": FREE}
REWARD = WORKER | _leaves(
    "code_url use_local judge_prompt judge_model_type judge_model_name judge_api_url judge_api_key format_pattern "
    "reward_type response_length_penalty_coef"
) | {"query_filter_config": _FILTER, "response_filter_config": _FILTER, "reward_manager_config": FREE}

# Worker sections of the top level (each a WorkerConfig; `teacher` may also map names to WorkerConfigs).
WORKER_SECTIONS = (
    "actor_train", "actor_infer", "reference", "critic", "reward", "validation", "reward_model",
    "teacher", "student_train", "student_infer",
)

TOP = _leaves(
    # ScheduleConfig, BaseConfig
    "generate_opt_level is_num_return_sequences_expand max_running_requests is_use_additional_prompts "
    "max_additional_running_prompts user_defined_rollout_loop_cls exp_name seed rpc_timeout output_dir base_dir "
    "logging_dir rollout_dump_dir track_with max_steps save_steps max_ckpt_to_keep logging_steps eval_steps "
    "rollout_batch_size val_batch_size local_rank resume_from_checkpoint prompt_length response_length "
    "sequence_length val_prompt_length val_sequence_length profiler_timeline profiler_memory report_length_and_rewards "
    "is_offload_states is_offload_optimizer_states_in_train_step length_profiler_dir profiler_output_dir "
    "otlp_output_dir model_update_buffer_size_mb num_nodes num_gpus_per_node model_download_type "
    # PPOConfig
    "pretrain reward_pretrain async_generation_ratio ppo_epochs max_grad_norm l2 lambd gamma pg_clip use_pg_clip_range "
    "pg_clip_low pg_clip_high value_clip kl_penalty target_kl init_kl_coef kl_horizon use_reward_scaling add_len_reward "
    "reward_clip use_reward_norm whiten_rewards whiten_advantages advantage_clip adv_estimator norm_mean_type "
    "norm_std_type add_token_level_kl critic_warmup use_kl_loss kl_loss_coef entropy_loss_coef loss_agg_mode "
    "dual_clip_loss enable_reference enable_old_logprobs_recompute force_disable_old_logprobs_recompute "
    "pure_opd_pipeline_type is_pure_opd use_opd "
    # RLVRConfig
    "global_template num_return_sequences_in_group save_logging_board_dir difficulty_loss_weight length_loss_weight "
    "postive_loss_coef use_topr_neg_loss_coef use_policy_loss_type use_topr_loss rl_loss_coef importance_sampling "
    "val_greedy val_n_sample max_len_mask mask_type difficulty_mask balance_length minibatch_data_iter_num "
    "difficulty_low_threshold difficulty_high_threshold error_max_len_clip error_max_len_threshold"
) | {
    "tracker_kwargs": FREE,
    "checkpoint_config": FREE,
    "system_envs": FREE,
    "tag_to_template": FREE,
    "router_args": {"router_name": None, "router_config": FREE, "max_running_requests": None},
    "rollout_mock": _leaves("enable mode dump_dir"),
    "transfer_backend": {"backend_name": None, "backend_config": FREE},
    "train_infer_correction": {
        "is_weight": _leaves("enabled weight_type upper_bound detach"),
        "filters": None,  # a list of filter rules
    },
    "dataset_filter": _leaves("source min_difficulty max_difficulty num_samples"),
    "rewards": {"*": REWARD},  # domain name → RewardConfig
    # Hydra's own sections
    "hydra": FREE,
    "defaults": None,
} | {name: WORKER for name in WORKER_SECTIONS}

# Knobs ActorPGWorker reads with getattr(actor_train, key, default). They are not WorkerConfig
# fields, so ROLL's loader drops them and the worker always sees the default given here.
PG_KNOBS = {
    "tis_lower_bound": 0.0,
    "tis_upper_bound": 1.0,
    "cispo_epsilon_low": 0.1,
    "cispo_epsilon_high": 0.1,
    "cispo_use_unified_mask": False,
    "kimi15_tau": 0.1,
}

# ROLL's off-policy doc shows the loss knobs at the top level; ROLL reads them from actor_train.
TOP_LEVEL_KNOBS = set(PG_KNOBS) | {"topr_positive_weight", "topr_negative_weight"}

# Keys ROLL's examples and docs use that no ROLL dataclass declares at 8eb27cc (ROLL drops them).
LEGACY_TOP = {
    "pg_variant": "only interpolated (e.g. into exp_name); ROLL reads actor_train.pg_variant",
    "reward_norm": "replaced by norm_mean_type / norm_std_type in ROLL",
    "reward_shift": "replaced by norm_mean_type / norm_std_type in ROLL",
    "reward_scale": "replaced by norm_mean_type / norm_std_type in ROLL",
    "positive_loss_coef": "documented in ROLL's TOPR doc; the RLVRConfig field is the misspelt postive_loss_coef",
    "lora_rank": "a top-level value for interpolation; ROLL reads <worker>.model_args.lora_rank",
    "lora_alpha": "a top-level value for interpolation; ROLL reads <worker>.model_args.lora_alpha",
    "lora_target": "a top-level value for interpolation; ROLL reads <worker>.model_args.lora_target",
    "offload_nccl": "a WorkerConfig field, not a top-level one",
    "reward_system_config": "not an RLVRConfig field",
}
LEGACY_WORKER = {
    "eval_steps": "a top-level key (eval_steps), not a worker one",
    "use_remove_padding": "not a WorkerConfig field",
}
LEGACY_SECTION = {
    "model_args": {"flash_attn": "older name of attn_implementation"},
    "data_args": {"dataset_dir": "not a DataArguments field", "interleave_probs": "not a DataArguments field"},
}

# ROLL's TOPR doc and example_topr.yaml present these as TOPR's knobs. What ROLL's code does with them:
TOPR_DOC_KEYS = {
    "positive_loss_coef": "no such ROLL field (RLVRConfig has the misspelt postive_loss_coef, which no code reads); "
    "ROLL's TOPR positive weight is actor_train.topr_positive_weight",
    "postive_loss_coef": "an RLVRConfig field no ROLL code reads; "
    "ROLL's TOPR positive weight is actor_train.topr_positive_weight",
    "use_topr_neg_loss_coef": "an RLVRConfig field no ROLL code reads; "
    "ROLL's TOPR negative weight is actor_train.topr_negative_weight",
    "use_topr_loss": "an RLVRConfig field no ROLL code reads; "
    "ROLL selects TOPR with actor_train.pg_variant: topr (worker_cls ActorPGWorker)",
    "use_policy_loss_type": "an RLVRConfig field no ROLL code reads; the loss comes from actor_train.pg_variant",
}

PG_VARIANTS = {"vanilla": "reinforce", "ppo": "ppo", "tis": "tis", "topr": "topr", "cispo": "cispo", "kimi15": "kimi15"}
PG_WORKER = "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker"


def section_schema(path: tuple[str, ...]) -> Any:
    """The schema at ``path`` (a tuple of keys), :data:`FREE`, ``None`` (a value) or ``KeyError`` (not a ROLL key).

    Legacy keys and PG knobs are not in the schemas: the caller checks them.
    """
    node: Any = TOP
    for i, key in enumerate(path):
        if node is FREE:
            return FREE
        if not isinstance(node, dict):
            raise KeyError(key)
        if key in node:
            node = node[key]
        elif "*" in node:
            node = node["*"]
        elif path[:i] == ("teacher",):  # teacher: {name: WorkerConfig} (multi-teacher distillation)
            node = WORKER
        else:
            raise KeyError(key)
    return node


# -- reasons for keys left out ------------------------------------------------------------------

_PLACEMENT = "ROLL worker placement, parallelism and batching: topr sizes micro-batches by tokens (train.micro_batch_tokens)"
_REASONS: list[tuple[tuple[str, ...], str]] = [
    (("hydra", "hydra.*"), "Hydra's runtime settings"),
    (("defaults", "defaults.*"), "Hydra composition: only this file is read (compose the config first)"),
    (("*.strategy_args.*",), "Megatron / FSDP / vLLM / SGLang strategy and placement"),
    (("*.device_mapping", "*.world_size", "*.num_gpus_per_worker", "*.infer_batch_size", "*.max_concurrency",
      "*.backend_timeout", "*dynamic_batching*", "*microbatch*", "*.sequence_length_round*", "*sequence_packing*",
      "*.offload_nccl", "*.logits_in_fp32", "*.apply_loss_scale", "*.router_replay.*", "*.mtp_training_mode",
      "*.model_update_frequency", "*.name"), _PLACEMENT),
    (("system_envs.*", "*.system_envs.*"), "environment variables for ROLL's workers"),
    (("track_with", "tracker_kwargs.*", "logging_steps", "save_logging_board_dir"),
     "tracker settings: topr names its tracked run after the run directory (tracking.* sets project, name, group, tags)"),
    (("checkpoint_config.*", "save_steps", "max_ckpt_to_keep", "resume_from_checkpoint", "output_dir", "base_dir",
      "logging_dir", "*.training_args.output_dir"),
     "ROLL's outputs and checkpoints: topr writes everything under run_dir and resumes when re-run"),
    (("profiler_*", "length_profiler_dir", "otlp_output_dir", "report_length_and_rewards", "rollout_dump_dir",
      "rollout_mock.*"), "profiling and debugging"),
    (("num_gpus_per_node", "num_nodes", "rpc_timeout", "local_rank", "model_update_buffer_size_mb", "is_offload_*",
      "model_download_type", "transfer_backend.*", "router_args.*", "generate_opt_level",
      "is_num_return_sequences_expand", "max_running_requests", "is_use_additional_prompts",
      "max_additional_running_prompts", "user_defined_rollout_loop_cls", "async_generation_ratio"),
     "ROLL's cluster runtime and rollout scheduler"),
    (("max_steps", "rollout_batch_size", "eval_steps", "val_batch_size", "*.training_args.max_steps",
      "*.training_args.num_train_epochs"),
     "counted in ROLL's online steps (one rollout batch, one update); a topr round samples generate.dataset, then "
     "trains — set rounds, eval_every and generate.dataset.limit"),
    (("*.data_args.*", "dataset_filter.*", "global_template", "tag_to_template.*"),
     "ROLL's data files and templates: point generate.dataset / eval.dataset at your prompts"),
    (("reference.*",), "the reference policy: ROLL's is pretrain (train.ref_model when the KL loss is on)"),
    (("critic.*", "lambd", "gamma", "value_clip", "critic_warmup"), "critic / GAE: topr has no value model"),
    (("reward.*", "reward_model.*"), "a reward-model cluster: topr scores with verifiers (score.verifier)"),
    (("teacher", "teacher.*", "student_*", "is_pure_opd", "use_opd", "pure_opd_pipeline_type"),
     "on-policy distillation: not part of topr"),
    (("train_infer_correction.*", "enable_old_logprobs_recompute", "force_disable_old_logprobs_recompute",
      "enable_reference"),
     "trainer/engine log-prob correction: topr stores μ from the engine, reports the gap and can recompute it "
     "(train.recompute_behavior)"),
    (("kl_penalty", "target_kl", "init_kl_coef", "kl_horizon", "add_token_level_kl"),
     "KL in the reward (add_token_level_kl): topr has the KL loss only (train.kl_coef, k3 as ROLL's KL loss)"),
    (("use_reward_scaling", "use_reward_norm", "add_len_reward", "l2", "val_greedy", "val_n_sample", "mask_type",
      "balance_length", "minibatch_data_iter_num"), "ROLL's RLVR pipeline does not read it (8eb27cc)"),
    (("*.model_args.*",), "model loading and kernel settings"),
    (("*.training_args.*",), "set by ROLL itself, or no topr equivalent"),
    (("*.generating_args.*",), "changes the sampling distribution or the engine's output: no topr equivalent"),
    (("prompt_length",), "ROLL truncates prompts to it; topr checks prompts against the model's context (generate.skip_long)"),
    (("*.pg_variant", "*.worker_cls"), "a worker other than actor_train"),
    (("*.topr_*", "*.tis_*", "*.cispo_*", "*.kimi15_*"), "ROLL reads loss knobs from actor_train only"),
]


def reason_for(key: str, value: Any) -> str:
    """Why a ROLL key has no topr counterpart (the first matching rule)."""
    for patterns, why in _REASONS:
        if any(fnmatch.fnmatchcase(key, p) for p in patterns):
            return why
    return "no topr equivalent"
