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
from builders import write_curated

from conftest import gen_config
from toprcli.config import CurateConfig, DatasetSpec, ScoreConfig, TrainConfig
from toprcli.stages.curate import run as curate
from toprcli.stages.generate import run as generate_samples
from toprcli.stages.score import run as score
from toprcli.stages.train import run as train_policy

pytestmark = pytest.mark.slow


def _chain(model: Path, tmp: Path, *, backend=None, backend_name: str = "hf") -> Path:
    gcfg = gen_config(
        model=str(model), dataset=DatasetSpec(source="builtin:arith", size=12, level=1), out=str(tmp / "samples"),
        n=4, max_new_tokens=40, backend=backend_name, seed=1,
    )
    generate_samples(gcfg, backend=backend)
    score(ScoreConfig(samples=str(tmp / "samples"), out=str(tmp / "scored")))
    curate(CurateConfig(scored=[str(tmp / "scored")], out=str(tmp / "train.parquet"), baseline=0.0))
    return tmp / "train.parquet"


def _moved(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def test_generate_score_curate_train(tiny_model_dir, tmp_path):
    data = _chain(tiny_model_dir, tmp_path)
    out = tmp_path / "policy"
    summary = train_policy(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(out), optimizer="adamw", lr=1e-3, batch_size=16))
    assert summary["rows"] == 48 and summary["steps"] == 3
    assert summary["behavior_gap_mean"] < 1e-5 and summary["behavior_gap_max"] < 1e-4  # hf sampler μ == trainer π_0
    assert _moved(tiny_model_dir, out) > 1e-4
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 101
    # the data came from this model, so μ may be recomputed; then the first ratio is exactly 1
    re = train_policy(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(tmp_path / "re"), optimizer="adamw", lr=1e-3, batch_size=16, recompute_behavior=True))
    assert re["behavior_gap_source"] == "full pass" and re["behavior_gap_mean"] < 1e-5


@pytest.mark.vllm
def test_trained_policy_serves_in_vllm_with_exact_mu(vllm_backend, tiny_model_dir, tmp_path):
    policy = tmp_path / "policy"
    synthetic = write_curated(tmp_path / "synthetic.parquet", n=32, policy=str(tiny_model_dir))
    train_policy(TrainConfig(model=str(tiny_model_dir), data=str(synthetic), out=str(policy), optimizer="adamw", lr=1e-2, batch_size=16, max_steps=3))
    # vLLM loads the trained policy (the session engine swaps its weights in) and samples from it
    data = _chain(policy, tmp_path / "round", backend=vllm_backend, backend_name="vllm")
    meta = json.loads((tmp_path / "round" / "samples" / "_manifest.json").read_text())
    assert meta["stage"] == "generate"
    out = tmp_path / "next"
    summary = train_policy(TrainConfig(model=str(policy), data=str(data), out=str(out), optimizer="adamw", lr=1e-3, batch_size=16))
    assert summary["behavior_gap_mean"] < 1e-5 and summary["behavior_gap_max"] < 1e-4  # vLLM μ == trainer π_0
    assert _moved(policy, out) > 1e-5


# -- the sampling distribution travels with the data -----------------------------------

# (temperature, top_k, top_p, min_p): the settings of issue #11 and their combination.
SAMPLINGS = [(1.0, -1, 1.0, 0.0), (0.7, -1, 1.0, 0.0), (1.0, 20, 1.0, 0.0), (1.0, -1, 0.9, 0.0), (1.0, -1, 1.0, 0.05), (0.7, 20, 0.9, 0.02)]


def _sampled_chain(model: Path, tmp: Path, sampling: tuple, *, backend=None, backend_name: str = "hf") -> Path:
    t, k, p, m = sampling
    gcfg = gen_config(
        model=str(model), dataset=DatasetSpec(source="builtin:arith", size=8, level=1), out=str(tmp / "samples"),
        n=4, max_new_tokens=32, backend=backend_name, seed=2, temperature=t, top_k=k, top_p=p, min_p=m,
    )
    generate_samples(gcfg, backend=backend)
    score(ScoreConfig(samples=str(tmp / "samples"), out=str(tmp / "scored")))
    curate(CurateConfig(scored=[str(tmp / "scored")], out=str(tmp / "train.parquet"), baseline=0.0))
    return tmp / "train.parquet"


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
def test_step_zero_pi_equals_mu_under_every_sampling_setting_hf(tiny_model_dir, tmp_path, sampling):
    data = _sampled_chain(tiny_model_dir, tmp_path, sampling)
    from toprcli.shards import read_file_metadata

    recorded = read_file_metadata(data)["sampling"]
    assert (recorded["temperature"], recorded["top_k"], recorded["top_p"], recorded["min_p"]) == sampling
    summary = train_policy(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(tmp_path / "p"), optimizer="adamw", lr=1e-3, batch_size=32, max_steps=1))
    assert summary["sampling"]["source"] == "data" and summary["sampling"]["temperature"] == sampling[0]
    assert summary["behavior_gap_mean"] <= 1e-4, summary
    summary_file = json.loads((tmp_path / "p" / "train_summary.json").read_text())
    assert summary_file["behavior_gap_mean"] == summary["behavior_gap_mean"]


@pytest.mark.vllm
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
def test_step_zero_pi_equals_mu_under_every_sampling_setting_vllm(vllm_backend, tiny_model_dir, tmp_path, sampling):
    data = _sampled_chain(tiny_model_dir, tmp_path, sampling, backend=vllm_backend, backend_name="vllm")
    summary = train_policy(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(tmp_path / "p"), optimizer="adamw", lr=1e-3, batch_size=32, max_steps=1))
    assert summary["behavior_gap_mean"] <= 1e-4, summary


@pytest.fixture(scope="module")
def topk_data(tiny_model_dir, tmp_path_factory) -> Path:
    return _sampled_chain(tiny_model_dir, tmp_path_factory.mktemp("topk"), (0.7, 20, 0.9, 0.0))


def test_train_refuses_a_sampling_setting_that_contradicts_the_data(tiny_model_dir, topk_data, tmp_path):
    from typer.testing import CliRunner

    from toprcli.cli.main import app

    out = tmp_path / "p"
    for flag, value, key in (("--temperature", "0.5", "temperature"), ("--top-k", "50", "top_k"), ("--top-p", "1.0", "top_p")):
        res = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(topk_data), "-o", str(out), "--no-progress", flag, value])
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and flag in lines[0] and f"{key} " in lines[0] and "contradicts the data" in lines[0], lines
        assert not out.exists() and not (tmp_path / "p.partial").exists()
    # The same values as the data are fine.
    res = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(topk_data), "-o", str(out), "--no-progress",
                                   "--temperature", "0.7", "--top-k", "20", "--max-steps", "1", "--optimizer", "adamw"])
    assert res.exit_code == 0, res.output


def test_the_sampled_token_keeps_a_finite_logprob_after_pi_moves(tiny_model_dir, topk_data, tmp_path):
    """After big updates many sampled tokens fall outside π's own top-k/top-p set; their log π stays finite."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from toprcli.sampling import Processing, kept_mask
    from toprcli.shards import read_table
    from toprcli.training.batching import TokenData, collate
    from toprcli.training.model import PolicyLogprobs

    moved = tmp_path / "moved"
    train_policy(TrainConfig(model=str(tiny_model_dir), data=str(topk_data), out=str(moved), optimizer="adamw", lr=5e-2, batch_size=8, max_steps=6))
    data = TokenData.from_table(read_table(topk_data))
    mb = collate(data, np.arange(data.n_rows))
    processing = Processing(temperature=0.7, top_k=20, top_p=0.9)
    lm = AutoModelForCausalLM.from_pretrained(moved).eval()
    with torch.no_grad():
        lp, _ = PolicyLogprobs(lm, processing)(mb.input_ids, mb.prompt_lens, mb.completion_lens)
        logits = lm(mb.input_ids).logits.float()
    outside = 0
    for i in range(data.n_rows):
        p, c = int(mb.prompt_lens[i]), int(mb.completion_lens[i])
        keep = kept_mask(logits[i, p - 1 : p + c - 1] / 0.7, processing)
        tokens = mb.input_ids[i, p : p + c]
        outside += int((~keep.gather(1, tokens[:, None])).sum())
    assert outside > 0, "the test needs sampled tokens that π's own truncation now drops"
    assert torch.isfinite(lp[mb.mask > 0]).all()


def test_greedy_data_trains_only_with_losses_that_ignore_mu(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from toprcli.cli.main import app

    data = _sampled_chain(tiny_model_dir, tmp_path, (0.0, -1, 1.0, 0.0))
    out = tmp_path / "p"
    res = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--no-progress", "--loss", "topr"])
    assert res.exit_code == 2 and "needs μ" in res.stderr and "greedy" in res.stderr, res.output
    assert not out.exists() and not (tmp_path / "p.partial").exists()
    res = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--no-progress",
                                   "--loss", "sft", "--max-steps", "1", "--optimizer", "adamw", "--json"])
    assert res.exit_code == 0, res.output
