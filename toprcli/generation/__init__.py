"""Generation backends behind one protocol: vLLM (the engine) and transformers (``hf``).

``open_backend(engine, model)`` opens the backend an
:class:`~toprcli.config.EngineConfig` asks for; ``backend="auto"`` picks vLLM
when it imports, else hf. Reads the model; writes no files.
"""

from __future__ import annotations

from typing import Any

from toprcli.errors import UserError
from toprcli.generation.base import (
    BackendOptions,
    Completion,
    GenerationBackend,
    ProgressEvent,
    PromptRequest,
    SamplingParams,
    derive_seed,
)

BACKENDS = ("auto", "vllm", "hf")

__all__ = [
    "BACKENDS",
    "BackendOptions",
    "Completion",
    "GenerationBackend",
    "ProgressEvent",
    "PromptRequest",
    "SamplingParams",
    "derive_seed",
    "open_backend",
    "resolve_backend_name",
    "backend_options",
]


def resolve_backend_name(name: str) -> str:
    """``auto`` → ``vllm`` when vLLM imports, else ``hf``; unknown names are a UserError."""
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r} — choose one of: {', '.join(BACKENDS)}")
    if name == "auto":
        from toprcli.generation.vllm_backend import vllm_available

        return "vllm" if vllm_available() else "hf"
    return name


def backend_options(engine: Any, model: str, seed: int = 0, sleep_mode: bool = False) -> BackendOptions:
    """Backend settings from an :class:`~toprcli.config.EngineConfig` (or an object with its fields)."""
    return BackendOptions(
        model=str(model),
        dtype=engine.dtype or "auto",
        max_model_len=engine.max_model_len,
        seed=int(seed),
        tensor_parallel_size=int(engine.tensor_parallel_size),
        gpu_memory_utilization=engine.gpu_memory_utilization,
        enforce_eager=engine.enforce_eager,
        batch_size=int(engine.batch_size),
        sleep_mode=sleep_mode,
        extra=dict(engine.engine_kwargs or {}),
    )


def open_backend(engine: Any, model: str, *, seed: int = 0, sleep_mode: bool = False) -> GenerationBackend:
    """Open the backend ``engine.backend`` names on ``model``; the caller closes it.

    ``engine`` is an :class:`~toprcli.config.EngineConfig`. ``seed`` seeds the
    engine's global sampler (requests normally carry their own seeds).
    ``sleep_mode``: a vLLM engine on GPUs that can :meth:`sleep` between uses.
    """
    from toprcli.generation.model_info import check_model

    name = resolve_backend_name(engine.backend or "auto")
    opts = backend_options(engine, model, seed, sleep_mode)
    check_model(opts.model)
    if name == "vllm":
        from toprcli.generation.vllm_backend import VLLMBackend

        return VLLMBackend(opts)
    from toprcli.generation.hf_backend import HFBackend

    return HFBackend(opts)
