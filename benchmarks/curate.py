"""Benchmark `topr curate`: wall time and peak RSS at 0.25 M, 1 M and 4 M scored rows.

Usage:
    python benchmarks/curate.py                       # 0.25M, 1M, 4M rows; data under /tmp/topr-bench-curate
    python benchmarks/curate.py --sizes 250000 1000000 --workdir DIR --keep

Synthetic scored shards (one shard = 65,536 rows; 16 samples per prompt) with
every column of the scored contract. Row shape: prompt ~200 chars (shared by
the prompt's 16 samples), completion 100–600 chars (mean ~350) drawn from a
pool of 50,000 texts plus the row number (so every completion is unique), prompt_token_ids 48 int32, completion_token_ids and
behavior_logprobs 16–64 entries (mean 40), 5% `length` truncations, a
per-prompt success rate drawn from Beta(0.6, 1.2) (mean p ≈ 0.33, many
all-wrong and some all-right prompts), rewards ±1.

Each measurement runs the stage in a fresh subprocess (`curate()` of
toprcli.stages.curate, exactly what the CLI calls); the child reports the
stage's wall time and its own peak RSS (``ru_maxrss``); the parent reports
the process wall time including interpreter start-up and imports, and the
1-minute load average before the run (other work on a shared machine slows
the wall time; the CPU time is the steadier number).
Two settings per size:
  default  --positive-fraction 0.15 (the scale goal: ≤ 10 s, ≤ 2 GiB at 1 M rows)
  all      --positive-fraction 0.15 --drop-truncated --dedupe --drop-uniform-prompts
           --first-positive --max-per-prompt 12
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from docs_section import write_section  # benchmarks/docs_section.py (the script's own directory)

SHARD_ROWS = 65_536
N_SAMPLES = 16
SETTINGS = {
    "default": {"positive_fraction": 0.15},
    "all": {
        "positive_fraction": 0.15,
        "drop_truncated": True,
        "dedupe": True,
        "drop_uniform_prompts": True,
        "first_positive": True,
        "max_per_prompt": 12,
    },
}


def make_scored(out_dir: Path, n_rows: int, seed: int = 0) -> None:
    """Write ``n_rows`` synthetic scored rows as shards (vectorised; ~1 s per 250k rows)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from toprcli import shards

    rng = np.random.default_rng(seed)
    words = np.array("the of and to a in is that for it as with was on be by this are we answer step so then total".split())
    n_pool = 50_000

    def text_pool(n: int, lo: int, hi: int) -> pa.Array:
        lengths = rng.integers(lo // 5, hi // 5, size=n)
        tokens = words[rng.integers(0, len(words), size=int(lengths.sum()))]
        tokens = np.char.add(tokens, " ")
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        flat = "".join(tokens.tolist())  # one join for the whole pool, not per row
        char_off = np.concatenate([[0], np.cumsum(np.char.str_len(tokens))])[offsets]
        return pa.array([flat[a:b] + f"#### {i % 997}" for i, (a, b) in enumerate(zip(char_off[:-1], char_off[1:]))])

    prompts = text_pool(2_000, 150, 250)
    completions = text_pool(n_pool, 100, 600)
    out_dir.mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, n_rows, SHARD_ROWS)):
        n = min(SHARD_ROWS, n_rows - start)
        row = np.arange(start, start + n)
        prompt = row // N_SAMPLES
        n_prompts = int(prompt[-1] - prompt[0] + 1)
        p_prompt = rng.beta(0.6, 1.2, size=n_prompts)
        correct = rng.random(n) < p_prompt[prompt - prompt[0]]
        truncated = rng.random(n) < 0.05
        correct &= ~truncated
        clen = rng.integers(16, 65, size=n)

        def lists(lengths, values):
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

        table = pa.table(
            {
                "prompt_id": pa.array(np.char.add("gsm8k-", prompt.astype(str))),
                "prompt": prompts.take(pa.array(prompt % len(prompts))),
                "answer": pa.array((prompt % 997).astype(str)),
                "prompt_token_ids": lists(np.full(n, 48), rng.integers(0, 32_000, size=48 * n, dtype=np.int32)),
                "sample_index": pa.array((row % N_SAMPLES).astype(np.int32)),
                # pool text + the row number: every completion unique, as in real samples
                "completion": pc.binary_join_element_wise(
                    completions.take(pa.array(rng.integers(0, n_pool, size=n))), pa.array(row.astype(str)), " #"
                ),
                "completion_token_ids": lists(clen, rng.integers(0, 32_000, size=int(clen.sum()), dtype=np.int32)),
                "behavior_logprobs": lists(clen, -rng.exponential(0.5, size=int(clen.sum())).astype(np.float32)),
                "finish_reason": pa.array(np.where(truncated, "length", "stop")),
                "policy": pa.array(["runs/bench/policy-0"] * n),
                "iteration": pa.array(np.zeros(n, dtype=np.int32)),
                "reward": pa.array(np.where(correct, 1.0, -1.0).astype(np.float32)),
                "correct": pa.array(correct),
                "extracted_answer": pa.array((prompt % 997).astype(str)),
                "verdict": pa.array(np.where(correct, "correct", np.where(truncated, "no_answer", "incorrect"))),
            }
        )
        shards.write_shard(out_dir, k, shards.conform(table, "scored"))


def child(cfg_json: str) -> None:
    t0 = time.perf_counter()
    from toprcli.config import CurateConfig
    from toprcli.stages.curate import run as curate

    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    result = curate(CurateConfig(**json.loads(cfg_json)))
    t2 = time.perf_counter()
    r2 = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "import_s": t1 - t0,
                "stage_s": t2 - t1,
                "stage_cpu_s": (r2.ru_utime - r1.ru_utime) + (r2.ru_stime - r1.ru_stime),
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rows_in": result["rows_in"],
                "rows_out": result["rows_out"],
                "c": result["c"],
                "p": result["p"],
                "p_effective": result["p_effective"],
            }
        )
    )


def measure(scored: Path, out: Path, setting: str) -> dict:
    cfg = {"scored": [str(scored)], "out": str(out), "overwrite": True, **SETTINGS[setting]}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_s"] = wall
    res["load_before"] = load
    res["out_mib"] = out.stat().st_size / 2**20
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000, 4_000_000])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/topr-bench-curate"))
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--write-docs", action="store_true", help="replace the curate section of docs/benchmarks.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)

    rows = []
    for n in args.sizes:
        scored = args.workdir / f"scored-{n}"
        if not (scored / "shard-00000.parquet").exists():
            t = time.perf_counter()
            make_scored(scored, n)
            print(f"generated {n:,} rows in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        in_mib = sum(f.stat().st_size for f in scored.glob("*.parquet")) / 2**20
        for setting in args.settings:
            res = measure(scored, args.workdir / f"train-{n}-{setting}.parquet", setting)
            res.update(rows=n, setting=setting, in_mib=in_mib)
            rows.append(res)
            print(json.dumps(res), file=sys.stderr)
            (args.workdir / f"train-{n}-{setting}.parquet").unlink()
        if not args.keep:
            shutil.rmtree(scored)

    text = render(rows)
    print(text)
    if args.write_docs:
        write_docs(text)


def render(rows: list[dict]) -> str:
    lines = [
        f"`python benchmarks/curate.py --write-docs` on {os.cpu_count()} cores, Python {sys.version.split()[0]}. "
        "Row shape and settings: the script's docstring (scored rows of ~1.2 KB in memory: 200-char prompt, "
        "~350-char unique completion, 48 prompt token ids, 16–64 completion token ids and log-probs; "
        "65,536-row input shards). `stage s` = wall time of the stage (what `topr curate` reports), "
        "`process s` adds interpreter start-up and imports, `CPU s` = user + system time of all threads, "
        "`load` = 1-minute load average just before the run (the machine is shared: wall times above the "
        "CPU time / 2 are waits for a core).",
        "",
        "| rows in | setting | rows out | stage s | process s | CPU s | CPU µs/row | peak RSS MiB | input MiB | output MiB | p̃ | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rows']:,} | {r['setting']} | {r['rows_out']:,} | {r['stage_s']:.2f} | {r['process_s']:.2f} | "
            f"{r['stage_cpu_s']:.2f} | {1e6 * r['stage_cpu_s'] / r['rows']:.2f} | {r['peak_rss_mib']:.0f} | "
            f"{r['in_mib']:.0f} | {r['out_mib']:.0f} | {r['p_effective']:.4f} | {r['load_before']:.1f} |"
        )
    lines += [
        "",
        "`default` = `--positive-fraction 0.15`; `all` adds `--drop-truncated --dedupe --drop-uniform-prompts "
        "--first-positive --max-per-prompt 12`. Goal (issue #5): 1 M rows in ≤ 10 s and ≤ 2 GiB peak RSS, "
        "cost linear in rows.",
    ]
    return "\n".join(lines)


def write_docs(body: str) -> None:
    """Replace (or append) the curate section of docs/benchmarks.md, leaving the others alone."""
    write_section(Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md", "curate", f"## curate\n\n{body}")


if __name__ == "__main__":
    main()
