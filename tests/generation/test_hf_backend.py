"""The hf backend on the tiny model: the backend contract, exact log-probs, seeds, the context cap.

The vLLM twin of these tests is tests/generation/test_vllm_backend.py; both use
:func:`check_backend_output`.
"""

from __future__ import annotations

import pytest

from toprcli.generation import PromptRequest, SamplingParams, derive_seed

# (temperature, top_k, top_p): plain, tempered, top-k, nucleus.
SETTINGS = [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 20, 1.0), (0.7, -1, 0.9)]


def _prompts(n: int = 12) -> list[list[int]]:
    # Varied lengths, so batches are left-padded.
    return [[1] + [40 + (i * 7) % 50, 41, 42 + i % 5, 30] * (1 + i % 3) for i in range(n)]


def check_backend_output(backend, model_dir, *, temperature, top_k, top_p, n=3, max_new_tokens=40):
    """Shared by the hf and vLLM tests: contract of one generate call + log-prob gap to transformers.

    Returns the mean absolute per-token gap between the stored log-probs and the
    policy's own fp32 log-probs (same temperature / top-k / top-p) on the same tokens.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from toprcli.generation.hf_backend import processed_logprobs

    params = SamplingParams(n=n, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens)
    prompts = _prompts()
    reqs = [PromptRequest(p, seed=derive_seed(0, 0, i)) for i, p in enumerate(prompts)]
    results = backend.generate(reqs, params)
    assert len(results) == len(prompts)
    flat_p, flat_c, flat_l = [], [], []
    for p, comps in zip(prompts, results):
        assert len(comps) == n
        for c in comps:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            eos_at = [i for i, t in enumerate(c.token_ids) if t in backend.eos_token_ids]
            if c.finish_reason == "stop":  # EOS kept, last, once
                assert eos_at == [len(c.token_ids) - 1]
            else:
                assert eos_at == [] and len(c.token_ids) == max_new_tokens
            flat_p.append(p)
            flat_c.append(c.token_ids)
            flat_l.append(c.logprobs)
    net = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ref = processed_logprobs(net, flat_p, flat_c, params)
    gaps = [abs(a - b) for got, want in zip(flat_l, ref) for a, b in zip(got, want)]
    mean_gap = sum(gaps) / len(gaps)
    assert mean_gap <= 1e-4, f"mean |stored - recomputed| log-prob gap {mean_gap:.2e}"
    assert max(gaps) <= 1e-3
    return mean_gap


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_hf_backend_contract_and_logprobs(hf_backend, tiny_model_dir, temperature, top_k, top_p, capsys):
    gap = check_backend_output(hf_backend, tiny_model_dir, temperature=temperature, top_k=top_k, top_p=top_p)
    with capsys.disabled():
        print(f"\n[hf] T={temperature} top_k={top_k} top_p={top_p}: mean log-prob gap {gap:.2e}")


def test_hf_backend_seeded_batches_are_order_independent(hf_backend):
    params = SamplingParams(n=2, max_new_tokens=16)
    reqs = [PromptRequest(p, seed=derive_seed(7, 0, i)) for i, p in enumerate(_prompts(8))]
    a = hf_backend.generate(reqs, params)
    b = hf_backend.generate(reqs[::-1], params)[::-1]
    assert [[c.token_ids for c in x] for x in a] == [[c.token_ids for c in x] for x in b]


def test_hf_backend_caps_completions_at_the_context(tiny_model_dir):
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend

    backend = HFBackend(BackendOptions(model=str(tiny_model_dir), max_model_len=30))
    out = backend.generate([PromptRequest([1] + [40] * 20), PromptRequest([1] + [41] * 10)], SamplingParams(n=2, max_new_tokens=50))
    for prompt_len, comps in ((21, out[0]), (11, out[1])):
        for c in comps:
            assert prompt_len + len(c.token_ids) <= 30


def test_hf_backend_load_weights(tiny_model_dir, tmp_path):
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend
    from toprcli.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=1)
    backend = HFBackend(BackendOptions(model=str(tiny_model_dir), batch_size=4))
    rec = backend.load_weights(str(other))
    assert rec["mode"] == "inplace" and backend.model == str(other)
    check_backend_output(backend, other, temperature=1.0, top_k=-1, top_p=1.0, n=2, max_new_tokens=16)


def test_derive_seed_is_stable():
    assert derive_seed(0, 0, "p1") == derive_seed(0, 0, "p1")
    assert derive_seed(0, 0, "p1") != derive_seed(0, 1, "p1")
    assert 0 <= derive_seed("x") < 2**31 - 2**16


def test_hf_backend_stops_on_the_tokenizers_eos_too(tiny_model_dir, tmp_path):
    """A fine-tune whose tokenizer ends turns with another token than its generation config names: vLLM stops on both,
    the hf backend stopped only on the generation config's and ran every completion to max_new_tokens."""
    import json
    import shutil

    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    tok = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**tok, "eos_token": "<unk>"}))  # id 3; generation config: 2
    backend = HFBackend(BackendOptions(model=str(model), batch_size=4))
    assert backend.tokenizer.eos_token_id == 3 and backend.eos_token_ids == {2, 3}
    forward = backend.net.forward

    def says_eos(*args, **kwargs):  # the model ends its turn with the tokenizer's eos at once
        out = forward(*args, **kwargs)
        out.logits[..., 3] += 50
        return out

    backend.net.forward = says_eos
    done = backend.generate([PromptRequest([1, 40, 41], seed=1)], SamplingParams(n=1, max_new_tokens=6))[0][0]
    assert (done.token_ids, done.finish_reason) == ([3], "stop")


def test_a_closed_backend_gives_the_caller_its_generator_and_progress_bars_back(tiny_model_dir):
    """In a notebook, hf generation left torch's generator at the last shard's seed and transformers' progress bars
    off for the rest of the session."""
    import torch
    import transformers

    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend

    was_on = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.enable_progress_bar()  # as a notebook has them (the session's other backends turned them off)
    torch.manual_seed(5)
    state = torch.get_rng_state().clone()
    backend = HFBackend(BackendOptions(model=str(tiny_model_dir)))
    backend.reseed(9)
    assert not transformers.utils.logging.is_progress_bar_enabled()  # ours are drawn while it runs
    backend.close()
    on = transformers.utils.logging.is_progress_bar_enabled()
    if not was_on:
        transformers.utils.logging.disable_progress_bar()
    assert torch.equal(torch.get_rng_state(), state) and on
