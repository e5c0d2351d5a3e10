"""Training: the off-policy trainer loop, token-budget batching, log-probs, checkpoints, FSDP2, LoRA.

Entry point: :func:`train_policy` (``topr train`` and the pipeline call it).
"""

from toprcli.training.trainer import SimulatedKill, prepare, train_policy

__all__ = ["SimulatedKill", "prepare", "train_policy"]
