"""Training checkpoints (resume) and the final policy (HF format).

Writes, under the run's partial directory ``<out>.partial/``::

    checkpoints/step-00000040/        one complete checkpoint (older ones are deleted)
        __0_0.distcp ...              model + optimizer state (torch.distributed.checkpoint,
                                      one file per rank: FSDP shards are saved as they are)
        scheduler.pt                  LR scheduler state
        rng-rank00000.pt ...          torch / cuda / numpy / python RNG state of each rank
        trainer_state.json            step, data position, config + data fingerprints (written last)

A checkpoint is written to ``.step-N.tmp/`` and renamed when complete, so a
``step-N/`` directory is always whole. Reads the same files on ``--resume``.

The final policy is written with ``save_pretrained`` (safetensors) plus the
tokenizer and generation config of the starting model: a plain HF model
directory that transformers and vLLM load. LoRA adapters are merged first.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from toprcli.shards import disk_full_named, fsync_dir, write_atomic, write_json_atomic
from toprcli.training.distributed import DistContext, barrier

CKPT_PATTERN = re.compile(r"^step-(\d{8})$")
STATE_NAME = "trainer_state.json"


@contextlib.contextmanager
def quiet_hf():
    """No transformers progress bars ("Loading weights", "Writing model shards") and no
    single-process DCP warning: the trainer has its own progress display."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def latest_checkpoint(root: Path) -> Optional[Path]:
    """The newest complete checkpoint under ``root`` (None if there is none)."""
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CKPT_PATTERN.match(p.name)) and (p / STATE_NAME).is_file()]
    return max(found)[1] if found else None


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():  # this rank's device only: a resume may see fewer GPUs (CUDA_VISIBLE_DEVICES)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # saved for every visible device (before toprcli saved its own only)
        cuda = cuda[torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.current_device() < len(cuda) else None
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


def _save_synced(obj: Any, path: Path) -> None:
    """torch.save, on disk before the call returns: a host crash must not leave an empty file in a checkpoint."""
    write_atomic(path, lambda tmp: torch.save(obj, tmp))


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    ctx: DistContext,
) -> Path:
    """Write checkpoint ``step`` (all ranks call this) and delete the older ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = root / checkpoint_name(step)
    tmp = root / f".{checkpoint_name(step)}.tmp"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(ctx)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        with quiet_hf(), disk_full_named(tmp):
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
            _save_synced(_rng_state(), tmp / f"rng-rank{ctx.rank:05d}.pt")
        barrier(ctx)
        if ctx.is_main:
            with disk_full_named(tmp):
                _save_synced(scheduler.state_dict(), tmp / "scheduler.pt")
                write_json_atomic(tmp / STATE_NAME, trainer_state)
    except BaseException:  # a full disk: the half-written checkpoint (a model and its optimizer state) would keep it full
        if ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if ctx.is_main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(root)  # the rename on disk before the older checkpoints go (dcp.save fsyncs its own files)
        for p in root.iterdir():
            if p != final and (CKPT_PATTERN.match(p.name) or p.name.endswith(".tmp")):
                shutil.rmtree(p, ignore_errors=True)
    barrier(ctx)
    return final


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, ctx: DistContext
) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and this rank's RNG from ``path``; return the trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with quiet_hf():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = path / f"rng-rank{ctx.rank:05d}.pt"
    if rng.is_file():  # absent when resuming on a different number of ranks
        _set_rng_state(torch.load(rng, weights_only=False))
    return json.loads((path / STATE_NAME).read_text())


def save_policy(
    out_dir: Path,
    policy: torch.nn.Module,
    ctx: DistContext,
    *,
    source: str,
    save_dtype: torch.dtype,
    lora: bool,
    lora_config: Any = None,
) -> None:
    """Write the trained policy to ``out_dir`` in HF format (all ranks call this).

    ``policy`` is the trainer's :class:`~toprcli.training.model.PolicyLogprobs`
    (its ``lm`` is the causal LM). Under FSDP the full state dict is gathered to
    rank 0 (on CPU) and written as it is (:func:`save_gathered`; LoRA: loaded into a
    fresh copy of the starting model to merge). LoRA adapters are merged into the base weights (``merge_and_unload``)
    so vLLM needs no adapter support. Floating-point tensors are saved as
    ``save_dtype`` (float32 by default, so small updates survive between rounds).
    """
    with quiet_hf():
        _save_policy(out_dir, policy, ctx, source=source, save_dtype=save_dtype, lora=lora, lora_config=lora_config)
    barrier(ctx)


LM_PREFIX = "lm."  # PolicyLogprobs holds the causal LM as .lm


def _save_policy(out_dir: Path, policy, ctx: DistContext, *, source: str, save_dtype, lora: bool, lora_config) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = policy.lm
    if ctx.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if ctx.is_main:
            full = {k[len(LM_PREFIX):] if k.startswith(LM_PREFIX) else k: v for k, v in full.items()}
            if not lora:  # the gathered weights are the model: written as they are, no second float32 copy on rank 0
                save_gathered(out_dir, full, source, save_dtype)
                model = None
            else:  # adapters are merged into a fresh copy of the base
                from peft import get_peft_model

                fresh = get_peft_model(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32), lora_config)
                _check_names(full, fresh.state_dict().keys(), set())
                fresh.load_state_dict(full, strict=False)
                model = fresh
        del full
    if ctx.is_main and model is not None:
        if lora:
            model = model.merge_and_unload()
        model = model.to(save_dtype)
        out_dir.mkdir(parents=True, exist_ok=True)
        with disk_full_named(out_dir):  # safetensors says so in its own exception type
            model.save_pretrained(out_dir, safe_serialization=True)
    if ctx.is_main:
        try:
            GenerationConfig.from_pretrained(source).save_pretrained(out_dir)
        except (OSError, ValueError):
            pass  # the starting model had no generation_config.json
        try:
            AutoTokenizer.from_pretrained(source).save_pretrained(out_dir)
        except (OSError, ValueError) as e:  # pragma: no cover - a model dir without a tokenizer
            warnings.warn(f"could not copy the tokenizer of {source} into {out_dir}: {e}")


def save_gathered(out_dir: Path, full: dict[str, torch.Tensor], source: str, save_dtype: torch.dtype) -> None:
    """Write a gathered full state dict (names without ``lm.``) as ``source``'s architecture in ``save_dtype``, each tensor
    converted in turn (``full`` is emptied). A model on the meta device gives ``save_pretrained`` the config and which
    names are one tied tensor (saved once, as from a loaded model): rank 0 holds the weights once, not twice (64 GB
    more for an 8B model in float32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=save_dtype)
    shared: dict[int, list[str]] = {}
    for name, param in skeleton.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    tied = {name for names in shared.values() for name in names[1:]}
    _check_names(full, skeleton.state_dict().keys(), tied)
    for name in list(full):
        tensor = full.pop(name)
        if name not in tied:
            full[name] = tensor.to(save_dtype) if tensor.is_floating_point() else tensor
    out_dir.mkdir(parents=True, exist_ok=True)
    with disk_full_named(out_dir):
        skeleton.save_pretrained(out_dir, state_dict=full, safe_serialization=True)


def _check_names(full: dict[str, Any], expected, tied: set[str]) -> None:
    """The gathered names are the model's (a rotary table is computed, not saved; a tied name may be either)."""
    missing = [k for k in expected if k not in full and k not in tied and "rotary" not in k]
    unexpected = [k for k in full if k not in set(expected)]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch saving the policy: missing={missing[:5]} unexpected={unexpected[:5]}")
