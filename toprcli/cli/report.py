"""`topr report`: plots and a markdown summary of a run directory, or several runs compared."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import console, echo_json, grid_table, user_errors


@user_errors
def report(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="One or more `topr iterate` run directories.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where the files go: one run's plots and summary.md (default: RUN_DIR/report); "
                                                                 "with several runs, compare.png and compare.md (required).")] = None,
    as_json: Annotated[bool, typer.Option("--json", metavar="", help="Print the per-round metrics as JSON (one run: a list of rounds; several: every run's rounds and the variants compared).")] = False,
) -> None:
    """Plot a run's rounds and write their summary; compare several runs.

    Per-round pass@1, maj@k, invalid rate, p and p̃, rewards and loss curves, as PNG plots and markdown;
    what changed when, and a branch's parent. Several runs: their curves on shared axes, named by what
    differs in their configs, and their last evaluated rounds side by side, each paired with the first
    (paired bootstrap). Runs that differ only in seeds are one variant: mean ± standard deviation.

    Examples:
      [bold]topr report runs/demo[/]
      [bold]topr report runs/demo --json | jq '.[] | {round, "pass@1"}'[/]
      [bold]topr report runs/demo runs/sft --out runs/compare[/]
      [bold]topr report runs/topr-s0 runs/topr-s1 runs/sft-s0 runs/sft-s1 --out runs/compare[/]   (2 seeds each)
    """
    from toprcli.compare import final_rows, notes, write_comparison
    from toprcli.errors import UserError
    from toprcli.report import eval_k, planned_rounds, unfinished, with_interval, write_report
    from toprcli.shards import lock_holder

    if len(run_dirs) > 1:
        if out is None:
            raise UserError("several runs: pass --out DIR for the comparison's plot and table")
        compared, where = write_comparison(run_dirs, out)
        if as_json:
            echo_json(compared)
            return
        groups = compared["variants"]
        console.print(grid_table("runs compared", ["", *[g["label"] for g in groups]], final_rows(groups)))
        for note in notes(groups, compared["runs"]):
            console.print(note, highlight=False, markup=False, soft_wrap=True)
        console.print(f"wrote {where}/compare.png and {where}/compare.md", highlight=False, markup=False)  # paths: [v1] is text
        return
    rows, where = write_report(run_dirs[0], out)
    if as_json:
        echo_json(rows, indent=2)
        return
    k = eval_k(rows)
    cols = ("round", "pass@1", f"maj@{k}", "greedy", "invalid", "p", "p̃", "mean reward", "changed")
    console.print(grid_table(f"run {run_dirs[0]}", cols, [
        [f"{r['round']} (unfinished)" if unfinished(r) else r["round"], *(with_interval(r, key, digits=3) for key in ("pass@1", "maj@k", "greedy_accuracy")), r.get("invalid_rate"),
         r.get("p"), r.get("p_effective"), r.get("reward_mean"), ", ".join(r.get("config_changed") or []) or None]
        for r in rows
    ]))
    console.print(f"wrote {where}/summary.md and {where}/{{accuracy,mix,rewards,loss}}.png", highlight=False, markup=False)
    if holder := lock_holder(run_dirs[0]):  # a round unfinished because it is running, or because the run stopped
        console.print(f"running: {holder}", highlight=False, markup=False)
    elif rows and (unfinished(rows[-1]) or rows[-1].get("pass@1") is None or rows[-1]["round"] < planned_rounds(run_dirs[0])):
        console.print("stopped: the same `topr iterate` resumes it", highlight=False, markup=False)
