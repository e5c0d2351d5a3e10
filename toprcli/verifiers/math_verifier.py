"""MATH verifier: math-verify (HF) choosing and comparing answers, our bounds around it.

Gold (the ``answer`` column, trusted dataset text):

* ``... #### n`` (GSM8K-style): the number after the last ``####``;
* text with math in it (``$...$``, ``\\(...\\)``, ``\\[...\\]``, ``\\boxed{}``),
  e.g. a worked solution: read as math-verify reads it (its priorities; several
  boxes listed together are one set answer), whatever its length;
* otherwise a bare answer (``\\frac{1}{2}``, ``[1,2)``, ``Monday``, ``x^2+1``):
  read whole, as if boxed. math-verify alone would read ``1,-2`` as ``1`` and
  ``x^2+1`` not at all. ``1,22`` is ambiguous (a pair, or 1.22 written with a
  decimal comma, math-verify's reading): both readings are accepted.

Prediction: math-verify's own extraction over the completion, so its
priorities decide which candidate is the answer: "final answer is X. I hope",
then final-answer statements and ``\\boxed{}`` alike, the rightmost first
(math-verify reads every bare ``\\boxed{}`` of the text together as one set:
a completion that boxes 2, corrects itself and boxes 3 answers {2, 3}, which
is wrong for gold 3; boxes each inside ``$...$`` are read apart), then "answer: X", then the last
``$...$`` or number. Only the last :data:`MAX_TEXT_CHARS` characters are read
(math-verify's regexes are quadratic on long digit runs), reaching back to the
last ``\\boxed{}`` when it is earlier, up to :data:`MAX_BOXED_WINDOW`; a box
further back is read with the :data:`MAX_TEXT_CHARS` after it, then the tail.
Then ``verify(gold, pred)`` — gold first, the function is not symmetric.

Safety (see :mod:`toprcli.verifiers.math_safety`): every candidate math-verify
is about to parse is screened first; a rejected candidate makes the prediction
``incorrect`` (the model gave an answer; no MATH answer looks like that) and a
rejected gold ``error``. math-verify's own timeouts use SIGALRM: they raise
off the main thread and did not stop ``\\boxed{1E999999}`` (42 s) in a probe.
They are disabled (``parsing_timeout=None``, ``timeout_seconds=None``); the
pool kills a worker past its limit instead. Its ``TimeoutException`` is a
``BaseException``; the worker catches ``BaseException``.

:func:`equivalent` compares two extracted answers (both read as bare answers)
for majority voting.
"""

from __future__ import annotations

import functools
import logging
import re

from toprcli.verifiers.base import CORRECT, ERROR, INCORRECT, NO_ANSWER, Verdict, clip_text, judged
from toprcli.verifiers.math_safety import (  # noqa: F401  (re-exported: tests and callers use them here)
    _SAFE_EXPR_RE,
    MAX_ANSWER_CHARS,
    MAX_DEPTH,
    MAX_FACTORIAL,
    MAX_POWER_DIGITS,
    Rejected,
    _guarded_calls,
    install_guards,
    screen,
    screening,
)

MAX_TEXT_CHARS = 4_000  # tail of a completion handed to math-verify
MAX_BOXED_WINDOW = 16_000  # how far back the window may reach to take in the last \boxed{}

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Math in running text: an unescaped $, \( or \[, or a box.
_DELIMITED_RE = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\(?:boxed|fbox)\b")
# A box holding only a constant's name: LaTeX would read \boxed{pi} as the product i·p.
_BOXED_NAME_RE = re.compile(r"(\\(?:boxed|fbox)\s*\{\s*)(pi|infty|inf)(\s*\})")
_PLAIN_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_COMMA_NUMBER_RE = re.compile(r"-?\d+,\d+")
# Plain words are a text answer ("Monday", "even"), unless they could be math
# (two letters like "xy" are a product; "pi", "sin" are names sympy knows).
_WORDS_RE = re.compile(r"[A-Za-z]{3,}(?: [A-Za-z]+)*")
_PROSE_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")  # a word, not a LaTeX command (\\frac)
# A command's own argument is no prose: \begin{pmatrix}, \text{ inches}, \mathrm{cm}.
_COMMAND_ARG_RE = re.compile(r"\\(?:begin|end|text\w*|mbox|math\w+|operatorname)\s*\{[^{}]*\}")
_MATH_NAMES = frozenset("pi inf infty oo sin cos tan cot sec csc log ln exp sqrt arcsin arccos arctan sinh cosh tanh".split())


# -- reading text ---------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}``, braces balanced; None if absent.

    Linear: one regex pass to find the last opening, one brace scan after it.
    An unclosed box yields what follows it.
    """
    start = None
    for m in _BOXED_RE.finditer(text):
        start = m
    if start is None:
        return None
    i = start.end()
    depth = 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return text[i:]


def _as_latex(answer: str) -> str:
    """Wrap a bare answer for math-verify; plain words become ``\\text{}`` (not a product of symbols)."""
    a = answer.strip().strip("$").strip()
    if a in _MATH_NAMES:
        a = "\\" + a  # "pi" → \pi (LaTeX would read a product of symbols i·p)
    elif _WORDS_RE.fullmatch(a) and a.split(" ", 1)[0].lower() not in _MATH_NAMES:
        a = "\\text{" + a + "}"
    return "$\\boxed{" + a + "}$"


def gold_text(answer: str) -> str:
    """The answer part of a gold that math-verify's own extraction did not read: after ``####`` (to the end of its line,
    as gsm8k reads it), the last box, or all; a sentence's final period is not part of it (``18.``)."""
    if "####" in answer:
        text = answer.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    else:
        boxed = last_boxed(answer)
        text = boxed if boxed is not None else answer.strip()
    return text.strip().removesuffix(".").rstrip() if not text.strip().endswith("..") else text.strip()


def window(completion: str) -> str:
    """The part of a completion math-verify reads: the tail, reaching back to the last box (linear)."""
    n = len(completion)
    start = max(0, n - MAX_TEXT_CHARS)
    if start == 0:
        return completion
    last = None
    for m in _BOXED_RE.finditer(completion):
        last = m
    if last is not None and last.start() < start:
        if last.start() >= n - MAX_BOXED_WINDOW:
            return completion[last.start() :]
        # Far back: the box's neighbourhood and the tail, each MAX_TEXT_CHARS long.
        return completion[last.start() : last.start() + MAX_TEXT_CHARS] + "\n\n" + completion[start:]
    # Start on a line boundary when one is near, not inside a $...$ of the cut line, but never past the last box.
    newline = completion.find("\n", start, start + 500)
    begin = newline + 1 if newline != -1 else start
    return completion[min(begin, last.start()) if last is not None else begin :]


# -- math-verify ------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _lib():
    """Import math-verify once per process, quiet its 'timeout disabled' warning, install guards."""
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    install_guards()
    return math_verify


def _parse(text: str):
    return _lib().parse(text, parsing_timeout=None)


def _parse_bare(answer: str):
    """A bare answer (no surrounding text), read whole."""
    if _PLAIN_NUMBER_RE.fullmatch(answer):
        # A bare number (GSM8K-style golds): the plain-expression path is 3x cheaper than LaTeX.
        lib = _lib()
        return lib.parse(answer, extraction_config=[lib.ExprExtractionConfig()], parsing_timeout=None)
    if not _WORDS_RE.fullmatch(answer.strip().strip("$").strip()) and any(
            w.lower() not in _MATH_NAMES and w != "and" for w in _PROSE_RE.findall(_COMMAND_ARG_RE.sub(" ", answer))):  # "-2 and 1": a list
        # Words around an answer ("The answer is: 13", "13 dollars"): as LaTeX they would be a product
        # of symbols no prediction equals; math-verify's extraction reads the answer out of the prose.
        parsed = _parse(answer)
        if parsed:
            return parsed
    return _parse(_as_latex(answer))


@functools.lru_cache(maxsize=256)
def parse_gold(answer: str):
    """Parsed gold, cached: the 16-32 samples of a prompt share it. Raises ValueError when screened out.

    Gold is dataset text: candidates get the structural screens (an absurd
    power would hang every worker that meets it) but no length limit.
    """
    try:
        with screening(None):
            if "####" not in answer and _DELIMITED_RE.search(answer):
                parsed = _parse(answer)
                if parsed:
                    return parsed
            g = gold_text(answer)
            parsed = _parse_bare(g)
            if _COMMA_NUMBER_RE.fullmatch(g):
                # "1,22": a pair, or 1.22 with a decimal comma (math-verify's reading); either is accepted.
                lib = _lib()
                parsed = parsed + lib.parse(g, extraction_config=[lib.ExprExtractionConfig()], parsing_timeout=None)
            return parsed
    except Rejected as r:
        raise ValueError(f"gold answer rejected: {r.why}") from None


def _shown(parsed) -> str | None:
    """What was read: math-verify's matched string (last element), else the expression."""
    if not parsed:
        return None
    for item in reversed(parsed):
        if isinstance(item, str):
            return item
    return str(parsed[0])


def check(completion: str, answer: str | None, row: dict | None = None) -> Verdict:
    if answer is None or not answer.strip():
        return Verdict(ERROR, detail="gold answer is empty")
    try:
        gold = parse_gold(answer)
    except ValueError as e:
        return Verdict(ERROR, detail=str(e))
    if not gold:
        return Verdict(ERROR, detail=f"math-verify could not parse the gold answer {clip_text(answer, 60)!r}")
    text = _BOXED_NAME_RE.sub(r"\1\\\2\3", window(completion))
    try:
        with screening(MAX_ANSWER_CHARS):
            pred = _parse(text)
    except Rejected as r:
        return Verdict(INCORRECT, clip_text(r.candidate), detail=f"rejected before parsing: {r.why}")
    if not pred:
        return Verdict(NO_ANSWER)
    ok = _lib().verify(gold, pred, timeout_seconds=None)
    return judged(bool(ok), _shown(pred))


@functools.lru_cache(maxsize=1024)
def _parse_answer(answer: str):
    """An extracted answer (model text) read as a bare answer; [] when screened out."""
    try:
        with screening(MAX_ANSWER_CHARS):
            return _parse_bare(answer.strip())
    except Rejected:
        return []


def equivalent(a: str, b: str) -> Verdict:
    """Do two extracted answers say the same thing? ``correct`` if so (either direction of ``verify``)."""
    if a.strip() == b.strip():
        return Verdict(CORRECT)
    pa, pb = _parse_answer(a), _parse_answer(b)
    if not pa or not pb:
        return Verdict(INCORRECT)
    verify = _lib().verify
    same = verify(pa, pb, timeout_seconds=None) or verify(pb, pa, timeout_seconds=None)
    return Verdict(CORRECT if same else INCORRECT)


def warmup() -> None:
    """Pay math-verify's first-call costs (lazy imports, regex compiles) before the first row."""
    check("The answer is $\\boxed{\\frac{1}{2}}$ or 0.5.", "\\frac{1}{2}")
    check("so 3 apples", "3")
    equivalent("\\frac{1}{2}", "0.5")
