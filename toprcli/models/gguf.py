"""Import a GGUF checkpoint as a plain Hugging Face model directory (float32 safetensors).

Reads one ``.gguf`` file (transformers' GGUF loader, package ``gguf``, dequantizes
it); writes ``OUT/`` with ``config.json``, ``model.safetensors`` (float32),
the tokenizer with its chat template, a ``generation_config.json`` holding
only the special token ids — no sampling defaults, so nothing a checkpoint
ships can change the distribution toprcli samples from — and
``toprcli_model.json`` (where the weights came from). transformers and vLLM
both load the result.

The GGUF-loaded model refuses ``save_pretrained`` (its config keeps the GGUF
quantization entry), so the model is rebuilt from a clean copy of its config
and the dequantized state dict is loaded into it. The directory is built next
to ``OUT`` under a temporary name and renamed into place: a failed or killed
import leaves nothing half-written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toprcli.errors import UserError
from toprcli.generation.model_info import first_line
from toprcli.models.output import check_model_out
from toprcli.shards import build_dir_beside, disk_full_named, swap_dir_into_place

GGUF_MAGIC = b"GGUF"
CARD = "toprcli_model.json"


def check_gguf(path: Path) -> dict[str, Any]:
    """Refuse anything but a readable GGUF file; return its ``general.*`` metadata.

    Parsing the file here (~3 s for a 100 MB checkpoint) turns a truncated or
    corrupt file into one line instead of a struct/mmap traceback from deep
    inside transformers.
    """
    if path.is_dir():
        raise UserError(f"{path} is a directory — pass the .gguf file itself")
    if not path.is_file():
        raise UserError(f"GGUF file not found: {path} — check the path")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise UserError(f"{path} is not a GGUF file (no GGUF header) — pass a .gguf checkpoint")
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise UserError(f"reading GGUF needs the `gguf` package ({first_line(e)}) — `pip install gguf`") from None
    try:
        reader = GGUFReader(path)
        general = {}
        for key in ("general.architecture", "general.name", "general.license"):
            field = reader.get_field(key)
            if field is not None and field.data:
                # A string field's value is the part its first data index points at (any gguf version).
                general[key.split(".", 1)[1]] = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
        # Turn terminators other than eos (Gemma's <end_of_turn>): generation must stop there too.
        ends = [reader.get_field(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
        general["end_of_turn_ids"] = [int(f.parts[f.data[0]][0]) for f in ends if f is not None and f.data]
    except Exception as e:  # the gguf reader raises whatever numpy/struct raise on a bad file
        raise UserError(f"{path} is not a readable GGUF file ({type(e).__name__}: {first_line(e)}) — is it truncated?") from None
    if "architecture" not in general:
        raise UserError(f"{path} has no general.architecture entry — not a model checkpoint transformers can import")
    return general


def import_gguf(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Dequantize ``gguf_path`` into a float32 HF model directory at ``out_dir``; returns ``out_dir``.

    Raises UserError for a missing, corrupt or non-GGUF file, an architecture
    transformers cannot load as a causal LM, or an ``out_dir`` that exists and
    is not empty (unless ``overwrite``). ``out_dir`` is untouched on failure.
    ``progress`` gets one status line once the input has been checked.
    """
    from transformers import GenerationConfig

    src, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    general = check_gguf(src)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} exists and is not a directory — choose another OUT")
    if src.resolve().is_relative_to(out.resolve()):  # --overwrite would replace the directory, the checkpoint with it
        raise UserError(f"OUT {out} holds the GGUF file {src.name} itself — choose another OUT (a new directory)")
    check_model_out(out, overwrite)
    tokenizer, model = _dequantize(src, general, progress)
    eos = getattr(model.config, "eos_token_id", None)
    stops = list(dict.fromkeys([*(eos if isinstance(eos, list) else [eos] if eos is not None else []), *general.pop("end_of_turn_ids", [])]))
    if len(stops) > 1:
        model.config.eos_token_id = stops  # config.json: what vLLM and the hf backend stop on
    special = {k: getattr(model.config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    if special["pad_token_id"] is None:
        special["pad_token_id"] = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else None)

    tmp = build_dir_beside(out)  # removes what killed builds of out left
    try:
        with disk_full_named(out):  # safetensors says so in its own exception type
            model.save_pretrained(tmp, safe_serialization=True)
        GenerationConfig(**{k: v for k, v in special.items() if v is not None}).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        card = {"builder": "toprcli.models.gguf.import_gguf", "source": src.name, "source_sha256": sha256_file(src), "dtype": "float32", **general}
        (tmp / CARD).write_text(json.dumps(card, indent=2, default=str) + "\n")
        swap_dir_into_place(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write {out}: {first_line(e)} — check the path and free disk space") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _dequantize(src: Path, general: dict[str, Any], progress: Callable[[str], None] | None) -> tuple[Any, Any]:
    """The GGUF's tokenizer, and its weights dequantized into a float32 transformers model of the GGUF's config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        # The tokenizer first: it reads the GGUF's config too, so an unsupported architecture
        # fails here, in seconds, before the status line and the slow dequantization.
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        if progress is not None:
            progress(f"dequantizing {src.name} ({general['architecture']}) to float32 …")
        with _no_dequantize_bar(), _quiet_load_report():
            gguf_model, loading = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32,
                                                                       output_loading_info=True)
    except ImportError as e:
        raise UserError(f"reading GGUF needs the `gguf` package ({first_line(e)}) — `pip install gguf`") from None
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        raise UserError(
            f"cannot import {src} (architecture {general['architecture']!r}): {first_line(e)} — "
            "transformers must support this GGUF architecture as a causal LM"
        ) from None
    tied = getattr(gguf_model.config, "tie_word_embeddings", False)
    # transformers fills a weight the file lacks with fresh random values: that is no import.
    absent = sorted(k for k in loading["missing_keys"] if "rotary" not in k and not (tied and k == "lm_head.weight"))
    if absent:
        raise UserError(f"cannot import {src}: the file has no weights for {', '.join(absent[:3])}{' ...' if len(absent) > 3 else ''} "
                        "— the GGUF is incomplete or not the architecture it declares")
    config = gguf_model.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)  # the GGUF quantization entry blocks save_pretrained; the name is the GGUF's
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    del gguf_model  # two float32 copies of the model at once only while copying
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise UserError(f"cannot import {src}: the dequantized weights do not fit the model ({(missing or unexpected)[:3]}) — report this checkpoint")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    # GGUF carries no tokenizer length limit (transformers leaves 1e30); the model's context is the real one.
    context = getattr(config, "max_position_embeddings", None)
    if context:
        tokenizer.model_max_length = context
    return tokenizer, model


@contextmanager
def _quiet_load_report() -> Iterator[None]:
    """transformers' table of missing weights: a missing weight is our own error line instead."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


@contextmanager
def _no_dequantize_bar() -> Iterator[None]:
    """Silence the tqdm bar transformers draws while dequantizing (its progress-bar switch misses
    it): progress belongs to the CLI, and this step takes a few seconds."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
