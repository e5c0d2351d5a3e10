"""What keeps the math verifier bounded and free of code execution.

Two layers around math-verify (the pool's hard per-check time limit is the
real guarantee; these keep the common attacks cheap and make them verdicts
instead of timeouts):

* :func:`screen` rejects, in linear time, an answer string that is too long,
  nests braces deeper than :data:`MAX_DEPTH`, writes exponents ``1E1000`` and
  beyond, power towers whose value would have more than
  :data:`MAX_POWER_DIGITS` digits, or factorials of numbers above
  :data:`MAX_FACTORIAL`. :func:`install_guards` applies it to every
  *candidate* math-verify is about to turn into a sympy object (its
  ``parse_latex_cached`` and ``parse_expr_cached``), after math-verify has
  chosen the candidate by its own priorities. A rejected candidate raises
  :class:`Rejected`, a ``BaseException`` so that math-verify's ``except
  Exception`` handlers do not swallow it and move on to a weaker candidate:
  the whole extraction stops there, and the caller decides the verdict.
  :func:`screening` sets the length limit: model text gets
  :data:`MAX_ANSWER_CHARS`, gold answers (trusted dataset text) none, the
  structural checks always.
* No model text is evaluated as Python. math-verify hands sympy's
  ``parse_expr`` (which calls ``eval``) only strings of digits and operators;
  :func:`install_guards` enforces that, so a future math-verify that widened
  the path fails closed, and refuses any string reaching sympy's
  ``parse_expr`` by another path that names a builtin or a private/dunder
  attribute. If math-verify no longer has the functions the guards wrap,
  installing them raises: the worker does not start rather than run unscreened.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import math
import re
from collections.abc import Iterator

from toprcli.verifiers.base import clip_text

MAX_ANSWER_CHARS = 1_000  # a candidate answer from model text longer than this is rejected
MAX_DEPTH = 50  # brace/parenthesis nesting
MAX_SCI_EXPONENT_DIGITS = 3  # 1E999 is allowed, 1E1000 is not
MAX_POWER_DIGITS = 100_000  # digits of the largest value a power tower may denote
MAX_FACTORIAL = 10_000

_SCI_RE = re.compile(rf"\d\s*[eE]\s*[+-]?\s*0*(\d{{{MAX_SCI_EXPONENT_DIGITS + 1},}})")
_INT_RE = re.compile(r"\d+")
_EXP_LITERAL_RE = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*[+-]?\s*(\d+)")
_GROUP_FACT_RE = re.compile(r"[)}\]](?=\s*!)")
_FACT_NUM_RE = re.compile(r"(\d+)\s*!")
_TOKEN_RE = re.compile(r"\*\*|\^|\\left|\\right|[{}()\[\]]|\d+(?:\.\d+)?|\\?[A-Za-z]+|\s+|.", re.S)
# The only strings math-verify may hand to parse_expr: digits, spaces and
# arithmetic (its ExprExtractionConfig pattern, after it turns ^ into **).
_SAFE_EXPR_RE = re.compile(r"[\d\s.+\-*×/^()÷]*")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_BUILTIN_NAMES = frozenset(dir(builtins)) - {"True", "False", "None"}


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


# -- candidate hooks ----------------------------------------------------------------


class Rejected(BaseException):
    """A candidate answer failed :func:`screen`.

    A ``BaseException`` on purpose: math-verify catches ``Exception`` around
    each candidate and would go on to a weaker one (an intermediate result).
    """

    def __init__(self, why: str, candidate: str) -> None:
        super().__init__(why)
        self.why = why
        self.candidate = candidate


# Length limit of the candidates screened now; model text unless a caller says otherwise.
_limit: list[int | None] = [MAX_ANSWER_CHARS]


@contextlib.contextmanager
def screening(max_chars: int | None) -> Iterator[None]:
    """Screen candidates with ``max_chars`` (None: no length limit, for trusted gold text)."""
    saved = _limit[0]
    _limit[0] = max_chars
    try:
        yield
    finally:
        _limit[0] = saved


def _check_candidate(text: object) -> None:
    if isinstance(text, str):
        why = screen(text, max_chars=_limit[0])
        if why:
            raise Rejected(why, text)


# -- guards -----------------------------------------------------------------------


class UnsafeExpression(ValueError):
    """A string that would reach sympy's ``parse_expr`` (i.e. ``eval``) but is not plain arithmetic."""


_guarded_calls: collections.deque[str] = collections.deque(maxlen=1000)  # the last strings the strict guard saw (tests read them)


def install_guards() -> None:
    """Screen math-verify's candidates and make sympy's ``eval`` paths refuse anything but arithmetic (idempotent)."""
    import latex2sympy2_extended.latex2sympy2 as l2s
    import math_verify.parser as mvp
    import sympy.parsing.sympy_parser as sp

    if getattr(mvp.parse_expr, "_toprcli_guard", False):
        return
    missing = [name for name in ("parse_expr", "parse_latex_cached", "parse_expr_cached") if not hasattr(mvp, name)]
    if missing:  # fail closed: never run math-verify without the screens
        raise RuntimeError(f"this math-verify has no {', '.join(missing)}: the math verifier cannot screen its input")
    original = sp.parse_expr
    parse_latex = mvp.parse_latex_cached
    parse_expr_cached = mvp.parse_expr_cached

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

    def screened_latex(latex, *args, **kwargs):
        _check_candidate(latex)
        return parse_latex(latex, *args, **kwargs)

    def screened_expr(expr, *args, **kwargs):
        _check_candidate(expr)
        return parse_expr_cached(expr, *args, **kwargs)

    strict_parse_expr._toprcli_guard = True  # type: ignore[attr-defined]
    generic_parse_expr._toprcli_guard = True  # type: ignore[attr-defined]
    mvp.parse_latex_cached = screened_latex  # every LaTeX candidate, after math-verify normalised it
    mvp.parse_expr_cached = screened_expr  # every plain-expression candidate
    parse_expr_cached.cache_clear()
    sp.parse_expr = generic_parse_expr  # sympify(str) looks it up here at call time
    l2s.parse_expr = generic_parse_expr
    mvp.parse_expr = strict_parse_expr  # the path that takes model text; set last: it marks the guards installed
