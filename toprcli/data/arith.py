"""Built-in synthetic arithmetic task (``arith``), GSM8K-style.

Reads and writes no files: problems are generated in memory from a seed.

Each problem is a dict ``{"id", "question", "answer"}``. The question is short
("What is 47 + 38?") and the gold answer shows its working, one step per line,
and ends with a GSM8K final-answer line::

    47 + 38 = 85
    #### 85

Levels (all intermediate values stay >= 0):

1. two operands in 0..30, ``+`` or ``-``
2. two 2-digit operands (10..99), ``+`` or ``-``
3. three 2-digit operands, two ``+``/``-`` steps
4. one small product (2..9 times 2..20), alone or combined with a 2-digit
   operand by ``+``/``-``; the product is worked out first

Train/test splits are disjoint by construction: a problem belongs to ``test``
when a hash of its question text falls in the lowest ``TEST_FRACTION`` of the
hash range, else to ``train``. The assignment depends on the question text only
(not on the seed or the level), so no seed or level mix can leak a test
question into training. The seed only chooses which problems, and in what
order, a call returns.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Iterator

from toprcli.errors import UserError

SPLITS = ("train", "test")
LEVELS = (1, 2, 3, 4)
TEST_FRACTION = 0.15
# Levels whose space is at most this many candidate problems are enumerated
# once (cached); bigger ones are sampled by rejection.
_ENUMERATE_LIMIT = 300_000

# A problem as generated: (question expression, working lines, final value).
_Problem = tuple[str, list[str], int]


def _split_of(question: str) -> str:
    """'test' or 'train', from a stable hash of the question text."""
    h = int.from_bytes(hashlib.blake2b(question.encode(), digest_size=8).digest(), "big")
    return "test" if h < TEST_FRACTION * 2**64 else "train"


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def _chain(operands: list[int], ops: list[str]) -> _Problem | None:
    """Left-to-right add/sub chain; None if any partial result is negative."""
    expr = str(operands[0])
    acc = operands[0]
    steps = []
    for op, x in zip(ops, operands[1:]):
        new = _apply(acc, op, x)
        if new < 0:
            return None
        steps.append(f"{acc} {op} {x} = {new}")
        expr += f" {op} {x}"
        acc = new
    return expr, steps, acc


# --- level spaces: size and a decoder from an index to a problem (or None) ---


def _decode_2op(lo: int, hi: int) -> Callable[[int], _Problem | None]:
    width = hi - lo + 1

    def decode(i: int) -> _Problem | None:
        i, op = divmod(i, 2)
        a, b = divmod(i, width)
        return _chain([lo + a, lo + b], ["+-"[op]])

    return decode


def _decode_3op(i: int) -> _Problem | None:
    i, ops = divmod(i, 4)
    i, c = divmod(i, 90)
    a, b = divmod(i, 90)
    return _chain([10 + a, 10 + b, 10 + c], ["+-"[ops & 1], "+-"[ops >> 1]])


# Level 4 forms: p = x * y with x in 2..9, y in 2..20; c in 10..99.
_L4_FORMS = ("p", "p+c", "p-c", "c+p", "c-p")


def _decode_mul(i: int) -> _Problem | None:
    i, form = divmod(i, len(_L4_FORMS))
    i, c = divmod(i, 90)
    x, y = divmod(i, 19)
    x, y, c = x + 2, y + 2, c + 10
    kind = _L4_FORMS[form]
    p = x * y
    product = f"{x} * {y}"
    first = f"{product} = {p}"
    if kind == "p":
        return (product, [first], p) if c == 10 else None  # c unused: keep one copy
    if kind in ("p+c", "p-c"):
        op = kind[1]
        value = _apply(p, op, c)
        expr, second = f"{product} {op} {c}", f"{p} {op} {c} = {value}"
    else:
        op = kind[1]
        value = _apply(c, op, p)
        expr, second = f"{c} {op} {product}", f"{c} {op} {p} = {value}"
    if value < 0:
        return None
    return expr, [first, second], value


_SPACES: dict[int, tuple[int, Callable[[int], _Problem | None]]] = {
    1: (31 * 31 * 2, _decode_2op(0, 30)),
    2: (90 * 90 * 2, _decode_2op(10, 99)),
    3: (90 * 90 * 90 * 4, _decode_3op),
    4: (8 * 19 * 90 * len(_L4_FORMS), _decode_mul),
}


def _key(expr: str) -> str:
    return expr.replace(" ", "").replace("+", "p").replace("-", "m").replace("*", "x")


def _record(level: int, problem: _Problem) -> dict:
    expr, steps, value = problem
    return {
        "id": f"arith-L{level}-{_key(expr)}",
        "question": f"What is {expr}?",
        "answer": "\n".join(steps) + f"\n#### {value}",
    }


def _iter_split(level: int, split: str) -> Iterator[tuple[int, _Problem]]:
    size, decode = _SPACES[level]
    for i in range(size):
        p = decode(i)
        if p is not None and _split_of(f"What is {p[0]}?") == split:
            yield i, p


@functools.lru_cache(maxsize=16)
def _all_indices(level: int, split: str) -> tuple[int, ...]:
    """Indices (into the level's space) of every problem in ``split``, in order."""
    return tuple(i for i, _ in _iter_split(level, split))


def num_problems(split: str, level: int = 2) -> int:
    """How many distinct problems ``split`` holds at ``level`` (level 3 enumerates: ~7 s, cached)."""
    _check(split, level)
    return len(_all_indices(level, split))


def _check(split: str, level: int) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown arith split {split!r} — use one of: {', '.join(SPLITS)}")
    if not isinstance(level, int) or isinstance(level, bool) or level not in LEVELS:
        raise UserError(f"unknown arith level {level!r} — use an integer from 1 to {LEVELS[-1]}")


def arith_problems(split: str, n: int, *, seed: int = 0, level: int = 2, at_most: bool = False) -> list[dict]:
    """``n`` distinct problems of ``split`` at ``level``, chosen and ordered by ``seed``.

    Returns dicts with keys ``id`` (``arith-L<level>-<key>``, stable: the same
    problem always has the same id), ``question`` and ``answer`` (working lines
    then ``#### <value>``). Deterministic in (split, n, seed, level).
    Raises UserError for an unknown split or level, a negative n, or an n larger
    than the number of distinct problems in the split (``at_most``: all of them).
    """
    _check(split, level)
    if not isinstance(n, int) or n < 0:
        raise UserError(f"arith problem count must be a non-negative integer, got {n!r} — pass n >= 0")
    size, decode = _SPACES[level]
    rng = random.Random(f"arith/L{level}/{split}/{seed}")

    if size > _ENUMERATE_LIMIT and n <= size // 50:
        # Big space, few problems: rejection sampling finds them quickly
        # (valid and in-split is a sizeable fraction of the space).
        chosen: dict[int, _Problem] = {}
        while len(chosen) < n:
            i = rng.randrange(size)
            if i in chosen:
                continue
            p = decode(i)
            if p is not None and _split_of(f"What is {p[0]}?") == split:
                chosen[i] = p
        return [_record(level, p) for p in chosen.values()]

    indices = _all_indices(level, split)
    n = min(n, len(indices)) if at_most else n
    if n > len(indices):
        raise UserError(
            f"asked for {n} arith problems but level {level} has only {len(indices)} "
            f"distinct {split} problems — lower n or pick another level"
        )
    picked = rng.sample(indices, n)
    return [_record(level, decode(i)) for i in picked]  # type: ignore[arg-type]
