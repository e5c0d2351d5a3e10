"""The generation backend protocol and the types every backend shares.

A backend turns token ids into sampled token ids, ``n`` per prompt, and returns
for every sampled token its log-probability under the distribution actually
sampled from (after temperature, min-p, top-k, top-p): the behaviour log-probs μ
that the off-policy losses need (docs/architecture.md §5). Two implementations:
:mod:`toprcli.generation.vllm_backend` (the engine) and
:mod:`toprcli.generation.hf_backend` (a transformers model's forward passes, sampled
through :mod:`toprcli.sampling`; never ``generate``). Reads and
writes no files.

Token accounting, the same in both backends: ``Completion.token_ids`` holds
exactly the sampled tokens, including a final EOS when the model stopped (the
policy must learn to emit it, so the trainer needs it with its log-prob), and
``len(token_ids) == len(logprobs)``. ``finish_reason`` is ``stop`` when the
last token is an EOS, else ``length`` (``max_new_tokens`` or the model's
context reached).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from toprcli.sampling import Processing

# Seeds handed to engines stay below 2**31 (some samplers draw int32 seeds), with
# room for the +i vLLM adds for the i-th of n samples of one request.
_SEED_SPACE = 2**31 - 2**16


def derive_seed(*parts: object) -> int:
    """A stable seed from any parts, e.g. ``derive_seed(seed, iteration, prompt_id)``.

    SHA-256 of the parts' text, so it is the same on every machine and Python
    version (unlike ``hash``), and independent of dataset order or sharding.
    """
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % _SEED_SPACE


@dataclass(frozen=True)
class SamplingParams:
    """What to sample: ``n`` completions per prompt from the processed distribution
    (:mod:`toprcli.sampling`). ``temperature == 0`` means greedy; ``top_k == -1`` and
    ``min_p == 0`` mean off."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        # A user's values were checked at config load; this is the sampling math's own guard (a public API).
        self.processing()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def processing(self) -> Processing:
        return Processing(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


@dataclass(frozen=True)
class PromptRequest:
    """One prompt: token ids in (never re-tokenised), an optional per-request seed.

    With a ``seed`` the vLLM backend samples this prompt from its own random
    stream (sample i uses ``seed + i``), so the result does not depend on what
    else is in the batch. ``key`` is free text for logs (the prompt id).
    """

    prompt_token_ids: list[int]
    seed: int | None = None
    key: str = ""


@dataclass
class Completion:
    """One sampled completion of one prompt."""

    token_ids: list[int]
    logprobs: list[float]  # log μ(token_t | prefix), one per token id
    finish_reason: str  # "stop" | "length"

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise AssertionError(
                f"backend bug: {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs"
            )


@dataclass
class ProgressEvent:
    """Incremental progress inside one ``generate`` call (cumulative within the call)."""

    prompts_done: int = 0
    completions_done: int = 0
    tokens_done: int | None = None  # None when the backend cannot tell mid-call


ProgressFn = Callable[[ProgressEvent], None]


@runtime_checkable
class GenerationBackend(Protocol):
    """What the generate stage, eval and the iterate loop need from an engine.

    One backend object holds one loaded model (one engine per process). It is
    reused across calls with different prompts and sampling parameters, and
    across rounds through :meth:`load_weights`.
    """

    name: str  # "vllm" | "hf"
    model: str  # the model dir or hub id whose weights are loaded now
    max_model_len: int  # context length: prompt + completion tokens
    engine_version: str
    eos_token_ids: frozenset[int]
    info: dict  # resolved engine settings (dtype, device, memory, ...) for manifests

    def generate(
        self,
        requests: list[PromptRequest],
        params: SamplingParams,
        *,
        progress: ProgressFn | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions for each request, in request order."""
        ...

    def continuation_logprobs(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[float]:
        """log P(continuation | prompt) of each pair: the sum of its tokens' log-probs under the
        model's own distribution (temperature 1, no truncation). Scores a verifier's verdicts."""
        ...

    def reseed(self, seed: int) -> None:
        """Reset the sampler's global random state (requests without their own seed)."""
        ...

    def load_weights(self, model_dir: str) -> dict:
        """Serve ``model_dir``'s weights from now on; returns {"mode": "inplace"|"restart", "seconds": s}."""
        ...

    def close(self) -> None:
        """Free the engine (processes, memory). Idempotent."""
        ...


@dataclass
class BackendOptions:
    """Engine settings shared by both backends (resolved from GenerateConfig)."""

    model: str
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int | None = None
    seed: int = 0
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None  # vLLM: None = eager on CPU, compiled on GPU
    batch_size: int = 64  # hf: prompts per generate call
    sleep_mode: bool = False  # vLLM on GPUs: able to sleep (give its memory back) between uses
    extra: dict = field(default_factory=dict)  # passed to vllm.LLM(...) as is


def resolve_dtype(dtype: str, on_gpu: bool) -> str:
    """``auto`` → float32 on CPU (exact μ; bf16 matmuls on CPU are slow anyway), bfloat16 on GPU, float16 on a GPU
    without bfloat16 (before Ampere: T4, V100), where vLLM refuses bfloat16 as its own ``auto`` would not pick it."""
    if dtype != "auto":
        return dtype
    if not on_gpu:
        return "float32"
    import torch

    return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"


def release_cuda_cache() -> None:
    """Give the GPU memory torch's caching allocator keeps for this process back to the device: another process
    (a vLLM engine waking or starting) cannot use what this one has reserved."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch always imports here
        return False
