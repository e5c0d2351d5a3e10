"""Training on data made by the real stages: generate → score → curate → train, with the hf
backend and with vLLM (which must also load and serve the trained policy).

μ must be exact: the engine's stored log-probs and the trainer's own log π of
the same (float32) policy agree to ~1e-7 per token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_train_data import write_curated

from toprcli.config import CurateConfig, DatasetSpec, GenerateConfig, ScoreConfig, TrainConfig
from toprcli.curate_stage import curate
from toprcli.generate_stage import generate_samples
from toprcli.scoring import score
from toprcli.training import train_policy

pytestmark = pytest.mark.slow


def _chain(model: Path, tmp: Path, *, backend=None, backend_name: str = "hf") -> Path:
    gcfg = GenerateConfig(
        model=str(model), dataset=DatasetSpec(source="builtin:arith", size=12, level=1), out=str(tmp / "samples"),
        n=4, max_new_tokens=40, backend=backend_name, seed=1,
    )
    generate_samples(gcfg, backend=backend, progress=False)
    score(ScoreConfig(samples=str(tmp / "samples"), out=str(tmp / "scored")), progress=False)
    curate(CurateConfig(scored=[str(tmp / "scored")], out=str(tmp / "train.parquet"), baseline=0.0))
    return tmp / "train.parquet"


def _moved(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def test_generate_score_curate_train(tiny_model_dir, tmp_path):
    data = _chain(tiny_model_dir, tmp_path)
    out = tmp_path / "policy"
    summary = train_policy(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(out), optimizer="adamw", lr=1e-3, batch_size=16), progress=False)
    assert summary["rows"] == 48 and summary["steps"] == 3
    assert summary["behavior_gap_mean"] < 1e-5 and summary["behavior_gap_max"] < 1e-4  # hf sampler μ == trainer π_0
    assert _moved(tiny_model_dir, out) > 1e-4
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 101
    # the data came from this model, so μ may be recomputed; then the first ratio is exactly 1
    re = train_policy(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(tmp_path / "re"), optimizer="adamw", lr=1e-3, batch_size=16, recompute_behavior=True), progress=False)
    assert re["behavior_gap_source"] == "full pass" and re["behavior_gap_mean"] < 1e-5


@pytest.mark.vllm
def test_trained_policy_serves_in_vllm_with_exact_mu(vllm_backend, tiny_model_dir, tmp_path):
    policy = tmp_path / "policy"
    synthetic = write_curated(tmp_path / "synthetic.parquet", n=32, policy=str(tiny_model_dir))
    train_policy(TrainConfig(model=str(tiny_model_dir), data=str(synthetic), out=str(policy), optimizer="adamw", lr=1e-2, batch_size=16, max_steps=3), progress=False)
    # vLLM loads the trained policy (the session engine swaps its weights in) and samples from it
    data = _chain(policy, tmp_path / "round", backend=vllm_backend, backend_name="vllm")
    meta = json.loads((tmp_path / "round" / "samples" / "_manifest.json").read_text())
    assert meta["stage"] == "generate"
    out = tmp_path / "next"
    summary = train_policy(TrainConfig(model=str(policy), data=str(data), out=str(out), optimizer="adamw", lr=1e-3, batch_size=16), progress=False)
    assert summary["behavior_gap_mean"] < 1e-5 and summary["behavior_gap_max"] < 1e-4  # vLLM μ == trainer π_0
    assert _moved(policy, out) > 1e-5
