"""Verifiers: turn (completion, gold answer) into a verdict and a reward.

* :func:`resolve_verifier` — ``--verifier`` spec → :class:`Verifier`
  (``gsm8k``, ``math``, ``exact``, ``regex:PATTERN``, ``python:MODULE:FUNCTION``).
* :class:`VerifierPool` — runs checks in worker processes with a hard
  per-check time limit (model text is untrusted).
* :class:`Verdict`, :data:`VERDICTS`, :class:`Rewards`, :func:`reward_of`, :func:`own_reward`.

Heavy libraries (sympy, math-verify) load only when the math verifier is used.
"""

from toprcli.verifiers.base import (
    CORRECT,
    ERROR,
    INCORRECT,
    NO_ANSWER,
    TIMEOUT,
    VERDICTS,
    Rewards,
    Verdict,
    Verifier,
    own_reward,
    reward_of,
)
from toprcli.verifiers.pool import DEFAULT_TIMEOUT, VerifierPool, default_workers
from toprcli.verifiers.registry import SPEC_HELP, check_sources, resolve_verifier

__all__ = [
    "CORRECT",
    "DEFAULT_TIMEOUT",
    "ERROR",
    "INCORRECT",
    "NO_ANSWER",
    "SPEC_HELP",
    "TIMEOUT",
    "VERDICTS",
    "Rewards",
    "Verdict",
    "Verifier",
    "VerifierPool",
    "check_sources",
    "default_workers",
    "own_reward",
    "resolve_verifier",
    "reward_of",
]
