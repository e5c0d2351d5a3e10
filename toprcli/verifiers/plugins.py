"""User verifiers: ``--verifier python:module:function``.

The function has this signature (documented in ``topr score --help``)::

    def my_check(completion: str, answer: str | None, row: dict) -> bool | float:
        ...

``row`` is the whole input row (every samples column, e.g. ``prompt``,
``prompt_id``, ``finish_reason``, token ids). Return ``True``/``False`` for
correct/incorrect, or a float: it becomes the ``reward`` as is, and the row is
``correct`` iff it is > 0. ``None`` means no answer. An exception gives
``error``; a hang past ``--timeout`` gives ``timeout``. The function runs in a
worker process, so it can keep module-level caches but must not rely on state
in the parent.

verl's reward functions run as they are: a function with the parameters
``solution_str`` and ``ground_truth`` (verl's ``compute_score(data_source,
solution_str, ground_truth, extra_info=None)``) is called by those names, with
the row's ``data_source`` and ``extra_info`` (None when absent), and a returned
``{"score": x, ...}`` is the float ``x``. Any other function must take
``(completion, answer, row)``: one that cannot (TRL's batched reward
functions, a function of two arguments) is refused when the verifier loads.

``module`` is an importable module name (the current directory is on the
path) or a path to a ``.py`` file: ``python:checks.py:reward`` or
``python:mypkg.checks:reward``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import site
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toprcli.errors import UserError
from toprcli.interrupt import Interrupted
from toprcli.verifiers.base import Verdict, from_plugin_result


def parse_plugin_spec(target: str) -> tuple[str, str]:
    """``"mod.sub:fn"`` or ``"path/to/file.py:fn"`` → (module, function)."""
    module, sep, func = target.rpartition(":")
    if not sep or not module or not func:
        raise UserError(f"bad plugin spec 'python:{target}' — write python:MODULE:FUNCTION, e.g. python:my_checks:is_correct")
    return module, func


# Per plugin loaded in this process: the files of the modules its import brought in from outside the Python installation
# (a helper module beside it, a package of the user's). They decide its verdicts as much as its own file does.
_LOCAL_IMPORTS: dict[str, list[tuple[str, str]]] = {}  # target -> [(module name, file)]


def source_digest(target: str) -> str | None:
    """A digest of the plugin's source file and of the user modules its import loaded (None when the file is not found
    here): a plugin, or a helper it imports, edited under the same name scores otherwise, so outputs scored with it
    must not be reused. Modules it imports only when called (in the workers) are not seen."""
    module_name, _ = parse_plugin_spec(target)
    if module_name.endswith(".py") or os.sep in module_name:
        path: Path | None = Path(module_name).resolve()
    else:
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            found = None
        path = Path(found.origin) if found is not None and found.origin else None
    if path is None or not path.is_file():
        return None
    digest = hashlib.sha256(path.read_bytes())
    for name, f in _LOCAL_IMPORTS.get(target, []):  # by module name: a project moved with its files keeps its digest
        digest.update(name.encode() + b"\0" + (Path(f).read_bytes() if Path(f).is_file() else b"(gone)"))
    return digest.hexdigest()[:16]


def _user_modules(names: set[str], own: Path | None) -> list[tuple[str, str]]:
    """(name, source file) of the modules ``names`` that are the user's: not the Python installation's (stdlib,
    site-packages) nor toprcli's own (the tool, whichever of it was imported before the plugin)."""
    installed = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                                              *site.getsitepackages(), site.getusersitepackages())})
    found = {(name, os.path.realpath(f)) for name in names if not name.split(".")[0] == "toprcli"
             and isinstance(f := getattr(sys.modules.get(name), "__file__", None), str)}
    return sorted((n, f) for n, f in found if not f.startswith(installed) and (own is None or f != str(own)) and f.endswith(".py"))


def load_function(target: str) -> Callable:
    """Import the plugin function; every failure is one-line :class:`UserError`."""
    module_name, func_name = parse_plugin_spec(target)
    before = set(sys.modules)
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name).resolve()
            if not path.is_file():
                raise UserError(f"plugin file not found: {module_name} — check the path in --verifier python:{target}")
            name = "toprcli_plugin_" + path.stem
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise UserError(f"cannot import plugin file {module_name} — is it a .py file?")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            cwd = os.getcwd()
            if cwd not in sys.path and "" not in sys.path:
                sys.path.insert(0, cwd)
            module = importlib.import_module(module_name)
    except (UserError, Interrupted, KeyboardInterrupt):  # a stop asked for while it imported is no fault of the plugin's
        raise
    except BaseException as e:  # a plugin may raise anything at import, even SystemExit
        first = str(e).splitlines()[0] if str(e) else ""
        if isinstance(e, MemoryError):  # it imports: in a verifier worker, under the worker's memory cap
            raise UserError(f"plugin module {module_name!r} ran out of memory as it imported — if it ran in a verifier worker, "
                            "raise worker_memory_mb (each worker's cap; 0: none)") from None
        raise UserError(
            f"plugin module {module_name!r} does not import ({type(e).__name__}: {first}) — "
            "check the name and that it is on PYTHONPATH or in the current directory"
        ) from None
    own = getattr(module, "__file__", None)
    found = _user_modules(set(sys.modules) - before, Path(os.path.realpath(own)) if own else None)
    _LOCAL_IMPORTS[target] = sorted({*_LOCAL_IMPORTS.get(target, []), *found})  # loaded again, its helpers are imported already
    func = getattr(module, func_name, None)
    if func is None:
        raise UserError(f"plugin module {module_name!r} has no attribute {func_name!r} — check --verifier python:{target}")
    if not callable(func):
        raise UserError(f"plugin {module_name}:{func_name} is not callable — point --verifier at a function")
    return func


def make_check(target: str) -> Callable[..., Verdict]:
    call = _caller(load_function(target), target)

    def check(completion: str, answer: str | None, row: dict | None = None) -> Verdict:
        return from_plugin_result(call(completion, answer, row if row is not None else {}))

    return check


def _caller(func: Callable, target: str) -> Callable[[str, str | None, dict], Any]:
    """How the plugin is called: as verl's ``compute_score`` when it has verl's parameter names, else as
    ``func(completion, answer, row)``, refused here when it cannot take that (it was called with its arguments in the
    wrong places, and every reward came out 0 or an error, in silence)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin: no signature to read; called as documented
        return func
    params = sig.parameters
    if {"solution_str", "ground_truth"} <= set(params):
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())

        def verl(completion: str, answer: str | None, row: dict) -> Any:
            given = {"data_source": row.get("data_source"), "solution_str": completion, "ground_truth": answer, "extra_info": row.get("extra_info")}
            # A value the row lacks leaves the function's own default (a functools.partial's data_source) in place.
            return func(**{k: v for k, v in given.items() if (takes_any or k in params)
                           and (v is not None or k not in params or params[k].default is inspect.Parameter.empty)})

        return verl
    expected = f"give it topr's signature def {getattr(func, '__name__', 'check')}(completion, answer, row) -> bool | float | None"
    first = next(iter(params), "")
    if first in ("completions", "prompts"):
        raise UserError(f"plugin {target} takes TRL's batched arguments ({', '.join(list(params)[:3])}, ...), one call for many "
                        f"completions — topr calls it once per completion: {expected}")
    try:
        sig.bind("", None, {})
    except TypeError as e:
        raise UserError(f"plugin {target} cannot be called as f(completion, answer, row) ({e}) — {expected}, or verl's "
                        "compute_score(data_source, solution_str, ground_truth, extra_info=None)") from None
    return func
