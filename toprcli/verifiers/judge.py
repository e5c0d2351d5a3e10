"""The ``judge`` verifier: did a generative verifier's completion give the right Yes/No verdict?

A verification completion ends with its verdict on its own final line —
``Yes`` or ``No``, optionally prefixed (``Verdict: No``, ``Answer: yes``) or
decorated (``**Yes**``, ``No.``), after an optional rationale. The verdict is
compared with the row's label (the ``answer`` column ``topr verifier-data``
writes: ``Yes`` when the judged solution is correct). A completion whose
last line is not a verdict is ``no_answer`` — by default rewarded like a wrong
judgement (``--reward-no-answer``), the paper's treatment of invalid verifier
outputs.
"""

from __future__ import annotations

import re

from toprcli.data.verification import NO, YES
from toprcli.verifiers.base import ERROR, NO_ANSWER, Verdict, judged

# The last line, e.g. "Yes", "No.", "**Yes**", "Verdict: No", "**Verdict**: Yes", "Final answer: yes".
_VERDICT_LINE = re.compile(
    r"^[\s*_>#-]*(?:(?:final\s+)?(?:answer|verdict|judg(?:e)?ment)[\s*_]*[:=-]\s*)?[\s*_]*(yes|no)[\s*_.!]*$",
    re.IGNORECASE,
)
_LABELS = {"yes": YES, "true": YES, "correct": YES, "1": YES, "no": NO, "false": NO, "incorrect": NO, "0": NO}


def verdict_of(completion: str) -> str | None:
    """``Yes``, ``No``, or None when the completion's last non-empty line is not a verdict."""
    lines = [ln for ln in (completion or "").splitlines() if ln.strip()]
    if not lines:
        return None
    m = _VERDICT_LINE.match(lines[-1][-200:])
    return None if m is None else (YES if m.group(1).lower() == "yes" else NO)


def label_of(answer: str | None) -> str | None:
    """The gold verdict of a verification row's ``answer`` (Yes/No, or true/false, correct/incorrect, 1/0)."""
    return _LABELS.get((answer or "").strip().lower())


def check(completion: str, answer: str | None, row: dict | None = None) -> Verdict:
    label = label_of(answer)
    if label is None:
        return Verdict(ERROR, detail=f"the label {answer!r} is not Yes or No — build the data with `topr verifier-data`")
    verdict = verdict_of(completion)
    if verdict is None:
        return Verdict(NO_ANSWER, detail="no Yes/No verdict on the last line")
    return judged(verdict == label, verdict)
