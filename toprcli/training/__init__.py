"""Training: the off-policy trainer loop, token-budget batching, log-probs, checkpoints, FSDP2, LoRA.

Entry point: :func:`train_policy` (``topr train`` and the pipeline call it).
"""

from toprcli.training.prepare import prepare
from toprcli.training.trainer import train_policy

__all__ = ["prepare", "train_policy"]
