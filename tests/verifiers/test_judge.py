"""The `judge` verifier: a generative verifier's last-line Yes/No verdict against the row's label."""

from __future__ import annotations

import pytest

from toprcli.verifiers import CORRECT, ERROR, INCORRECT, NO_ANSWER, resolve_verifier
from toprcli.verifiers.judge import check, label_of, verdict_of


@pytest.mark.parametrize(
    "completion, verdict",
    [
        ("Yes", "Yes"),
        (" no", "No"),
        ("No.", "No"),
        ("**Yes**", "Yes"),
        ("The sum is 12, as claimed.\nVerdict: Yes", "Yes"),
        ("Step 1 is wrong.\n\nFinal answer: NO!\n\n", "No"),
        ("Answer - yes", "Yes"),
        ("Judgement: No", "No"),
        ("**Verdict**: Yes", "Yes"),  # the label in bold (was no answer)
        ("**Final answer:** no", "No"),
        ("Yes, because 3 + 4 = 7", None),  # a verdict with a reason on the same line is not its own line
        ("Yes\nbut the last step is wrong", None),  # the verdict must be the last line
        ("Maybe", None),
        ("Yesterday", None),
        ("", None),
        ("Yes or No", None),
    ],
)
def test_verdict_is_the_last_line(completion, verdict):
    assert verdict_of(completion) == verdict


def test_labels_and_checks():
    assert [label_of(a) for a in ("Yes", "no", "TRUE", "incorrect", "1", "maybe", None)] == ["Yes", "No", "Yes", "No", "Yes", None, None]
    assert check("Yes", "Yes").verdict == CORRECT
    assert check("reasoning...\nNo", "Yes").verdict == INCORRECT and check("No", "Yes").extracted_answer == "No"
    v = check("I cannot tell.", "No")
    assert v.verdict == NO_ANSWER and not v.correct and v.extracted_answer is None
    assert check("Yes", "42").verdict == ERROR  # not a verification label


def test_judge_is_a_registered_verifier_and_no_answer_is_a_wrong_judgement_by_default():
    from toprcli.verifiers import Rewards, reward_of

    judge = resolve_verifier("judge")
    assert judge.name == "judge"
    rewards = Rewards()  # +1 / −1 / −1
    assert reward_of(judge.check("Yes", "Yes"), rewards) == 1.0
    assert reward_of(judge.check("No", "Yes"), rewards) == -1.0
    assert reward_of(judge.check("hmm", "Yes"), rewards) == -1.0
