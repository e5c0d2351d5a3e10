"""Exact and regex verifiers: string comparison after whitespace normalisation.

``exact``: the whole completion equals the gold answer once both are stripped
and runs of whitespace are collapsed to one space (case matters). An empty
completion is ``no_answer``.

``regex:PATTERN``: the **first** match of PATTERN in the completion
(``re.search``); its first capture group (the whole match when the pattern has
no group) is the extracted answer, compared with the gold answer after the same
normalisation. No match is ``no_answer``. Anchor the pattern to pick another
occurrence, e.g. ``regex:(?s).*ANSWER: (\\w+)`` for the last one. A user pattern
can backtrack catastrophically; the pool's per-check time limit turns that into
``timeout``.
"""

from __future__ import annotations

import functools
import re

from toprcli.verifiers.base import ERROR, NO_ANSWER, Verdict, judged, normalize_ws


def check_exact(completion: str, answer: str | None, row: dict | None = None) -> Verdict:
    if answer is None or not answer.strip():  # "" matches only an empty completion, which is no answer: nothing to check
        return Verdict(ERROR, detail="gold answer is empty")
    pred = normalize_ws(completion)
    if not pred:
        return Verdict(NO_ANSWER)
    return judged(pred == normalize_ws(answer), pred)


@functools.lru_cache(maxsize=16)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a user pattern (raises ``re.error``; the registry turns it into a UserError)."""
    return re.compile(pattern)


def check_regex(completion: str, answer: str | None, row: dict | None = None, *, pattern: str) -> Verdict:
    if answer is None or not answer.strip():
        return Verdict(ERROR, detail="gold answer is empty")
    rx = compile_pattern(pattern)
    m = rx.search(completion)
    if m is None:
        return Verdict(NO_ANSWER)
    got = m.group(1) if rx.groups else m.group(0)
    if got is None:  # the first group did not take part in the match
        return Verdict(NO_ANSWER)
    pred = normalize_ws(got)
    return judged(pred == normalize_ws(answer), pred)
