"""Import a GGUF checkpoint as a plain Hugging Face model directory (float32 safetensors).

Reads one ``.gguf`` file (transformers' GGUF loader, package ``gguf``, dequantizes
it); writes ``OUT/`` with ``config.json``, ``model.safetensors`` (float32),
the tokenizer with its chat template, and a ``generation_config.json`` holding
only the special token ids — no sampling defaults, so nothing a checkpoint
ships can change the distribution toprcli samples from. transformers and
vLLM both load the result.

The GGUF-loaded model refuses ``save_pretrained`` (its config keeps the GGUF
quantization entry), so the model is rebuilt from a clean copy of its config
and the dequantized state dict is loaded into it. The directory is built next
to ``OUT`` under a temporary name and renamed into place: a failed or killed
import leaves nothing half-written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from toprcli.errors import UserError
from toprcli.shards import swap_dir_into_place
from toprcli.generation.model_info import first_line

GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise UserError(f"GGUF file not found: {path} — check the path")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise UserError(f"{path} is not a GGUF file (no GGUF header) — pass a .gguf checkpoint")


def import_gguf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Dequantize ``gguf_path`` into a float32 HF model directory at ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    src, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    check_gguf(src)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} exists and is not a directory — choose another OUT")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"output dir {out} already exists and is not empty — pass --overwrite or choose another OUT")

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    except ImportError as e:
        raise UserError(f"reading GGUF needs the `gguf` package ({first_line(e)}) — `pip install gguf`") from None
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        raise UserError(f"cannot import {src}: {first_line(e)} — transformers must support this GGUF architecture") from None

    config = gguf_model.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)  # the GGUF quantization entry blocks save_pretrained; the name is the GGUF's
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise UserError(f"cannot import {src}: the dequantized weights do not fit the model ({(missing or unexpected)[:3]}) — report this checkpoint")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    special = {k: getattr(config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    if special["pad_token_id"] is None:
        special["pad_token_id"] = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else special["eos_token_id"]
    del gguf_model

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        GenerationConfig(**{k: v for k, v in special.items() if v is not None}).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        swap_dir_into_place(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write {out}: {first_line(e)} — check the path and free disk space") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
