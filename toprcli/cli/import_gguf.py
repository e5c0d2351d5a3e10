"""`topr import-gguf`: a GGUF checkpoint → a float32 Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import console, err_console, summary_table, user_errors


@user_errors
def import_gguf(
    gguf_file: Annotated[Path, typer.Argument(help="The .gguf checkpoint (any quantization transformers can read).")],
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the HF model to (safetensors + tokenizer + chat template).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing non-empty directory.")] = False,
) -> None:
    """Dequantize a GGUF checkpoint into a float32 HF model directory that transformers and vLLM load.

    The generation config keeps only the special tokens: no sampling defaults.

    Examples:
      [bold]topr import-gguf SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2[/]
      [bold]topr init-model models/smollm2 --preset smollm2-135m-instruct[/]   (fetches and imports it for you)
    """
    from toprcli.models.gguf import import_gguf as run_import

    err_console.print(f"importing {gguf_file} …", highlight=False)
    path = run_import(gguf_file, out_dir, overwrite=overwrite)
    console.print(summary_table(f"imported {path}", model_rows(path)))


def model_rows(path: Path) -> list[tuple[str, object]]:
    from transformers import AutoConfig, AutoTokenizer

    from toprcli.models.tiny import count_parameters

    cfg = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    return [
        ("architecture", cfg.architectures[0] if cfg.architectures else cfg.model_type),
        ("parameters", f"{count_parameters(path):,}"),
        ("layers", cfg.num_hidden_layers),
        ("hidden size", cfg.hidden_size),
        ("vocab", cfg.vocab_size),
        ("context", cfg.max_position_embeddings),
        ("chat template", "yes" if getattr(tok, "chat_template", None) else "no"),
        ("eos", tok.eos_token),
    ]
