"""Training: the off-policy trainer loop, token-budget batching, log-probs, checkpoints, FSDP2, LoRA.

Entry points: :func:`train_policy` (``topr train`` and the pipeline call it) and
:func:`prepare` (every check before anything is written). They are loaded on
first use (PEP 562), so that importing a leaf such as ``toprcli.training.optim``
(the config reads its optimizer names) does not pull in the trainer and, with it,
the config itself.
"""

from __future__ import annotations

__all__ = ["prepare", "train_policy"]


def __getattr__(name: str):
    if name == "train_policy":
        from toprcli.training.trainer import train_policy

        return train_policy
    if name == "prepare":
        from toprcli.training.prepare import prepare

        return prepare
    raise AttributeError(f"module 'toprcli.training' has no attribute {name!r}")
