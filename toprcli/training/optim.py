"""Optimizers (AdamW, Adafactor) and learning-rate schedules (constant, linear, cosine; linear warm-up).

:class:`Adafactor` is Shazeer & Stern (2018) with an absolute learning rate —
the configuration ``transformers.optimization.Adafactor(lr=..., scale_parameter=False,
relative_step=False, warmup_init=False)`` that fine-tuning recipes (and the
TOPR paper's "Adafactor at a constant 5e-7") use — written with tensor
operations only, so it also runs on FSDP2's sharded DTensor parameters (the
transformers class mixes plain tensors into DTensor arithmetic and fails there).
``torch.optim.Adafactor`` is a different algorithm (relative step sizes scaled
by the parameter RMS), so it is not used.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch


class Adafactor(torch.optim.Optimizer):
    """Adafactor, absolute step size, no first moment (β1 = None).

    For a matrix gradient G (…, n, m), per step t:

        β2_t = 1 − t^(decay_rate)                         (decay_rate = −0.8)
        U    = G² + eps1
        R    = β2_t R + (1 − β2_t) mean_m(U)              (…, n)   row factor
        Cc   = β2_t Cc + (1 − β2_t) mean_n(U)             (…, m)   column factor
        V̂    = (R / mean(R)) ⊗ Cc                         (factored second moment)
        Δ    = G / sqrt(V̂);   Δ /= max(1, RMS(Δ) / clip_threshold)
        θ   ←  θ − lr · wd · θ − lr · Δ

    Vectors keep an unfactored V = β2_t V + (1 − β2_t) U. Matches
    ``transformers.optimization.Adafactor`` with ``scale_parameter=False,
    relative_step=False, warmup_init=False, beta1=None``.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        *,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        weight_decay: float = 0.0,
    ):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        defaults = dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @staticmethod
    def _replicated(t: torch.Tensor) -> torch.Tensor:
        """A DTensor reduction over the sharded dim is a pending sum ("Partial"); make it a
        plain replicated value before it is stored as optimizer state."""
        placements = getattr(t, "placements", None)
        if placements is not None and any(pl.is_partial() for pl in placements):
            from torch.distributed.tensor import Replicate

            return t.redistribute(t.device_mesh, [Replicate()] * len(placements))
        return t

    @staticmethod
    def _rms(t: torch.Tensor) -> torch.Tensor:
        return t.norm(2) / math.sqrt(t.numel())

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            eps1 = group["eps"][0]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                factored = grad.dim() >= 2
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    if factored:
                        state["exp_avg_sq_row"] = torch.zeros_like(grad.mean(dim=-1))
                        state["exp_avg_sq_col"] = torch.zeros_like(self._replicated(grad.mean(dim=-2)))
                    else:
                        state["exp_avg_sq"] = torch.zeros_like(grad)
                state["step"] += 1
                t = float(state["step"])
                beta2t = 1.0 - math.pow(t, group["decay_rate"])
                update = grad * grad + eps1
                if factored:
                    row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
                    row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
                    col.mul_(beta2t).add_(self._replicated(update.mean(dim=-2)), alpha=1.0 - beta2t)
                    r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
                    c_factor = col.unsqueeze(-2).rsqrt()
                    update = r_factor * c_factor * grad
                else:
                    v = state["exp_avg_sq"]
                    v.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                    update = v.rsqrt() * grad
                update = update / (self._rms(update) / group["clip_threshold"]).clamp(min=1.0)
                p_fp32 = p if p.dtype == torch.float32 else p.float()
                if group["weight_decay"] != 0:
                    p_fp32.add_(p_fp32, alpha=-group["weight_decay"] * lr)
                p_fp32.add_(update, alpha=-lr)
                if p_fp32 is not p:
                    p.copy_(p_fp32)
        return loss


OPTIMIZERS = ("adafactor", "adamw")  # the names build_optimizer knows


def build_optimizer(name: str, params: list[torch.nn.Parameter], *, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.Optimizer:
    """``name``'s optimizer over ``params``; weight decay on matrices only (biases and norm gains, 1-d, are not decayed:
    pulling a norm's gain to 0 shrinks a whole layer's output, as transformers' Trainer and nanoGPT keep them apart)."""
    groups: Any = params
    if weight_decay:
        split = ([p for p in params if p.ndim >= 2], weight_decay), ([p for p in params if p.ndim < 2], 0.0)
        groups = [{"params": ps, "weight_decay": wd} for ps, wd in split if ps]
    if name == "adamw":
        # The fused CUDA kernel when every parameter is a plain CUDA tensor (not an FSDP2 DTensor shard). Not
        # torch's fused CPU kernel: 3.4x faster per update, but its rounding changes the demo's numbers
        # (round 0's pass@1 0.338 -> 0.523), which docs/results.md records to every digit.
        fused = bool(params) and all(p.is_cuda and type(p.data) is torch.Tensor for p in params)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused or None)
    if name == "adafactor":
        return Adafactor(groups, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based).

    Warm-up: (step+1)/warmup_steps for the first ``warmup_steps`` steps (full lr
    at the last warm-up step). Then ``constant``: 1; ``linear``: 1 − progress (transformers' default); ``cosine``:
    ½(1 + cos(π · progress)), progress = (step − warmup)/(total − warmup),
    which reaches 0 just after the last step (as transformers' cosine schedule; the
    last step's factor is ½(1 + cos(π(T − 1 − w)/(T − w))), 0.5 for two steps after warm-up).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, *, schedule: str, warmup_steps: int, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps)
    )
