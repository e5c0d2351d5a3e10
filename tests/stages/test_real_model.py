"""The real pretrained model tier: SmolLM2-135M-Instruct (BPE tokenizer, chat template, a
generation_config.json with instruct-style sampling defaults) through every stage.

Every generation here runs on the copy whose generation_config.json sets do_sample,
temperature 0.7, top_p 0.8, top_k 20 and repetition_penalty 1.05: the stored μ must
still be the distribution the command asked for, on both backends. One vLLM engine
serves the session (tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from conftest import GSM8K_DIR, gen_config

from toprcli.config import CurateConfig, DatasetSpec, ScoreConfig, TrainConfig
from toprcli.stages.curate import run as curate
from toprcli.stages.generate import run as generate_samples
from toprcli.sampling import Processing
from toprcli.stages.score import run as score
from toprcli.shards import read_file_metadata, read_table
from toprcli.stages.train import run as train_policy

pytestmark = pytest.mark.real_model

# (temperature, top_k, top_p, min_p): each processing alone, and combined.
SETTINGS = [(1.0, -1, 1.0, 0.0), (0.7, -1, 1.0, 0.0), (1.0, 20, 1.0, 0.0), (1.0, -1, 0.9, 0.0), (1.0, -1, 1.0, 0.05), (0.7, 20, 0.9, 0.05)]
IDS = ["T1", "T0.7", "topk20", "topp0.9", "minp0.05", "combined"]
EOS = 2  # <|im_end|>


def gsm8k(limit: int) -> DatasetSpec:
    return DatasetSpec(source=str(GSM8K_DIR / "test.jsonl"), split="test", chat_template=True, limit=limit)


def sample(backend, model: Path, out: Path, setting: tuple, *, n: int = 2, limit: int = 3, max_new: int = 32) -> pa.Table:
    t, k, p, m = setting
    cfg = gen_config(model=str(model), dataset=gsm8k(limit), out=str(out), n=n, shard_size=limit, backend=backend.name,
                     temperature=t, top_k=k, top_p=p, min_p=m, max_new_tokens=max_new, seed=3)
    generate_samples(cfg, backend=backend)
    return read_table(out)


@pytest.fixture(scope="module")
def smollm2_lm(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_sampling_defaults_dir):
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend

    backend = HFBackend(BackendOptions(model=str(smollm2_sampling_defaults_dir), dtype="float32", batch_size=8))
    yield backend
    backend.close()


def check_rows(table: pa.Table) -> None:
    """Token accounting on a real tokenizer: stopped completions end in the model's EOS, with its log-prob."""
    rows = table.to_pylist()
    assert rows
    assert rows[0]["prompt"].startswith("<|im_start|>system") and rows[0]["prompt"].endswith("<|im_start|>assistant\n")
    for r in rows:
        assert len(r["completion_token_ids"]) == len(r["behavior_logprobs"]) >= 1
        assert all(np.isfinite(r["behavior_logprobs"])) and max(r["behavior_logprobs"]) <= 1e-6
        if r["finish_reason"] == "stop":
            assert r["completion_token_ids"][-1] == EOS and EOS not in r["completion_token_ids"][:-1]
        else:
            assert EOS not in r["completion_token_ids"]


def step_zero_gap(lm, table: pa.Table) -> tuple[float, float]:
    """Mean and max |log π − log μ| per token: the trainer's own log π (chunked head, the data's
    processing read from the samples' metadata) of the policy that sampled, on the stored tokens."""
    from toprcli.training.batching import TokenData, collate
    from toprcli.training.model import PolicyLogprobs

    n = table.num_rows
    table = table.append_column("advantage", pa.array(np.ones(n, dtype=np.float32))).append_column("weight", pa.array(np.ones(n, dtype=np.float32)))
    data = TokenData.from_table(table)
    mb = collate(data, np.arange(n))
    processing = Processing.from_mapping(table.schema.metadata and json.loads(table.schema.metadata[b"toprcli"])["sampling"])
    with torch.no_grad():
        lp, _ = PolicyLogprobs(lm, processing, chunk_size=97)(mb.input_ids, mb.prompt_lens, mb.completion_lens)
    gap = (lp - mb.behavior).abs()[mb.mask > 0]
    return float(gap.mean()), float(gap.max())


@pytest.mark.vllm
@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_vllm_mu_is_the_trainers_pi_at_step_zero(smollm2_vllm, smollm2_sampling_defaults_dir, smollm2_lm, tmp_path, setting):
    table = sample(smollm2_vllm, smollm2_sampling_defaults_dir, tmp_path / "s", setting)
    check_rows(table)
    mean, worst = step_zero_gap(smollm2_lm, table)
    assert mean <= 1e-4 and worst <= 2e-3, (mean, worst)


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_hf_mu_is_the_trainers_pi_at_step_zero(smollm2_hf, smollm2_sampling_defaults_dir, smollm2_lm, tmp_path, setting):
    table = sample(smollm2_hf, smollm2_sampling_defaults_dir, tmp_path / "s", setting)
    check_rows(table)
    mean, worst = step_zero_gap(smollm2_lm, table)
    assert mean <= 1e-4 and worst <= 2e-3, (mean, worst)


def test_sampling_defaults_in_the_checkpoint_never_reach_the_manifest(smollm2_hf, smollm2_sampling_defaults_dir, tmp_path):
    sample(smollm2_hf, smollm2_sampling_defaults_dir, tmp_path / "s", SETTINGS[0], limit=1, max_new=4)
    recorded = read_file_metadata(next((tmp_path / "s").glob("shard-*.parquet")))["sampling"]
    assert (recorded["temperature"], recorded["top_p"], recorded["top_k"], recorded["min_p"]) == (1.0, 1.0, -1, 0.0)


def _chain(backend, model: Path, tmp: Path) -> Path:
    """generate (T 0.7, top-k 20, top-p 0.9) → score → curate, on GSM8K test prompts with the chat template."""
    sample(backend, model, tmp / "samples", (0.7, 20, 0.9, 0.0), n=4, limit=4, max_new=48)
    score(ScoreConfig(samples=str(tmp / "samples"), out=str(tmp / "scored"), verifier="gsm8k"))
    curate(CurateConfig(scored=[str(tmp / "scored")], out=str(tmp / "train.parquet"), baseline=0.0))
    return tmp / "train.parquet"


def _train(model: Path, data: Path, out: Path) -> dict:
    return train_policy(TrainConfig(model=str(model), data=str(data), out=str(out), optimizer="adamw", lr=1e-4,
                                    batch_size=16, max_steps=1, micro_batch_tokens=4096))


@pytest.mark.vllm
def test_vllm_samples_train_and_the_policy_serves_again(smollm2_vllm, smollm2_sampling_defaults_dir, tmp_path):
    """score → curate → train on real samples (μ gap ≤ 1e-4 at step 0); the trained policy loads in
    transformers and in vLLM (in place) and generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toprcli.generation import PromptRequest, SamplingParams

    data = _chain(smollm2_vllm, smollm2_sampling_defaults_dir, tmp_path)
    summary = _train(smollm2_sampling_defaults_dir, data, tmp_path / "policy")
    assert summary["sampling"] == {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.0, "source": "data"}
    assert summary["behavior_gap_mean"] <= 1e-4, summary

    policy = tmp_path / "policy"
    tok = AutoTokenizer.from_pretrained(policy)
    lm = AutoModelForCausalLM.from_pretrained(policy)
    assert next(lm.parameters()).dtype == torch.float32 and tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    assert lm.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4

    before = smollm2_vllm.weight_checksum()
    try:
        assert smollm2_vllm.load_weights(str(policy))["mode"] == "inplace"
        assert smollm2_vllm.weight_checksum() != before
        out = smollm2_vllm.generate([PromptRequest(ids[0].tolist(), seed=1)], SamplingParams(n=1, max_new_tokens=8))
        assert len(out[0][0].token_ids) >= 1
    finally:
        smollm2_vllm.load_weights(str(smollm2_sampling_defaults_dir))


def test_hf_samples_train_with_an_exact_mu(smollm2_hf, smollm2_sampling_defaults_dir, tmp_path):
    data = _chain(smollm2_hf, smollm2_sampling_defaults_dir, tmp_path)
    summary = _train(smollm2_sampling_defaults_dir, data, tmp_path / "policy")
    assert summary["behavior_gap_mean"] <= 1e-4, summary
