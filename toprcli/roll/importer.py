"""`topr config import-roll`: a ROLL RLVR config (alibaba/ROLL, Hydra YAML) → a topr pipeline config.

:func:`import_roll` is pure: a mapping in, an :class:`ImportResult` out — the
pipeline config (only the keys it sets; defaults fill the rest), one
:class:`KeyRow` per leaf key of the input (mapped / left out / unknown, with
the target or the reason) and call-outs where ROLL's docs or the file say one
thing and ROLL's code (commit 8eb27cc) does another. :func:`write_config`
validates the result as an :class:`~toprcli.config.IterateConfig` and writes it
atomically. docs/from-roll.md has the mapping and the semantic differences.

Where a file states what it wants (``pg_variant``, a loss knob) the import
follows it, and says so when ROLL would do otherwise; where it is silent, the
import reproduces what ROLL does (its defaults, its worker).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toprcli.config import IterateConfig, from_dict
from toprcli.errors import UserError
from toprcli.roll import keys as K
from toprcli.roll.interp import dotted, resolve
from toprcli.roll.keys import reason_for
from toprcli.roll.rules import apply_rules
from toprcli.shards import write_text_atomic

MAPPED, LEFT_OUT, UNKNOWN = "mapped", "left out", "unknown"


@dataclass
class KeyRow:
    key: str  # dotted ROLL key, e.g. actor_train.training_args.learning_rate
    value: Any
    status: str = LEFT_OUT  # mapped | left out | unknown
    detail: str = ""  # mapped: the topr keys it sets; otherwise why


@dataclass
class ImportResult:
    config: dict[str, Any]
    rows: list[KeyRow]
    callouts: list[str] = field(default_factory=list)

    @property
    def unknown(self) -> list[str]:
        return [r.key for r in self.rows if r.status == UNKNOWN]


# -- walking the input ------------------------------------------------------------------------


def _leaves(data: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, path + (str(k),))]
    return [(path, data)]


def _classify(path: tuple) -> tuple[str, str]:
    """(status, reason) of a key by the catalogue alone: a ROLL key (reason filled in later) or unknown."""
    for i in range(len(path)):
        try:
            node = K.section_schema(path[: i + 1])
        except KeyError:
            parent, key = path[:i], path[i]
            parent_node = K.section_schema(parent)
            if parent == () and key in K.LEGACY_TOP:
                return LEFT_OUT, f"not a ROLL config field at 8eb27cc ({K.LEGACY_TOP[key]}); ROLL ignores it"
            if (parent_node in (K.WORKER, K.REWARD) and key in K.PG_KNOBS) or (parent == () and key in K.TOP_LEVEL_KNOBS):
                return LEFT_OUT, ""
            if parent_node in (K.WORKER, K.REWARD) and key in K.LEGACY_WORKER:
                return LEFT_OUT, f"not a ROLL config field at 8eb27cc ({K.LEGACY_WORKER[key]}); ROLL ignores it"
            legacy = K.LEGACY_SECTION.get(parent[-1] if parent else "", {})
            if key in legacy:
                return LEFT_OUT, f"not a ROLL config field at 8eb27cc ({legacy[key]}); ROLL ignores it"
            return UNKNOWN, _suggest(parent, key)
        if node is K.FREE:
            break
    return LEFT_OUT, ""


def _suggest(parent: tuple, key: str) -> str:
    import difflib

    node = K.section_schema(parent)
    names = list(node) if isinstance(node, dict) else []
    if parent == ():
        names += list(K.TOP_LEVEL_KNOBS)
    elif node in (K.WORKER, K.REWARD):
        names += list(K.PG_KNOBS)
    close = difflib.get_close_matches(key, [n for n in names if n != "*"], n=1, cutoff=0.75)
    return f"not a ROLL key; did you mean {dotted(parent + (close[0],))}?" if close else "not a ROLL key"


# -- the mapping ------------------------------------------------------------------------------


class _Mapper:
    """Reads resolved ROLL values by dotted key, sets topr keys, records each decision on the key's row."""

    def __init__(self, data: dict[str, Any], rows: dict[str, KeyRow], unresolved: dict[str, str]):
        self.data = data
        self.rows = rows
        self.unresolved = unresolved
        self.config: dict[str, Any] = {}
        self.callouts: list[str] = []
        self.last_key = ""  # the key read last: the one whose value a rule could not use

    def has(self, key: str) -> bool:
        if key in self.rows and self.rows[key].status == UNKNOWN:
            return False  # with --allow-unknown, unknown keys are listed and skipped, never mapped
        node: Any = self.data
        for p in key.split("."):
            if not isinstance(node, dict) or p not in node:
                return False
            node = node[p]
        return True

    def get(self, key: str, default: Any = None) -> Any:
        self.last_key = key
        if within := next((u for u in self.unresolved if key == u or key.startswith(u + ".")), None):  # a mapping one refers to, too
            raise UserError(
                f"{within}: {self.unresolved[within]!r} uses a resolver topr does not evaluate — write the value into the file"
            )
        if not self.has(key):
            return default
        node: Any = self.data
        for p in key.split("."):
            node = node[p]
        return node

    def number(self, key: str, default: Any = None, *, integer: bool = False) -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if integer:
                if out != int(out):
                    raise ValueError
                return int(out)
            return out
        except (TypeError, ValueError):
            kind = "an integer" if integer else "a number"
            raise UserError(f"{key}: {value!r} is not {kind} — fix the value in the ROLL file") from None

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise UserError(f"{key}: {value!r} is not true or false — fix the value in the ROLL file")
        return value

    def set(self, target: str, value: Any) -> None:
        node = self.config
        parts = target.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value

    def mapped(self, key: str, *targets: tuple[str, Any], note: str = "") -> None:
        """Set each (topr key, value) and mark ``key`` mapped (when it is in the file)."""
        for target, value in targets:
            self.set(target, value)
        text = ", ".join(f"{t} = {_show(v)}" for t, v in targets)
        self.note(key, MAPPED, (f"{text} ({note})" if note else text) if text else note or "nothing to set here")

    def left_out(self, key: str, why: str) -> None:
        self.note(key, LEFT_OUT, why)

    def note(self, key: str, status: str, detail: str) -> None:
        for row_key, row in self.rows.items():
            if (row_key == key or row_key.startswith(key + ".")) and row.status != UNKNOWN:
                row.status, row.detail = status, detail

    def callout(self, text: str) -> None:
        self.callouts.append(text)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def import_roll(data: dict[str, Any]) -> ImportResult:
    """Map a ROLL RLVR config (the parsed YAML) to a topr pipeline config; see the module docstring."""
    if not isinstance(data, dict):
        raise UserError("a ROLL config must be a mapping of keys to values")
    resolved = resolve(data)
    rows: dict[str, KeyRow] = {}
    for path, value in _leaves(resolved.data):
        if not path:
            continue
        status, reason = _classify(path)
        rows[dotted(path)] = KeyRow(dotted(path), value, status, reason)
    m = _Mapper(resolved.data, rows, resolved.unresolved)
    try:
        apply_rules(m)
    except TypeError:  # a value of another kind than ROLL takes there (a list for a dtype name, null in a count)
        raise UserError(f"{m.last_key}: {m.get(m.last_key)!r} is not a value ROLL takes there — fix it in the file") from None
    except UserError as e:  # a key a rule needs may be there misspelt (response_lenght): name the unknown keys with it
        unknown = [f"{r.key} ({r.detail})" for r in rows.values() if r.status == UNKNOWN]
        if unknown:
            raise UserError(f"{e} (unknown keys in the file, maybe the one meant: {'; '.join(unknown[:5])})") from None
        raise
    for row in rows.values():
        if row.status == LEFT_OUT and not row.detail:
            row.detail = reason_for(row.key, row.value)
        if row.key in resolved.unresolved and row.status != MAPPED:
            row.detail += f" (unresolved: {resolved.unresolved[row.key]})"
    return ImportResult(m.config, list(rows.values()), m.callouts)


# -- output -----------------------------------------------------------------------------------


def to_yaml(result: ImportResult, source: str) -> str:
    import yaml

    head = (
        f"# topr pipeline config imported from the ROLL config {source}\n"
        "# by `topr config import-roll` (ROLL: github.com/alibaba/ROLL, Apache-2.0; keys as of 8eb27cc).\n"
        "# Only imported keys are set; `topr config check` shows the rest (defaults). See docs/from-roll.md.\n"
    )
    return head + yaml.safe_dump(result.config, sort_keys=False, default_flow_style=False)


def validate(result: ImportResult) -> Any:
    """The imported config as an :class:`IterateConfig` (a ConfigError names any bad key), its loss options checked
    as `topr config check` checks them (a knob's value ROLL takes that the loss refuses: topr_negative_weight -1)."""
    from toprcli.training.prepare import resolve_loss

    try:
        cfg = from_dict(IterateConfig, result.config)
        resolve_loss(cfg.train)
        return cfg
    except UserError as e:
        raise UserError(f"the imported config does not validate: {e}") from None


def check_out(out: str | os.PathLike[str], source: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """``out`` can take the imported config: a file name, not the ROLL config itself, new unless ``overwrite``."""
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out {out} is a directory — give a file name such as {out / 'topr.yaml'}")
    if out.exists() and out.resolve() == Path(source).resolve():
        raise UserError(f"--out {out} is the ROLL config being imported — write the topr config to another file")
    if out.exists() and not overwrite:
        raise UserError(f"{out} already exists — pass --overwrite or choose another --out")


def write_config(result: ImportResult, out: str | os.PathLike[str], source: str, *, overwrite: bool = False) -> Path:
    """Validate, then write atomically (temporary file in the same directory, fsync, rename)."""
    out = Path(out)
    check_out(out, source, overwrite=overwrite)
    validate(result)
    text = to_yaml(result, source)
    return write_text_atomic(out, text)


def unknown_error(result: ImportResult) -> UserError:
    rows = [r for r in result.rows if r.status == UNKNOWN]
    shown = "; ".join(f"{r.key} ({r.detail})" for r in rows[:8]) + (f"; and {len(rows) - 8} more" if len(rows) > 8 else "")
    return UserError(
        f"{len(rows)} unknown key(s) in the ROLL config: {shown} — fix the spelling, or pass --allow-unknown to import without them"
    )
