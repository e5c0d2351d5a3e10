"""`topr report`: plots and a markdown summary of a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import console, grid_table, user_errors


@user_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A `topr iterate` run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-round metrics as JSON (a list of objects) instead of a table.")] = False,
) -> None:
    """Per-round pass@1, maj@k, invalid rate, p and p̃, rewards and loss curves, as PNG plots and markdown.

    Examples:
      [bold]topr report runs/demo[/]
      [bold]topr report runs/demo --json | jq '.[] | {round, "pass@1"}'[/]
    """
    from toprcli.report import write_report

    rows, out = write_report(run_dir)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    cols = ("round", "pass@1", "maj@k", "greedy", "invalid", "p", "p̃", "mean reward")
    console.print(grid_table(f"run {run_dir}", cols, [
        [r["round"], r.get("pass@1"), r.get("maj@k"), r.get("greedy_accuracy"), r.get("invalid_rate"), r.get("p"), r.get("p_effective"), r.get("reward_mean")]
        for r in rows
    ]))
    console.print(f"wrote {out}/summary.md and {out}/{{accuracy,mix,rewards,loss}}.png", highlight=False)
