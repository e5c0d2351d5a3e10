"""`topr config show|check|import-roll`: the defaults, a pipeline config resolved and validated, a ROLL config imported."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from toprcli.cli.common import console, echo, echo_json, err_console, user_errors

app = typer.Typer(help="Show default configs and validate config files.", no_args_is_help=True)


def commented_yaml(cfg: object, indent: str = "", skip: frozenset[str] = frozenset(), prefix: str = "") -> list[str]:
    """``cfg`` as YAML, every key followed by its help as a comment (still valid YAML to edit and load); the dotted keys
    ``skip`` left out."""
    lines = []
    for f in dataclasses.fields(cfg):
        value, note = getattr(cfg, f.name), f.metadata.get("help")
        comment = f"  # {note}" if note else ""
        if prefix + f.name in skip:
            continue
        if dataclasses.is_dataclass(value):
            lines += [f"{indent}{f.name}:{comment}", *commented_yaml(value, indent + "  ", skip, f"{prefix}{f.name}.")]
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).removesuffix("...\n").strip()
            lines.append(f"{indent}{f.name}: {text}{comment}")
    return lines


@app.command("show")
@user_errors
def show(
    stage: Annotated[str | None, typer.Argument(metavar="STAGE", help="generate, score, curate, verifier-data, train, eval or iterate (the pipeline: when omitted).")] = None,
) -> None:
    """Print the default config of a stage (or of the whole pipeline) as YAML, each key with its help.

    The output is a valid config: save it, edit what you need, and pass it with --config. The pipeline's
    leaves out what each round sets itself (a stage's model, input and output in the run directory).

    Examples:
      [bold]topr config show[/]
      [bold]topr config show train > train.yaml[/]
    """
    from toprcli.config import default_config

    from toprcli.config.schema import PIPELINE_REFUSES, ROUND_SETS

    pipeline = stage in (None, "iterate")
    skip = frozenset([*PIPELINE_REFUSES, *(f"{s}.{k}" for s, keys in ROUND_SETS.items() for k in keys)] if pipeline else [])
    echo("\n".join(commented_yaml(default_config(stage or "iterate"), skip=skip)))


@app.command("check")
@user_errors
def check(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A pipeline config YAML (as used by `topr iterate`), or one stage's.")],
    stage: Annotated[str | None, typer.Option("--stage", help="Check FILE as this stage's config (generate, train, ...); "
                                                              "unset: a pipeline config, else the one stage whose config it is.")] = None,
) -> None:
    """Validate a config and print it fully resolved (defaults filled in).

    Checks what `topr iterate` checks before any work (every key, value and cross-stage rule, the loss
    options, the verifier specs, a starting model named there and the trackers' packages); a problem is one error
    line and exit 2 (every unknown or moved key at once). A stage's own config (`topr config show train`) is
    checked as that stage's.

    Examples:
      [bold]topr config check configs/demo.yaml[/]
      [bold]topr config check train.yaml --stage train[/]
    """
    from toprcli.config import ConfigError, IterateConfig, config_to_dict, load_config
    from toprcli.stages.checks import check_before_work

    cls, what = _config_class(file, stage)
    try:
        cfg = load_config(cls, file)
    except ConfigError as e:
        if stage is None and cls is IterateConfig and str(e).startswith("unknown config key"):
            raise ConfigError(f"{e}; or, if {file} is one stage's config, name it: --stage train (generate, score, ...)") from None
        raise
    check_before_work(cfg)  # loss options, verifier specs, trackers: as the command checks them first
    if cls is IterateConfig:
        _check_pipeline(cfg)
    typer.echo(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False), nl=False)
    err_console.print(f"[green]ok[/]: {escape(str(file))} is a valid {what} config", highlight=False)


def _config_class(file: Path, stage: str | None) -> tuple[type, str]:
    """The config class FILE is checked as: ``stage``'s, else the pipeline's, else the one stage whose keys it has."""
    from toprcli.config import STAGES, IterateConfig, stage_class

    if stage is not None:
        return stage_class(stage, "--stage: "), ("pipeline" if stage == "iterate" else stage)
    from toprcli.config import read_yaml
    from toprcli.config.fields import migrate, unknown_keys

    data = read_yaml(file)
    if unknown_keys(IterateConfig, migrate(IterateConfig, dict(data))):  # not a pipeline's keys: the one stage that has them all
        fits = [name for name, cls in STAGES.items() if name != "iterate" and not unknown_keys(cls, migrate(cls, dict(data)))]
        if len(fits) == 1:
            return STAGES[fits[0]], fits[0].replace("_", "-")
    return IterateConfig, "pipeline"  # its own error names every unknown key


def _check_pipeline(cfg) -> None:
    """A model named in a pipeline config exists and fits (none: iterate's --model gives it; init_model builds it)."""
    from toprcli.stages.checks import check_starting_model

    if cfg.model and not cfg.warm_start.init_model:
        check_starting_model(cfg, cfg.model, hub=False)  # a hub id's config is not fetched: a config is checked offline


@app.command("import-roll")
@user_errors
def import_roll(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A ROLL RLVR config (Hydra YAML), e.g. examples/qwen2.5-7B-rlvr-offpolicy/rlvr_config.yaml.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The topr pipeline config to write (YAML).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", metavar="", help="Replace an existing --out.")] = False,
    allow_unknown: Annotated[
        bool, typer.Option("--allow-unknown", metavar="", help="Import even when the file has keys ROLL does not define (they are listed and skipped).")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", metavar="", help="Print the key table and call-outs as JSON on stdout instead of a table.")] = False,
) -> None:
    """Turn a ROLL RLVR config into a topr pipeline config, with a table of every ROLL key.

    Interpolation (${...}) is resolved; each key is [green]mapped[/] (to the topr keys it sets),
    [yellow]left out[/] (and why) or [red]unknown[/] (not a ROLL key: refused, exit 2, nothing written,
    unless --allow-unknown). Call-outs name keys whose documented meaning differs from what ROLL's code
    does. The output passes `topr config check`; see docs/from-roll.md.

    Examples:
      [bold]topr config import-roll rlvr_config.yaml --out topr.yaml[/]
      [bold]topr config import-roll example_topr.yaml --out topr.yaml --overwrite --allow-unknown[/]
      [bold]topr config import-roll rlvr_config.yaml --out topr.yaml --json | jq '.rows[] | select(.status == \"left out\")'[/]
    """
    import json

    from toprcli.config import read_yaml
    from toprcli.roll.importer import LEFT_OUT, MAPPED, UNKNOWN, check_out, unknown_error, write_config
    from toprcli.roll.importer import import_roll as run_import

    check_out(out, file, overwrite=overwrite)  # before any work, so nothing is half done
    result = run_import(read_yaml(file))
    if result.unknown and not allow_unknown:
        raise unknown_error(result)
    written = write_config(result, out, str(file), overwrite=overwrite)
    if json_out:
        rows = [dataclasses.asdict(r) for r in result.rows]
        echo_json({"out": str(written), "rows": rows, "callouts": result.callouts, "unknown": result.unknown})
        return
    colors = {MAPPED: "green", LEFT_OUT: "yellow", UNKNOWN: "red"}
    table = Table(title=escape(f"ROLL keys of {file}"), show_header=True, header_style="bold", show_lines=False)
    for name in ("ROLL key", "value", "status", "topr key / why"):
        table.add_column(name, overflow="fold")
    for r in result.rows:
        value = json.dumps(r.value, default=str) if isinstance(r.value, (list, dict)) else str(r.value)
        table.add_row(escape(r.key), escape(value[:40] + ("…" if len(value) > 40 else "")), f"[{colors[r.status]}]{r.status}[/]", escape(r.detail))
    console.print(table)
    counts = {s: sum(r.status == s for r in result.rows) for s in colors}
    for text in result.callouts:
        console.print(f"[bold magenta]call-out:[/] {escape(text)}", highlight=False)
    console.print(
        f"[green]wrote[/] {escape(str(written))}: {counts[MAPPED]} keys mapped, {counts[LEFT_OUT]} left out, "
        f"{counts[UNKNOWN]} unknown — check it with `topr config check {escape(str(written))}`",
        highlight=False,
    )
