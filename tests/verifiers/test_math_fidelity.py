"""The math verifier reads answers the way math-verify does, with our screens on its candidates.

Cases from issue 14 (real model output math-verify's own suite covers) and the
adversarial guarantees that must survive the change. In-process; the pool path
is exercised by test_voting.py and benchmarks/mathverify_agreement.py.
"""

from __future__ import annotations

import time

import pytest

from toprcli.verifiers import math_verifier as mv

FILLER = "We check each case carefully and simplify the expression once more before moving on. "


@pytest.mark.parametrize(
    "completion, answer, verdict",
    [
        # A closing final-answer statement outranks an intermediate box (math-verify's priorities).
        (
            "Interest after six months: $0.04 \\cdot 10,000 \\cdot \\frac{1}{2} = \\boxed{200}$, and after a year "
            "$\\boxed{255}$ on the second CD. Adding both accounts, the final answer is $10,455$",
            "10455",
            "correct",
        ),
        ("First $\\boxed{12}$. The final answer is $13$.", "12", "incorrect"),
        ("The final answer is $13$. Checking again: $\\boxed{12}$", "12", "correct"),  # the rightmost of the two
        # Several boxes listed together are one set answer, on the prediction side...
        ("So $x = \\boxed{-2}$ and $x = \\boxed{1}$.", "\\boxed{1,-2}", "correct"),
        ("The solutions are \\boxed{-2} and \\boxed{1}", "1,-2", "correct"),
        ("The solutions are \\boxed{-2} and \\boxed{3}", "1,-2", "incorrect"),
        ("Only $\\boxed{1}$ works.", "1,-2", "incorrect"),
        # ...and on the gold side.
        ("$\\boxed{1,2}$", "$\\boxed{1}\\boxed{2}$", "correct"),
        ("$\\boxed{2, 1}$", "\\boxed{1}\\boxed{2}", "correct"),
        ("$\\boxed{2}$", "$\\boxed{1}\\boxed{2}$", "incorrect"),
        # A gold "1,22" is a pair or 1.22 (decimal comma): both readings count.
        ("1.22", "1,22", "correct"),
        ("\\boxed{1,22}", "1,22", "correct"),
        ("\\boxed{1.2}", "1,22", "incorrect"),
        # A box holding a constant's bare name is that constant, not a product of letters.
        ("\\boxed{pi}", "\\pi", "correct"),
        ("\\boxed{infty}", "\\infty", "correct"),
    ],
)
def test_math_verify_priorities(completion, answer, verdict):
    v = mv.check(completion, answer)
    assert v.verdict == verdict, v


def test_long_gold_solution_without_box_is_read_not_rejected():
    """A worked solution of over 1,000 characters is trusted dataset text, not model text."""
    gold = (
        "The stock keeps $90 \\%$ of its value on Monday and $80 \\%$ of that on Tuesday. "
        + FILLER * 14
        + "So it keeps $0.9 \\cdot 0.8 = 0.72$ of its value. Final Answer: The final answer is $28 \\%$. I hope it is correct."
    )
    assert len(gold) > 1_000 and "\\boxed" not in gold
    right = mv.check("The total loss is $\\boxed{28\\%}$.", gold)
    assert right.verdict == "correct", right
    wrong = mv.check("The total loss is $\\boxed{30\\%}$.", gold)
    assert wrong.verdict == "incorrect", wrong


def test_absurd_gold_is_still_an_error_whatever_its_form():
    for gold in ("9^{9^9}", "The answer is $\\boxed{9^{9^9}}$.", "Final answer: $10^{1000000}$"):
        v = mv.check("\\boxed{3}", gold)
        assert v.verdict == "error" and "rejected" in v.detail, (gold, v)


def test_screens_apply_to_the_chosen_candidate_not_the_whole_text():
    t = time.perf_counter()
    # An absurd expression mentioned on the way does not condemn the answer...
    v = mv.check("Note that $9^{9^9}$ is astronomically large. The final answer is $5$.", "5")
    assert v.verdict == "correct", v
    # ...but when it is the answer math-verify picks, the prediction is incorrect, unparsed.
    for completion in ("The final answer is $9^{9^9}$.", "So $5$ then... \\boxed{9^{9^9}}", "The answer: 9**9**9"):
        v = mv.check(completion, "5")
        assert v.verdict == "incorrect" and "rejected" in v.detail, (completion, v)
    # A rejected candidate stops the extraction: no fallback to an earlier, weaker candidate.
    v = mv.check("We found $5$ first. \\boxed{1E999999}", "5")
    assert v.verdict == "incorrect" and "rejected" in v.detail, v
    assert time.perf_counter() - t < 5.0


def test_window_reaches_back_to_the_last_box():
    tail = FILLER * 60  # ~5,000 characters of rambling after the answer
    assert len(tail) > mv.MAX_TEXT_CHARS
    assert mv.check("Thus \\boxed{42}. " + tail, "42").verdict == "correct"
    far = FILLER * 250  # ~21,000 characters: beyond MAX_BOXED_WINDOW
    assert len(far) > mv.MAX_BOXED_WINDOW
    assert mv.check("Thus \\boxed{42}. " + far, "42").verdict == "correct"
    assert mv.check("Thus \\boxed{42}. " + far + " The final answer is $41$.", "41").verdict == "correct"
    # A box just inside the tail, before the line the window would start on, is not cut off (was no_answer).
    box = "x" * 700 + " So the answer is $\\boxed{\\frac{7}{3}}$.\nLet me check " + "7 apples and 3 pears.\n" * 180
    assert 0 < box.index("\\boxed") - (len(box) - mv.MAX_TEXT_CHARS) < 100
    assert "\\boxed" in mv.window(box) and mv.check(box, "\\frac{7}{3}").verdict == "correct"
    # The window is bounded whatever the completion.
    huge = "\\boxed{1} " + "7 " * 100_000
    assert len(mv.window(huge)) <= 2 * mv.MAX_TEXT_CHARS + 2
    t = time.perf_counter()
    assert mv.check(huge, "1").verdict in ("correct", "incorrect", "no_answer")
    assert time.perf_counter() - t < 5.0


def test_equivalent_reads_extracted_answers():
    assert mv.equivalent("\\frac{1}{2}", "0.5").correct
    assert mv.equivalent("0.3", "\\frac{3}{10}").correct
    assert mv.equivalent("-2 and 1", "1,-2").correct  # what check shows for listed boxes
    assert mv.equivalent("10,455", "10455").correct
    assert not mv.equivalent("3", "\\frac{1}{2}").correct
    assert not mv.equivalent("[1,2)", "[1,2]").correct
    # Model text: screened like a prediction; only an identical string matches an absurd one.
    t = time.perf_counter()
    assert mv.equivalent("9^{9^9}", "9^{9^9}").correct
    assert not mv.equivalent("9^{9^9}", "9^{9^{9}}").correct
    assert time.perf_counter() - t < 2.0


def test_guards_fail_closed_without_the_functions_they_wrap(monkeypatch):
    import math_verify.parser as mvp

    from toprcli.verifiers import math_safety

    mv._lib()
    monkeypatch.setattr(mvp, "parse_expr", lambda *a, **k: None)  # looks unguarded
    monkeypatch.delattr(mvp, "parse_latex_cached")
    with pytest.raises(RuntimeError, match="parse_latex_cached"):
        math_safety.install_guards()


def test_a_bare_gold_with_a_commands_words_or_a_final_period_is_read_whole():
    """\\begin{pmatrix}'s and \\text{ inches}'s words were taken for prose: the gold became its last number (2 for a vector),
    so the gold itself was wrong and a lone 2 right. '18.' and '#### 18.' stayed strings no answer equals; '#### 18' with
    text after it was read as the text's last number."""
    vector = "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
    assert mv.check("\\boxed{" + vector + "}", vector).verdict == "correct"
    assert mv.check("\\boxed{2}", vector).verdict == "incorrect"
    assert mv.equivalent(vector, "\\begin{pmatrix} 5 \\\\ 2 \\end{pmatrix}").verdict == "incorrect"
    assert mv.check("\\boxed{2\\pi\\text{ inches}}", "2\\pi\\text{ inches}").verdict == "correct"
    assert mv.check("\\boxed{8\\sqrt{2}}", "8\\sqrt{2}\\text{ units}").verdict == "correct"
    for gold in ("18.", "#### 18.", "#### 18\n\nsome text 7"):
        assert mv.check("\\boxed{18}", gold).verdict == "correct", gold
    assert mv.check("\\boxed{1000}", "#### 1,000.").verdict == "correct"
    assert mv.check("The answer is 13", "The answer is: 13").verdict == "correct"  # prose golds still read as prose
