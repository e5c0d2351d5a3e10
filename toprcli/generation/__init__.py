"""Generation backends behind one protocol: vLLM (the engine) and transformers (``hf``).

``open_backend(cfg)`` opens the backend a :class:`~toprcli.config.GenerateConfig`
(or anything with the same attributes) asks for; ``backend="auto"`` picks vLLM
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


def backend_options(cfg: Any, model: str | None = None) -> BackendOptions:
    """Engine settings from a GenerateConfig-like object (missing attributes take defaults)."""
    g = lambda key, default=None: getattr(cfg, key, default)  # noqa: E731
    return BackendOptions(
        model=str(model or g("model")),
        dtype=g("dtype", "auto") or "auto",
        max_model_len=g("max_model_len"),
        seed=int(g("seed", 0) or 0),
        tensor_parallel_size=int(g("tensor_parallel_size", 1) or 1),
        gpu_memory_utilization=g("gpu_memory_utilization"),
        enforce_eager=g("enforce_eager"),
        batch_size=int(g("batch_size", 64) or 64),
        extra=dict(g("engine_kwargs", None) or {}),
    )


def open_backend(cfg: Any, *, model: str | None = None) -> GenerationBackend:
    """Open the backend ``cfg.backend`` names on ``model`` (default ``cfg.model``).

    ``cfg`` is a GenerateConfig, an EvalConfig, or any object with ``backend``,
    ``model`` and optionally ``dtype``, ``max_model_len``, ``seed``,
    ``tensor_parallel_size``, ``gpu_memory_utilization``, ``enforce_eager``,
    ``batch_size``. The caller closes it (``backend.close()`` or ``with``).
    """
    from toprcli.generate_stage import check_model

    name = resolve_backend_name(getattr(cfg, "backend", "auto") or "auto")
    opts = backend_options(cfg, model)
    check_model(opts.model)
    if name == "vllm":
        from toprcli.generation.vllm_backend import VLLMBackend

        return VLLMBackend(opts)
    from toprcli.generation.hf_backend import HFBackend

    return HFBackend(opts)
