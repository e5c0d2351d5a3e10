"""The built-in tiny Llama: tokenizer round trip, deterministic build, loads in transformers and vLLM."""

from __future__ import annotations

import hashlib
import string

import pytest

from toprcli.errors import UserError
from toprcli.models.tiny import TINY_PRESETS, build_tiny_model, build_tokenizer, count_parameters

PROMPT = "Question: What is 47 + 38?\nAnswer:"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """One tiny model for the whole session (read-only for tests)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


# -- tokenizer ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "47 + 38 = 85\n#### 85",
        "  leading and trailing  ",
        "tabs\tand\nnew\n\nlines\n",
        string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", ""),
        "Solve it. Don't stop; (x^2 + y_1) / {z} * 3! <s> is text here",
    ],
)
def test_tokenizer_round_trip(text):
    tok = build_tokenizer()
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text.replace("<s>", "")
    plain = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(plain) == text
    # One token per character, except a literal "<s>" (a special token).
    assert len(plain) == len(text) - 2 * text.count("<s>")


def test_tokenizer_specials_and_unknown():
    tok = build_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + 95 + 2
    ids = tok("é€", add_special_tokens=False)["input_ids"]
    assert ids == [tok.unk_token_id, tok.unk_token_id]
    # Decoding stops nowhere special: eos decodes to its text unless skipped.
    ids = tok("12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids) == "12</s>"
    assert tok.decode(ids, skip_special_tokens=True) == "12"


def test_chat_template_matches_plain_prompt(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    msgs = [{"role": "user", "content": "What is 47 + 38?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<s>" + PROMPT
    # Rendered text already holds bos: tokenize it without adding another.
    assert tok(text, add_special_tokens=False)["input_ids"] == tok(PROMPT)["input_ids"]
    full = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *msgs, {"role": "assistant", "content": "85"}], tokenize=False
    )
    assert full == "<s>Be brief.\nQuestion: What is 47 + 38?\nAnswer: 85</s>\n"


# -- model ----------------------------------------------------------------------


def _weights_digest(model_dir) -> str:
    from safetensors.torch import load_file

    h = hashlib.sha256()
    tensors = load_file(str(model_dir / "model.safetensors"))
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].numpy().tobytes())
    return h.hexdigest()


def test_build_writes_hf_dir_and_loads(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tok)
    assert 300_000 < count_parameters(tiny_dir) < 600_000
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=8, do_sample=True, temperature=1.0, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]
    assert isinstance(tok.decode(out[0, ids.shape[1] :]), str)


def test_build_is_deterministic(tmp_path, tiny_dir):
    a = build_tiny_model(tmp_path / "a", seed=0)
    b = build_tiny_model(tmp_path / "b", seed=1)
    assert _weights_digest(a) == _weights_digest(tiny_dir)
    assert (a / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert _weights_digest(a) != _weights_digest(b)


def test_build_leaves_global_rng_alone(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_existing_dir_needs_overwrite(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    build_tiny_model(out)  # an empty dir is fine
    before = _weights_digest(out)
    with pytest.raises(UserError, match="--overwrite"):
        build_tiny_model(out, seed=1)
    assert _weights_digest(out) == before  # untouched
    build_tiny_model(out, seed=1, overwrite=True)
    assert _weights_digest(out) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_bad_sizes_raise_user_error(tmp_path):
    with pytest.raises(UserError, match="head_dim"):
        build_tiny_model(tmp_path / "m", hidden_size=96, num_heads=4)  # head_dim 24
    with pytest.raises(UserError, match="divisible"):
        build_tiny_model(tmp_path / "m", hidden_size=100, num_heads=3)
    with pytest.raises(UserError, match="preset"):
        build_tiny_model(tmp_path / "m", preset="huge")
    assert not (tmp_path / "m").exists()


def test_presets_are_valid_kwargs():
    import inspect

    params = inspect.signature(build_tiny_model).parameters
    for name, kw in TINY_PRESETS.items():
        assert set(kw) <= set(params), name
        assert kw["hidden_size"] // kw["num_heads"] in (32, 64), name
    assert {"tiny", "bench"} <= set(TINY_PRESETS)


# -- vLLM -----------------------------------------------------------------------


@pytest.mark.vllm
def test_vllm_generates_with_logprobs(vllm_backend, tiny_model_dir):
    """The real vLLM engine (the session's shared one) loads the tiny model dir and samples from it."""
    vllm_engine, tiny_dir = vllm_backend.llm, tiny_model_dir
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tok(PROMPT)["input_ids"]
    params = SamplingParams(max_tokens=16, temperature=1.0, logprobs=0, ignore_eos=True)
    outs = vllm_engine.generate([{"prompt_token_ids": ids}] * 4, params, use_tqdm=False)
    assert len(outs) == 4
    for o in outs:
        assert list(o.prompt_token_ids) == ids
        c = o.outputs[0]
        assert len(c.token_ids) == 16 and c.finish_reason == "length"
        assert all(0 <= t < len(tok) for t in c.token_ids)
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        # logprobs=0: exactly the sampled token's log-prob at each step.
        assert len(c.logprobs) == 16
        for t, lp in zip(c.token_ids, c.logprobs):
            assert t in lp and lp[t].logprob <= 0.0
    # Different requests sample differently (engine seed, no per-request seed).
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) > 1
