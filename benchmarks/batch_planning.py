"""What planning a training's micro-batches costs as the training set grows (no model, no tokens).

`topr train` plans every step twice: once before step 1, for the largest micro-batch (whether to turn
on gradient checkpointing: ``prepare.micro_batch_tokens``), and once per step on every rank
(``precompute.micro_batches``: deal the step's units over the ranks, pack each rank's). Each unit's
longest row is read from every row of the set; it used to be read again in every step's plan, so the
plan of a whole run cost O(rows × steps). Now ``Prepared.unit_longest`` reads it once.

Data: ``--rows`` synthetic rows (prompts of 200–800 tokens, completions of 100–4,096: the lengths
alone, no token ids), batch 64, 8 ranks, a 16,384-token budget; single rows, or groups of 16 rows a
prompt with the shared-prefix cost. For each: the time of one step's plan (all 8 ranks' plans, as
each rank computes them), with each unit's longest row read in the step (before) and read once
(now), and ``micro_batch_tokens`` over the whole run.

Usage: python benchmarks/batch_planning.py [--rows 1000000] [--steps 200] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np  # noqa: E402

from docs_section import write_section  # noqa: E402  (benchmarks/, the script's own directory)
from toprcli.training.batching import TokenData, Units, plan_micro_batches, step_plan, unit_longest  # noqa: E402
from toprcli.training.prepare import micro_batch_tokens  # noqa: E402

RANKS, BUDGET, BATCH, GROUP = 8, 16_384, 64, 16


def synthetic(rows: int) -> TokenData:
    rng = np.random.default_rng(0)
    offsets = [np.concatenate([[0], np.cumsum(rng.integers(lo, hi, rows))]) for lo, hi in ((200, 800), (100, 4096))]
    empty = np.zeros(0)
    return TokenData(empty, offsets[0], empty, offsets[1], empty, offsets[1], np.zeros(rows, np.float32), np.ones(rows, np.float32))


def measure(data: TokenData, grouped: bool, steps: int) -> dict[str, float]:
    units = Units.from_labels(np.arange(data.n_rows) // GROUP) if grouped else Units.singletons(data.n_rows)
    plan = step_plan(units, BATCH, 1.0, None, 0)
    lengths, prompts = (data.completion_lens, data.prompt_lens) if grouped else (data.seq_lens, None)
    longest = unit_longest(units, lengths, prompts)
    timed = range(min(steps, plan.steps))
    out = {"steps": plan.steps}
    for name, given in (("per_step_before_ms", None), ("per_step_now_ms", longest)):
        start = time.perf_counter()
        for s in timed:
            plan_micro_batches(plan.step_units(s), units, lengths, RANKS, BUDGET, prompt_lens=prompts, longest=given)
        out[name] = (time.perf_counter() - start) / len(timed) * 1e3
    start = time.perf_counter()
    micro_batch_tokens(SimpleNamespace(shared_prefix=grouped, micro_batch_tokens=BUDGET), data, units, plan)
    out["micro_batch_tokens_s"] = time.perf_counter() - start
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=200, help="steps timed per variant")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args()
    data = synthetic(args.rows)
    lines = ["| units | steps | one step's plan, longest rows read in the step | read once (as `topr train` does) | micro_batch_tokens, whole run |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for grouped in (False, True):
        r = measure(data, grouped, args.steps)
        label = f"prompts of {GROUP} rows, shared prefix" if grouped else "single rows"
        lines.append(f"| {label} | {r['steps']:,} | {r['per_step_before_ms']:.1f} ms | {r['per_step_now_ms']:.2f} ms | {r['micro_batch_tokens_s']:.1f} s |")
    body = (f"`python benchmarks/batch_planning.py --rows {args.rows}` ({args.rows:,} rows, batch {BATCH}, {RANKS} ranks, a "
            f"{BUDGET:,}-token budget; one epoch):\n\n" + "\n".join(lines))
    print(body)
    if args.write_docs:
        write_section(Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md", "batch-planning", body,
                      heading="## Planning micro-batches at scale")


if __name__ == "__main__":
    main()
