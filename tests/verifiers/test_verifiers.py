"""Verifiers as plain functions (in-process): gsm8k, math, exact/regex, plugins, registry, rewards.

Isolation (worker processes, hard time limits) is tested in test_pool.py.
"""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from builders import gsm8k_rows, shifted_pairs
from toprcli.errors import UserError
from toprcli.verifiers import Rewards, Verdict, resolve_verifier, reward_of
from toprcli.verifiers import gsm8k
from toprcli.verifiers import math_verifier as mv

# -- gsm8k ----------------------------------------------------------------------


def test_gsm8k_every_gold_solution_is_correct_and_wrong_for_other_problems():
    rows = gsm8k_rows()
    assert len(rows) == 1319
    verdicts = [gsm8k.check(r["answer"], r["answer"]) for r in rows]
    assert sum(v.verdict == "correct" for v in verdicts) == 1319
    assert all(v.extracted_answer for v in verdicts)
    wrong = [gsm8k.check(c, a) for c, a in shifted_pairs(rows)]
    assert all(v.verdict == "incorrect" for v in wrong)


@pytest.mark.parametrize(
    "completion, answer, verdict, extracted",
    [
        ("so 16-3-4=9 and 9*2=18\n#### 18", "#### 18", "correct", "18"),
        ("#### 18.00", "... #### 18", "correct", "18.00"),
        ("#### $1,000.", "#### 1000", "correct", "$1,000"),
        ("#### -5", "#### -5", "correct", "-5"),
        ("#### −5", "-5", "correct", "−5"),  # Unicode minus
        ("#### 0.50", "0.5", "correct", "0.50"),
        ("The answer is 42.", "#### 42", "correct", "42"),
        ("the final answer is: $7", "7", "correct", "$7"),
        ("First 3 apples, then 4, total 7.", "#### 7", "correct", "7"),
        ("#### 18 and then 19 more words 20", "18", "correct", "18"),  # #### wins over the last number
        ("The answer is 5. Wait, 6", "#### 5", "correct", "5"),  # "the answer is" wins over the last number
        ("#### 17", "#### 18", "incorrect", "17"),
        ("x - 3", "3", "correct", "3"),  # a minus needs to touch the number
        ("so x-5 = 3, so 8-3", "5", "incorrect", "3"),  # subtraction, not a sign (was -3)
        ("from 2023-2024", "2024", "correct", "2024"),  # a range
        ("(2+3)-1 is 4, answer -4", "-4", "correct", "-4"),  # a sign after a space still is one
        ("1,234,567", "1234567", "correct", "1,234,567"),
        ("no digits here", "#### 4", "no_answer", None),
        ("", "#### 4", "no_answer", None),
        ("18", "18.000", "correct", "18"),
        ("1e999999999", "#### 1", "incorrect", "999999999"),  # no exponent notation, ever
        ("#### 1. Eggs per day\n16-3-4=9\n#### 2. Money\n9*2=18\n#### 18", "18", "correct", "18"),  # headings are not answers
        ("#### 1. Eggs per day\n16-3-4=9 eggs\nThe answer is 18.", "18", "correct", "18"),  # no "#### n" line: not the heading
        ("#### 12. Money\n9*2=18\n**Final answer:** $\\boxed{18}$", "18", "correct", "18"),  # (was 1, then 12's "1")
        ("#### 18 dollars in all", "18", "correct", "18"),  # words after the number: still the answer
        ("The answer is **18**.\nCheck: 9*2 = 18 > 3.", "18", "correct", "18"),  # bold (was the last number, 3)
        ("The final answer is: $\\boxed{18}$. Note 3 eggs.", "18", "correct", "18"),
        ("So the answer is \\(18\\), not 3", "18", "correct", "18"),
        # The number after #### as chat models decorate it (each was the later 3, and no_answer under --strict).
        ("#### **18**\n\nQuestion: Tom has 3 apples.", "18", "correct", "18"),
        ("#### \\$18\n\nQuestion: Tom has 3 apples.", "18", "correct", "$18"),
        ("#### $\\boxed{18}$\n\nStep 2 of 3", "18", "correct", "18"),
        ("#### \\(18\\)\nQ: 3", "18", "correct", "18"),
        # Headings in other forms (each was 1).
        ("#### 1. **Eggs laid per day**\n16-3-4=9\n#### $18 per day", "18", "correct", "$18"),
        ("#### 1: Eggs per day\n16-3-4=9\n#### 18 dollars", "18", "correct", "18"),
        ("#### 1) Eggs\n16-3-4=9\nThe answer is 18.", "18", "correct", "18"),
        # LaTeX's thousands separators (were 000, 1, 1).
        ("\\boxed{1{,}000}", "#### 1,000", "correct", "1,000"),
        ("The answer is $\\boxed{10,\\!000}$", "10000", "correct", "10,000"),
        ("The answer is 1\\,000", "1000", "correct", "1,000"),
        # A fraction is its value (3/4 was 3, correct for gold 3); commas group digits in threes (1,2 was 12).
        ("The answer is 3/4", "#### 3", "incorrect", "3/4"),
        ("The answer is 3/4", "#### 0.75", "correct", "3/4"),
        ("\\boxed{\\frac{1}{2}}", "0.5", "correct", "1/2"),
        ("So it is 1/0", "1", "no_answer", "1/0"),
        ("The answer is 1,2", "#### 12", "incorrect", "1"),
        # The last box, not a number after it (the last number was the answer).
        ("So she makes $\\boxed{18}$ dollars (9 eggs sold at $2).", "18", "correct", "18"),
        ("Final: \\boxed{18}. That is 2 more than 16.", "18", "correct", "18"),
        # A signed LaTeX fraction, and one after "the answer is" (were 2, and 4: the last number); "Final answer: n" (was 2).
        ("\\boxed{-\\frac{1}{2}}", "-0.5", "correct", "-1/2"),
        ("\\boxed{-\\frac{1}{2}}", "0.5", "incorrect", "-1/2"),
        ("The answer is $\\frac{3}{4}$", "#### 3/4", "correct", "3/4"),
        ("Final answer: 72\n\nNote: we used 2 months.", "72", "correct", "72"),
        ("**Final Answer:** 72 apples in 2 days", "72", "correct", "72"),
        # A calculation said as the answer is its result (each was its first operand: 3, 2, 20, $3), a result that is
        # itself a sum leaves the number said, and a "#### n Title" heading before "the answer is" is no answer (was 1).
        ("The answer is 3 * 4 = 12.", "12", "correct", "12"),
        ("So the answer is 2 x 21 = 42", "42", "correct", "42"),
        ("Final answer: 20+22=42", "42", "correct", "42"),
        ("The final answer is $3 \\times 4 = 12$", "12", "correct", "12"),
        ("The answer is $5 \\cdot 3 = \\boxed{15}$. Then 2 more.", "15", "correct", "15"),
        ("The answer is 42 = 6 * 7.", "42", "correct", "42"),
        ("The answer is 12, because x = 5", "12", "correct", "12"),
        ("The answer is 2 + 3", "5", "incorrect", "2"),  # no result said: nothing is computed from model text
        ("#### 1 Eggs per day\n16-3-4=9\nThe answer is 18", "18", "correct", "18"),
        # ... and where it must not: arithmetic after the answer, not begun by it; a dash; a ramble to a next problem.
        ("So the answer is **18**, since 16 − 3 − 4 = 9 eggs are sold", "18", "correct", "18"),
        ("The answer is 20 - note 5 * 4 = 20, not 5 + 4 = 9", "20", "correct", "20"),
        ("#### 18 dollars\nQuestion: Tom has 3 apples. The answer is 7", "18", "correct", "18"),
        ("Janet makes 18.\n#### 18 dollars\n\nQuestion 2: A robe takes 2 + 1 = 3. The answer is 3.", "18", "correct", "18"),
        ("#### 1 Understand the question\n**Question:** Janet...\n9*2=18\nThe answer is 18", "18", "correct", "18"),
        ("The answer is 1,000 * 2 = 2,000", "2000", "correct", "2,000"),
        ("The answer is 10. 10 x 2 = 20", "10", "correct", "10"),
        ("The answer is 60 = 15 - 20 minutes", "60", "correct", "60"),
        # The result is where the chain of "=" ends, not the sentence's last "=" (SmolLM2 went on: "... and so on to 3 * 2.3 = 6.6").
        ("The final answer is 23*0.12 = 2.3 equal parts and so on to 3 * 2.3 = 6.6", "2.3", "correct", "2.3"),
        ("The answer is 3 * 4 = 6 * 2 = 12", "12", "correct", "12"),
        ("The answer is 3 * 4 = **12**.", "12", "correct", "12"),
        ("The answer is 3 * 4 = 6 * 2", "12", "incorrect", "3"),  # left open: the number said
    ],
)
def test_gsm8k_reading_and_numeric_comparison(completion, answer, verdict, extracted):
    v = gsm8k.check(completion, answer)
    assert (v.verdict, v.extracted_answer) == (verdict, extracted)


def test_gsm8k_strict_requires_hashes():
    assert gsm8k.check("The answer is 4", "#### 4", strict=True).verdict == "no_answer"
    assert gsm8k.check("#### **18**\nQuestion: 3 apples", "#### 18", strict=True).verdict == "correct"  # decorated, still ####
    assert gsm8k.check("blah 4", "#### 4", strict=True).verdict == "no_answer"
    assert gsm8k.check("so #### 4", "#### 4", strict=True).verdict == "correct"
    assert gsm8k.check("#### 1. Eggs\nThe answer is 4", "#### 4", strict=True).verdict == "no_answer"  # a heading is no answer
    assert resolve_verifier("gsm8k", strict=True).check("The answer is 4", "4").verdict == "no_answer"


def test_gsm8k_gold_forms():
    assert gsm8k.gold_number("Janet ... #### 18") == 18
    assert gsm8k.gold_number("#### 1,200") == 1200
    assert gsm8k.gold_number(" 18 ") == 18
    assert gsm8k.gold_number("18.") == 18
    assert gsm8k.gold_number("eighteen") is None
    assert gsm8k.gold_number("1e5") is None  # a bare value must be a plain decimal
    assert gsm8k.gold_number("#### 1/2") == gsm8k.gold_number("1/2") == Fraction(1, 2)  # was 1, and an error
    assert [gsm8k.vote_key(a) for a in ("1/2", "2/4", "0.50", "1/3", "-3/4")] == ["0.5", "0.5", "0.5", "1/3", "-0.75"]
    assert gsm8k.gold_number(None) is None
    v = gsm8k.check("#### 4", "four")
    assert v.verdict == "error" and "gold" in v.detail
    assert (gsm8k.check("#### 4", None).verdict, gsm8k.check("#### 4", None).detail) == ("error", "gold answer is empty")  # was "...: None"


def test_gsm8k_is_fast_and_bounded_on_huge_inputs():
    nasty = [
        "1" * 100_000,
        "1," * 50_000,
        "#### " * 20_000,
        "#" * 100_000,
        "The answer is " * 7_000,
        "- $" * 30_000 + "5",
        "9" * 50_000 + "." + "9" * 50_000,
        "1e999999999 " * 8_000,
        "The answer is " + "_" * 8_000,  # was quadratic: 7.7 s, a timeout
        "The answer is " + "*" * 8_000,
        "The answer is" + " " * 8_000 + ":" + " " * 8_000 + "x",
        "Final answer:**" + " " * 8_000 + "*" * 8_000,
        "\\boxed{" * 20_000,
        "1/" * 50_000,
        "The answer is 3 * 4 = 12" + " " * 50_000 + "x",  # a calculation's result, checked past its closers in one pass
        "The answer is 3 * 4 =" + " 1 =" * 20_000,
        "#### 1 Title\n" + "The answer is 2 + " * 5_000,
        "The answer is 3 * 4 =" + " 1 * 2 =" * 10_000,
    ]
    t = time.perf_counter()
    for text in nasty:
        v = gsm8k.check(text, "#### 5")
        assert v.verdict in ("correct", "incorrect", "no_answer")
        assert v.extracted_answer is None or len(v.extracted_answer) <= 200
    assert time.perf_counter() - t < 2.0


# -- math ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("So $x = \\boxed{0.5}$.", "\\frac{1}{2}"),
        ("\\boxed{\\frac12}", "0.5"),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{[1,2)}", "[1,2)"),
        ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
        ("\\boxed{\\{3, 1, 2\\}}", "\\{1,2,3\\}"),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{3}}", "\\frac{1}{\\sqrt{3}}"),
        ("\\boxed{-7}", "-7"),
        ("the result is \\boxed{-\\frac{3}{4}}", "-0.75"),
        ("\\boxed{\\text{Monday}}", "\\text{Monday}"),
        ("\\boxed{\\text{Monday}}", "Monday"),
        ("\\boxed{Monday}", "\\text{Monday}"),
        ("\\boxed{\\text{even}}", "even"),
        ("\\boxed{\\pi}", "pi"),  # a math name is not a text answer
        ("\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}"),
        ("\\boxed{1+x^2}", "x^2+1"),
        ("First \\boxed{3}. That was wrong: I misread the question. Redone: \\boxed{5}.", "5"),  # the last box counts
        ("Solution ... The final answer is $\\boxed{12}$", "The sum is $\\boxed{12}$."),  # boxed gold solution
        ("#### 18", "Janet ... #### 18"),  # GSM8K-style gold
        ("She makes 18 dollars.", "18"),  # no box: math-verify's own extraction
        ("\\boxed{13}", "The answer is: 13"),  # a gold in words: read as math-verify reads prose (a product of symbols before)
        ("\\boxed{13}", "13 dollars"),
        ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}\\text{ inches}"),
    ],
)
def test_math_equivalences(completion, answer):
    v = mv.check(completion, answer)
    assert v.verdict == "correct", v


@pytest.mark.parametrize(
    "completion, answer, verdict",
    [
        ("\\boxed{0.51}", "\\frac{1}{2}", "incorrect"),
        ("\\boxed{[1,2]}", "[1,2)", "incorrect"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2,3\\}", "incorrect"),
        ("\\boxed{7}", "-7", "incorrect"),
        ("\\boxed{\\text{Tuesday}}", "\\text{Monday}", "incorrect"),
        ("\\boxed{5}, no wait \\boxed{3}", "5", "incorrect"),
        # Boxes listed together (close, or joined by a comma/and/or) are one set answer, as math-verify reads them.
        ("First \\boxed{3}, then, correcting myself, \\boxed{5}.", "5", "incorrect"),
        ("\\boxed{}", "5", "no_answer"),
        ("I do not know.", "5", "no_answer"),
        ("\\boxed{5}", None, "error"),
        ("\\boxed{7}", "The answer is: 13", "incorrect"),
        ("\\boxed{2}", "2 \\sqrt{3}", "incorrect"),  # LaTeX commands are not prose: the whole gold counts
    ],
)
def test_math_rejections(completion, answer, verdict):
    assert mv.check(completion, answer).verdict == verdict


def test_last_boxed_is_balanced_and_linear():
    assert mv.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert mv.last_boxed("\\fbox{7}") == "7"
    assert mv.last_boxed("no box") is None
    assert mv.last_boxed("\\boxed{unclosed {x}") == "unclosed {x}"
    t = time.perf_counter()
    mv.last_boxed("\\boxed{" * 20_000 + "}" * 100_000)
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize(
    "text, rejected",
    [
        ("9^{9^9}", True),
        ("9^9^9", True),
        ("9**9**9", True),
        ("x^{9^{9^{9}}}", True),
        ("3^{3^{3^3}}", True),
        ("10^{100000}", True),
        ("1000000^{1000000}", True),
        ("1E999999999", True),
        ("1e1000", True),
        ("100000!", True),
        ("(10^6)!", True),
        ("\\frac{1}{" * 60 + "2" + "}" * 60, True),
        ("1" * 1001, True),
        ("2^{2^{2^{2}}}", False),  # 2^16: fine
        ("e^{x^2}", False),
        ("x^2+123456789", False),
        ("1E999", False),
        ("(2n)!", False),
        ("10!", False),
        ("\\frac{1}{2}", False),
        ("[1,2)", False),
    ],
)
def test_screen(text, rejected):
    assert (mv.screen(text) is not None) == rejected, mv.screen(text)


def test_math_screen_rejections_are_incorrect_and_fast():
    t = time.perf_counter()
    for box in ("9^{9^9}", "1E999999999", "100000000!", "\\frac{1}{" * 500 + "2" + "}" * 500, "1" * 100_000):
        v = mv.check(f"\\boxed{{{box}}}", "2")
        assert v.verdict == "incorrect" and "rejected" in v.detail
    v = mv.check("The answer: 9**9**9", "2")  # unboxed text is screened as well
    assert v.verdict == "incorrect"
    assert mv.check("so", "9^{9^9}").verdict == "error"  # an absurd gold is the data's fault
    assert time.perf_counter() - t < 2.0


def test_no_model_text_reaches_eval(tmp_path, monkeypatch):
    """Python in \\boxed{} or plain text executes nothing, and sympy's eval only sees arithmetic."""
    monkeypatch.chdir(tmp_path)
    mv._lib()  # install the guards
    mv._guarded_calls.clear()
    payloads = [
        "__import__('os').system('touch pwned1')",
        "open('pwned2', 'w').write('x')",
        "exec(chr(111)+chr(112))",
        "(lambda: __import__('pathlib').Path('pwned3').touch())()",
        "[c for c in ().__class__.__base__.__subclasses__()]",
        "eval('1+1')",
    ]
    for p in payloads:
        for completion in (f"\\boxed{{{p}}}", f"The answer is {p}", f"answer: {p}", f"$${p}$$", p):
            v = mv.check(completion, "2")
            assert v.verdict in ("incorrect", "no_answer", "error")
        mv.check("The answer is 1+1", "2")  # an expression that does go through parse_expr
    assert not list(tmp_path.iterdir())
    assert "1+1" in mv._guarded_calls
    assert all(mv._SAFE_EXPR_RE.fullmatch(s) for s in mv._guarded_calls), mv._guarded_calls
    # And the guard refuses anything else, should math-verify ever widen that path.
    import math_verify.parser as mvp

    with pytest.raises(ValueError):
        mvp.parse_expr("__import__('os')")
    import sympy.parsing.sympy_parser as sp

    with pytest.raises(ValueError):
        sp.parse_expr("open('x')")
    assert sp.parse_expr("x + 1") is not None  # ordinary sympy use still works


# -- exact / regex / plugins --------------------------------------------------


def test_exact():
    check = resolve_verifier("exact").check
    assert check("  Paris \n", "Paris").verdict == "correct"
    assert check("New   York", "New York").verdict == "correct"
    assert check("paris", "Paris").verdict == "incorrect"
    assert check("   ", "Paris").verdict == "no_answer"
    assert check("Paris", " ").verdict == check("x", None).verdict == "error"  # an empty gold (was incorrect: wrong, not unchecked)
    assert resolve_verifier(r"regex:\d+").check("42", "").verdict == "error"


def test_regex():
    v = resolve_verifier(r"regex:ANSWER:\s*(.+)")
    assert v.check("blah\nANSWER:   New   York", "New York").verdict == "correct"
    assert v.check("ANSWER: Boston", "New York").extracted_answer == "Boston"
    assert v.check("nothing", "x").verdict == "no_answer"
    whole = resolve_verifier(r"regex:\d+")  # no group: the whole match
    assert whole.check("it is 42 or 43", "42").verdict == "correct"  # first match


def test_plugins(tmp_path, monkeypatch):
    (tmp_path / "myplug.py").write_text(
        "def check(completion, answer, row):\n"
        "    return completion == answer and row.get('prompt_id') == 'p'\n"
        "def score(completion, answer, row):\n"
        "    return 0.25 if completion else -0.5\n"
        "def none(completion, answer, row):\n"
        "    return None\n"
        "def bad(completion, answer, row):\n"
        "    return 'yes'\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    v = resolve_verifier("python:myplug:check")
    assert v.needs_row
    assert v.check("a", "a", {"prompt_id": "p"}).verdict == "correct"
    assert v.check("a", "a", {"prompt_id": "q"}).verdict == "incorrect"
    s = resolve_verifier("python:myplug:score").check
    assert s("x", None, {}) == Verdict("correct", score=0.25)
    assert s("", None, {}) == Verdict("incorrect", score=-0.5)
    assert resolve_verifier("python:myplug:none").check("x", None, {}).verdict == "no_answer"
    assert resolve_verifier("python:myplug:bad").check("x", None, {}).verdict == "error"
    by_path = resolve_verifier(f"python:{tmp_path / 'myplug.py'}:check")
    assert by_path.check("a", "a", {"prompt_id": "p"}).correct


def test_a_plugins_own_verdict_is_checked_like_a_bare_return():
    """A returned Verdict passed through unchecked: a NaN or infinite score became the reward, one beyond float32
    became inf when stored, and an int extracted answer crashed the shard's write after all of it was verified."""
    from toprcli.verifiers.base import from_plugin_result

    for score in (float("nan"), float("inf"), 1e39, "high"):
        v = from_plugin_result(Verdict("incorrect", score=score))
        assert v.verdict == "error" and "score" in v.detail
    assert from_plugin_result(Verdict("correct", extracted_answer=42, score=2)) == Verdict("correct", extracted_answer="42", score=2.0)
    assert from_plugin_result(1e39).verdict == "error" and from_plugin_result(-3).score == -3.0


def test_a_verl_reward_dict_is_correct_by_its_acc_and_answers_with_its_pred():
    """verl's {"score": 0.1, "acc": False} (a format bonus on a wrong answer) was counted correct (score > 0): curate's
    positives, pairs and p̃ read `correct`. A dict without "score" was "expected bool or float"."""
    from toprcli.verifiers.base import from_plugin_result

    assert from_plugin_result({"score": 0.1, "acc": False, "pred": 12}) == Verdict("incorrect", extracted_answer="12", score=0.1)
    assert from_plugin_result({"score": 0.0, "acc": True}).verdict == "correct"
    assert from_plugin_result({"score": 1.0}) == Verdict("correct", score=1.0)  # no acc: by the score, as before
    assert from_plugin_result({"score": None, "acc": True}).verdict == "no_answer"
    missing = from_plugin_result({"reward": 1.0})
    assert missing.verdict == "error" and "without a 'score' key (keys: reward)" in missing.detail


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nope", "unknown verifier"),
        ("", "empty --verifier"),
        ("regex:([a-z", "bad regular expression"),
        ("regex:a{99999999999}", "bad regular expression"),  # an OverflowError, not a re.error: it was a traceback
        ("regex:", "empty pattern"),
        ("python:no_such_module_xyz:f", "does not import"),
        ("python:json:no_such_fn", "has no attribute"),
        ("python:json", "bad plugin spec"),
        ("python:toprcli.verifiers.base:MAX_EXTRACTED_CHARS", "not callable"),
        ("python:/no/such/file.py:f", "not found"),
    ],
)
def test_resolution_errors_are_one_line_user_errors(spec, words):
    with pytest.raises(UserError) as e:
        resolve_verifier(spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_plugin_that_raises_at_import_is_a_user_error(tmp_path, monkeypatch):
    (tmp_path / "brokenplug.py").write_text("raise SystemExit('no')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="does not import"):
        resolve_verifier("python:brokenplug:f")


# -- rewards ---------------------------------------------------------------------


def test_rewards():
    r = Rewards(correct=2.0, incorrect=-1.0, no_answer=-0.5)
    assert reward_of(Verdict("correct"), r) == 2.0
    assert reward_of(Verdict("incorrect"), r) == -1.0
    assert reward_of(Verdict("no_answer"), r) == -0.5
    assert reward_of(Verdict("timeout"), r) == -1.0
    assert reward_of(Verdict("error"), r) == -1.0
    assert reward_of(Verdict("correct", score=0.3), r) == 0.3  # plugin float = the reward
    assert reward_of(Verdict("incorrect", score=-0.2), r) == -0.2
    assert reward_of(Verdict("correct"), Rewards()) == 1.0 and reward_of(Verdict("incorrect"), Rewards()) == -1.0
