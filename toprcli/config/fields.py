"""How config dataclasses are checked and converted: value checks, YAML/CLI values → types.

``_from_dict`` builds a config dataclass from plain data, strictly: an unknown key
or a bad value raises :class:`ConfigError` naming the key, the value and what is
allowed; a dataclass with a ``check()`` method gets its cross-field rules run.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from toprcli.errors import UserError


class ConfigError(UserError):
    """A config key or value a user got wrong."""


def choice(options, what: str = "one of") -> dict:
    """Field metadata for a string that must be one of ``options`` (a registry's names)."""
    options = tuple(options)
    return {"check": lambda v: v in options, "allowed": f"{what} {', '.join(repr(o) for o in options)}"}


def _check(predicate, allowed: str) -> dict:
    """Field metadata: a value check and the words that say what is allowed."""
    return {"check": predicate, "allowed": allowed}


POSITIVE = _check(lambda v: v > 0, "a number > 0")
NON_NEGATIVE = _check(lambda v: v >= 0, "a number >= 0")
AT_LEAST_ONE = _check(lambda v: v >= 1, "an integer >= 1")
UNIT_OPEN = _check(lambda v: 0 < v < 1, "a number strictly between 0 and 1")
UNIT_HALF_OPEN = _check(lambda v: 0 < v <= 1, "a number in (0, 1]")


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in typing.get_args(tp) if a is not type(None)]
        opt = type(None) in typing.get_args(tp)
        return " or ".join(parts) + (" or null" if opt else "")
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


_MISSING = object()


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Convert a YAML/CLI value to ``tp`` or return _MISSING when it does not fit."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        return value if value in typing.get_args(tp) else _MISSING
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None if type(None) in typing.get_args(tp) else _MISSING
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            out = _coerce(arg, value, key)
            if out is not _MISSING:
                return out
        return _MISSING
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return _MISSING
        (inner,) = typing.get_args(tp)
        items = [_coerce(inner, v, key) for v in value]
        return _MISSING if any(i is _MISSING for i in items) else items
    if origin is dict:
        return dict(value) if isinstance(value, dict) else _MISSING
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            return _MISSING
        return _from_dict(tp, value, prefix=f"{key}.")
    if tp is bool:
        return value if isinstance(value, bool) else _MISSING
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if tp is float:
        if isinstance(value, bool):
            return _MISSING
        if isinstance(value, str):  # PyYAML reads 5e-7 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _MISSING
        return float(value) if isinstance(value, (int, float)) else _MISSING
    if tp is str:
        return value if isinstance(value, str) else _MISSING
    return value


def _from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            nested = [n for n, tp in hints.items() if dataclasses.is_dataclass(tp) and key in {f.name for f in dataclasses.fields(tp)}]
            if nested:
                raise ConfigError(f"unknown config key '{prefix}{key}' — it lives in a section here: '{prefix}{nested[0]}.{key}'")
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key '{prefix}{key}' — allowed keys here: {allowed}")
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        out = _coerce(tp, value, prefix + name)
        if out is _MISSING:
            raise ConfigError(f"bad value for '{prefix}{name}': {value!r} — expected {_describe(tp)}")
        check = fields[name].metadata.get("check")
        if check is not None and out is not None and not check(out):
            raise ConfigError(
                f"bad value for '{prefix}{name}': {value!r} — expected {fields[name].metadata['allowed']}"
            )
        kwargs[name] = out
    obj = cls(**kwargs)
    if hasattr(obj, "check"):  # cross-field rules, one line each
        obj.check()
    return obj


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain data (what goes into ``_manifest.json``)."""
    return dataclasses.asdict(cfg)
