"""What a model directory (or hub id) says about itself: existence, tokenizer, context length.

One home for the context-length rule every stage uses (generation, eval,
training): an explicit override, else the first of the config's length keys,
else unknown (``None``: no check is made against it). Reads config files; writes
nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from toprcli.errors import UserError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PRUNED_FILE = "pruned.json"  # a run's old round policy whose weights keep_policies removed (its records stay)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")  # one at least
# Keys under which model configs give their context length, most specific first.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
# Config keys that must match for an in-place weight reload to be valid.
ARCH_KEYS = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
    "max_position_embeddings", "rope_parameters", "rope_scaling", "rope_theta",
)


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def check_model(model: str, *, tokenizer: bool = True) -> None:
    """A local model dir with a config.json (and a tokenizer, unless only its weights are read), or what looks like a hub id."""
    if not model:
        raise UserError("no model given — pass --model DIR (build the tiny one with `topr init-model DIR`)")
    p = Path(model).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UserError(f"model path {model} is a file, not a model directory — pass the directory holding config.json")
        if (p / PRUNED_FILE).is_file():
            raise UserError(f"model dir {model}: its weights were removed by the run's keep_policies ({PRUNED_FILE}) — use a later round's "
                            "policy, or raise keep_policies before the rounds you want to keep end")
        if not (p / "config.json").is_file():
            raise UserError(f"model dir {model} has no config.json — pass a Hugging Face model directory (`topr init-model DIR` builds one)")
        if tokenizer and not any((p / name).is_file() for name in TOKENIZER_FILES):  # train copies it into the policy
            raise UserError(f"model dir {model} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}) — save the model's tokenizer "
                            "there (tokenizer.save_pretrained(DIR))")
        return
    if model.startswith((".", "/", "~")) or not _HUB_ID.match(model):
        raise UserError(f"model dir not found: {model} — check the path (`topr init-model DIR` builds the tiny model)")


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise UserError(f"cannot load the tokenizer of {model}: {first_line(e)} — check the model dir or hub id") from None


def load_config(model: str) -> Any:
    """The model's transformers config (its text part for multimodal configs)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except Exception as e:
        raise UserError(f"cannot read the config of {model}: {first_line(e)} — check the model dir or hub id") from None
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def config_context_length(config: Any) -> int | None:
    """The context length a config declares (prompt + completion tokens), or None."""
    for key in CONTEXT_KEYS:
        v = getattr(config, key, None) if not isinstance(config, dict) else config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def context_length(model: str, override: int | None = None) -> int | None:
    """Prompt + completion tokens the model takes: ``override``, else its config's; None if unknown."""
    if override is not None:
        return int(override)
    return config_context_length(load_config(model))


def model_config_json(model: str, name: str = "config.json") -> dict[str, Any]:
    """A local model dir's ``name`` (config.json, generation_config.json) as written ({} when absent or unreadable, e.g. a hub id)."""
    p = Path(model) / name
    try:
        return json.loads(p.read_text()) if p.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def stop_token_ids(*sources: Any) -> frozenset[int]:
    """Every end-of-sequence id the sources name (an id, a list of ids, None): vLLM stops on the tokenizer's
    eos and on every eos of the model's config and generation config; the hf backend stops on the same."""
    ids: set[int] = set()
    for src in sources:
        ids.update([int(src)] if isinstance(src, int) else [int(x) for x in src] if isinstance(src, (list, tuple)) else [])
    return frozenset(ids)



def same_tokenizer(a: str, b: str) -> bool:
    """Whether two models tokenize, template and stop alike: the same tokenizer (its serialised form, not its files'
    bytes, which each save_pretrained rewrites), chat template, special tokens and generation stop ids."""
    if a == b:
        return True
    try:
        forms = [_tokenizer_form(m) for m in (a, b)]
    except UserError:
        return False
    return forms[0] == forms[1]


def _tokenizer_form(model: str) -> tuple:
    tok = load_tokenizer(model)
    backend = getattr(tok, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else sorted(tok.get_vocab().items())
    generation = Path(model) / "generation_config.json"
    stops = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    return vocab, tok.chat_template, tok.all_special_ids, stops


def same_architecture(a: str, b: str) -> bool:
    """Whether two model dirs have the same architecture and shapes (in-place reload is valid).

    Compared as transformers reads the configs, not as written: a checkpoint saved by another
    transformers version spells the same RoPE differently (``rope_theta`` beside ``rope_scaling``,
    or ``rope_parameters``), which once restarted the engine at every such reload."""
    if not model_config_json(a) or not model_config_json(b):
        return False
    try:
        ca, cb = load_config(a).to_dict(), load_config(b).to_dict()
    except UserError:
        return False
    return all(ca.get(k) == cb.get(k) for k in ARCH_KEYS)
