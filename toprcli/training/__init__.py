"""Training: the off-policy trainer loop, token-budget batching, log-probs, checkpoints, FSDP2, LoRA.

The stage that runs it (checks, output files, the lock) is :mod:`toprcli.stages.train`;
here are its parts: :mod:`~toprcli.training.prepare` (every check before anything is
written), :mod:`~toprcli.training.trainer` (the loop), :mod:`~toprcli.training.model`
(loading, precision, FSDP2 placement, log π), :mod:`~toprcli.training.logprobs` and
:mod:`~toprcli.training.optim` (pure torch), :mod:`~toprcli.training.batching`,
:mod:`~toprcli.training.stats`, :mod:`~toprcli.training.checkpoint`,
:mod:`~toprcli.training.distributed`, :mod:`~toprcli.training.lora`.
"""
