"""The config dataclasses: one per stage, the shared sampling and engine parts, the pipeline.

Defaults follow the paper (docs/architecture.md §4). Choice lists come from their
registries (losses, aggregations, KL estimators, optimizers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from toprcli.config.fields import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT_HALF_OPEN,
    UNIT_OPEN,
    ConfigError,
    _check,
    _from_dict,
    choice,
    config_to_dict,
)
from toprcli.losses import AGGREGATIONS, KL_ESTIMATORS, LOSSES
from toprcli.training.optim import OPTIMIZERS

# -- datasets -----------------------------------------------------------------


@dataclass
class DatasetSpec:
    """Where prompts come from and how they are rendered.

    ``source`` is a hub id (``openai/gsm8k``), a local ``.jsonl``/``.json``/
    ``.parquet``/``.csv`` file, or ``builtin:arith``. ``preset`` picks the
    column mapping, gold-answer rule and instruction (``gsm8k``, ``math``,
    ``arith``, ``verification`` — what ``topr verifier-data`` writes); ``auto``
    infers it from the source.
    """

    source: str = "builtin:arith"
    config_name: str | None = None
    split: str = "train"
    preset: Literal["auto", "gsm8k", "math", "arith", "verification", "none"] = "auto"
    question_column: str | None = None
    answer_column: str | None = None
    id_column: str | None = None
    template: str | None = None
    chat_template: bool = False
    system_prompt: str | None = None
    limit: int | None = field(default=None, metadata=AT_LEAST_ONE)
    # builtin:arith only
    size: int = field(default=2000, metadata=AT_LEAST_ONE)
    level: int = field(default=2, metadata=_check(lambda v: 1 <= v <= 4, "an integer 1..4"))
    seed: int = 0


# -- shared parts ---------------------------------------------------------------


@dataclass
class SamplingConfig:
    """What to sample: the distribution μ is drawn from (docs/architecture.md §5).

    Declared once and shared by ``generate`` and ``eval``. Every samples shard
    records it; ``score`` and ``curate`` carry it on; ``train`` reads it from the
    data and computes log π under the same processing (logits / temperature,
    then min-p, top-k, top-p, renormalised). ``temperature: 0`` is greedy.
    """

    temperature: float = field(default=1.0, metadata=_check(lambda v: v >= 0, "a number >= 0 (0 = greedy)"))
    top_p: float = field(default=1.0, metadata=UNIT_HALF_OPEN)
    top_k: int = field(default=-1, metadata=_check(lambda v: v == -1 or v >= 1, "-1 (off) or an integer >= 1"))
    min_p: float = field(default=0.0, metadata=_check(lambda v: 0 <= v < 1, "a number in [0, 1) (0 = off)"))
    max_new_tokens: int = field(default=512, metadata=AT_LEAST_ONE)
    # Base seed: every prompt samples from its own stream seeded by (seed, iteration, prompt id).
    seed: int = 0


@dataclass
class EngineConfig:
    """The generation engine: which backend, and how it holds the model. Shared by generate and eval."""

    backend: Literal["auto", "vllm", "hf"] = "auto"  # auto: vLLM when it imports, else hf
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: float32 on CPU, bfloat16 on GPU
    tensor_parallel_size: int = field(default=1, metadata=AT_LEAST_ONE)
    # vLLM: share of device memory (of RAM on CPU) for weights + KV cache; None = 0.9 on GPU, 0.2 on CPU.
    gpu_memory_utilization: float | None = field(default=None, metadata=UNIT_HALF_OPEN)
    max_model_len: int | None = field(default=None, metadata=AT_LEAST_ONE)  # None = the model's context
    enforce_eager: bool | None = None  # vLLM: None = eager on CPU (fast start), compiled on GPU
    batch_size: int = field(default=64, metadata=AT_LEAST_ONE)  # prompts per engine call (hf backend)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # extra vllm.LLM(...) arguments


# -- stages -------------------------------------------------------------------


@dataclass
class GenerateConfig:
    model: str = ""
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    out: str = ""
    n: int = field(default=16, metadata=AT_LEAST_ONE)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    limit: int | None = field(default=None, metadata=AT_LEAST_ONE)
    shard_size: int = field(default=64, metadata=AT_LEAST_ONE)
    shard_index: int = field(default=0, metadata=NON_NEGATIVE)
    num_shards: int = field(default=1, metadata=AT_LEAST_ONE)
    skip_long: bool = False
    # max_new_tokens beyond what the context leaves for a prompt: refused, unless clipped on request
    # (then recorded in the manifest and the summary).
    clip_to_context: bool = False
    iteration: int = field(default=0, metadata=NON_NEGATIVE)
    # One seed per (seed, iteration, prompt_id) for every request (vLLM; results then do not
    # depend on batching or sharding). Off: the sampler RNG is reseeded per shard only.
    per_request_seed: bool = True
    # Processes (one engine each, on their own GPUs) splitting the prompts into disjoint shard
    # ranges of the same --out; the rows do not depend on it.
    data_parallel_size: int = field(default=1, metadata=AT_LEAST_ONE)


@dataclass
class ScoreConfig:
    samples: str = ""
    out: str = ""
    verifier: str = "gsm8k"
    strict: bool = False
    workers: int | None = field(default=None, metadata=AT_LEAST_ONE)
    timeout: float = field(default=5.0, metadata=POSITIVE)
    reward_correct: float = 1.0
    reward_incorrect: float = -1.0
    reward_no_answer: float = -1.0
    worker_memory_mb: int = field(default=4096, metadata=NON_NEGATIVE)  # address-space cap per verifier worker; 0 = none
    overwrite: bool = False  # replace an --out scored from other inputs or settings


@dataclass
class CurateConfig:
    scored: list[str] = field(default_factory=list)
    out: str = ""
    # A number (constant c), "batch-mean" (c = the mean reward of all scored samples), "group-mean"
    # or "leave-one-out"; None = constant 0 (A = R).
    # Exclusive with positive_fraction (which solves the constant c from the data).
    baseline: float | str | None = None
    positive_fraction: float | None = field(default=None, metadata=UNIT_OPEN)
    source_weights: list[float] | None = None
    drop_uniform_prompts: bool = False
    drop_truncated: bool = False
    dedupe: bool = False
    max_per_prompt: int | None = field(default=None, metadata=AT_LEAST_ONE)
    first_positive: bool = False
    subsample: int | None = field(default=None, metadata=AT_LEAST_ONE)
    seed: int = 0
    overwrite: bool = False  # replace an existing --out made from other inputs or settings
    # With positive_fraction: the constant baseline to use when the data has one outcome only
    # (P unreachable). None = fail. `topr iterate` sets it so one lopsided round cannot stop a run.
    unreachable_baseline: float | None = None
    # Keep only prompts whose accuracy (share of `correct` among all their scored samples) lies
    # strictly between low and high, e.g. [0.1, 0.95] (ROLL's difficulty_mask). [0, 1] keeps mixed prompts.
    keep_accuracy: list[float] | None = field(
        default=None,
        metadata=_check(lambda v: len(v) == 2 and 0 <= v[0] < v[1] <= 1, "[low, high] with 0 <= low < high <= 1"),
    )
    # Divide A by the reward standard deviation over all scored samples ("batch") or over the
    # prompt's samples ("group"), as ROLL's norm_std_type: A = (R − c) / (std + 1e-6).
    std_normalize: Literal["batch", "group"] | None = None
    # Clip A (after std_normalize) to [−x, x] (ROLL's reward_clip, which clips the normalised reward).
    reward_clip: float | None = field(default=None, metadata=POSITIVE)


@dataclass
class VerifierDataConfig:
    """``topr verifier-data``: scored completions → a verification dataset (question + candidate → Yes/No)."""

    scored: list[str] = field(default_factory=list)
    out: str = ""
    # Equal numbers of correct and incorrect candidates (the larger class is subsampled, seeded).
    balance: bool = False
    max_per_question: int | None = field(default=None, metadata=AT_LEAST_ONE)  # candidates per question, seeded choice
    dedupe: bool = True  # one row per distinct (question, candidate text)
    seed: int = 0
    overwrite: bool = False


@dataclass
class TrainConfig:
    model: str = ""
    data: str = ""
    out: str = ""
    loss: str = field(default="topr", metadata=choice(LOSSES, "a registered loss:"))
    loss_options: dict[str, Any] = field(default_factory=dict)
    aggregation: str = field(default="seq-mean-token-mean", metadata=choice(AGGREGATIONS))
    optimizer: str = field(default="adafactor", metadata=choice(OPTIMIZERS))
    lr: float = field(default=5e-7, metadata=POSITIVE)
    weight_decay: float = field(default=0.0, metadata=NON_NEGATIVE)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = field(default=0, metadata=NON_NEGATIVE)
    grad_clip: float | None = field(default=1.0, metadata=POSITIVE)
    epochs: float = field(default=1.0, metadata=POSITIVE)
    max_steps: int | None = field(default=None, metadata=AT_LEAST_ONE)
    batch_size: int = field(default=64, metadata=AT_LEAST_ONE)  # sequences per optimizer step
    micro_batch_tokens: int = field(default=8192, metadata=AT_LEAST_ONE)  # token budget per forward
    # The sampling distribution comes from the data (its `sampling` metadata): log π is computed
    # under the same processing as μ. These are optional checks; a value that contradicts the
    # data is refused. Only for data without sampling metadata do they set the processing.
    temperature: float | None = field(default=None, metadata=POSITIVE)
    top_p: float | None = field(default=None, metadata=UNIT_HALF_OPEN)
    top_k: int | None = field(default=None, metadata=_check(lambda v: v == -1 or v >= 1, "-1 (off) or an integer >= 1"))
    min_p: float | None = field(default=None, metadata=_check(lambda v: 0 <= v < 1, "a number in [0, 1) (0 = off)"))
    seed: int = 0
    # auto: float32 on CPU, bf16 compute with float32 master weights on GPU. bfloat16: bf16 compute
    # (autocast) with float32 master weights, gradients and optimizer arithmetic. bfloat16-pure:
    # bf16 weights and updates (half the memory; small updates are rounded away — a warning says so).
    dtype: Literal["auto", "float32", "bfloat16", "bfloat16-pure"] = "auto"
    save_dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # dtype of the saved policy's weights
    # auto: on when one micro-batch's activations would take more than 1/8 of the device's memory.
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    # Completion positions per chunk of the LM-head projection; None = as many as keep one chunk's
    # float32 logits near 128 MiB (log-probs never hold a tokens × vocabulary tensor).
    logprob_chunk_size: int | None = field(default=None, metadata=AT_LEAST_ONE)
    save_every: int | None = field(default=None, metadata=AT_LEAST_ONE)
    resume: bool = False
    recompute_behavior: bool = False
    lora_rank: int = field(default=0, metadata=NON_NEGATIVE)
    lora_alpha: float = field(default=16.0, metadata=POSITIVE)
    lora_dropout: float = field(default=0.0, metadata=NON_NEGATIVE)
    lora_target_modules: list[str] | None = None
    ref_model: str | None = None
    kl_coef: float = field(default=0.0, metadata=NON_NEGATIVE)
    kl_estimator: str = field(default="k3", metadata=choice(KL_ESTIMATORS))
    entropy_coef: float = 0.0
    whiten_advantages: bool = False
    adv_clip: float | None = field(default=None, metadata=POSITIVE)
    log_every: int = field(default=1, metadata=AT_LEAST_ONE)
    tensorboard: bool = False
    # N of seq-mean-token-sum-norm; None = the longest completion in the data (a constant per run).
    norm_length: int | None = field(default=None, metadata=AT_LEAST_ONE)
    threads: int | None = field(default=None, metadata=AT_LEAST_ONE)  # torch CPU threads; None = torch's default
    overwrite: bool = False  # replace an existing complete --out
    # Ranks on this node: > 1 runs training under `torchrun --nproc-per-node N` in a child process.
    nproc_per_node: int = field(default=1, metadata=AT_LEAST_ONE)
    # A command template for other launchers (multi-node), with {config}, {nproc_per_node}, {python}, e.g.
    # "srun torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 -m toprcli train --config {config}"
    launcher: str | None = None


@dataclass
class EvalConfig:
    model: str = ""
    dataset: DatasetSpec = field(default_factory=lambda: DatasetSpec(split="test"))
    out: str = ""
    k: int = field(default=16, metadata=AT_LEAST_ONE)
    greedy: bool = True  # also decode one greedy completion per prompt
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(seed=1234))
    engine: EngineConfig = field(default_factory=EngineConfig)
    verifier: str = "auto"  # "auto": the dataset preset's verifier (gsm8k for GSM8K/arith, math for MATH)
    workers: int | None = field(default=None, metadata=AT_LEAST_ONE)
    timeout: float = field(default=5.0, metadata=POSITIVE)
    shard_size: int = field(default=64, metadata=AT_LEAST_ONE)
    iteration: int = field(default=0, metadata=NON_NEGATIVE)
    data_parallel_size: int = field(default=1, metadata=AT_LEAST_ONE)  # engines (processes) sharing the prompts
    # A generative verifier (trained on `topr verifier-data` with the `judge` verifier) scores each of the
    # k samples: best-of-k and verifier-weighted maj@k, and its accuracy, invalid-verdict rate and AUC.
    verifier_model: str | None = None
    # p-yes: P(Yes) / (P(Yes) + P(No)) at the verdict position (direct verifiers); sampled: the share of Yes
    # among `verifier_samples` sampled verdicts (verifiers that write a rationale first).
    verifier_mode: Literal["p-yes", "sampled"] = "p-yes"
    verifier_samples: int = field(default=4, metadata=AT_LEAST_ONE)
    verifier_max_new_tokens: int = field(default=64, metadata=AT_LEAST_ONE)  # sampled mode: tokens per verdict
    # Render verification prompts with the verifier's chat template (as its training data was rendered).
    verifier_chat_template: bool = False
    # A scored dir of another policy's samples whose candidates `model` itself judges, as a verifier: what
    # `topr iterate` evaluates each round when the policy it trains is a verifier (exclusive with verifier_model).
    candidates: str | None = None

    def check(self) -> None:
        if self.sampling.temperature == 0:
            raise ConfigError(
                "bad value for 'sampling.temperature': 0 — eval samples k completions per prompt; "
                "use a temperature > 0 (the greedy pass is separate: greedy: true)"
            )
        if self.verifier_model and self.candidates:
            raise ConfigError(
                "verifier_model and candidates both given — verifier_model judges this eval's samples with another model; "
                "candidates judges other samples with this model: choose one"
            )


# The warm start is supervised training on gold solutions: these keys of the train
# config differ from the rounds' training unless the config says otherwise.
WARM_START_TRAIN = {
    "loss": "sft", "loss_options": {}, "optimizer": "adamw", "lr": 2e-3, "batch_size": 64,
    "schedule": "cosine", "warmup_steps": 10, "epochs": 1.0, "max_steps": None, "kl_coef": 0.0, "ref_model": None,
}


@dataclass
class WarmStartConfig:
    """Supervised training on gold solutions before round 0.

    Trains with the pipeline's ``train`` config, overridden first by
    :data:`WARM_START_TRAIN` and then by ``train`` here (any train key).
    """

    enabled: bool = False
    init_model: bool = False  # build the built-in tiny model first (then `model` is ignored)
    model_seed: int = 0
    model_preset: Literal["tiny", "small"] = "tiny"
    examples: int = field(default=2000, metadata=AT_LEAST_ONE)
    train: dict[str, Any] = field(default_factory=dict)  # overrides of the train config


@dataclass
class IterateConfig:
    run_dir: str = "runs/topr"
    model: str = ""
    rounds: int = field(default=3, metadata=AT_LEAST_ONE)
    train_from: Literal["previous", "base"] = "previous"
    replay_rounds: int = field(default=0, metadata=NON_NEGATIVE)  # earlier rounds mixed into curation
    replay_weight: float = field(default=1.0, metadata=NON_NEGATIVE)
    eval_every: int = field(default=1, metadata=AT_LEAST_ONE)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    curate: CurateConfig = field(default_factory=lambda: CurateConfig(unreachable_baseline=0.0))
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Before training, the generation engine gives its memory back (vLLM sleep mode on GPUs, closed
    # elsewhere) and takes it again afterwards. auto: on GPUs, or when training runs in child processes.
    engine_handover: Literal["auto", "release", "keep"] = "auto"

    def check(self) -> None:
        # The trainer reads the sampling distribution from the data generate writes; a train
        # setting that contradicts it would be refused at the first round's training.
        for key in ("temperature", "top_p", "top_k", "min_p"):
            want, have = getattr(self.train, key), getattr(self.generate.sampling, key)
            if want is not None and want != have:
                raise ConfigError(
                    f"train.{key} is {want!r} but generate.sampling.{key} is {have!r} — training reads the "
                    f"sampling settings from the data; drop train.{key} (or make it equal)"
                )
        # Training a verifier: each round's policy judges eval.candidates, rendered as its training prompts were.
        if self.eval.candidates and self.eval.verifier_chat_template != self.generate.dataset.chat_template:
            raise ConfigError(
                f"eval.verifier_chat_template is {self.eval.verifier_chat_template} but generate.dataset.chat_template is "
                f"{self.generate.dataset.chat_template} — the verifier judges eval.candidates with the prompts it was trained on; make them equal"
            )
        self.warm_start_train()

    def warm_start_train(self) -> TrainConfig:
        """The train config of the warm start: ``train`` ← WARM_START_TRAIN ← ``warm_start.train``."""
        data = config_to_dict(self.train)
        data.update(WARM_START_TRAIN)
        data.update({k: v for k, v in self.warm_start.train.items()})
        return _from_dict(TrainConfig, data, prefix="warm_start.train.")


STAGES: dict[str, type] = {
    "generate": GenerateConfig,
    "score": ScoreConfig,
    "curate": CurateConfig,
    "verifier_data": VerifierDataConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "iterate": IterateConfig,
}
