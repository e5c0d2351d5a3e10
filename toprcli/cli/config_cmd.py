"""`topr config show|check`: the defaults, and a pipeline config resolved and validated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import err_console, user_errors

app = typer.Typer(help="Show default configs and validate config files.", no_args_is_help=True)


def _yaml(data: object) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


@app.command("show")
@user_errors
def show(
    stage: Annotated[
        str | None, typer.Argument(help="generate, score, curate, train, eval or iterate; all when omitted.")
    ] = None,
) -> None:
    """Print the default config of a stage (or of the whole pipeline) as YAML.

    Examples:
      [bold]topr config show[/]
      [bold]topr config show train > train.yaml[/]
    """
    from toprcli.config import config_to_dict, default_config

    typer.echo(_yaml(config_to_dict(default_config(stage or "iterate"))), nl=False)


@app.command("check")
@user_errors
def check(
    file: Annotated[Path, typer.Argument(help="A pipeline config YAML (as used by `topr iterate`).")],
) -> None:
    """Validate a pipeline config and print it fully resolved (defaults filled in).

    Example:
      [bold]topr config check configs/demo.yaml[/]
    """
    from toprcli.config import IterateConfig, config_to_dict, load_config

    cfg = load_config(IterateConfig, file)
    typer.echo(_yaml(config_to_dict(cfg)), nl=False)
    err_console.print(f"[green]ok[/]: {file} is a valid pipeline config", highlight=False)
