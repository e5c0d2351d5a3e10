"""`topr init-model`: build the built-in tiny Llama model and tokenizer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import console, summary_table, user_errors


@user_errors
def init_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model to (HF format, safetensors).")],
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation; same seed, same weights.")] = 0,
    preset: Annotated[str, typer.Option(help="Model size preset: 'tiny' (the demo's) or 'bench' (~50-100M, for benchmarks).")] = "tiny",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing non-empty directory.")] = False,
) -> None:
    """Build the built-in tiny Llama-architecture model and its character tokenizer.

    The result loads in transformers and vLLM like any HF model directory.

    Examples:
      [bold]topr init-model models/tiny[/]
      [bold]topr init-model models/bench --preset bench --seed 1[/]
    """
    from toprcli.errors import UserError
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model

    if preset not in TINY_PRESETS:
        raise UserError(f"unknown model preset {preset!r} — choose one of: {', '.join(TINY_PRESETS)}")
    path = build_tiny_model(out_dir, seed=seed, overwrite=overwrite, **TINY_PRESETS[preset])
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    n_params = _count_params(path)
    console.print(
        summary_table(
            f"built {path}",
            [
                ("architecture", cfg.architectures[0] if cfg.architectures else cfg.model_type),
                ("parameters", f"{n_params:,}"),
                ("layers", cfg.num_hidden_layers),
                ("hidden size", cfg.hidden_size),
                ("vocab", cfg.vocab_size),
                ("context", cfg.max_position_embeddings),
                ("seed", seed),
            ],
        )
    )


def _count_params(path: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in Path(path).glob("*.safetensors"):
        with safe_open(str(f), "np") as st:
            for k in st.keys():
                total += math.prod(st.get_slice(k).get_shape())
    return total
