"""What every verifier shares: the verdict type, the verifier record, rewards.

A verifier is a plain function ``check(completion, answer, row=None) -> Verdict``
plus a name. It never sees a process, a timeout or a file: isolation is the
job of :mod:`toprcli.verifiers.pool`, resolution from a ``--verifier`` string
the job of :mod:`toprcli.verifiers.registry`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from toprcli.shards.schema import VERDICTS

# The verdict vocabulary is part of the column contract (the ``verdict`` column).
CORRECT, INCORRECT, NO_ANSWER, TIMEOUT, ERROR = VERDICTS

# ``extracted_answer`` records what was read, cut to this many characters so a
# runaway completion cannot bloat the scored shards.
MAX_EXTRACTED_CHARS = 200


def clip_text(text: str | None, limit: int = MAX_EXTRACTED_CHARS) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one check.

    ``verdict`` is one of :data:`VERDICTS`. ``score`` is set only by plugins
    that return a float: it then *is* the reward (see :func:`reward_of`).
    ``detail`` says why for ``error``/``timeout`` (kept out of the Parquet
    shards; the score summary shows a few examples).
    """

    verdict: str
    extracted_answer: str | None = None
    score: float | None = None
    detail: str | None = None

    @property
    def correct(self) -> bool:
        return self.verdict == CORRECT


def judged(ok: bool, extracted: str | None) -> Verdict:
    return Verdict(CORRECT if ok else INCORRECT, clip_text(extracted))


CheckFn = Callable[..., Verdict]  # (completion: str, answer: str | None, row: dict | None = None)


@dataclass(frozen=True)
class Verifier:
    """A resolved ``--verifier`` spec.

    ``check(completion, answer, row=None)`` does the work. A worker process
    rebuilds the verifier from ``spec`` and ``options`` (functions do not
    travel between processes), so both must be plain data.

    ``needs_row``: the pool ships the input row (plugins: all of it, which costs
    IPC; ``row_columns`` narrows it). ``chunk_size``: rows per task sent to a worker — large for
    microsecond checks so pipe traffic is amortised, small for sympy.
    ``preload``: modules a fresh worker imports before it says it is ready.
    ``warmup``: called once per worker so first-call costs (regex compiles,
    lazy imports) are not charged to the first row's time limit.
    ``equivalent(a, b)``: do two extracted answers say the same thing
    (``correct`` if so)? Majority voting groups answers with it, in the pool
    like a check. Without it, answers vote by ``vote_key(answer)``: the form
    in which ``check`` compares an answer with the gold one, so that answers
    the check tells apart never share a vote (None:
    :func:`toprcli.evaluation.normalize_answer`, numbers by value, text by content).
    """

    name: str
    spec: str
    check: CheckFn
    options: Mapping[str, Any] = field(default_factory=dict)
    needs_row: bool = False
    row_columns: tuple[str, ...] | None = None  # with needs_row: only these columns travel (None: the whole row)
    chunk_size: int = 256
    preload: tuple[str, ...] = ()
    warmup: Callable[[], None] | None = None
    equivalent: Callable[[str, str], Verdict] | None = None
    vote_key: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Rewards:
    """Reward per verdict. Paper defaults: +1 correct, −1 otherwise.

    ``timeout`` and ``error`` get ``incorrect``: a completion that cannot be
    verified in time is not rewarded, and giving it the no-answer reward would
    make hanging the verifier a strategy when no-answer pays more.
    """

    correct: float = 1.0
    incorrect: float = -1.0
    no_answer: float = -1.0


def own_reward(v: Verdict) -> bool:
    """Whether the verdict's reward is its plugin's own number (a float score) rather than the configured reward."""
    return v.score is not None and v.verdict in (CORRECT, INCORRECT)


def reward_of(v: Verdict, rewards: Rewards) -> float:
    """The reward of one verdict; a plugin's float score, when given, is the reward itself."""
    if own_reward(v):
        return float(v.score)
    if v.verdict == CORRECT:
        return rewards.correct
    if v.verdict == NO_ANSWER:
        return rewards.no_answer
    return rewards.incorrect


_WS = re.compile(r"\s+")


def normalize_ws(text: str) -> str:
    """Strip and collapse runs of whitespace to one space (linear time)."""
    return _WS.sub(" ", text).strip()


def from_plugin_result(result: Any) -> Verdict:
    """Map a plugin's return value to a verdict.

    ``True``/``False`` → correct/incorrect; a float (or int) → ``score`` = that
    number, correct iff it is > 0; ``None`` → no_answer; a :class:`Verdict`
    passes through; verl's ``{"score": x, ...}`` is ``x``, correct by its ``acc`` when it has one (verl's accuracy: a
    format bonus scores a wrong answer above 0) and with its ``pred`` as the answer. Anything else (or NaN) is an ``error``.
    """
    if isinstance(result, Verdict):
        if result.verdict not in VERDICTS:
            return Verdict(ERROR, detail=f"plugin returned unknown verdict {result.verdict!r}")
        bad = _bad_score(result.score) if result.score is not None else None
        if bad:
            return Verdict(ERROR, detail=f"plugin returned a Verdict with score {bad}")
        extracted = result.extracted_answer
        return replace(result, score=None if result.score is None else float(result.score),
                       extracted_answer=None if extracted is None else clip_text(str(extracted)))  # stored, as the built-ins' are: clipped
    if isinstance(result, dict):  # verl's reward dict: its score; the other keys are its extra metrics
        return _from_reward_dict(result)
    if result is None:
        return Verdict(NO_ANSWER)
    if isinstance(result, bool):
        return Verdict(CORRECT if result else INCORRECT)
    try:
        import numpy as np

        np_number = isinstance(result, (np.bool_, np.integer, np.floating))
    except ImportError:  # pragma: no cover
        np_number = False
    if np_number and isinstance(result, np.bool_):
        return Verdict(CORRECT if bool(result) else INCORRECT)
    if isinstance(result, (int, float)) or np_number:
        bad = _bad_score(result)
        if bad:
            return Verdict(ERROR, detail=f"plugin returned {bad}")
        x = float(result)
        return Verdict(CORRECT if x > 0 else INCORRECT, score=x)
    return Verdict(ERROR, detail=f"plugin returned {type(result).__name__}, expected bool or float")


def _from_reward_dict(result: dict) -> Verdict:
    if "score" not in result:
        return Verdict(ERROR, detail=f"plugin returned a dict without a 'score' key (keys: {', '.join(map(str, list(result)[:5]))})")
    verdict = from_plugin_result(result["score"])
    acc, pred = result.get("acc"), result.get("pred")
    if verdict.verdict in (CORRECT, INCORRECT) and acc is not None and not isinstance(acc, (str, bytes)):
        verdict = replace(verdict, verdict=CORRECT if bool(acc) else INCORRECT)
    return verdict if pred is None else replace(verdict, extracted_answer=clip_text(str(pred)))


_FLOAT32_MAX = 3.4028234663852886e38  # rewards are stored as float32


def _bad_score(x: Any) -> str | None:
    """Why a plugin's score cannot be a reward (not a number, NaN, infinite, beyond float32), else None."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return f"{x!r}, not a number"
    return f"{x}" if not math.isfinite(x) else f"{x}, beyond float32" if abs(x) > _FLOAT32_MAX else None
