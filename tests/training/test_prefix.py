"""Shared-prefix forward (toprcli/training/prefix.py) against the one-pass layout: same log-probs, same gradient."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from builders import grouped_file
from toprcli.sampling import Processing
from toprcli.shards import read_table
from toprcli.training.batching import TokenData, collate, collate_shared
from toprcli.training.distributed import DistContext
from toprcli.training.model import Precision, load_policy


LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None}


def grouped_data(tmp_path, per_prompt: tuple[int, ...] = (4, 1, 3)) -> TokenData:
    return TokenData.from_table(read_table(grouped_file(tmp_path / "g.parquet", per_prompt)))


def policy_of(model_dir, processing=Processing(), **kw):
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    policy, _ = load_policy(str(model_dir), ctx, Precision.resolve("float32", ctx.device), processing, **kw)
    return policy


def logprobs_and_grad(policy, mb, weights: torch.Tensor):
    policy.zero_grad(set_to_none=True)
    lp, _ = policy(mb.input_ids, mb.prompt_lens, mb.completion_lens, **mb.prefix())
    (lp * mb.mask * weights[: lp.shape[1]]).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    return lp.detach(), grads


def assert_same(policy, data, rows):
    one, shared = collate(data, rows), collate_shared(data, rows)
    assert shared.prompt_ids.shape[0] < len(rows)  # prompts were shared
    w = torch.linspace(0.5, 1.5, 64)  # a per-column weight, so the gradient is not a plain sum
    lp_a, g_a = logprobs_and_grad(policy, one, w)
    lp_b, g_b = logprobs_and_grad(policy, shared, w)
    mask = one.mask.bool()
    assert (lp_a - lp_b)[mask].abs().max().item() <= 1e-5
    assert g_a.keys() == g_b.keys()
    for name in g_a:
        rel = (g_a[name] - g_b[name]).norm() / g_a[name].norm().clamp(min=1e-12)
        assert rel.item() <= 1e-4, (name, rel.item())


@pytest.mark.parametrize("processing", [Processing(), Processing(temperature=0.7, top_p=0.9)], ids=["plain", "T0.7-topp0.9"])
def test_shared_prefix_equals_one_pass_on_the_tiny_model(tmp_path, tiny_model_dir, processing):
    data = grouped_data(tmp_path)
    policy = policy_of(tiny_model_dir, processing)
    assert_same(policy, data, np.array([0, 5, 1, 4, 2, 3, 6, 7]))  # groups interleaved, a group of 1
    assert_same(policy, data, np.array([0, 1, 2, 3]))  # one prompt: the broadcast path


def test_length_buckets_are_the_cheapest_grouping():
    """The dynamic programme against every grouping of the sorted lengths into contiguous runs."""
    import itertools

    from toprcli.training.prefix import length_buckets

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 80, size=int(rng.integers(1, 8))).tolist()
        cost = int(rng.integers(0, 100))
        got = length_buckets(lengths, cost)
        assert sorted(i for b in got for i in b) == list(range(len(lengths)))
        price = lambda buckets: sum(len(b) * max(lengths[i] for i in b) + cost for b in buckets)  # noqa: E731
        s = sorted(lengths)
        best = min(sum(len(s[a:b]) * s[b - 1] + cost for a, b in zip((0, *cuts), (*cuts, len(s))))
                   for k in range(len(s)) for cuts in itertools.combinations(range(1, len(s)), k))
        assert price(got) == best


@pytest.mark.parametrize("call_cost", [64, 0], ids=["default", "a-bucket-per-length"])
def test_shared_prefix_in_length_buckets_equals_one_pass(tmp_path, tiny_model_dir, call_cost, monkeypatch):
    """Prompts and completions run in buckets of similar length (here, with call_cost 0, one per distinct length)."""
    import toprcli.training.prefix as prefix

    monkeypatch.setattr(prefix, "CALL_COST_TOKENS", call_cost)
    data = grouped_data(tmp_path, per_prompt=(5, 2, 3))
    assert len(set(data.completion_lens.tolist())) > 2  # uneven lengths, so several buckets
    assert len(set(data.prompt_lens.tolist())) == 3  # three prompt lengths: three prompt passes with call_cost 0
    assert_same(policy_of(tiny_model_dir), data, np.array([0, 5, 1, 7, 2, 6, 3, 8, 4, 9]))


def test_shared_prefix_with_gradient_checkpointing_and_lora(tmp_path, tiny_model_dir):
    data = grouped_data(tmp_path)
    assert_same(policy_of(tiny_model_dir, gradient_checkpointing=True), data, np.arange(8))
    assert_same(policy_of(tiny_model_dir, lora=LORA), data, np.arange(8))


# -- in the trainer ------------------------------------------------------------------


def _train(model_dir, data, out, **kw):
    from toprcli.config import TrainConfig
    from toprcli.stages.train import run as train_policy

    base = dict(model=str(model_dir), data=str(data), out=str(out), optimizer="adamw", lr=1e-2, batch_size=8, max_steps=4,
                group_by_prompt=True)
    return train_policy(TrainConfig(**{**base, **kw}))


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _close(a, b) -> float:
    wa, wb = _weights(a), _weights(b)
    return max(((wa[k] - wb[k]).norm() / wb[k].norm().clamp(min=1e-12)).item() for k in wa)


@pytest.mark.parametrize("budget", [4096, 40], ids=["whole-groups", "groups-split-over-micro-batches"])
def test_training_with_a_shared_prefix_equals_the_one_pass_trainer(tmp_path, tiny_model_dir, budget):
    """Same batches (prompt groups), same losses and weights: the shared prefix changes only the cost."""
    data = grouped_file(tmp_path / "d.parquet", per_prompt=(4, 1, 3, 6, 2, 5, 3))
    one = _train(tiny_model_dir, data, tmp_path / "one", micro_batch_tokens=budget)
    shared = _train(tiny_model_dir, data, tmp_path / "shared", micro_batch_tokens=budget, shared_prefix=True)
    assert shared["shared_prefix"] and shared["batch_units"] == "rows by prompt"
    first = [json.loads((tmp_path / d / "metrics.jsonl").read_text().splitlines()[0]) for d in ("one", "shared")]
    assert first[1]["loss"] == pytest.approx(first[0]["loss"], rel=1e-5)
    assert first[1]["grad_norm"] == pytest.approx(first[0]["grad_norm"], rel=1e-5)  # the whole step's gradient
    # Later steps: Adam divides by √v, so float-rounding differences of near-zero gradients grow into the
    # weights (~1e-3 relative after 4 steps); a wrong mask or position changes the loss at the first digit.
    assert shared["final_loss"] == pytest.approx(one["final_loss"], rel=1e-3)


def test_a_resumed_shared_prefix_run_equals_an_uninterrupted_one(tmp_path, tiny_model_dir, kill_after_checkpoint, monkeypatch):
    from conftest import Killed

    data = grouped_file(tmp_path / "d.parquet", per_prompt=(4, 1, 3, 6, 2, 5, 3))
    kw = dict(max_steps=5, save_every=2, shared_prefix=True, micro_batch_tokens=60)
    _train(tiny_model_dir, data, tmp_path / "a", **kw)
    kill_after_checkpoint(2)
    with pytest.raises(Killed):
        _train(tiny_model_dir, data, tmp_path / "b", **kw)
    monkeypatch.undo()
    resumed = _train(tiny_model_dir, data, tmp_path / "b", resume=True, **kw)
    assert resumed["resumed_from_step"] == 2
    assert _close(tmp_path / "a", tmp_path / "b") == 0.0


@pytest.mark.parametrize("loss", ["topr", "sft", "ppo", "kimi15", "cispo", "tis", "is", "reinforce"])
def test_every_loss_trains_with_a_shared_prefix(tmp_path, tiny_model_dir, loss):
    data = grouped_file(tmp_path / "d.parquet", policy=str(tiny_model_dir))
    summary = _train(tiny_model_dir, data, tmp_path / "o", loss=loss, shared_prefix=True, max_steps=1, kl_coef=0.1,
                     recompute_behavior=True)
    assert summary["steps"] == 1 and np.isfinite(summary["final_loss"])


def real_text_data(tmp_path, model_dir, per_prompt=(2, 1, 2)) -> TokenData:
    """GSM8K questions as prompts and GSM8K solutions as completions, in the model's own tokens."""
    from transformers import AutoTokenizer

    from builders import curated_rows, gsm8k_rows, write_curated

    tok = AutoTokenizer.from_pretrained(model_dir)
    problems = gsm8k_rows()
    n = sum(per_prompt)
    rows = curated_rows(n, seed=1)
    owner = np.repeat(np.arange(len(per_prompt)), per_prompt)
    rows["prompt_token_ids"] = [tok(problems[g]["question"])["input_ids"] for g in owner]
    rows["completion_token_ids"] = [tok(problems[10 + i]["answer"])["input_ids"][: 8 + 5 * i] for i in range(n)]
    rows["behavior_logprobs"] = [[-1.0] * len(c) for c in rows["completion_token_ids"]]
    rows["prompt_id"] = [f"p{g}" for g in owner]
    return TokenData.from_table(read_table(write_curated(tmp_path / "real.parquet", rows)))


@pytest.mark.parametrize("call_cost", [64, 0], ids=["default", "a-bucket-per-length"])
def test_shared_prefix_equals_one_pass_on_smollm2(tmp_path, smollm2_dir, call_cost, monkeypatch):
    """The real pretrained model (tied embeddings, GQA, 30 layers) on real text, top-p processing of π.

    In float64 the two layouts agree exactly (the head's float32 logits aside). In float32 on
    SmolLM2 the one-pass trainer's own log-probs move by up to ~3e-5 between batch compositions
    (padding changes the kernels' blocking), and the shared prefix stays within that floor."""
    import toprcli.training.prefix as prefix

    monkeypatch.setattr(prefix, "CALL_COST_TOKENS", call_cost)  # 0: each completion length its own decoder call
    data = real_text_data(tmp_path, smollm2_dir)
    policy = policy_of(smollm2_dir, Processing(temperature=0.7, top_p=0.9))
    rows = np.arange(5)
    with torch.no_grad():
        one = collate(data, rows)
        lp, _ = policy(one.input_ids, one.prompt_lens, one.completion_lens)
        alone = [policy(*(lambda m: (m.input_ids, m.prompt_lens, m.completion_lens))(collate(data, rows[i : i + 1])))[0][0]
                 for i in range(len(rows))]
        shared = collate_shared(data, rows)
        lp_shared, _ = policy(shared.input_ids, shared.prompt_lens, shared.completion_lens, **shared.prefix())
    mask = one.mask.bool()
    floor = max((lp[i, : len(a)] - a).abs().max().item() for i, a in enumerate(alone))
    assert (lp - lp_shared)[mask].abs().max().item() <= max(2 * floor, 1e-5)
    assert_same(policy.double(), data, rows)
    if call_cost == 0:  # and the packed layout (FlexAttention's), its mask dense
        policy.packed_prefix = True
        assert_same(policy, data, rows)


# -- the packed layout (FlexAttention's, on CUDA) -----------------------------------


@pytest.mark.parametrize("kw", [{}, {"gradient_checkpointing": True}, {"lora": LORA}], ids=["plain", "gradient-checkpointing", "lora"])
def test_packed_prefix_layout_equals_one_pass(tmp_path, tiny_model_dir, kw):
    """Prompts and completions packed into one row each, the block mask materialised dense (SDPA):
    the layout's positions, mask and gradient, which FlexAttention cannot run backward on CPU."""
    data = grouped_data(tmp_path, per_prompt=(5, 2, 3))
    policy = policy_of(tiny_model_dir, Processing(temperature=0.7, top_p=0.9), **kw)
    assert not policy.packed_prefix  # SDPA on CPU: the padded layout unless asked
    policy.packed_prefix = True
    assert_same(policy, data, np.array([0, 5, 1, 7, 2, 6, 3, 8, 4, 9]))  # groups interleaved, uneven lengths
    (tmp_path / "b").mkdir()
    assert_same(policy, grouped_data(tmp_path / "b"), np.array([0, 5, 1, 4, 2, 3, 6, 7]))  # with a group of 1


@pytest.fixture
def fresh_compiler():
    """Each flex test compiles its own kernels: torch 2.13's CPU codegen of a flex kernel recompiled for
    dynamic shapes (another test's sizes in the cache) emits C++ that does not compile (Triton on CUDA is
    another code path)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_flex_attention_kernel_forward_equals_one_pass(tmp_path, tiny_model_dir, fresh_compiler):
    """The model loaded with FlexAttention runs the packed layout through torch's compiled flex kernel
    and a BlockMask (forward only here: PyTorch has no FlexAttention backward on CPU)."""
    from toprcli.training.prefix_packed import FLEX

    data = grouped_data(tmp_path, per_prompt=(5, 2, 3))
    flex = policy_of(tiny_model_dir, attention=FLEX)
    assert flex.packed_prefix
    flex.eval()
    rows = np.array([0, 5, 1, 7, 2, 6, 3, 8, 4, 9])
    one, shared = collate(data, rows), collate_shared(data, rows)
    with torch.no_grad():
        ref, _ = policy_of(tiny_model_dir)(one.input_ids, one.prompt_lens, one.completion_lens)
        got, _ = flex(shared.input_ids, shared.prompt_lens, shared.completion_lens, **shared.prefix())
    assert (ref - got)[one.mask.bool()].abs().max().item() <= 1e-5


def test_flex_attention_kernel_forward_on_smollm2(tmp_path, smollm2_dir, fresh_compiler):
    """SmolLM2 (GQA, 9 query heads) through the flex kernel, packed, against its padded shared-prefix layout."""
    from toprcli.training.prefix_packed import FLEX

    data = real_text_data(tmp_path, smollm2_dir)
    rows = np.arange(5)
    shared = collate_shared(data, rows)
    args = (shared.input_ids, shared.prompt_lens, shared.completion_lens)
    with torch.no_grad():
        padded, _ = policy_of(smollm2_dir)(*args, **shared.prefix())
        flex = policy_of(smollm2_dir, attention=FLEX)
        assert flex.packed_prefix
        packed, _ = flex.eval()(*args, **shared.prefix())
    mask = collate(data, rows).mask.bool()
    assert (padded - packed)[mask].abs().max().item() <= 1e-4  # float32, different kernels (the one-pass floor is ~3e-5)


def test_an_attention_the_model_cannot_take_falls_back_to_its_default(tmp_path, tiny_model_dir):
    with pytest.warns(UserWarning, match="'no_such_kernel' is not available"):
        policy = policy_of(tiny_model_dir, attention="no_such_kernel")
    assert not policy.packed_prefix  # the padded layout, with the model's own attention


def test_a_sharded_policy_makes_one_decoder_call_per_pass(tmp_path, tiny_model_dir, monkeypatch):
    """Under FSDP2 each decoder call gathers every layer (a collective), so ranks must make equally many
    calls whatever their rows' lengths: a sharded policy runs prompts and completions unbucketed."""
    import toprcli.training.prefix as prefix
    from toprcli.training.model import PolicyLogprobs

    monkeypatch.setattr(prefix, "CALL_COST_TOKENS", 0)  # a bucket per distinct length
    data = grouped_data(tmp_path, per_prompt=(5, 2, 3))
    rows = np.array([0, 5, 1, 7, 2, 6, 3, 8, 4, 9])
    mb = collate_shared(data, rows)
    calls = {}
    for sharded in (False, True):
        lm = policy_of(tiny_model_dir).lm
        policy = PolicyLogprobs(lm, Processing(), sharded=sharded)
        n = []
        lm.get_decoder().register_forward_hook(lambda *a: n.append(1))
        lp, _ = policy(mb.input_ids, mb.prompt_lens, mb.completion_lens, **mb.prefix())
        calls[sharded] = (len(n), lp.detach())
    assert calls[False][0] > 2 and calls[True][0] == 2
    assert (calls[False][1] - calls[True][1])[collate(data, rows).mask.bool()].abs().max().item() <= 1e-5


def test_recomputed_behavior_is_computed_in_the_shared_layout(tmp_path, tiny_model_dir):
    """--recompute-behavior scored μ in the one-pass layout while training used the shared prefix: in bf16 the first
    step's ratios were off by up to e^±0.008 (on SmolLM2, a sequence's log-ratio by up to 2.3) instead of 1."""
    from toprcli.config import TrainConfig
    from toprcli.stages.train import run

    data = grouped_file(tmp_path / "d.parquet", per_prompt=(4, 1, 3, 6, 2, 5, 3), policy=str(tiny_model_dir))
    run(TrainConfig(model=str(tiny_model_dir), data=str(data), out=str(tmp_path / "p"), batch_size=24, max_steps=1, recompute_behavior=True,
                    shared_prefix=True, dtype="bfloat16", micro_batch_tokens=100))
    first = json.loads((tmp_path / "p" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["log_ratio_min"] == first["log_ratio_max"] == 0.0


def test_models_the_shared_layout_cannot_run_exactly_are_refused(tmp_path, tiny_model_dir):
    """One 4-D mask for every layer: a sliding window was ignored (log-probs off by up to 0.5 on Mistral, Gemma 3),
    hybrid layers crashed after setup, and GPT-2's decoder dropped the prompt's cache under checkpointing."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    from toprcli.config import TrainConfig
    from toprcli.errors import UserError
    from toprcli.stages.train import run
    from toprcli.training.prefix import unsupported

    small = dict(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=64)
    assert "sliding window (4 tokens)" in unsupported(MistralConfig(sliding_window=4, **small), 30, False)
    assert unsupported(MistralConfig(sliding_window=4096, **small), 30, False) is None  # wider than any sequence: no effect
    assert unsupported(Qwen2Config(use_sliding_window=False, sliding_window=4, **small), 30, False) is None
    hybrid = LlamaConfig(**small)
    hybrid.layer_types = ["full_attention", "linear_attention"]
    assert "linear_attention" in unsupported(hybrid, 30, False)
    assert "gradient checkpointing" in unsupported(GPT2Config(n_layer=2, n_embd=16, n_head=2), 30, True)
    assert unsupported(GPT2Config(n_layer=2, n_embd=16, n_head=2), 30, False) is None and unsupported(LlamaConfig(**small), 30, True) is None
    model = tmp_path / "windowed"
    shutil.copytree(tiny_model_dir, model)
    data_path = grouped_file(tmp_path / "d.parquet", per_prompt=(4, 3), policy=str(tiny_model_dir))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4}))
    with pytest.raises(UserError, match="--shared-prefix: .*sliding window \\(4 tokens\\).*drop --shared-prefix"):
        run(TrainConfig(model=str(model), data=str(data_path), out=str(tmp_path / "p"), shared_prefix=True, max_steps=1))
    assert not (tmp_path / "p.partial").exists()
