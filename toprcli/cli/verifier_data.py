"""`topr verifier-data`: scored completions → a verification dataset for training a generative verifier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import ConfigFile, console, progress_bars, summary_table, user_errors


@user_errors
def verifier_data(
    scored: Annotated[
        list[Path] | None,
        typer.Option("--scored", "-s", help="A `topr score` output directory (or an eval's scored/). Repeat it, or list several after one --scored."),
    ] = None,
    more_scored: Annotated[list[Path] | None, typer.Argument(metavar="DIR", show_default=False, help="More scored directories.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The verification dataset to write, one Parquet file (e.g. verify-train.parquet).")] = None,
    balance: Annotated[bool | None, typer.Option("--balance/--no-balance", help="As many correct as incorrect candidates (the larger class is subsampled).")] = None,
    max_per_question: Annotated[int | None, typer.Option("--max-per-question", help="At most this many candidates per question (a seeded choice).")] = None,
    dedupe: Annotated[bool | None, typer.Option("--dedupe/--no-dedupe", help="One row per distinct question and candidate text. Default: on.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of --balance and --max-per-question.")] = None,
    overwrite: Annotated[bool | None, typer.Option("--overwrite", help="Replace an --out made from other inputs or settings.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    config: ConfigFile = None,
) -> None:
    """Turn scored completions into verification prompts labelled Yes (correct) or No, to train a [bold]generative verifier[/].

    Each row shows a question and one candidate solution and asks for a Yes/No verdict on the
    last line; its `answer` is the label. `topr generate` reads the file like any dataset (the
    `verification` preset), the `judge` verifier scores the verdicts, so `topr iterate` trains a
    verifier with TOPR like any policy; `topr eval --verifier-model` then uses it. See docs/verifier.md.

    Examples:
      [bold]topr verifier-data -s runs/demo/round-001/scored runs/demo/round-002/scored -o verify/train.parquet --balance[/]
      [bold]topr verifier-data -s runs/demo/round-003/eval/scored -o verify/test.parquet --max-per-question 4[/]
    """
    from toprcli.config import VerifierDataConfig, load_config
    from toprcli.stages import verifier_data as stage

    dirs = [str(p) for p in (scored or []) + (more_scored or [])]
    overrides = {
        "scored": dirs or None, "out": str(out) if out is not None else None, "balance": balance,
        "max_per_question": max_per_question, "dedupe": dedupe, "seed": seed, "overwrite": overwrite,
    }
    cfg = load_config(VerifierDataConfig, config, overrides)
    with progress_bars(not json_out, transient=True) as progress:
        result = stage.run(cfg, progress=progress)
    if json_out:
        typer.echo(json.dumps(result.as_dict()))
        return
    s = result.summary
    rows = [
        ("candidates in", f"{s['rows_in']:,}"),
        *[(f"dropped: {k}", f"{v:,}") for k, v in s["dropped"].items()],
        ("rows out", f"{s['rows_out']:,}"),
        ("labelled Yes / No", f"{s['yes']:,} / {s['no']:,}"),
        ("questions", f"{s['questions']:,}"),
        ("question text from", s["question_source"]),
        ("wall time (s)", round(result.wall_time_s, 2)),
    ]
    console.print(summary_table(f"{'already written' if result.skipped else 'verification data'} → {result.out}", rows))
