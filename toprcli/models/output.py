"""Where a built or imported model is written: a new or empty directory, or (``--overwrite``) a model's."""

from __future__ import annotations

from pathlib import Path

from toprcli.errors import UserError

MODEL_FILES = ("config.json", "toprcli_model.json")  # what makes a directory a model's (transformers', ours)


def check_model_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` a model may not be written to. ``--overwrite`` replaces the whole directory, so it replaces only
    a model (``topr init-model . --overwrite`` deleted a project), never the working directory or one holding it."""
    if out.exists() and not out.is_dir():
        raise UserError(f"model output path {out} exists and is not a directory — choose another directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise UserError(f"model output dir {out} already exists and is not empty — pass --overwrite or choose another dir")
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise UserError(f"--overwrite would replace {out}, which holds the working directory — choose another dir")
    if not any((out / name).is_file() for name in MODEL_FILES):
        raise UserError(f"--overwrite replaces a model directory, and {out} holds no model (no config.json) — choose another dir, "
                        "or empty it first")
