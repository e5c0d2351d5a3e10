"""Resolve Hydra/OmegaConf ``${...}`` interpolation in a plain YAML mapping, without OmegaConf.

ROLL configs are Hydra YAML: ``max_new_tokens: ${response_length}``,
``exp_name: Qwen2.5-7B-RLVR-${pg_variant}``. Supported, as OmegaConf reads them:

- absolute references ``${a.b}``, ``${a.b[0]}`` / ``${a.b.0}`` (list items);
- relative ones ``${.x}`` (a sibling) and ``${..x}`` (one level up, and so on);
- a value that is exactly one reference keeps the referenced value's type; a
  reference inside text is replaced by the value's text;
- nested references (``${a.${b}}``) and ``\\${`` for a literal ``${``.

Resolver calls (``${oc.env:HOME}``, ``${now:%H}``, custom resolvers) are not
evaluated: such a value is left as written and reported in
:attr:`Resolved.unresolved`, so a caller can refuse it only where it matters. A
reference to a key the file does not define, and a cycle, raise
:class:`~toprcli.errors.UserError`. Pure: no files, no environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from toprcli.errors import UserError

Path = tuple  # of str keys and int list indices

_INNER = re.compile(r"\$\{([^${}]*)\}")  # an innermost ${...}
_ESCAPE = "\\${"
_ESCAPED = "\x00ESCAPED-INTERPOLATION\x00"
_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@dataclass
class Resolved:
    data: Any
    unresolved: dict[str, str] = field(default_factory=dict)  # dotted path → the value as written


def dotted(path: Path) -> str:
    return ".".join(str(p) for p in path)


def resolve(data: dict[str, Any]) -> Resolved:
    """``data`` with every ``${...}`` reference replaced by its value (see the module docstring)."""
    r = _Resolver(data)
    return Resolved(r.node(()), {dotted(p): v for p, v in r.unresolved.items()})


class _Unresolvable(Exception):
    pass


class _Resolver:
    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.done: dict[Path, Any] = {}
        self.stack: list[Path] = []
        self.unresolved: dict[Path, str] = {}

    def raw(self, path: Path) -> Any:
        node: Any = self.root
        for p in path:
            if isinstance(node, dict) and p in node:
                node = node[p]
            elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
                node = node[p]
            else:
                raise KeyError(p)
        return node

    def node(self, path: Path) -> Any:
        if path in self.done:
            return self.done[path]
        if path in self.stack:
            cycle = " → ".join(dotted(p) for p in self.stack[self.stack.index(path):] + [path])
            raise UserError(f"interpolation cycle: {cycle} — make one of these keys a plain value")
        self.stack.append(path)
        raw = self.raw(path)
        if isinstance(raw, dict):
            value: Any = {k: self.node(path + (k,)) for k in raw}
        elif isinstance(raw, list):
            value = [self.node(path + (i,)) for i in range(len(raw))]
        elif isinstance(raw, str) and "${" in raw:
            try:
                value = self.interpolate(raw, path)
            except _Unresolvable:
                self.unresolved[path] = raw
                value = raw
        else:
            value = raw
        self.stack.pop()
        self.done[path] = value
        return value

    def interpolate(self, text: str, path: Path) -> Any:
        text = text.replace(_ESCAPE, _ESCAPED)
        while True:
            m = _INNER.search(text)
            if m is None:
                return text.replace(_ESCAPED, "${")
            value = self.lookup(m.group(1).strip(), path)
            if m.span() == (0, len(text)):
                return value  # the whole value is one reference: keep its type
            if isinstance(value, (dict, list)):
                raise UserError(
                    f"{dotted(path)}: '{m.group(0)}' inside text refers to a mapping or list — refer to a single value"
                )
            shown = str(value)  # as OmegaConf renders it: True, None, 1e-05
            # A substituted value is text, never read again: an escaped "${" it carries stays literal.
            text = text[: m.start()] + shown.replace("${", _ESCAPED) + text[m.end():]

    def lookup(self, expr: str, path: Path) -> Any:
        if ":" in expr or not expr:
            raise _Unresolvable(expr)  # a resolver call such as oc.env:HOME
        depth = len(expr) - len(expr.lstrip("."))
        base = path[: len(path) - depth] if depth else ()
        target = base + tuple(self.parse(expr[depth:], path))
        value = self.walk(target, path, expr)
        if any(u[: len(target)] == target for u in self.unresolved):  # it, or a value inside the mapping it is
            raise _Unresolvable(expr)
        return value

    def walk(self, target: Path, path: Path, expr: str) -> Any:
        """The value at ``target``, also through a node that is itself a reference (``${x.tp}`` with ``x: ${base}``)."""
        for i in range(len(target) + 1):
            try:
                self.raw(target[:i])
            except KeyError:
                if not isinstance(self.raw(target[: i - 1]), str):  # a key that is not there, not a reference to walk through
                    break
                node = self.node(target[: i - 1])
                for p in target[i - 1:]:
                    if isinstance(node, dict) and p in node or isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
                        node = node[p]
                    else:
                        break
                else:
                    return node
                break
        else:
            return self.node(target)
        raise UserError(f"{dotted(path)}: '${{{expr}}}' refers to '{dotted(target)}', which the file does not define — "
                        "fix the reference or write the value")

    def parse(self, ref: str, path: Path) -> list[Any]:
        parts: list[Any] = []
        for m in _TOKEN.finditer(ref):
            key, index = m.groups()
            parts.append(int(index) if index is not None else int(key) if key.isdigit() else key)
        if not parts:
            raise UserError(f"{dotted(path)}: empty reference '${{{ref}}}' — write the key it refers to")
        return parts
