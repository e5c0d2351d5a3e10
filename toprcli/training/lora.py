"""LoRA through peft: wrap the policy, train only the adapters, save merged.

Reads and writes no files (``checkpoint.save_policy`` merges and saves).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from toprcli.errors import UserError


def lora_config(rank: int, alpha: float, dropout: float, target_modules: Optional[Sequence[str]]):
    """A peft ``LoraConfig`` for a causal LM; ``target_modules`` None = every linear layer but the head."""
    try:
        from peft import LoraConfig
    except ImportError:  # pragma: no cover - peft is a dependency
        raise UserError("LoRA needs peft — `pip install peft` or drop --lora-rank") from None
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules) if target_modules else "all-linear",
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, config) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (base weights frozen). Raises UserError when no
    module matches ``target_modules``."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, config)
    except ValueError as e:
        raise UserError(f"LoRA: {e} — fix --lora-target (module names such as q_proj, v_proj)") from None


def check_lora_targets(model: torch.nn.Module, target_modules: Optional[Sequence[str]]) -> None:
    """Fail early (before any output exists) when no module name ends with a target."""
    if not target_modules:
        return
    names = [n for n, _ in model.named_modules()]
    missing = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise UserError(f"LoRA target modules not found in the model: {', '.join(missing)} — choose from: {', '.join(linear)}")
