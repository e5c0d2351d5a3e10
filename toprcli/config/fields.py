"""A config field declared once (:func:`opt`: default, help, flag, check), and plain data made into a
config strictly (:func:`from_dict`: every unknown or moved key named in one error, each value
converted to its field's type and checked, then the dataclass's own ``check()``)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from typing import Any, Literal

import yaml

from toprcli.errors import UserError


class ConfigError(UserError):
    """A config key or value a user got wrong."""


def opt(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, flag: str | None = None,
        short: str | None = None, cli: bool = True, check: dict | None = None) -> Any:
    """A config field: default (or ``factory``), help, ``flag`` (default ``--name``; a bool gets ``--x/--no-x``,
    or write ``"--strict/--flexible"``), ``cli=False`` for no flag (``--set`` reaches it), a ``check`` below."""
    meta = {"help": help, "cli": cli, "flag": flag, "short": short, **(check or {})}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _check(predicate, allowed: str) -> dict:
    """A check: a predicate, and words saying what is allowed."""
    return {"check": predicate, "allowed": allowed}


def choice(options, what: str = "one of") -> dict:
    """A check: a string that must be one of ``options`` (a registry's names)."""
    options = tuple(options)
    return {**_check(lambda v: v in options, f"{what} {', '.join(repr(o) for o in options)}"), "choices": options}


FINITE = _check(math.isfinite, "a finite number")
REWARD = _check(lambda v: math.isfinite(v) and abs(v) <= 3.4028234663852886e38, "a finite number within float32's range (rewards are stored as float32)")
POSITIVE = _check(lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
NON_NEGATIVE = _check(lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
AT_LEAST_ONE = _check(lambda v: v >= 1, "an integer >= 1")
UNIT_OPEN = _check(lambda v: 0 < v < 1, "a number strictly between 0 and 1")
UNIT_HALF_OPEN = _check(lambda v: 0 < v <= 1, "a number in (0, 1]")
TOP_K = _check(lambda v: v == -1 or v >= 1, "-1 (off) or an integer >= 1")
MIN_P = _check(lambda v: 0 <= v < 1, "a number in [0, 1) (0 = off)")
SEED = _check(lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)")  # what torch and numpy seed with
PATH = {"path": True}  # a path written to: a leading ~ is the home dir (YAML and `--out=~/x` reach us unexpanded)


def alternatives(tp: Any) -> list[Any]:
    """The types a field may hold besides None: a union's members (``float | str | None`` → float, str), else ``[tp]``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def describe(tp: Any) -> str:
    """What a type accepts, in words."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        parts = [describe(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in typing.get_args(tp) else "")
    if origin is list:
        return f"a list of {describe(typing.get_args(tp)[0])}"
    if origin is dict and typing.get_args(tp)[1] is not Any:
        return f"a mapping of {describe(typing.get_args(tp)[0])} to {describe(typing.get_args(tp)[1])}"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


_MISSING = object()


def _coerce(tp: Any, value: Any) -> Any:
    """``value`` converted to ``tp``, or _MISSING when it does not fit."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        return value if value in typing.get_args(tp) else _MISSING
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None if type(None) in typing.get_args(tp) else _MISSING
        outs = (_coerce(a, value) for a in typing.get_args(tp) if a is not type(None))
        return next((o for o in outs if o is not _MISSING), _MISSING)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return _MISSING
        items = [_coerce(typing.get_args(tp)[0], v) for v in value]
        return _MISSING if any(i is _MISSING for i in items) else items
    if origin is dict:  # its keys and values are of its types too (a verifier name 5 crashed score)
        if not isinstance(value, dict):
            return _MISSING
        pairs = [(_coerce(typing.get_args(tp)[0], k), _coerce(typing.get_args(tp)[1], v)) for k, v in value.items()]
        return _MISSING if any(_MISSING in pair for pair in pairs) else dict(pairs)
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else _MISSING  # a mapping is built by _build, over its default
    if tp in (bool, int, str):  # that type only: a bool is no int
        return value if isinstance(value, tp) and (tp is bool or not isinstance(value, bool)) else _MISSING
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 5e-7 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _MISSING
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _MISSING
    return value


def sections(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are config dataclasses themselves (its sections)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def leaf_paths(cls: type, prefix: str = "") -> list[str]:
    """Every settable key of ``cls``, dotted (``sampling.top_p``), sections expanded."""
    subs = sections(cls)
    out = []
    for f in dataclasses.fields(cls):
        out += leaf_paths(subs[f.name], f"{prefix}{f.name}.") if f.name in subs else [prefix + f.name]
    return out


def section_paths(cls: type, prefix: str = "") -> list[str]:
    """Every section of ``cls``, dotted (``generate.sampling``), nested ones included."""
    return [p for name, tp in sections(cls).items() for p in (prefix + name, *section_paths(tp, f"{prefix}{name}."))]


def unknown_keys(cls: type, data: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key of ``data`` that ``cls`` does not have, each with where it went or what was meant."""
    names, subs, problems = {f.name for f in dataclasses.fields(cls)}, sections(cls), []
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(f"'{prefix}{key}' (a key is a name, not {type(key).__name__})")
        elif key in subs and isinstance(value, dict):
            problems += unknown_keys(subs[key], value, f"{prefix}{key}.")
        elif key not in names:
            homes = [p for p in leaf_paths(cls) + section_paths(cls) if p.endswith("." + key)]  # under a section: one home, where it moved
            tails = {p.rsplit(".", 1)[-1]: p for p in reversed(leaf_paths(cls))}  # a name here wins over a section's
            close = difflib.get_close_matches(key, sorted(names), n=1) or difflib.get_close_matches(key, sorted(tails), n=1)
            hint = (f"moved to '{prefix}{homes[0]}'" if len(homes) == 1 else
                    f"it is {', '.join(prefix + h for h in homes[:-1])} or {prefix}{homes[-1]}: write the one you mean" if homes else
                    f"did you mean '{prefix}{close[0] if close[0] in names else tails[close[0]]}'?" if close else "no such key")
            problems.append(f"'{prefix}{key}' ({hint})")
    return problems


def migrate(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with keys of older toprcli versions moved where they live now (a config's ``migrate``), sections too."""
    data = cls.migrate(dict(data)) if hasattr(cls, "migrate") else dict(data)
    for name, tp in sections(cls).items():
        if isinstance(data.get(name), dict):
            data[name] = migrate(tp, data[name])
    return data


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """A ``cls`` from plain data; :class:`ConfigError` names every unknown key at once, or a bad value."""
    data = migrate(cls, data)
    problems = unknown_keys(cls, data, prefix)
    if problems:
        raise ConfigError(f"unknown config key{'s' if len(problems) > 1 else ''}: {'; '.join(problems)} — fix or remove them (topr config show lists every key)")
    return _build(cls, data, prefix)


def validated(cfg: Any) -> Any:
    """``cfg`` checked as a config file's would be (types, each field's check, the cross-field rules, ``~`` in a path): a
    config built in Python skipped all of it (batch_size 0 hung the trainer, workers -1 the scorer)."""
    return from_dict(type(cfg), config_to_dict(cfg))


def _build(cls: type, data: dict[str, Any], prefix: str, base: Any = None) -> Any:
    """A ``cls`` from ``data`` over ``base`` (default ``cls()``): a section given in part keeps the rest of
    its default as its parent declares it (eval's dataset split test, the pipeline's curate), not its class's."""
    base = cls() if base is None else base
    hints, subs = typing.get_type_hints(cls), sections(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        if name in subs and (value is None or isinstance(value, dict)):  # a section left empty in YAML (`generate:`) is its default
            kwargs[name] = _build(subs[name], value or {}, f"{prefix}{name}.", getattr(base, name))
            continue
        out = _coerce(hints[name], value)
        if out is _MISSING:
            raise ConfigError(f"bad value for '{prefix}{name}': {value!r} — expected {describe(hints[name])}")
        check = fields[name].metadata.get("check")
        if check is not None and out is not None and not check(out):
            raise ConfigError(f"bad value for '{prefix}{name}': {value!r} — expected {fields[name].metadata['allowed']}")
        kwargs[name] = os.path.expanduser(out) if fields[name].metadata.get("path") and isinstance(out, str) else out
    obj = dataclasses.replace(base, **kwargs)
    if hasattr(obj, "check"):  # cross-field rules, one line each
        obj.check()
    return obj


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain data (what goes into ``_manifest.json``)."""
    return dataclasses.asdict(cfg)


def config_yaml(cfg: Any) -> str:
    """A config (or its plain data) as topr writes it to a file, its keys in declared order: a run's records are
    compared byte for byte, so every writer goes through here."""
    return yaml.safe_dump(cfg if isinstance(cfg, dict) else config_to_dict(cfg), sort_keys=False)
