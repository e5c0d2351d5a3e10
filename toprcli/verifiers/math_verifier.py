"""MATH verifier: math-verify (HF) with our own bounds around it.

Gold: the ``answer`` column — a bare answer (``\\frac{1}{2}``, ``[1,2)``,
``\\text{Monday}``), a solution whose last ``\\boxed{}`` holds it, or a
GSM8K-style ``... #### n``. Prediction: the content of the completion's
**last** ``\\boxed{}``/``\\fbox{}``; when there is none, math-verify's own
extraction ("final answer is", ``$...$``, last number) over the last
:data:`MAX_TEXT_CHARS` characters. Then ``verify(gold, pred)`` — gold first,
the function is not symmetric.

How this stays bounded and safe (the pool's hard per-check limit is the real
guarantee; this keeps the common attacks cheap):

* math-verify's own timeouts use SIGALRM: they raise off the main thread and
  did not stop ``\\boxed{1E999999}`` (42 s) in a probe. They are disabled
  (``parsing_timeout=None``, ``timeout_seconds=None``); the pool kills a
  worker past its limit instead. Its ``TimeoutException`` is a
  ``BaseException``; the worker catches ``BaseException``.
* :func:`screen` rejects, before any parsing, candidates that are too long
  (> :data:`MAX_ANSWER_CHARS`), nest braces deeper than :data:`MAX_DEPTH`,
  write exponents ``1E1000`` and beyond, power towers whose value would have
  more than :data:`MAX_POWER_DIGITS` digits, or factorials of numbers above
  :data:`MAX_FACTORIAL`. A rejected prediction is ``incorrect`` (the model
  gave an answer; no MATH answer looks like that); a rejected gold is ``error``.
* math-verify's regexes are quadratic on long digit-and-space runs, hence the
  :data:`MAX_TEXT_CHARS` tail when there is no ``\\boxed{}``.
* No model text is evaluated as Python. math-verify hands sympy's
  ``parse_expr`` (which calls ``eval``) only strings of digits and operators;
  :func:`install_guards` enforces that inside our process, so a future
  math-verify that widened the path fails closed, and refuses any string
  reaching sympy's ``parse_expr`` by another path that names a builtin or a
  private/dunder attribute.
"""

from __future__ import annotations

import builtins
import functools
import logging
import math
import re

from toprcli.verifiers.base import ERROR, INCORRECT, NO_ANSWER, Verdict, clip_text, judged

MAX_TEXT_CHARS = 4_000  # tail of a completion without \boxed{} handed to math-verify
MAX_ANSWER_CHARS = 1_000  # a boxed answer longer than this is rejected
MAX_DEPTH = 50  # brace/parenthesis nesting
MAX_SCI_EXPONENT_DIGITS = 3  # 1E999 is allowed, 1E1000 is not
MAX_POWER_DIGITS = 100_000  # digits of the largest value a power tower may denote
MAX_FACTORIAL = 10_000

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_SCI_RE = re.compile(rf"\d\s*[eE]\s*[+-]?\s*0*(\d{{{MAX_SCI_EXPONENT_DIGITS + 1},}})")
_INT_RE = re.compile(r"\d+")
_EXP_LITERAL_RE = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*[+-]?\s*(\d+)")
_GROUP_FACT_RE = re.compile(r"[)}\]](?=\s*!)")
_FACT_NUM_RE = re.compile(r"(\d+)\s*!")
_TOKEN_RE = re.compile(r"\*\*|\^|\\left|\\right|[{}()\[\]]|\d+(?:\.\d+)?|\\?[A-Za-z]+|\s+|.", re.S)
_PLAIN_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
# Plain words are a text answer ("Monday", "even"), unless they could be math
# (two letters like "xy" are a product; "pi", "sin" are names sympy knows).
_WORDS_RE = re.compile(r"[A-Za-z]{3,}(?: [A-Za-z]+)*")
_MATH_NAMES = frozenset("pi inf infty oo sin cos tan cot sec csc log ln exp sqrt arcsin arccos arctan sinh cosh tanh".split())
# The only strings math-verify may hand to parse_expr: digits, spaces and
# arithmetic (its ExprExtractionConfig pattern, after it turns ^ into **).
_SAFE_EXPR_RE = re.compile(r"[\d\s.+\-*×/^()÷]*")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_BUILTIN_NAMES = frozenset(dir(builtins)) - {"True", "False", "None"}


# -- candidate extraction -------------------------------------------------------


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
    if "####" in answer:
        return answer.rsplit("####", 1)[1].strip()
    boxed = last_boxed(answer)
    return boxed if boxed is not None else answer.strip()


# -- screening ------------------------------------------------------------------


def _power_depth(text: str) -> int:
    """How many powers are stacked (``2^{3^4}`` → 2, ``9**9**9`` → 2, ``x^2+y^2`` → 1).

    Counts, at every exponent, the exponent groups it sits in plus the length of
    an unbraced chain ``a^b^c``. Linear in the text.
    """
    stack: list[bool] = []  # open groups: is it an exponent group?
    open_exp = 0
    chain = 0
    best = 0
    after_pow = False
    for m in _TOKEN_RE.finditer(text):
        t = m.group()
        if t.isspace() or t in ("\\left", "\\right"):
            continue
        if t in ("^", "**"):
            after_pow = True
            continue
        if t in "{([":
            stack.append(after_pow)
            if after_pow:
                open_exp += 1
                best = max(best, open_exp + chain)
            after_pow = False
            continue
        if t in "})]":
            if stack and stack.pop():
                open_exp -= 1
            after_pow = False
            continue
        if after_pow:
            chain += 1
            best = max(best, open_exp + chain)
        else:
            chain = 0
        after_pow = False
    return best


def _tower_digits(base: int, height: int) -> float:
    """log10 of a tower of ``height`` exponents, every level ``base`` (inf when absurd)."""
    if base <= 1 or height <= 0:
        return 0.0
    lg = math.log10(base)
    value = float(base)  # the topmost exponent
    digits = 0.0
    for level in range(height):
        digits = value * lg
        if digits > MAX_POWER_DIGITS or (level < height - 1 and digits > 300):
            return math.inf
        if level < height - 1:
            value = 10.0**digits
    return digits


def _int(text: str) -> int:
    return int(text) if len(text) < 20 else 10**19


def _computed_factorial(text: str) -> bool:
    """``(10^6)!``-like: a bracketed group followed by ``!`` that holds a power, a product or a big number."""
    for m in _GROUP_FACT_RE.finditer(text):
        close = m.start()
        depth = 0
        for i in range(close, max(-1, close - 200), -1):
            if text[i] in ")}]":
                depth += 1
            elif text[i] in "({[":
                depth -= 1
                if depth == 0:
                    group = text[i + 1 : close]
                    if any(op in group for op in ("^", "*", "\\times", "\\cdot")):
                        return True
                    if any(_int(x) > MAX_FACTORIAL for x in _INT_RE.findall(group)):
                        return True
                    break
        else:
            return True  # a group longer than 200 characters, then "!": not an answer
    return False


def screen(text: str, max_chars: int | None = MAX_ANSWER_CHARS) -> str | None:
    """Why ``text`` is too dangerous to parse, or None when it is fine. Linear time."""
    if max_chars is not None and len(text) > max_chars:
        return f"longer than {max_chars} characters"
    depth = 0
    for c in text:
        if c in "{([":
            depth += 1
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH}"
        elif c in "})]":
            depth = max(0, depth - 1)
    if _SCI_RE.search(text):
        return "exponent of 1000 or more in scientific notation"
    height = _power_depth(text)
    if height == 1:
        # One level: the exponent literal times the digits of the biggest number present.
        biggest = max((_int(x) for x in _INT_RE.findall(text)), default=2)
        exponent = max((_int(x) for x in _EXP_LITERAL_RE.findall(text)), default=0)
        if exponent * math.log10(max(biggest, 2)) > MAX_POWER_DIGITS:
            return f"power of more than {MAX_POWER_DIGITS} digits"
    elif height > 1:
        # A tower: assume every level is the biggest number present (conservative).
        biggest = max((_int(x) for x in _INT_RE.findall(text)), default=2)
        if _tower_digits(max(biggest, 2), height) > MAX_POWER_DIGITS:
            return f"power tower of more than {MAX_POWER_DIGITS} digits"
    for m in _FACT_NUM_RE.finditer(text):
        if _int(m.group(1)) > MAX_FACTORIAL:
            return f"factorial of a number above {MAX_FACTORIAL}"
    if _computed_factorial(text):
        return "factorial of a computed value"
    return None


# -- guards -----------------------------------------------------------------------


class UnsafeExpression(ValueError):
    """A string that would reach sympy's ``parse_expr`` (i.e. ``eval``) but is not plain arithmetic."""


_guarded_calls: list[str] = []  # strings seen by the strict guard (tests read it)


def install_guards() -> None:
    """Make sympy's ``eval`` paths refuse anything but plain arithmetic (idempotent)."""
    import latex2sympy2_extended.latex2sympy2 as l2s
    import math_verify.parser as mvp
    import sympy.parsing.sympy_parser as sp

    if getattr(mvp.parse_expr, "_toprcli_guard", False):
        return
    original = sp.parse_expr

    def strict_parse_expr(s, *args, **kwargs):
        _guarded_calls.append(s if isinstance(s, str) else repr(s))
        if not isinstance(s, str) or not _SAFE_EXPR_RE.fullmatch(s):
            raise UnsafeExpression(f"refusing to evaluate {clip_text(str(s), 60)!r}")
        return original(s, *args, **kwargs)

    def generic_parse_expr(s, *args, **kwargs):
        if isinstance(s, str):
            for name in _IDENT_RE.findall(s):
                if name.startswith("_") or name in _BUILTIN_NAMES:
                    raise UnsafeExpression(f"refusing to evaluate {clip_text(s, 60)!r}")
        return original(s, *args, **kwargs)

    strict_parse_expr._toprcli_guard = True  # type: ignore[attr-defined]
    generic_parse_expr._toprcli_guard = True  # type: ignore[attr-defined]
    mvp.parse_expr = strict_parse_expr  # the path that takes model text
    mvp.parse_expr_cached.cache_clear()
    sp.parse_expr = generic_parse_expr  # sympify(str) looks it up here at call time
    l2s.parse_expr = generic_parse_expr


@functools.lru_cache(maxsize=1)
def _lib():
    """Import math-verify once per process, quiet its 'timeout disabled' warning, install guards."""
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    install_guards()
    return math_verify


def _parse(text: str):
    return _lib().parse(text, parsing_timeout=None)


@functools.lru_cache(maxsize=256)
def parse_gold(answer: str):
    """Parsed gold, cached: the 16-32 samples of a prompt share it."""
    g = gold_text(answer)
    why = screen(g)
    if why:
        raise ValueError(f"gold answer rejected: {why}")
    if _PLAIN_NUMBER_RE.fullmatch(g):
        # A bare number (GSM8K-style golds): the plain-expression path is 3x cheaper than LaTeX.
        lib = _lib()
        return lib.parse(g, extraction_config=[lib.ExprExtractionConfig()], parsing_timeout=None)
    return _parse(_as_latex(g))


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

    boxed = last_boxed(completion)
    if boxed is not None:
        if not boxed.strip():
            return Verdict(NO_ANSWER, "")
        why = screen(boxed)
        if why:
            return Verdict(INCORRECT, clip_text(boxed), detail=f"rejected before parsing: {why}")
        pred = _parse(_as_latex(boxed))
        shown = boxed
    else:
        tail = completion[-MAX_TEXT_CHARS:]
        why = screen(tail, max_chars=None)
        if why:
            # math-verify may hand any number or $...$ of this text to sympy.
            return Verdict(INCORRECT, None, detail=f"rejected before parsing: {why}")
        pred = _parse(tail)
        shown = _shown(pred)
    if not pred:
        return Verdict(NO_ANSWER, clip_text(shown) if boxed is not None else None)
    ok = _lib().verify(gold, pred, timeout_seconds=None)
    return judged(bool(ok), shown)


def warmup() -> None:
    """Pay math-verify's first-call costs (lazy imports, regex compiles) before the first row."""
    check("The answer is $\\boxed{\\frac{1}{2}}$ or 0.5.", "\\frac{1}{2}")
    check("so 3 apples", "3")
