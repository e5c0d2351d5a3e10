"""One builder makes every stage command from its config class.

Each field's declaration (``config.fields.opt``) becomes a typer option whose help ends with
the field's real default; every stage command gets the same vocabulary (``--config/-c``,
``--set KEY=VALUE``, ``--json``, ``--progress/--no-progress``, ``--verbose``). A command module
keeps only what is its own: how it runs and its summary table (:class:`Stage`)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from toprcli.cli.common import RESUME, Verbose, echo_json, progress_bars, send_noise_to, user_errors
from toprcli.config import load_config, parse_override, parse_value, split_override
from toprcli.config.fields import alternatives, describe, sections
from toprcli.errors import UserError
from toprcli.shards import output_error
from toprcli.stages import StageResult


@dataclass(frozen=True)
class Flag:
    """A config field on the command line: its dotted key, typer's parameter, how the value becomes the config's."""

    key: str
    param: str
    annotation: Any
    parse: Callable[[Any], Any]


@dataclass
class Stage:
    """What a stage command is made of; the rest (options, config, output) is the builder's."""

    name: str
    config: type
    run: Callable[..., StageResult | None]  # (cfg, progress=..., **extra); None: a torchrun rank other than 0
    show: Callable[[StageResult, Any], None]  # the summary table(s)
    doc: str
    log: Callable[[Any], str | None] = lambda cfg: f"{Path(cfg.out)}.log" if cfg.out else None  # beside the output (out/ → out.log)
    resume: str = RESUME  # the advice printed when a signal stops the command
    more: str | None = None  # a list field that also takes positional values (curate -s a b c)
    default_config: Callable[[dict[str, Any]], Any] | None = None  # the config file used when --config is not given (given the flags)
    check_config: Callable[[str, dict[str, Any], Any], None] | None = None  # (--config's path, the flags given, the config): refusals
    transient: bool = True  # progress bars vanish when the stage ends
    extra: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)  # own options: name → (annotation, default), passed to run


def lazy(target: str) -> Callable[..., Any]:
    """The function ``module:name``, imported when called: `topr --help` does not load vLLM, the stages or the trainer
    (torch it does: the configs name the loss registry's losses)."""
    module, name = target.split(":")
    return lambda *args, **kwargs: getattr(importlib.import_module(module), name)(*args, **kwargs)


def _cli_type(tp: Any, flag: str) -> tuple[Any, Callable[[Any], Any]]:
    """The type typer parses a field's value as, and how that becomes the config value."""
    args = alternatives(tp)
    if bool in args:  # bool, or bool | "auto": a --x/--no-x flag
        return bool, lambda v: v
    if len(args) == 1 and typing.get_origin(args[0]) is list:
        inner = typing.get_args(args[0])[0]
        if inner is str:
            return list[str], lambda v: list(v) or None
        return list[str], lambda v: [parse_value(x) for item in v for x in item.split(",") if x.strip()] or None
    if len(args) == 1 and args[0] in (int, float, str):
        return args[0], lambda v: v
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:  # checked by the config: one error line naming the choices
        return str, lambda v: v
    if len(args) == 1 and typing.get_origin(args[0]) is dict:  # KEY=VALUE pairs
        return list[str], lambda v: dict(parse_override(x, flag, "name=value") for x in v) or None
    return str, parse_value  # a union such as float | str: read as YAML, checked by the config


def _metavar(tp: Any, meta: Any) -> str | None:
    """The value's shape in --help where typer's type name would mislead: the choices, a comma list of numbers,
    KEY=VALUE pairs, a number or a name; None keeps typer's."""
    args = alternatives(tp)
    choices = meta.get("choices") or (typing.get_args(args[0]) if len(args) == 1 and typing.get_origin(args[0]) is Literal else None)
    if choices:
        shown = f"<{'|'.join(choices)}>"
        return shown if len(shown) <= 20 else "<name>"  # a long list stays in the help text, not the type column
    if len(args) == 1 and typing.get_origin(args[0]) is list and typing.get_args(args[0])[0] is not str:
        return f"<{typing.get_args(args[0])[0].__name__},...>"  # ASCII dots: "…" is how a cut line ends
    if len(args) == 1 and typing.get_origin(args[0]) is dict:
        return "<key=value>"
    return "<number|name>" if len(args) > 1 and bool not in args else None


def _show(value: Any, decl: str | None = None) -> str:
    """A default as --help shows it; a --x/--y flag's: the one that is on (``--flexible``, not ``False``)."""
    if decl is not None and isinstance(value, bool):
        return decl.split("/")[0 if value else 1]
    return "unset" if value is None or value == [] or value == {} else '""' if value == "" else str(value)


def flags(cls: type) -> list[Flag]:
    """Every field of ``cls`` (sections expanded) that has a flag, with its typer option."""
    out: list[Flag] = []

    def walk(tp: type, instance: Any, prefix: str) -> None:
        hints, subs = typing.get_type_hints(tp), sections(tp)
        for f in dataclasses.fields(tp):
            meta, value = f.metadata, getattr(instance, f.name)
            if not meta.get("cli", True):
                continue
            if f.name in subs:
                walk(subs[f.name], value, f"{prefix}{f.name}.")
                continue
            decl = meta.get("flag") or "--" + f.name.replace("_", "-")
            kind, parse = _cli_type(hints[f.name], decl)
            if kind is bool and "/" not in decl:
                decl = f"{decl}/--no-{decl[2:]}"
            names = [decl] + ([meta["short"]] if meta.get("short") else [])
            metavar = _metavar(hints[f.name], meta)
            allowed = f" ({describe(hints[f.name])})" if typing.get_origin(hints[f.name]) is Literal else f" ({meta['allowed']})" if kind is str and "allowed" in meta else ""
            allowed = "" if metavar and metavar.count("|") and metavar != "<number|name>" else allowed  # the choices are in the type column
            shown = _show(value, decl if kind is bool else None) + (f"; --set {prefix}{f.name}={'null' if value is None else value}" if kind is bool and not isinstance(value, bool) else "")
            option = typer.Option(*names, help=f"{meta.get('help', '')}{allowed} (default: {shown})", show_default=False, metavar="" if kind is bool else metavar)
            out.append(Flag(prefix + f.name, (prefix + f.name).replace(".", "__"), Annotated[kind | None, option], parse))

    walk(cls, cls(), "")
    return out


def _param(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _common_options(stage: Stage) -> dict[str, tuple[Any, Any]]:
    """The vocabulary every stage command shares, as ``Stage.extra``: name → (annotation, default)."""
    found = "a given --run-dir's own, else the built-in demo settings" if stage.default_config else "none"
    return {
        "config_": (Annotated[str | None, typer.Option("--config", "-c", help=f"YAML config: a stage's keys, or a pipeline config with a section per stage; the options here override it (default: {found}).", show_default=False)], None),
        "set_": (Annotated[list[str] | None, typer.Option("--set", metavar="<key=value>", help="Set any key, KEY=VALUE (repeatable): dotted (sampling.top_p=0.9), or its last part where that is unambiguous (top_p=0.9).", show_default=False)], None),
        "json_": (Annotated[bool, typer.Option("--json", metavar="", help="Print the stage result as JSON on stdout instead of tables.")], False),
        "progress_": (Annotated[bool, typer.Option("--progress/--no-progress", metavar="", help="Show progress bars (on stderr) (default: on).", show_default=False)], True),
        "verbose_": (Verbose, False),
    }


def build(stage: Stage) -> Callable[..., None]:
    """The typer command of ``stage``: one option per flagged config field, the common vocabulary, the run."""
    options = flags(stage.config)
    params = [_param(f.param, f.annotation) for f in options]
    params += [_param(name, annotation, default) for name, (annotation, default) in {**_common_options(stage), **stage.extra}.items()]
    if stage.more:
        params.append(_param("more_", Annotated[list[str] | None, typer.Argument(metavar="DIR", show_default=False, help=f"More --{stage.more} values.")]))

    def command(**kw: Any) -> None:
        overrides = {f.key: f.parse(kw[f.param]) if kw[f.param] is not None else None for f in options}
        if stage.more and kw["more_"]:
            short = {f.name: f for f in dataclasses.fields(stage.config)}[stage.more].metadata.get("short")
            overrides[stage.more] = _in_given_order((f"--{stage.more}", short), overrides[stage.more] or [], list(kw["more_"]))
        sets = dict(split_override(s) for s in kw["set_"] or [])  # text: load_config reads it by the field's type
        given = {**overrides, **sets, **{name: kw[name] for name in stage.extra}}
        path = kw["config_"] or (stage.default_config(given) if stage.default_config else None)
        cfg = load_config(stage.config, path, overrides, sets=sets)
        if stage.check_config and kw["config_"]:
            stage.check_config(kw["config_"], given, cfg)
        send_noise_to(stage.log(cfg), kw["verbose_"], kw["json_"])
        try:
            with progress_bars(kw["progress_"] and not kw["json_"], transient=stage.transient) as progress:
                result = stage.run(cfg, progress=progress, **{name: kw[name] for name in stage.extra})
        except OSError as e:  # pyarrow's disk errors name no file: what was being written is the command's output
            err = output_error(e, getattr(cfg, "out", None) or getattr(cfg, "run_dir", None))
            if err is None:
                raise
            raise err from None
        if result is None:  # a rank other than 0 under torchrun: it prints nothing
            return
        if kw["json_"]:
            echo_json(result.as_dict())
        else:
            stage.show(result, cfg)

    command.__signature__ = inspect.Signature(params)  # what typer reads the options from
    command.__name__ = stage.name.replace("-", "_")
    command.__doc__ = stage.doc
    return user_errors(resume=stage.resume)(command)


def _in_given_order(names: tuple[str, str | None], flagged: list[str], loose: list[str]) -> list[str]:
    """``--scored A B C``: A from the flag, then the loose values. Typer keeps no order across the two, so a flag repeated
    around loose values, or a loose value before the flag, is refused: their order is the weights' (--source-weights)."""
    argv = sys.argv[1:]
    written = tuple(w for w in (f"{names[0]}=", names[1]) if w)  # --scored=A, and -sA (a short flag takes its value attached)
    first_flag = next((i for i, a in enumerate(argv) if a in names or a.startswith(written)), None)
    if len(flagged) > 1 or (first_flag is not None and any(v in argv[:first_flag] for v in loose)):
        raise UserError(f"{names[0]} values both flagged and given as DIR arguments: their order is lost — write them in one "
                        f"place: {names[0]} A B C, or {names[0]} A {names[0]} B {names[0]} C")
    return flagged + loose


def register(app: typer.Typer, *stages: Stage) -> None:
    for stage in stages:
        app.command(stage.name)(build(stage))
