"""The config dataclasses: one per stage, the shared sampling and engine parts, the pipeline.

Every field is declared once with :func:`~toprcli.config.fields.opt`: default, help, flag,
check. The CLI is generated from these (``cli/builder.py``). Defaults follow the paper
(docs/architecture.md §4). Choice lists come from their registries (losses,
aggregations, KL estimators, optimizers).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from toprcli.config.fields import AT_LEAST_ONE, FINITE, MIN_P, NON_NEGATIVE, PATH, POSITIVE, REWARD, SEED, TOP_K, UNIT_HALF_OPEN, UNIT_OPEN, ConfigError
from toprcli.config.fields import _check, choice, config_to_dict, from_dict, opt
from toprcli.losses import AGGREGATIONS, KL_ESTIMATORS, LOSSES
from toprcli.training.optim import OPTIMIZERS

# c in A = R − c by name (curate.baseline), and the rule each names.
BASELINES = {"batch-mean": "batch-mean", "group-mean": "group-mean", "mean": "group-mean", "leave-one-out": "leave-one-out", "loo": "leave-one-out"}
# verl's data_source values and the verifier each names (score.verifier_by_source adds to or overrides them).
VERIFIER_BY_SOURCE = {"openai/gsm8k": "gsm8k", "gsm8k": "gsm8k", "HuggingFaceH4/MATH-500": "math", "DigitalLearningGmbH/MATH-lighteval": "math",
                      "lighteval/MATH": "math", "hendrycks/competition_math": "math", "EleutherAI/hendrycks_math": "math"}


@dataclass
class DatasetSpec:
    """Where prompts come from and how they are rendered (``data/datasets.py``)."""

    source: str = opt("builtin:arith", "Prompts: builtin:gsm8k, builtin:arith, a hub id (openai/gsm8k) or a local .jsonl/.json/.parquet/.csv/.tsv (.gz, .bz2, .xz too).",
                      flag="--dataset", short="-d")
    config_name: str | None = opt(None, "The hub dataset's config (openai/gsm8k: main, chosen for you).", flag="--dataset-config")
    split: str = opt("train", "Dataset split.")
    preset: Literal["auto", "gsm8k", "math", "arith", "verification", "verl", "trl", "messages", "none"] = opt(
        "auto", "Column mapping, gold-answer rule and instruction; auto: verl/trl/messages from the columns, else from the source's name, "
                "else from the content (`#### n` answers: gsm8k; a problem with a boxed solution: math).")
    question_column: str | None = opt(None, "Column of the question; a.b reads field b of struct column a (not in CSV); unset: the preset's.")
    answer_column: str | None = opt(None, "Column of the gold answer, e.g. reward_model.ground_truth; unset: the preset's.")
    id_column: str | None = opt(None, "Column of a unique prompt id; unset: a hash of the question.")
    template: str | None = opt(None, "Plain-text prompt with {question}; unset: the preset's.")
    chat_template: bool = opt(False, "Render prompts with the tokenizer's chat template (instruct models).")
    system_prompt: str | None = opt(None, "System message for --chat-template prompts, only where a row has no system turn of its own.")
    few_shot: int = opt(0, "Prepend k solved examples from --few-shot-split (paper: 8 for GSM8K, 4 for MATH).", check=NON_NEGATIVE)
    few_shot_split: str = opt("train", "The split few-shot examples come from (never the problem itself); with a local file, another file.")
    few_shot_seed: int = opt(0, "Seed of the few-shot choice (with each problem's id).", check=SEED)
    limit: int | None = opt(None, "Use only the first K prompts.", check=AT_LEAST_ONE)
    size: int = opt(2000, "builtin:arith: problems per split (at most what the split has: level 1 test, 222).", flag="--arith-size", check=AT_LEAST_ONE)
    level: int = opt(2, "builtin:arith: difficulty 1..4 (the demo's: 1).", flag="--arith-level", check=_check(lambda v: 1 <= v <= 4, "an integer 1..4"))
    seed: int = opt(0, "builtin:arith: seed of the problems.", cli=False, check=SEED)

    def check(self) -> None:  # a setting that would do nothing in silence (and be recorded as if it did)
        if self.system_prompt and not self.chat_template:
            raise ConfigError("dataset.system_prompt needs dataset.chat_template: true (a plain-text prompt has no system turn) — "
                              "turn --chat-template on, or put the text in --template")


@dataclass
class SamplingConfig:
    """The distribution μ is drawn from, shared by generate and eval; it travels with the data and train
    computes log π under the same processing (docs/architecture.md §5)."""

    temperature: float = opt(1.0, "Sampling temperature (0 = greedy).", check=_check(  # vLLM's range: it raises (0, 0.01) to 0.01
        lambda v: v == 0 or 0.01 <= v <= 2, "0 (greedy) or a number in [0.01, 2] (vLLM samples at no other temperature)"))
    top_p: float = opt(1.0, "Nucleus sampling mass in (0, 1].", check=UNIT_HALF_OPEN)
    top_k: int = opt(-1, "Keep the k most likely tokens; -1 is off.", check=TOP_K)
    min_p: float = opt(0.0, "Drop tokens less likely than min-p × the most likely one; 0 is off.", check=MIN_P)
    max_new_tokens: int = opt(512, "Most tokens per completion.", check=AT_LEAST_ONE)
    seed: int = opt(0, "Base seed; each prompt samples from its own stream seeded by (seed, iteration, prompt id).", check=SEED)


@dataclass
class EngineConfig:
    """The generation engine: which backend, and how it holds the model. Shared by generate and eval."""

    backend: Literal["auto", "vllm", "hf"] = opt("auto", "auto (vLLM when it imports), vllm or hf.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt("auto", "Weights' dtype; auto: float32 on CPU, bfloat16 on GPU (float16 before Ampere).")
    tensor_parallel_size: int = opt(1, "GPUs per vLLM engine (tensor parallelism).", check=AT_LEAST_ONE)
    gpu_memory_utilization: float | None = opt(
        None, "vLLM's share of device memory for weights + KV cache; unset: 0.9 on GPU. On CPU a share of RAM; unset: a KV cache of 15% "
        "of RAM (1-8 GiB) but no more than 256 full-context sequences fill, or VLLM_CPU_KVCACHE_SPACE GiB.", check=UNIT_HALF_OPEN)
    max_model_len: int | None = opt(None, "Context length (prompt + completion); unset: the model's.", check=AT_LEAST_ONE)
    enforce_eager: bool | None = opt(None, "vLLM: no CUDA graphs / compilation; unset: eager on CPU (fast start), compiled on GPU.")
    batch_size: int = opt(64, "Prompts per engine call (hf backend).", check=AT_LEAST_ONE)
    engine_kwargs: dict[str, Any] = opt(factory=dict, help="Extra vllm.LLM(...) arguments.", cli=False)


@dataclass
class GenerateConfig:
    model: str = opt("", "Policy: a Hugging Face model dir (or hub id).", short="-m")
    dataset: DatasetSpec = opt(factory=DatasetSpec)
    out: str = opt("", "Output directory for shard-*.parquet and _manifest.json.", short="-o", check=PATH)
    n: int = opt(16, "Completions per prompt (paper: 16 for GSM8K, 32 for MATH).", check=AT_LEAST_ONE)
    sampling: SamplingConfig = opt(factory=SamplingConfig)
    engine: EngineConfig = opt(factory=EngineConfig)
    shard_size: int = opt(64, "Prompts per shard file (the unit of resume).", check=AT_LEAST_ONE)
    shard_index: int = opt(0, "This process's part, 0..num-shards-1 (data parallel).", check=NON_NEGATIVE)
    num_shards: int = opt(1, "Processes sharing the prompt set (data parallel).", check=AT_LEAST_ONE)
    skip_long: bool = opt(False, "Drop prompts longer than the context (counted) instead of stopping.")
    clip_to_context: bool = opt(False, "Cut completions where prompt + max-new-tokens would pass the context (recorded) instead of stopping.")
    iteration: int = opt(0, "Round number stored in each row and mixed into the seeds.", check=NON_NEGATIVE)
    per_request_seed: bool = opt(True, "Seed every prompt from (seed, iteration, prompt id) (vLLM); off: reseed per shard only.")
    data_parallel_size: int = opt(1, "Launch N processes here, one engine each (GPUs or CPU cores split between them), disjoint shards.", check=AT_LEAST_ONE)


_BY_SOURCE_HELP = "data_source=verifier pairs for --verifier data_source."
_STRICT_HELP = "gsm8k: require '#### n' (strict), or also accept 'The answer is n', the last \\boxed{n} and the last number."


@dataclass
class ScoreConfig:
    samples: str = opt("", "The samples directory `topr generate` wrote (or one Parquet file).", short="-s")
    out: str = opt("", "Directory for the scored shards and _manifest.json.", short="-o", check=PATH)
    verifier: str = opt("auto", "auto (the verifier of the dataset the samples were generated from, as their manifest records it; gsm8k "
                                "if it names none) | gsm8k | math | exact | judge (a generative verifier's Yes/No against the row's label) | regex:PATTERN | python:MODULE:FUNCTION (fn(completion, answer, row) -> "
                                "bool | float | None, or verl's compute_score) | data_source (each row's verl data_source picks one through "
                                "--verifier-by-source).", short="-v")
    verifier_by_source: dict[str, str] = opt(factory=lambda: dict(VERIFIER_BY_SOURCE), help=_BY_SOURCE_HELP)
    strict: bool = opt(False, _STRICT_HELP, flag="--strict/--flexible")
    workers: int | None = opt(None, "Verifier worker processes; unset: one per core.", short="-w", check=AT_LEAST_ONE)
    timeout: float = opt(5.0, "Hard limit per check in seconds; a check past it is killed (verdict 'timeout').", check=POSITIVE)
    reward_correct: float = opt(1.0, "Reward of a correct completion (a plugin that returns a number sets its own).", check=REWARD)
    reward_incorrect: float = opt(-1.0, "Reward of an incorrect one (also 'timeout' and 'error').", check=REWARD)
    reward_no_answer: float = opt(-1.0, "Reward when no answer could be read.", check=REWARD)
    worker_memory_mb: int = opt(4096, "Address-space cap per worker in MiB; 0 = none (e.g. plugins that load CUDA).", check=NON_NEGATIVE)
    overwrite: bool = opt(False, "Rescore an --out scored from other samples or settings.")


@dataclass
class CurateConfig:
    scored: list[str] = opt(factory=list, help="`topr score` output dirs (or Parquet files): this round first, then earlier rounds to replay.", short="-s")
    out: str = opt("", "The training set to write, one Parquet file; its manifest goes to <out>.manifest.json.", short="-o", check=PATH)
    baseline: float | str | None = opt(None, "c in A = R − c: a number, batch-mean (the mean reward), group-mean (alias mean) or leave-one-out "
                                             "(alias loo; per prompt); unset: 0.",
                                       check=_check(lambda v: math.isfinite(v) if isinstance(v, float) else v.strip().lower() in BASELINES,
                                                    "a finite number, batch-mean, group-mean or leave-one-out"))
    positive_fraction: float | None = opt(
        None, "Target effective share of positives p̃; solves the constant c from the data (paper: 0.1–0.2). Exclusive with --baseline.",
        check=UNIT_OPEN)
    positive_fraction_rule: Literal["fixed", "at-least-p"] = opt(
        "fixed", "fixed: p̃ = --positive-fraction; at-least-p: p̃ = max(--positive-fraction, p), the raw baseline (c = 0 with ±1 rewards) once the share p of correct samples passes it.")
    source_weights: list[float] | None = opt(None, "Weight per scored input, in order (e.g. 1,0.5); written to the `weight` column.")
    drop_uniform_prompts: bool = opt(False, "Drop prompts whose samples are all correct or all incorrect.",
                                     flag="--drop-uniform-prompts/--keep-uniform-prompts")
    drop_truncated: bool = opt(False, "Drop samples cut off at max_new_tokens (finish_reason = length).", flag="--drop-truncated/--keep-truncated")
    drop_unchecked: bool = opt(True, "Drop samples whose check failed (verdict error: a gold the verifier cannot read, a plugin that raised): "
                                     "no evidence either way, so not negatives. Timeouts are kept (the policy's output hung).",
                               flag="--drop-unchecked/--keep-unchecked")
    dedupe: bool = opt(False, "Keep one copy of identical completions within a prompt.")
    max_per_prompt: int | None = opt(None, "Keep at most this many samples per prompt (lowest sample_index first).", check=AT_LEAST_ONE)
    first_positive: bool = opt(False, "Per prompt keep the first correct sample and every incorrect one.", flag="--first-positive/--all-positives")
    subsample: int | None = opt(None, "Keep a uniform random subset of this many rows (after the filters).", check=AT_LEAST_ONE)
    seed: int = opt(0, "Seed of --subsample and of --pairs all's choice under --max-pairs-per-prompt.", check=SEED)
    overwrite: bool = opt(False, "Replace an --out made from other inputs or settings.")
    unreachable_baseline: float | None = opt(None, "With --positive-fraction: the constant c when the data has one outcome only; unset: fail (iterate uses 0).",
                                             check=FINITE)
    keep_accuracy: list[float] | None = opt(
        None, "Keep prompts whose accuracy lies strictly between low and high, e.g. 0.1,0.95 (ROLL's difficulty_mask; "
              "-0.1,1 also keeps accuracy 0).",
        check=_check(lambda v: len(v) == 2 and v[0] < v[1], "[low, high] with low < high (beyond [0, 1]: no bound on that side)"))
    std_normalize: Literal["batch", "group"] | None = opt(
        None, "Divide A by the reward std over all samples (batch) or the prompt's (group), as ROLL's norm_std_type.")
    reward_clip: float | None = opt(None, "Clip A (after --std-normalize) to [−x, x] (ROLL's reward_clip).", check=POSITIVE)
    pairs: Literal["none", "matched", "all"] = opt(
        "none", "Preference pairs for --loss dpo, written as rows (chosen, rejected) with pair_id and chosen columns: matched "
        "(per prompt the i-th correct with the i-th incorrect sample, each sample once; the one to use for DPO) or all "
        "(every correct × incorrect combination).")
    max_pairs_per_prompt: int | None = opt(
        None, "With --pairs: at most this many pairs per prompt (matched: the first; all: a choice seeded by --seed).", check=AT_LEAST_ONE)

    def check(self) -> None:  # options that contradict each other, or would do nothing in silence
        if self.positive_fraction is not None and self.baseline is not None:
            raise ConfigError("--baseline and --positive-fraction both given — choose one: the positive fraction solves the constant baseline")
        for name, on in (("std_normalize: group", self.std_normalize == "group"), ("reward_clip", self.reward_clip is not None)):
            if on and self.positive_fraction is not None:  # p̃ is solved for the constant c: these would move it off the target
                raise ConfigError(f"positive_fraction and {name} both given — {name} changes |A| after c is solved, "
                                  "so p̃ would miss the target; drop one of them")
        for w in self.source_weights or ():
            if not (math.isfinite(w) and w >= 0):
                raise ConfigError(f"bad source weight {w} — source weights are finite numbers >= 0")
        if self.source_weights is not None and not any(w > 0 for w in self.source_weights):
            raise ConfigError("every source weight is 0 — at least one source needs a positive weight")
        if self.max_pairs_per_prompt is not None and self.pairs == "none":
            raise ConfigError("max_pairs_per_prompt is set but pairs is none — it caps preference pairs: set pairs (matched or all) or drop it")
        if self.positive_fraction_rule != "fixed" and self.positive_fraction is None:
            raise ConfigError(f"positive_fraction_rule {self.positive_fraction_rule} needs positive_fraction — set it, or drop the rule")


@dataclass
class VerifierDataConfig:
    """``topr verifier-data``: scored completions → a verification dataset (question + candidate → Yes/No)."""

    scored: list[str] = opt(factory=list, help="`topr score` output dirs (or an eval's scored/).", short="-s")
    out: str = opt("", "The verification dataset to write, one Parquet file.", short="-o", check=PATH)
    balance: bool = opt(False, "As many correct as incorrect candidates (the larger class is subsampled, seeded).")
    max_per_question: int | None = opt(None, "At most this many candidates per question (a seeded choice).", check=AT_LEAST_ONE)
    dedupe: bool = opt(True, "One row per distinct question and candidate text.")
    seed: int = opt(0, "Seed of --balance, --max-per-question and the rows' shuffled order.", check=SEED)
    overwrite: bool = opt(False, "Replace an --out made from other inputs or settings.")


TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")


@dataclass
class TrackingConfig:
    """Experiment trackers the run also reports to (``tracking/``): one tracked run per run directory, resumed with it."""

    report_to: list[str] = opt(factory=list, help="Trackers (repeatable, or a comma list): tensorboard (<run>/tb), wandb, mlflow, trackio; none. See docs/tracking.md.",
                               check=_check(lambda v: set(v) <= set(TRACKERS), f"a list of {', '.join(TRACKERS)}"))
    project: str | None = opt(None, "W&B or trackio project, MLflow experiment; unset: WANDB_PROJECT or MLFLOW_EXPERIMENT_NAME, else toprcli.")
    run_name: str | None = opt(None, "The tracked run's name; unset: the run directory's name.")
    group: str | None = opt(None, "Group of runs (W&B and trackio group, MLflow tag); unset: a branch's parent run's name.")
    tags: dict[str, Any] = opt(factory=dict, help="A tag as KEY=VALUE (repeatable), e.g. variant=topr.", flag="--tag")

    @staticmethod
    def migrate(data: dict[str, Any]) -> dict[str, Any]:
        """``report_to`` as TRL users write it: one name (``report_to: wandb``), a comma list (``wandb,mlflow``), ``none``."""
        given = data.get("report_to")
        if isinstance(given, str) or isinstance(given, list) and all(isinstance(name, str) for name in given):
            names = [part.strip() for name in ([given] if isinstance(given, str) else given) for part in name.split(",") if part.strip()]
            data["report_to"] = [] if names == ["none"] else names
        return data


_CHECK_DATA = "Check against the data's sampling {} (read from the data; a different value is refused)."


@dataclass
class TrainConfig:
    model: str = opt("", "Starting policy: an HF model dir or hub id; the policy that generated the data (π_k).", short="-m")
    data: str = opt("", "Curated training set (Parquet file or shard dir from `topr curate`).", short="-d")
    out: str = opt("", "Output dir for the new policy (HF format) + metrics.jsonl + train_summary.json (while it trains: <out>.partial/).", short="-o", check=PATH)
    loss: str = opt("topr", "Policy loss.", check=choice(LOSSES, "a registered loss:"))
    loss_options: dict[str, Any] = opt(factory=dict, help="A loss option as KEY=VALUE (repeatable), e.g. ratio_level=token.", flag="--loss-option")
    aggregation: str = opt("seq-mean-token-mean", "How per-token losses are averaged.", check=choice(AGGREGATIONS))
    optimizer: str = opt("adafactor", "Optimizer (paper: adafactor).", check=choice(OPTIMIZERS))
    lr: float = opt(5e-7, "Learning rate (paper: 5e-7 with Adafactor).", check=POSITIVE)
    adam_betas: list[float] = opt(factory=lambda: [0.9, 0.999], help="AdamW's beta1,beta2 (LLM fine-tuning often takes 0.9,0.95).",
                                  check=_check(lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1): beta1,beta2"))
    adam_eps: float = opt(1e-8, "AdamW's epsilon.", check=POSITIVE)
    weight_decay: float = opt(0.0, "Decoupled weight decay, of weight matrices (not of biases and norm gains).", check=NON_NEGATIVE)
    schedule: Literal["constant", "linear", "cosine"] = opt("constant", "Learning-rate schedule after the linear warm-up (linear and cosine "
                                                                        "decay to 0 at the last step).")
    warmup_steps: int = opt(0, "Linear warm-up steps.", check=NON_NEGATIVE)
    grad_clip: float | None = opt(1.0, "Clip the global gradient norm to this; 0 (or null) is no clipping.", check=NON_NEGATIVE)
    epochs: float = opt(1.0, "Passes over the data (fractions allowed).", check=POSITIVE)
    max_steps: int | None = opt(None, "Optimizer steps; overrides --epochs.", check=AT_LEAST_ONE)
    batch_size: int = opt(64, "Sequences per optimizer step (over all ranks).", check=AT_LEAST_ONE)
    group_by_prompt: bool = opt(
        False, "Draw each step's batch as whole prompt groups (a group larger than --batch-size takes a step alone; "
               "micro-batches may split a group). Pairwise losses always keep a pair together.")
    shared_prefix: bool = opt(
        False, "Compute each prompt once per micro-batch and let its completions attend to it (batches are drawn as "
               "prompt groups, as --group-by-prompt); log-probs equal the one-pass layout's. See docs/benchmarks.md.")
    micro_batch_tokens: int = opt(8192, "Token budget of one forward pass (rows × padded length); gradients accumulate.", check=AT_LEAST_ONE)
    temperature: float | None = opt(None, _CHECK_DATA.format("temperature"), check=POSITIVE)
    top_p: float | None = opt(None, _CHECK_DATA.format("top-p"), check=UNIT_HALF_OPEN)
    top_k: int | None = opt(None, _CHECK_DATA.format("top-k"), check=TOP_K)
    min_p: float | None = opt(None, _CHECK_DATA.format("min-p"), check=MIN_P)
    seed: int = opt(0, "Seed of the data order and initialisation.", check=SEED)
    dtype: Literal["auto", "float32", "bfloat16", "bfloat16-pure"] = opt(
        "auto", "auto: fp32 on CPU, bfloat16 on GPU (fp32 before Ampere); bfloat16: bf16 compute, fp32 master weights; bfloat16-pure: bf16 weights (small updates are lost).")
    save_dtype: Literal["float32", "bfloat16", "float16"] = opt("float32", "dtype of the saved weights (float32 keeps small updates).")
    gradient_checkpointing: bool | Literal["auto"] = opt(
        "auto", "Recompute activations in backward (less memory); auto: on when a micro-batch's activations would take > 1/8 of the device.")
    logprob_chunk_size: int | None = opt(None, "Completion positions per LM-head chunk; unset: about 128 MiB of float32 logits per chunk.", check=AT_LEAST_ONE)
    save_every: int | None = opt(None, "Checkpoint every N steps (for --resume).", check=AT_LEAST_ONE)
    save_every_minutes: float | None = opt(30.0, "Also checkpoint once this many minutes have passed since the last (a kill -9 or an "
                                                 "out-of-memory kill loses at most that); unset: by steps only.", check=POSITIVE)
    resume: bool = opt(False, "Continue a killed run from its last checkpoint (else it starts over); a finished --out with the same settings is kept either way.")
    recompute_behavior: bool = opt(False, "Replace the stored μ with this trainer's log-probs of the starting policy (the data must come from --model).")
    lora_rank: int = opt(0, "Train LoRA adapters of this rank (0 = full fine-tuning); saved merged.", check=NON_NEGATIVE)
    lora_alpha: float = opt(16.0, "LoRA alpha.", check=POSITIVE)
    lora_dropout: float = opt(0.0, "LoRA dropout.", check=NON_NEGATIVE)
    lora_target_modules: list[str] | None = opt(None, "Module names to adapt (repeatable); unset: all linear layers.", flag="--lora-target")
    ref_model: str | None = opt(None, "Reference policy of the KL penalty; unset: the starting policy.")
    kl_coef: float = opt(0.0, "KL penalty coefficient (0 = off).", check=NON_NEGATIVE)
    kl_estimator: str = opt("k3", "KL estimator (k1+, k3+: that value, k2's gradient; docs/architecture.md §4).", check=choice(KL_ESTIMATORS))
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient (0 = off; below 0 a penalty).", check=FINITE)
    whiten_advantages: bool = opt(False, "Whiten advantages over each step's batch.")
    adv_clip: float | None = opt(None, "Clip advantages to [-c, c].", check=POSITIVE)
    log_every: int = opt(1, "Write every Nth step's metrics (that step's, not an average of the N; the last step's always).", check=AT_LEAST_ONE)
    norm_length: int | None = opt(None, "N of seq-mean-token-sum-norm; unset: the longest completion in the data.", check=AT_LEAST_ONE)
    threads: int | None = opt(None, "torch CPU threads; unset: torch's choice (a core share per rank under torchrun).", check=AT_LEAST_ONE)
    overwrite: bool = opt(False, "Replace an existing complete --out (at the end, once the new policy is complete).")
    nproc_per_node: int = opt(1, "Train on N ranks of this node: relaunches itself under torchrun (FSDP2).", check=AT_LEAST_ONE)
    launcher: str | None = opt(None, "Command template for other launchers with {config}, {nproc_per_node}, {python} "
                                     "(e.g. srun torchrun ... -m toprcli train --config {config}).")
    tracking: TrackingConfig = opt(factory=TrackingConfig)

    def check(self) -> None:
        if self.lora_dropout > 0 and self.loss in LOSSES and LOSSES[self.loss].uses_behavior:  # π a function of the weights (§5)
            raise ConfigError(f"lora_dropout {self.lora_dropout} with loss {self.loss}: dropout makes π random, so its ratio to μ is noise — "
                              "set lora_dropout 0 (or train with loss sft)")

    @staticmethod
    def migrate(data: dict[str, Any]) -> dict[str, Any]:
        """``tensorboard: true`` (before trackers) is ``tracking.report_to: [tensorboard]``."""
        if data.pop("tensorboard", False):
            tracking = TrackingConfig.migrate(dict(data.get("tracking") or {}))  # report_to as one name or a comma list too
            data["tracking"] = {**tracking, "report_to": [*(tracking.get("report_to") or []), "tensorboard"]}
        return data


@dataclass
class EvalConfig:
    model: str = opt("", "Policy: an HF model dir or hub id.", short="-m")
    dataset: DatasetSpec = opt(factory=lambda: DatasetSpec(split="test"))
    out: str = opt("", "Output dir: samples/, scored/, greedy/, eval.json.", short="-o", check=PATH)
    k: int = opt(16, "Samples per prompt for pass@k and maj@k.", check=AT_LEAST_ONE)
    n: int | None = opt(None, "Samples per prompt when more than k: pass@1 and pass@k (unbiased) use all n, with less variance; "
                              "maj@k votes over the first k. Unset: k.", check=AT_LEAST_ONE)
    greedy: bool = opt(True, "Also decode one greedy completion per prompt.")
    sampling: SamplingConfig = opt(factory=lambda: SamplingConfig(seed=1234))
    engine: EngineConfig = opt(factory=EngineConfig)
    verifier: str = opt("auto", "gsm8k, math, exact, judge, regex:PATTERN, python:mod:fn, data_source, or auto (the dataset preset's; "
                                "under iterate, on the rounds' dataset: the rounds' score verifier, strict and verifier_by_source).", short="-v")
    verifier_by_source: dict[str, str] = opt(factory=lambda: dict(VERIFIER_BY_SOURCE), help=_BY_SOURCE_HELP)
    strict: bool = opt(False, _STRICT_HELP, flag="--strict/--flexible")
    workers: int | None = opt(None, "Verifier worker processes; unset: one per core.", short="-w", check=AT_LEAST_ONE)
    timeout: float = opt(5.0, "Hard limit per check in seconds.", check=POSITIVE)
    shard_size: int = opt(64, "Prompts per shard file (the unit of resume).", check=AT_LEAST_ONE)
    iteration: int = opt(0, "Round number stored in each row and mixed into the seeds.", check=NON_NEGATIVE)
    data_parallel_size: int = opt(1, "Engines (processes) sharing the prompts.", check=AT_LEAST_ONE)
    verifier_model: str | None = opt(None, "A generative verifier (model dir) that scores each of the k samples: best-of-k, weighted maj@k.")
    verifier_mode: Literal["p-yes", "sampled"] = opt(
        "p-yes", "p-yes: P(Yes) at the verdict position; sampled: the share of Yes among --verifier-samples sampled verdicts.")
    verifier_samples: int = opt(4, "Verdicts sampled per candidate (--verifier-mode sampled).", check=AT_LEAST_ONE)
    verifier_max_new_tokens: int = opt(64, "Tokens per sampled verdict.", check=AT_LEAST_ONE)
    verifier_chat_template: bool = opt(False, "Render verification prompts with the verifier's chat template (as it was trained).")
    candidates: str | None = opt(None, "Judge this scored dir's samples with --model itself as the verifier (evaluating a trained verifier).")
    bootstrap_resamples: int = opt(1000, "Resamples of the percentile bootstrap (over prompts) behind every 95% interval.", check=AT_LEAST_ONE)
    bootstrap_seed: int = opt(0, "Seed of the bootstrap resamples.", check=SEED)
    tracking: TrackingConfig = opt(factory=TrackingConfig)

    def check(self) -> None:
        if self.sampling.temperature == 0:
            raise ConfigError("bad value for 'sampling.temperature': 0 — eval samples k completions per prompt; "
                              "use a temperature > 0 (the greedy pass is separate: greedy: true)")
        if self.n is not None and self.n < self.k:
            raise ConfigError(f"eval n {self.n} is below k {self.k}: pass@k and maj@k need k samples per prompt — raise n (or lower k)")
        if self.verifier_model and self.candidates:
            raise ConfigError("verifier_model and candidates both given — verifier_model judges this eval's samples with another model; "
                              "candidates judges other samples with this model: choose one")


# The warm start is supervised training on gold solutions: these keys of the train
# config differ from the rounds' training unless the config says otherwise.
WARM_START_TRAIN = {
    "loss": "sft", "loss_options": {}, "optimizer": "adamw", "lr": 2e-3, "batch_size": 64,
    "schedule": "cosine", "warmup_steps": 10, "epochs": 1.0, "max_steps": None, "kl_coef": 0.0, "ref_model": None, "recompute_behavior": False,
    "group_by_prompt": False, "shared_prefix": False,  # one gold solution per prompt: nothing to share, rows batched as rows
}


@dataclass
class WarmStartConfig:
    """Supervised training on gold solutions before round 0: the pipeline's ``train`` config ← WARM_START_TRAIN ← ``train`` here."""

    enabled: bool = opt(False, "Warm-start with supervised training on the dataset's gold solutions.")
    init_model: bool = opt(False, "Build the built-in tiny model first (then `model` is ignored).")
    model_seed: int = opt(0, "Seed of the built-in model's weights.", check=SEED)
    model_preset: Literal["tiny", "small"] = opt("tiny", "The built-in model's size.")
    examples: int = opt(2000, "Gold solutions to train on.", check=AT_LEAST_ONE)
    train: dict[str, Any] = opt(factory=dict, help="Overrides of the train config for the warm start (any train key).")


@dataclass
class IterateConfig:
    run_dir: str = opt("runs/topr", "Run directory; rerun the same command to resume.", check={**_check(lambda v: bool(v.strip()), "a directory name"), **PATH})
    model: str = opt("", "The starting policy (unless warm_start.init_model builds one).", short="-m")
    rounds: int = opt(3, "Number of rounds.", check=AT_LEAST_ONE)
    train_from: Literal["previous", "base"] = opt("previous", "Each round trains the previous round's policy, or the base policy.")
    replay_rounds: int = opt(0, "Earlier rounds' scored samples mixed into each round's curation.", check=NON_NEGATIVE)
    replay_weight: float = opt(1.0, "Weight of the replayed rounds' rows.", check=NON_NEGATIVE)
    eval_every: int = opt(1, "Evaluate every N rounds (and always the last).", check=AT_LEAST_ONE)
    keep_policies: int | None = opt(None, "Keep the weights of the last N rounds' policies (older ones go once no eval to come needs them; "
                                          "their records stay); unset: keep all.", check=AT_LEAST_ONE)
    warm_start: WarmStartConfig = opt(factory=WarmStartConfig, cli=False)
    generate: GenerateConfig = opt(factory=GenerateConfig, cli=False)
    score: ScoreConfig = opt(factory=ScoreConfig, cli=False)  # auto: the dataset preset's verifier
    curate: CurateConfig = opt(factory=lambda: CurateConfig(unreachable_baseline=0.0), cli=False)
    train: TrainConfig = opt(factory=TrainConfig, cli=False)
    eval: EvalConfig = opt(factory=EvalConfig, cli=False)
    engine_handover: Literal["auto", "release", "keep"] = opt(
        "auto", "Before training the engine gives its memory back (vLLM sleep on GPUs, closed elsewhere); auto: on GPUs or with training in child processes.")
    tracking: TrackingConfig = opt(factory=TrackingConfig)

    @staticmethod
    def migrate(data: dict[str, Any]) -> dict[str, Any]:
        """A run's ``train.tensorboard: true`` (before trackers) reports the whole run to TensorBoard; what each round sets
        itself (``ROUND_SETS``) is dropped (never used: a run recorded with it goes on; `topr iterate` says so of a -c's)."""
        train = data.get("train")
        if isinstance(train, dict) and train.get("tensorboard"):
            data["tracking"] = TrainConfig.migrate({"tensorboard": train.pop("tensorboard"), "tracking": data.get("tracking")})["tracking"]
        for stage, keys in ((s, k) for s, k in ROUND_SETS.items() if isinstance(data.get(s), dict)):
            data[stage] = {k: v for k, v in data[stage].items() if k not in keys}
        return data

    def check(self) -> None:
        # The trainer reads the sampling distribution from the data generate writes; a train
        # setting that contradicts it would be refused at the first round's training.
        for key in ("temperature", "top_p", "top_k", "min_p"):
            want, have = getattr(self.train, key), getattr(self.generate.sampling, key)
            if want is not None and want != have:
                raise ConfigError(f"train.{key} is {want!r} but generate.sampling.{key} is {have!r} — training reads the "
                                  f"sampling settings from the data; drop train.{key} (or make it equal)")
        if LOSSES[self.train.loss].pairwise and self.curate.pairs == "none":
            raise ConfigError(f"train.loss {self.train.loss} trains on preference pairs but curate.pairs is none — "
                              "set curate.pairs=matched (or all)")
        if not LOSSES[self.train.loss].pairwise and self.curate.pairs != "none":  # a DPO config's pairs, carried to a branch
            warnings.warn(f"curate.pairs is {self.curate.pairs} but train.loss {self.train.loss} reads rows one by one: each round "
                          "trains on paired rows only (prompts with no right-and-wrong pair dropped, p = 0.5) — set curate.pairs=none "
                          "unless that is meant", stacklevel=2)
        # Training a verifier: each round's policy judges eval.candidates, rendered as its training prompts were.
        if self.eval.candidates and self.eval.verifier_chat_template != self.generate.dataset.chat_template:
            raise ConfigError(f"eval.verifier_chat_template is {self.eval.verifier_chat_template} but generate.dataset.chat_template is "
                              f"{self.generate.dataset.chat_template} — the verifier judges eval.candidates with the prompts it was trained on; make them equal")
        for key in ("system_prompt", "template") if self.eval.candidates else ():
            if getattr(self.eval.dataset, key) != getattr(self.generate.dataset, key):
                raise ConfigError(f"eval.dataset.{key} differs from generate.dataset.{key} — the verifier judges eval.candidates "
                                  "with the prompts it was trained on; make them equal")
        if self.train.recompute_behavior and (self.replay_rounds or self.train_from != "previous"):  # μ by the policy trained from
            raise ConfigError("train.recompute_behavior recomputes μ with the policy a round trains from, which must be the one that sampled "
                              "all its data — set train_from: previous and replay_rounds: 0, or drop it")
        if (self.generate.num_shards, self.generate.shard_index) != (1, 0):  # iterate generates the whole prompt set
            raise ConfigError("generate.num_shards is set in a pipeline config — a round generates every prompt; spread it over "
                              "processes with generate.data_parallel_size instead")
        for stage in ("train", "eval"):
            if getattr(self, stage).tracking.report_to:
                raise ConfigError(f"{stage}.tracking is set in a pipeline config — tracking is one run per run directory: "
                                  f"move it to the top level (tracking: {{report_to: [...]}})")
        self.warm_start_train()

    def warm_start_train(self) -> TrainConfig:
        """The train config of the warm start: ``train`` ← WARM_START_TRAIN ← ``warm_start.train``."""
        data = {**config_to_dict(self.train), **WARM_START_TRAIN, **self.warm_start.train}
        return from_dict(TrainConfig, data, prefix="warm_start.train.")


# A pipeline's stage keys that each round sets itself (its policy, input, output), and those it refuses: not in `config show`.
ROUND_SETS = {"generate": ("model", "out", "iteration"), "score": ("samples", "out"), "curate": ("scored", "out", "source_weights"),
              "train": ("model", "data", "out", "resume"), "eval": ("model", "out", "iteration")}
PIPELINE_REFUSES = ("generate.shard_index", "generate.num_shards", "train.tracking", "eval.tracking")
STAGES: dict[str, type] = {"generate": GenerateConfig, "score": ScoreConfig, "curate": CurateConfig, "verifier_data": VerifierDataConfig,
                           "train": TrainConfig, "eval": EvalConfig, "iterate": IterateConfig}
