"""What a generative verifier is shown, and the two words it answers with.

One home for the verification format, used to build training data (``topr
verifier-data``), to judge candidates at test time (``topr eval
--verifier-model``) and by the ``judge`` verifier. The format follows the
generative-verifier practice (GenRM, Zhang et al. 2024): the problem, the
candidate solution, and a request for a Yes/No verdict on the last line, so
that verification is next-token prediction and P(Yes) is a score.

The verification *text* below is the dataset's question; the ``verification``
dataset preset renders it like any prompt (plain: the text then ``Verdict:``;
with ``chat_template``: the text as the user message).
"""

from __future__ import annotations

import hashlib

YES, NO = "Yes", "No"
REQUEST = "Is the proposed solution correct? Answer Yes or No on the last line."


def verification_text(question: str, solution: str) -> str:
    """The problem and a candidate solution, followed by the request for a verdict."""
    return f"Question: {question.strip()}\n\nProposed solution: {solution.strip()}\n\n{REQUEST}"


def label_word(correct: bool) -> str:
    return YES if correct else NO


def verification_id(text: str) -> str:
    """A stable id from the verification text (the same question and candidate: the same id)."""
    return "v-" + hashlib.sha1(text.encode()).hexdigest()[:16]
