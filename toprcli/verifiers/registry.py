"""Resolve a ``--verifier`` spec string to a :class:`Verifier`.

Specs: ``gsm8k``, ``math``, ``exact``, ``regex:PATTERN``, ``python:MODULE:FUNCTION``, and
``data_source`` (verl datasets: each row's ``data_source`` names its verifier, through ``by_source``).
Every resolution error (unknown name, bad regex, a plugin that does not import
or is not callable) is a one-line :class:`~toprcli.errors.UserError`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from toprcli.errors import UserError
from toprcli.verifiers.base import Verifier, normalize_ws

BUILTIN = ("gsm8k", "math", "exact", "judge", "data_source")
SPEC_HELP = "gsm8k, math, exact, judge, data_source, regex:PATTERN or python:MODULE:FUNCTION"


def check_by_source(completion: str, answer: str | None, row: dict | None = None, *, checks: dict) -> Any:
    """The check the row's ``data_source`` names (score refuses unmapped sources before it starts)."""
    source = (row or {}).get("data_source")
    if source not in checks:
        raise ValueError(f"no verifier for data_source {source!r}")
    return checks[source](completion, answer, row)


def check_sources(sources: set[str | None], mapping: dict[str, str]) -> None:
    """Every data_source has a verifier in ``mapping`` (eval checks its examples' before it generates)."""
    if sources <= {None}:
        raise UserError("the data has no data_source values — --verifier data_source is for verl-format datasets; pick a verifier")
    if None in sources:  # a null is no name a mapping could hold
        raise UserError("some rows have no data_source value — --verifier data_source picks each row's verifier by it: fill it in, "
                        "or score with one verifier (--verifier math, gsm8k, ...)")
    unknown = sorted(str(s) for s in sources - set(mapping))
    if unknown:
        raise UserError(f"no verifier for data_source {', '.join(unknown)} — add it: --verifier-by-source {unknown[0]}=math (or gsm8k, exact)")


def _by_source(strict: bool, by_source: dict[str, str] | None) -> Verifier:
    mapping = dict(by_source or {})
    subs = {name: resolve_verifier(name, strict=strict) for name in sorted(set(mapping.values()))}
    if any(s.needs_row and s.row_columns is None for s in subs.values()):
        raise UserError("verifier_by_source: map data sources to gsm8k, math, exact or regex:PATTERN (plugins take the row themselves)")
    warmups = [s.warmup for s in subs.values() if s.warmup]
    return Verifier(
        "data_source", "data_source", functools.partial(check_by_source, checks={src: subs[v].check for src, v in mapping.items()}),
        {"strict": strict, "by_source": mapping}, needs_row=True, row_columns=("data_source",),
        chunk_size=min([s.chunk_size for s in subs.values()], default=64), preload=tuple(m for s in subs.values() for m in s.preload),
        warmup=(lambda: [w() for w in warmups]) if warmups else None,
    )


def resolve_verifier(spec: str, *, strict: bool = False, by_source: dict[str, str] | None = None) -> Verifier:
    """Build the verifier named by ``spec``; ``strict`` applies to gsm8k (require ``####``).

    Each verifier's module is imported here, when it is asked for: the math verifier pulls
    in sympy and math-verify (seconds, in every worker process), which a gsm8k run never needs.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty --verifier — choose one of: {SPEC_HELP}")
    spec = spec.strip()
    if spec == "data_source":
        return _by_source(strict, by_source)
    options: dict[str, Any] = {"strict": strict} if spec == "gsm8k" else {}
    if spec == "gsm8k":
        from toprcli.verifiers import gsm8k

        check = gsm8k.check_strict if strict else gsm8k.check
        return Verifier(
            "gsm8k-strict" if strict else "gsm8k", spec, check, options, chunk_size=512, preload=("toprcli.verifiers.gsm8k",),
            vote_key=gsm8k.vote_key,
        )
    if spec == "math":
        from toprcli.verifiers import math_verifier

        return Verifier(
            "math",
            spec,
            math_verifier.check,
            options,
            chunk_size=8,
            preload=("toprcli.verifiers.math_verifier", "math_verify", "sympy"),
            warmup=math_verifier.warmup,
            equivalent=math_verifier.equivalent,
        )
    if spec == "exact":
        from toprcli.verifiers import exact

        return Verifier("exact", spec, exact.check_exact, options, chunk_size=512, vote_key=normalize_ws)
    if spec == "judge":  # a generative verifier's Yes/No verdict against the row's label
        from toprcli.verifiers import judge

        return Verifier("judge", spec, judge.check, options, chunk_size=512, vote_key=normalize_ws)
    if spec.startswith("regex:"):
        from toprcli.verifiers import exact

        pattern = spec[len("regex:") :]
        if not pattern:
            raise UserError("empty pattern in --verifier regex: — write regex:PATTERN, e.g. 'regex:ANSWER: (\\S+)'")
        try:
            exact.compile_pattern(pattern)
        except (re.error, OverflowError, RecursionError) as e:  # a{99999999999}: too large a repeat, not a re.error
            raise UserError(f"bad regular expression in --verifier {spec!r}: {e} — fix the pattern") from None
        return Verifier("regex", spec, functools.partial(exact.check_regex, pattern=pattern), options, chunk_size=512, vote_key=normalize_ws)
    if spec.startswith("python:"):
        from toprcli.verifiers import plugins

        target = spec[len("python:") :]
        return Verifier(f"python:{target}", spec, plugins.make_check(target), options, needs_row=True, chunk_size=64)
    raise UserError(f"unknown verifier {spec!r} — choose one of: {SPEC_HELP}")
