"""GSM8K verifier: read a number, compare it numerically with the gold number.

Gold: the number after ``#### `` in the ``answer`` column (the last ``####``),
or the whole value when it is a bare number.

Prediction, in order (flexible mode, the default):

1. the number after the first ``####`` that ends its line (what GSM8K solutions
   end with; text after it is the model rambling on; ``#### 1. Step one``,
   ``#### 1: Step one`` and ``#### 1) Step one`` are markdown headings), else after
   the first ``####`` that is not such a heading; the number may be bold, boxed,
   in ``\\( \\)`` or after an escaped ``\\$``,
2. the number after the first "the answer is" / "the final answer is", also
   in bold, ``$\\boxed{}$`` or ``\\( \\)``; when it begins a calculation
   ("the answer is 3 * 4 = 12"), the result its chain of ``=`` ends with (a
   ``####`` whose number a title follows, "#### 1 Eggs per day", is a heading when
   "the answer is" comes after it),
3. the number in the last ``\\boxed{}`` (``\\boxed{\\frac{1}{2}}`` too),
4. the last number in the completion.

``strict=True`` uses only (1). Numbers are compared exactly, as
:class:`~decimal.Decimal` (or a :class:`~fractions.Fraction` for ``a/b``: ``3/4``
is 0.75, not 3), after removing thousands separators (commas between groups of
three digits, LaTeX's ``1{,}000``, ``10,\\!000`` and ``1\\,000`` too; ``1,2`` is two
numbers), ``$`` and a trailing period, so ``18.00`` equals ``18`` and ``1,000``
equals ``1000``; no string equality.

Bounded time on any input: the number pattern has no nested quantifiers and
no exponent notation (``1e999999999`` reads as ``1``, then ``999999999``; a
Decimal is never built from an exponent), each regex scan is linear in the
text, and a Decimal of an n-digit literal is built and compared in O(n).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from toprcli.verifiers.base import ERROR, NO_ANSWER, Verdict, clip_text, judged

# A number as GSM8K writes it: optional sign and $, digits with optional
# thousands commas (digits in threes: 1,2 is two numbers), optional decimals, optional
# "/n" (3/4 is three quarters, not 3). ``−`` is the Unicode minus. A hyphen right
# after a word or a ")" is subtraction or a range (8-3, 2023-2024), not a sign.
_NUMBER = r"(?:(?<![\w)])[-−]\$?|\$[-−]?)?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:/\d+(?![\d.]))?"
_NUMBER_RE = re.compile(_NUMBER)
# What may wrap the number: bold, an escaped \$, a box or \( \) ("#### **18**", "is: $\boxed{18}$", "#### \$18").
_OPEN = r"[*_]*(?:\\(?=\$))?(?:(?:\$+[ \t]*)?(?:\\\(|\\\[|\\(?:boxed|fbox)\{)[ \t*_]*)?"
_CLOSE = r"(?:[ \t*_}$.]|\\[)\]])*"
# "#### 18" ending its line; else "#### 18 dollars", but a markdown heading ("#### 1. Eggs laid per day", "#### 1: Eggs",
# "#### 1) **Eggs**") is not the answer.
_HASH_RE = re.compile(r"####[ \t]*" + _OPEN + "(" + _NUMBER + r")(?![\d,]|[.:)][ \t]*[*_]*[^\W\d_])")
_HASH_LINE_RE = re.compile(r"####[ \t]*" + _OPEN + "(" + _NUMBER + ")" + _CLOSE + "$", re.M)
# A number, or a fraction as LaTeX writes it, signed or not ("\frac{1}{2}", "-\dfrac{3}{4}"): groups number | sign, top, bottom.
_VALUE = "(?:(" + _NUMBER + r")|(?:\$[ \t]*)?([-−]?)\\[dt]?frac\{(\d+)\}\{(\d+)\})"
# "The answer is 18", "Final answer: 18", also bold, boxed or in \( \): "The answer is **18**", "is: $\boxed{18}$",
# "**Final Answer:** $\frac{3}{4}$". One [*_]* next to another only across whitespace: linear.
_ANSWER_IS_RE = re.compile(r"(?i:the\s+(?:final\s+)?answer\s+is(?:\s*:)?|final\s+answer\s*:(?:[*_]+(?=\s))?)\s*" + _OPEN + _VALUE)
# The last box holding a number or a fraction ("\boxed{18}", "\boxed{-\frac{1}{2}}").
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\{[ \t$]*" + _VALUE + r"[ \t$.]*\}")
# LaTeX's thousands separators: 1{,}000, 10,\!000, 1\,000 (a thin space).
_LATEX_THOUSANDS_RE = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\,)(?=\d{3}(?!\d))")
_BARE_RE = re.compile(r"\s*(" + _NUMBER + r")\s*\.?\s*")
# A calculation right after "the answer is 3" ("3 * 4 = 12", "20+22=42"): an operator, then a number; its result is the
# number after the sentence's last "=", when nothing more is done to it. A new problem a model rambles on to.
_OPS = r"(?:[-−+*/×x÷·^]|\\(?:times|cdot|div))"
_CALCULATION_RE = re.compile(r"[ \t]*" + _OPS + r"[ \t]*(?:\$[ \t]*)?\d")
_RESULT_RE = re.compile(r"[ \t]*" + _OPEN + _VALUE)
_SENTENCE_END_RE = re.compile(r"\.(?!\d)|[\n!?;]")
_CLOSE_RE = re.compile(_CLOSE)
_TITLE_RE = re.compile(r"[ \t]*[*_]*[A-Z]")  # "#### 1 Eggs per day": a heading's title after its number ("#### 18 dollars": units)


def to_number(text: str) -> Decimal | Fraction | None:
    """A number's text as :func:`to_decimal`, and ``a/b`` as the fraction (None for /0 or over 100 digits a part)."""
    if "/" not in text:
        return to_decimal(text)
    top, bottom = (to_decimal(part) for part in text.rsplit("/", 1))
    if top is None or bottom is None or bottom == 0 or len(text) > 200:
        return None
    return Fraction(top) / Fraction(bottom)


def to_decimal(text: str) -> Decimal | None:
    """``"$1,234.50"`` → ``Decimal("1234.50")``; None when it is not a number."""
    s = text.strip().replace(",", "").replace("$", "").replace("−", "-").replace(" ", "")
    s = s.rstrip(".")
    if not s or s in "-+":
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    # Our pattern never yields an exponent, but the gold path accepts any text:
    # refuse what is not a plain finite decimal literal.
    return d if d.is_finite() and "e" not in s.lower() else None


def vote_key(answer: str) -> str | None:
    """The number an extracted answer says, as ``check`` compares it (``-$5``, ``−5``, ``-5.00`` are one vote)."""
    d = to_number(answer)
    if d is None:
        return None
    if isinstance(d, Fraction):  # as its decimal when it has one (1/2 votes with 0.5), else a/b in lowest terms
        exact = _exact_decimal(d)
        if exact is None:
            return f"{d.numerator}/{d.denominator}"
        d = exact
    if d == 0:
        return "0"  # -0 is 0
    return format(d.normalize(), "f") if abs(d.adjusted()) <= 100 else str(d.normalize())


def _exact_decimal(f: Fraction) -> Decimal | None:
    """``f`` as a decimal, when it has a finite one: its denominator's only prime factors are 2 and 5."""
    rest, twos, fives = f.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return None
    k = max(twos, fives)
    return Decimal(f"{f.numerator * (10**k // f.denominator)}E-{k}")  # from text: exact at any length


def gold_number(answer: str | None) -> Decimal | Fraction | None:
    if answer is None:
        return None
    answer = _LATEX_THOUSANDS_RE.sub(",", answer)
    if "####" in answer:
        m = _NUMBER_RE.search(answer.rsplit("####", 1)[1])
        return to_number(m.group(0)) if m else None
    m = _BARE_RE.fullmatch(answer)
    return to_number(m.group(1)) if m else None


def extract(completion: str, strict: bool = False) -> str | None:
    """The number text the model gave, or None."""
    completion = _LATEX_THOUSANDS_RE.sub(",", completion)
    m = _HASH_LINE_RE.search(completion)
    if m is None and (m := _HASH_RE.search(completion)) and not strict and _TITLE_RE.match(completion, m.end()):
        if said := _ANSWER_IS_RE.search(completion, m.end()):  # "#### 1 Eggs per day ... The answer is 18": a heading
            return _result(completion, said)
    if m:
        return m.group(1)
    if strict:
        return None
    m = _ANSWER_IS_RE.search(completion)
    if m:
        return _result(completion, m)
    box = None
    for box in _BOXED_RE.finditer(completion):
        pass
    if box is not None:  # a boxed answer, not a number said after it
        return _value(box)
    last = None
    for m in _NUMBER_RE.finditer(completion):
        last = m
    return last.group(0) if last else None


def _result(completion: str, m: re.Match) -> str:
    """The number said after "the answer is"; when it begins a calculation ("3 * 4 = 12", "$20+22=42$"), the result
    its chain of ``=`` ends with ("3 * 4 = 6 * 2 = 12"; "2 * 2 = 4 apples, then 5 = 6": 4). A chain that ends in a
    calculation left open ("3 * 4 = 6 * 2") leaves the number said, as does one the number said does not begin."""
    end = _SENTENCE_END_RE.search(completion, m.end())
    said = completion[m.end() : end.start() if end else len(completion)]
    if not _CALCULATION_RE.match(said):
        return _value(m)
    pos = said.find("=")
    while pos != -1:  # each step moves on past an "=": linear in the sentence
        r = _RESULT_RE.match(said, pos + 1)
        if r is None:
            break
        if _CALCULATION_RE.match(said, r.end()):  # "= 6 * 2 = 12": the chain goes on at its next "="
            pos = said.find("=", r.end())
        elif said.startswith("=", nxt := _CLOSE_RE.match(said, r.end()).end()):  # "= 12 = 12", past closers: bold, $, a box
            pos = nxt
        else:
            return _value(r)
    return _value(m)


def _value(m: re.Match) -> str:
    """A _VALUE match as number text: ``18``, or a LaTeX fraction as ``-1/2``."""
    return m.group(1) or f"{m.group(2)}{m.group(3)}/{m.group(4)}"


def check(completion: str, answer: str | None, row: dict | None = None, *, strict: bool = False) -> Verdict:
    gold = gold_number(answer)
    if gold is None:
        said = "gold answer is empty" if answer is None or not answer.strip() else f"gold answer has no '#### n' and is not a number: {clip_text(answer, 60)!r}"
        return Verdict(ERROR, detail=said)
    text = extract(completion, strict)
    if text is None:
        return Verdict(NO_ANSWER)
    pred = to_number(text)
    if pred is None:
        return Verdict(NO_ANSWER, clip_text(text.strip()))
    same = Fraction(pred) == Fraction(gold) if Fraction in (type(pred), type(gold)) else pred == gold  # exact, either way
    return judged(same, text.strip())


def check_strict(completion: str, answer: str | None, row: dict | None = None) -> Verdict:
    return check(completion, answer, row, strict=True)
