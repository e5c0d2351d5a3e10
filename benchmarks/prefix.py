"""Shared-prefix training against the one-pass trainer, on SmolLM2-135M-Instruct and real rows.

Three shapes, each a real curated training set made by the CLI itself:

(a) ``paper``: 8-shot GSM8K prompts with the chat template (~1,840 tokens), n = 16
    completions sampled from the model (temperature 1, up to 256 new tokens);
(b) ``verifier``: `topr verifier-data` prompts (question + candidate solution, ~350
    tokens) from (a)'s scored samples, m = 8 sampled verdicts each;
(c) ``short``: the arithmetic task's short chat prompts (~60 tokens), n = 4 (the
    kind of run the README and docs/results.md make).

Each measurement is one `topr train` process on the shape's file with the same
options but ``--shared-prefix`` (and ``--group-by-prompt`` for the one-pass run, so
both see the same batches); the two are interleaved round by round and the medians
of their steps after the first are reported: completion tokens per wall second and
per CPU second (the process's), and peak RSS. The token ceiling of a shape is
Σ (prompt + completion) over Σ distinct prompts + Σ completions of a step batch:
the speed-up if only token count mattered; its compute ceiling weighs each token by
the decoder's matmul FLOPs and adds the LM head's per completion token (both layouts
pay it), the speed-up if only matmul FLOPs mattered.

Usage:
  python benchmarks/prefix.py --write-docs                      # ~25–40 min on 2 cores (37 min for the docs' numbers)
  python benchmarks/prefix.py --shapes short --rounds 1         # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from docs_section import write_section  # benchmarks/ (the script's own directory)

REPO = Path(__file__).resolve().parents[1]
SHAPES = ("paper", "verifier", "short")


def topr(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "toprcli", *args, "--no-progress"], check=True, cwd=REPO)


def make_data(shape: str, work: Path, model: str, args) -> Path:
    """The shape's curated file (made once; a rerun reuses it)."""
    out = work / shape / "train.parquet"
    if out.exists():
        return out
    d = work / shape
    if shape in ("paper", "verifier"):
        paper = work / "paper"
        if not (paper / "scored" / "_manifest.json").exists():
            topr("generate", "-m", model, "-d", "builtin:gsm8k", "--split", "train", "--limit", str(args.prompts), "--few-shot", "8",
                 "--chat-template", "--n", "16", "--max-new-tokens", "256", "-o", str(paper / "samples"), "--backend", "vllm")
            topr("score", "-s", str(paper / "samples"), "-o", str(paper / "scored"), "--verifier", "gsm8k")
        if shape == "paper":
            topr("curate", "-s", str(paper / "scored"), "-o", str(out))
            return out
        topr("verifier-data", "-s", str(paper / "scored"), "-o", str(d / "verify.parquet"), "--max-per-question", "2")
        topr("generate", "-m", model, "-d", str(d / "verify.parquet"), "--preset", "verification", "--chat-template",
             "--limit", str(args.verifier_prompts), "--n", "8", "--max-new-tokens", "64", "-o", str(d / "samples"), "--backend", "vllm")
        topr("score", "-s", str(d / "samples"), "-o", str(d / "scored"), "--verifier", "judge")
    else:
        topr("generate", "-m", model, "-d", "builtin:arith", "--set", "dataset.level=1", "--split", "train", "--limit", "32",
             "--chat-template", "--n", "4", "--max-new-tokens", "96", "-o", str(d / "samples"), "--backend", "vllm")
        topr("score", "-s", str(d / "samples"), "-o", str(d / "scored"), "--verifier", "gsm8k")
    topr("curate", "-s", str(d / "scored"), "-o", str(out))
    return out


def ceiling(path: Path, model: str) -> tuple[float, float, int]:
    """(token ceiling, compute ceiling, rows) of the file. The compute ceiling weighs a token by the
    decoder's matmul FLOPs and adds the LM head's for each completion token, which both layouts pay:
    what the speed-up would be if only matmul FLOPs mattered (attention left out; it favours sharing)."""
    import pyarrow.parquet as pq
    from transformers import AutoConfig

    t = pq.read_table(path, columns=["prompt_token_ids", "completion_token_ids"]).to_pydict()
    p = sum(len(x) for x in t["prompt_token_ids"])
    c = sum(len(x) for x in t["completion_token_ids"])
    distinct = sum(len(x) for x in {tuple(x) for x in t["prompt_token_ids"]})
    cfg = AutoConfig.from_pretrained(model)
    H, kv = cfg.hidden_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    decoder = cfg.num_hidden_layers * (2 * H * H + 2 * H * kv + 3 * H * cfg.intermediate_size)  # weights a token meets
    head = cfg.vocab_size * H
    compute = ((p + c) * decoder + c * head) / ((distinct + c) * decoder + c * head)
    return (p + c) / (distinct + c), compute, len(t["prompt_token_ids"])


def measure(data: Path, model: str, work: Path, shared: bool, args, tag: str) -> dict:
    out = work / f"out-{tag}"
    cmd = ["train", "-m", model, "-d", str(data), "-o", str(out), "--overwrite", "--loss", "topr", "--optimizer", "adamw",
           "--lr", "1e-6", "--batch-size", str(args.batch), "--max-steps", str(args.steps), "--micro-batch-tokens",
           str(args.micro_batch_tokens), "--group-by-prompt"] + (["--shared-prefix"] if shared else [])
    topr(*cmd)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]  # the first step warms up
    summary = json.loads((out / "train_summary.json").read_text())
    return {
        "wall_s": [s["step_time_s"] for s in steps], "cpu_s": [s["step_cpu_s"] for s in steps],
        "completion_tokens": [s["completion_tokens"] for s in steps],
        "tokens": [s["tokens"] for s in steps], "peak_rss_mib": summary.get("peak_host_rss_mib"),
        "gradient_checkpointing": summary.get("gradient_checkpointing"),
    }


def summarize(runs: list[dict]) -> dict:
    wall = [c / w for r in runs for c, w in zip(r["completion_tokens"], r["wall_s"])]
    cpu = [c / s for r in runs for c, s in zip(r["completion_tokens"], r["cpu_s"])]
    return {"completion_tok_per_wall_s": statistics.median(wall), "completion_tok_per_cpu_s": statistics.median(cpu),
            "step_wall_s": statistics.median([w for r in runs for w in r["wall_s"]]),
            "peak_rss_mib": max(r["peak_rss_mib"] or 0 for r in runs), "gradient_checkpointing": runs[0]["gradient_checkpointing"]}


def table(results: dict) -> str:
    lines = ["| shape | rows | token / compute ceiling | one-pass: completion tok/s (wall / CPU) | shared prefix: completion tok/s (wall / CPU) | "
             "speed-up (wall) | share of the compute ceiling | peak RSS one-pass / shared (MiB) |", "|---|---:|---:|---|---|---:|---:|---|"]
    for shape, r in results.items():
        a, b = r["one_pass"], r["shared"]
        speedup = b["completion_tok_per_wall_s"] / a["completion_tok_per_wall_s"]
        lines.append(f"| {shape} | {r['rows']} | {r['ceiling']:.2f}× / {r['compute_ceiling']:.2f}× | {a['completion_tok_per_wall_s']:.1f} / {a['completion_tok_per_cpu_s']:.1f} | "
                     f"{b['completion_tok_per_wall_s']:.1f} / {b['completion_tok_per_cpu_s']:.1f} | "
                     f"{speedup:.2f}× | {speedup / r['compute_ceiling']:.0%} | {a['peak_rss_mib']:.0f} / {b['peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--prompts", type=int, default=4, help="GSM8K prompts of shape (a)")
    ap.add_argument("--verifier-prompts", type=int, default=8, help="verification prompts of shape (b)")
    ap.add_argument("--batch", type=int, default=16, help="rows per step (whole prompt groups)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run (the first is not counted)")
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of each mode")
    ap.add_argument("--work", default="runs/bench-prefix")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    from toprcli.models.pretrained import ensure_preset

    model = str(ensure_preset("smollm2-135m-instruct"))
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = {}
    for shape in args.shapes.split(","):
        data = make_data(shape, work, model, args)
        ratio, compute, rows = ceiling(data, model)
        runs: dict[str, list[dict]] = {"one_pass": [], "shared": []}
        for k in range(args.rounds):
            for mode in ("one_pass", "shared"):
                runs[mode].append(measure(data, model, work / shape, mode == "shared", args, f"{mode}-{k}"))
        results[shape] = {"rows": rows, "ceiling": ratio, "compute_ceiling": compute, **{m: summarize(r) for m, r in runs.items()}}
        print(table({shape: results[shape]}), flush=True)
    text = table(results)
    print(text)
    (work / "result.json").write_text(json.dumps({"args": vars(args), "results": results, "wall_s": time.perf_counter() - t0}, indent=2))
    if args.write_docs:
        cmd = "python benchmarks/prefix.py " + " ".join(sys.argv[1:])
        body = f"Command: `{cmd}` — {(time.perf_counter() - t0) / 60:.0f} min on 2 CPU cores (SmolLM2-135M-Instruct, fp32).\n\n{text}"
        write_section(REPO / "docs" / "benchmarks.md", "prefix", body, heading="## Shared-prefix training")


if __name__ == "__main__":
    main()
