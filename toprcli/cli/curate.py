"""`topr curate`: scored shards → one frozen training set with advantages and weights."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import ConfigFile, console, grid_table, progress_bars, summary_table, user_errors


def _parse_weights(text: str | None) -> list[float] | None:
    if text is None:
        return None
    from toprcli.errors import UserError

    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UserError(f"bad --source-weights {text!r} — give comma-separated numbers, one per --scored, e.g. 1,0.5") from None


@user_errors
def curate(
    scored: Annotated[
        list[Path] | None,
        typer.Option(
            "--scored",
            "-s",
            help="A `topr score` output directory (or Parquet file). Repeat it, or list several after one --scored: this round first, then earlier rounds to replay.",
        ),
    ] = None,
    more_scored: Annotated[
        list[Path] | None, typer.Argument(metavar="DIR", show_default=False, help="More scored directories (as in --scored a b c).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The training set to write, one Parquet file (e.g. train.parquet); its manifest goes to <out>.manifest.json.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option(help="Baseline c in A = R − c: a number (constant; default 0), 'group-mean' or 'leave-one-out' (per prompt)."),
    ] = None,
    positive_fraction: Annotated[
        float | None,
        typer.Option(help="Target effective share of positives p̃ in (0, 1); solves the constant c from the data (paper: 0.1–0.2 works best)."),
    ] = None,
    source_weights: Annotated[
        str | None, typer.Option(help="Comma-separated weight per scored input, in order (e.g. 1,0.5); written to the `weight` column.")
    ] = None,
    drop_uniform_prompts: Annotated[
        bool | None, typer.Option("--drop-uniform-prompts/--keep-uniform-prompts", help="Drop prompts whose samples are all correct or all incorrect.")
    ] = None,
    drop_truncated: Annotated[
        bool | None, typer.Option("--drop-truncated/--keep-truncated", help="Drop samples cut off at max_new_tokens (finish_reason = length).")
    ] = None,
    dedupe: Annotated[bool | None, typer.Option("--dedupe/--no-dedupe", help="Keep one copy of identical completions within a prompt.")] = None,
    max_per_prompt: Annotated[int | None, typer.Option(help="Keep at most this many samples per prompt (lowest sample_index first).")] = None,
    first_positive: Annotated[
        bool | None,
        typer.Option("--first-positive/--all-positives", help="'Anna Karenina' curation: per prompt keep the first correct sample and every incorrect one."),
    ] = None,
    subsample: Annotated[int | None, typer.Option(help="Keep a uniform random subset of this many rows (after the filters).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of --subsample.")] = None,
    overwrite: Annotated[bool | None, typer.Option("--overwrite", help="Replace an --out made from other inputs or settings.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    config: ConfigFile = None,
) -> None:
    """Turn scored samples into a training set: baseline, advantages, positive/negative mix, replay.

    Advantage A = R − c; rows with A ≥ 0 are positives. [bold]--positive-fraction P[/] picks the constant c so that positives carry the share P of Σ w·|A| (with ±1 rewards: c = (p − P)/(p + P(1 − 2p)), p the raw positive share). Output: every scored column plus `advantage` and `weight`, one Parquet file. See docs/curate.md.

    Examples:
      [bold]topr curate --scored runs/x/round-1/scored --out runs/x/round-1/train.parquet --positive-fraction 0.15[/]
      [bold]topr curate --scored r2/scored r1/scored --source-weights 1,0.5 --out r2/train.parquet --baseline leave-one-out[/]
      [bold]topr curate -s scored --out train.parquet --first-positive --drop-truncated --dedupe[/]
    """
    import json

    from toprcli.config import CurateConfig, load_config
    from toprcli.stages import curate as curate_stage

    dirs = [str(p) for p in (scored or []) + (more_scored or [])]
    overrides = {
        "scored": dirs or None,
        "out": str(out) if out is not None else None,
        "baseline": baseline,
        "positive_fraction": positive_fraction,
        "source_weights": _parse_weights(source_weights),
        "drop_uniform_prompts": drop_uniform_prompts,
        "drop_truncated": drop_truncated,
        "dedupe": dedupe,
        "max_per_prompt": max_per_prompt,
        "first_positive": first_positive,
        "subsample": subsample,
        "seed": seed,
        "overwrite": overwrite,
    }
    cfg = load_config(CurateConfig, config, overrides)

    with progress_bars(not json_out, transient=True) as progress:
        result = curate_stage.run(cfg, progress=progress)

    if json_out:
        typer.echo(json.dumps(result.as_dict()))
        return
    s = result.summary
    title = f"{'already curated' if result.skipped else 'curated'} → {result.out}"
    rows = [
        ("rows in", f"{s['rows_in']:,}"),
        ("rows out", f"{s['rows_out']:,}"),
        ("prompts in / out", f"{s['prompts_in']:,} / {s['prompts_out']:,}"),
        *[(f"dropped: {k}", f"{v:,}") for k, v in s["dropped"].items()],
        ("baseline", s["baseline"]),
        ("c", "per prompt" if s["c"] is None else s["c"]),
        ("p (share correct)", s["p"]),
        ("p̃ (effective positive share)", s["p_effective"]),
    ]
    if s["positive_fraction"] is not None:
        rows.append(("p̃ target (--positive-fraction)", s["positive_fraction"]))
    rows += [
        ("positives kept (A ≥ 0)", f"{s['positives']:,}"),
        ("negatives kept (A < 0)", f"{s['negatives']:,}"),
        ("wall time (s)", round(result.wall_time_s, 2)),
    ]
    console.print(summary_table(title, rows))
    if len(s["sources"]) > 1 or s["sources"][0]["weight"] != 1.0:
        console.print(
            grid_table(
                "sources",
                ["scored", "weight", "iterations", "rows in", "rows out", "positives"],
                [
                    (src["path"], src["weight"], ",".join(map(str, src["iterations"])), f"{src['rows_in']:,}", f"{src['rows_out']:,}", f"{src['positives']:,}")
                    for src in s["sources"]
                ],
            )
        )
