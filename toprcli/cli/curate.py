"""`topr curate`: scored shards → one frozen training set with advantages and weights."""

from __future__ import annotations

from toprcli.cli.builder import Stage, lazy
from toprcli.cli.common import console, grid_table, summary_table
from toprcli.config import CurateConfig
from toprcli.stages import StageResult

DOC = """Turn scored samples into a training set: baseline, advantages, positive/negative mix, replay.

    Advantage A = R − c; rows with A ≥ 0 are positives. [bold]--positive-fraction P[/] picks the constant c so that positives carry the share P of Σ w·|A| (with ±1 rewards: c = (p − P)/(p + P(1 − 2p)), p the raw positive share). Output: every scored column plus `advantage` and `weight`, one Parquet file. See docs/curate.md.

    Examples:
      [bold]topr curate --scored runs/x/round-001/scored --out runs/x/round-001/train.parquet --positive-fraction 0.15[/]
      [bold]topr curate --scored r2/scored r1/scored --source-weights 1,0.5 --out r2/train.parquet --baseline leave-one-out[/]
      [bold]topr curate -s scored --out train.parquet --first-positive --drop-truncated --dedupe[/]
      [bold]topr curate -s scored --out pairs.parquet --pairs matched[/]   (preference pairs for --loss dpo)
    """


def show(result: StageResult, cfg: CurateConfig) -> None:
    s = result.summary
    rows = [
        ("rows in", s["rows_in"]), ("rows out", s["rows_out"]),
        ("prompts in / out", f"{s['prompts_in']:,} / {s['prompts_out']:,}"),
        *[(f"dropped: {k}", v) for k, v in s["dropped"].items()],
        ("baseline", s["baseline"]), ("c", "per prompt" if s["c"] is None else s["c"]),
        ("p (share correct)", s["p"]), ("p̃ (effective positive share)", s["p_effective"]),
    ]
    if s["positive_fraction"] is not None:
        rule = "" if cfg.positive_fraction_rule == "fixed" else f", rule {cfg.positive_fraction_rule}"
        rows.append((f"p̃ target (--positive-fraction {s['positive_fraction']}{rule})", s["p_target"]))
    if s.get("pairs") is not None:
        rows += [(f"pairs ({cfg.pairs})", s["pairs"]), ("prompts without a pair", s["prompts_without_pair"])]
    rows += [("positives kept (A ≥ 0)", s["positives"]), ("negatives kept (A < 0)", s["negatives"]),
             ("wall time (s)", round(result.wall_time_s, 2))]
    console.print(summary_table(f"{'already curated' if result.skipped else 'curated'} → {result.out}", rows))
    if len(s["sources"]) > 1 or s["sources"][0]["weight"] != 1.0:
        console.print(grid_table("sources", ["scored", "weight", "iterations", "rows in", "rows out", "positives"], [
            (src["path"], src["weight"], ",".join(map(str, src["iterations"])), src["rows_in"], src["rows_out"], src["positives"])
            for src in s["sources"]
        ]))


STAGE = Stage("curate", CurateConfig, lazy("toprcli.stages.curate:run"), show, DOC, more="scored")
