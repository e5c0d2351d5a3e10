"""The built-in tiny Llama model and its character-level tokenizer.

Writes one Hugging Face model directory (``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``); reads nothing. The directory loads with
``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` and with vLLM (CPU or
GPU), so every stage can run for real on a laptop.

Tokenizer: one token per character of printable ASCII plus ``\\n`` and ``\\t``;
any other character becomes ``<unk>``. Specials: ``<pad>`` = 0, ``<s>`` = 1
(bos, prepended by ``tokenizer(text)``), ``</s>`` = 2 (eos), ``<unk>`` = 3.
Decoding concatenates characters, so ``decode(encode(s), skip_special_tokens=True)
== s`` for printable ASCII ``s`` with ``\n`` and ``\t`` that does not spell a special
token (``\r`` becomes ``<unk>``; the text ``</s>`` is the eos token).

vLLM's CPU attention kernels support head_dim in {32, 64, 80, 96, 112, 128,
160, 192, 224, 256, 512}; every preset uses 32 or 64.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from toprcli.errors import UserError
from toprcli.models.output import check_model_out
from toprcli.shards import build_dir_beside, disk_full_named, swap_dir_into_place

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n", "\t")

# A plain "Question/Answer" chat format. The generation prompt renders to the
# same text and tokens as ``tokenizer("Question: {q}\nAnswer:")`` (bos included).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'user' -%}{{ 'Question: ' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ 'Answer: ' + message['content'] + eos_token + '\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Answer:' }}{%- endif -%}"
)

# Model sizes. "tiny" is the CPU demo/test model (~0.4M parameters); "small"
# (~3M) is a harder-task CPU option; "bench" (~85M) is for throughput
# benchmarks only (random weights, never trained in tests).
TINY_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 352},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 704},
    "bench": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 2048},
}

VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (see module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own pre-token ([\s\S] also matches newlines).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins tokens with no separator (the default would insert spaces).
    tok.decoder = decoders.Fuse()
    bos_id = vocab[BOS]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=100_000,
        padding_side="left",
    )


def _llama_config(vocab_size: int, *, hidden_size: int, num_layers: int, num_heads: int,
                  intermediate_size: int | None, max_position_embeddings: int, tie_word_embeddings: bool = False):
    from transformers import LlamaConfig

    if hidden_size % num_heads:
        raise UserError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads} — pick sizes that divide")
    head_dim = hidden_size // num_heads
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise UserError(
            f"head_dim {head_dim} (= hidden_size / num_heads) is not supported by vLLM's CPU attention — "
            f"use one of {', '.join(map(str, VLLM_CPU_HEAD_DIMS))}"
        )
    if intermediate_size is None:
        # Llama's ~8/3 ratio rounded up to a multiple of 32.
        intermediate_size = -(-8 * hidden_size // 3 // 32) * 32
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        dtype="float32",
        architectures=["LlamaForCausalLM"],
    )


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    preset: str | None = None,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = False,
    overwrite: bool = False,
) -> Path:
    """Build a randomly initialised float32 ``LlamaForCausalLM`` + tokenizer in ``out_dir``.

    ``preset`` (a key of TINY_PRESETS) overrides the size arguments. The
    weights depend only on the sizes and ``seed``: the same arguments give a
    byte-identical ``model.safetensors``. The directory is built next to
    ``out_dir`` under a temporary name and renamed into place, so a killed
    build leaves no partial model. Raises UserError if ``out_dir`` exists and
    is not empty (unless ``overwrite``), or for sizes vLLM's CPU kernels reject.
    Returns ``out_dir`` as a Path.
    """
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    if preset is not None:
        if preset not in TINY_PRESETS:
            raise UserError(f"unknown model preset {preset!r} — use one of: {', '.join(TINY_PRESETS)}")
        p = TINY_PRESETS[preset]
        hidden_size, num_layers = p["hidden_size"], p["num_layers"]
        num_heads, intermediate_size = p["num_heads"], p["intermediate_size"]

    out = Path(out_dir)
    check_model_out(out, overwrite)

    tokenizer = build_tokenizer()
    config = _llama_config(
        len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    # Seed a private RNG state so building a model never disturbs the caller's.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()

    tmp = build_dir_beside(out)  # removes what killed builds of out left
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file model
        with disk_full_named(out):  # safetensors says so in its own exception type
            model.save_pretrained(tmp, safe_serialization=True)
        GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "toprcli_model.json").write_text(json.dumps(_card(seed, config), indent=2) + "\n")
        swap_dir_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _card(seed: int, config: Any) -> dict:
    return {
        "builder": "toprcli.models.tiny.build_tiny_model",
        "seed": seed,
        "hidden_size": config.hidden_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
    }


def count_parameters(model_dir: str | os.PathLike) -> int:
    """Number of parameters stored in ``model_dir``'s safetensors files."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            for k in st.keys():
                n = 1
                for dim in st.get_slice(k).get_shape():
                    n *= dim
                total += n
    return total
