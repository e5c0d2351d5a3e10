"""Where a `topr train` step's time goes on the README walkthrough's shape (SmolLM2-135M-Instruct, real rows).

Data: the README walkthrough's commands (GSM8K train prompts with the chat template, n = 4, at most
64 new tokens, T = 0.7, top-p 0.9, constant baseline −0.8) with ``--limit 16``, so that a run has
steps after its first. Variants, each one `topr train` process (batch 8, AdamW, lr 1e-6, as in the
README), interleaved over ``--rounds``:

  cli        the rows as the CLI wrote them, with their sampling record (T 0.7, top-p 0.9)
  t1         the same rows recorded as T = 1, top-p 1: π needs no processing
  synthetic  benchmarks/train.py's kind of rows: random token ids, the same batch, every prompt of
             the walkthrough's mean length, completions of its mean length varied over [C/4, 7C/4], T = 1

For each: tokens/s of the first step (what a one-step walkthrough reports) and the median of the
steps after the second (the second is profiled), the padding of its micro-batches, and one later step profiled (torch.profiler, self CPU
time) into the decoder's matmuls, the LM head's, attention, the optimizer, top-p (sort, top-k,
cumsum), and everything else.

Usage: python benchmarks/train_account.py [--rounds 2 --steps 4] [--write-docs]
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
VARIANTS = ("cli", "t1", "synthetic")
PARTS = ("decoder matmuls", "LM head matmuls", "attention", "optimizer", "top-p", "other")


def topr(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "toprcli", *args, "--no-progress"], check=True, cwd=REPO)


def make_data(work: Path, model: str) -> Path:
    """The walkthrough's rows (its commands, 16 prompts), made once."""
    out = work / "train.parquet"
    if not out.exists():
        topr("generate", "-m", model, "-d", "builtin:gsm8k", "--split", "train", "-o", str(work / "samples"), "--chat-template",
             "--n", "4", "--limit", "16", "--max-new-tokens", "64", "--temperature", "0.7", "--top-p", "0.9")
        topr("score", "-s", str(work / "samples"), "-o", str(work / "scored"), "--verifier", "gsm8k")
        topr("curate", "-s", str(work / "scored"), "-o", str(out), "--baseline", "-0.8")
    return out


def variant_data(src: Path, work: Path, variant: str) -> Path:
    """The rows of ``variant`` (see the module docstring)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = work / f"{variant}.parquet"
    if variant == "cli" or out.exists():
        return src if variant == "cli" else out
    table = pq.read_table(src)
    meta = dict(table.schema.metadata or {})
    own = json.loads(meta[b"toprcli"])  # the file's record: its sampling settings among them
    own["sampling"] = {**own["sampling"], "temperature": 1.0, "top_p": 1.0}
    meta[b"toprcli"] = json.dumps(own).encode()
    if variant == "synthetic":
        rng = np.random.default_rng(0)
        p = round(float(np.mean([len(x) for x in table.column("prompt_token_ids").to_pylist()])))
        c = round(float(np.mean([len(x) for x in table.column("completion_token_ids").to_pylist()])))
        lengths = rng.integers(max(1, c // 4), c * 7 // 4 + 1, table.num_rows)
        prompts = [[1] + rng.integers(4, 49152, p - 1).tolist() for _ in range(table.num_rows)]
        completions = [rng.integers(4, 49152, int(n)).tolist() for n in lengths]
        mu = [(-np.log(49152) + rng.normal(0, 0.1, int(n))).astype(np.float32).tolist() for n in lengths]
        for name, values in (("prompt_token_ids", prompts), ("completion_token_ids", completions), ("behavior_logprobs", mu)):
            table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, type=table.schema.field(name).type))
    pq.write_table(table.replace_schema_metadata(meta), out)
    return out


def classify(averages, vocab: int) -> dict[str, float]:
    """Self CPU seconds of one profiled step by part (``averages``: key_averages grouped by input shape)."""
    parts = dict.fromkeys(PARTS, 0.0)
    for e in averages:
        name, shapes, t = e.key, str(e.input_shapes), e.self_cpu_time_total / 1e6
        if name in ("aten::mm", "aten::addmm", "aten::bmm"):
            parts["LM head matmuls" if str(vocab) in shapes else "decoder matmuls"] += t
        elif "scaled_dot_product" in name or "attention" in name:
            parts["attention"] += t
        elif name in ("aten::sort", "aten::topk", "aten::cumsum"):
            parts["top-p"] += t
        elif name.startswith("Optimizer.step"):
            parts["optimizer"] += e.cpu_time_total / 1e6  # inclusive: the update's own kernels
        elif not name.startswith(("ProfilerStep", "Optimizer")):
            parts["other"] += t
    return parts


def worker(model: str, data: str, out: str, steps: int) -> None:
    """One `topr train` run in this process; the second step is profiled. Prints a JSON line."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from toprcli.config import TrainConfig
    from toprcli.stages.train import run

    cfg = TrainConfig(model=model, data=data, out=out, overwrite=True, optimizer="adamw", lr=1e-6, batch_size=8, max_steps=steps)
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=1, warmup=0, active=1, repeat=1))
    with prof:
        result = run(cfg, on_record=lambda record: prof.step())
    parts = classify(prof.key_averages(group_by_input_shape=True), 49152)
    steps_ = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    print(json.dumps({"steps": steps_, "parts": parts, "threads": torch.get_num_threads(),
                      "gradient_checkpointing": result.summary["gradient_checkpointing"]}))


def padding(model: str, data: Path) -> float:
    """Padded tokens / real tokens over the run's micro-batches, as the trainer lays them out."""
    from toprcli.config import TrainConfig
    from toprcli.training.batching import collate
    from toprcli.training.distributed import DistContext
    from toprcli.training.prepare import prepare
    from toprcli.training.trainer import _micro_batches

    import torch

    prep = prepare(TrainConfig(model=model, data=str(data), out="/tmp/unused", optimizer="adamw", batch_size=8))
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    padded = real = 0
    for step in range(prep.steps):
        units = prep.plan.step_units(step)
        for rows in _micro_batches(prep, units, ctx):
            padded += collate(prep.data, rows, pad_id=0).input_ids.numel()
            real += int(prep.data.seq_lens[rows].sum())
    return padded / real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="steps per run (the first is reported apart, the second profiled)")
    ap.add_argument("--work", default="runs/bench-account")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.worker[2], int(args.worker[3]))
        return
    from toprcli.models.pretrained import ensure_preset

    model, work, t0 = str(ensure_preset("smollm2-135m-instruct")), Path(args.work).resolve(), time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    src = make_data(work, model)
    data = {v: variant_data(src, work, v) for v in VARIANTS}
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for k in range(args.rounds):
        for v in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--worker", model, str(data[v]), str(work / f"out-{v}"), str(args.steps)],
                                 check=True, capture_output=True, text=True, cwd=REPO).stdout
            runs[v].append(json.loads(out.strip().splitlines()[-1]))
            print(v, k, [round(s["tokens_per_s"], 1) for s in runs[v][-1]["steps"]], flush=True)
    results = {v: summarize(r, padding(model, data[v])) for v, r in runs.items()}
    text = table(results)
    print(text)
    (work / "result.json").write_text(json.dumps({"args": vars(args), "results": results, "runs": runs, "wall_s": time.perf_counter() - t0}, indent=2))
    if args.write_docs:
        cmd = "python benchmarks/train_account.py " + " ".join(sys.argv[1:])
        body = f"Command: `{cmd}` — {(time.perf_counter() - t0) / 60:.0f} min on 2 CPU cores.\n\n{text}"
        write_section(REPO / "docs" / "benchmarks.md", "train-account", body)


def summarize(runs: list[dict], pad: float) -> dict:
    first = [r["steps"][0]["tokens_per_s"] for r in runs]
    later = [s["tokens_per_s"] for r in runs for s in r["steps"][2:]]  # step 2 is the profiled one
    parts = {p: statistics.median(r["parts"][p] for r in runs) for p in PARTS}
    return {"first_tok_s": statistics.median(first), "later_tok_s": statistics.median(later), "padding": pad, "parts_cpu_s": parts,
            "tokens_per_step": statistics.median(s["tokens"] for r in runs for s in r["steps"]),
            "threads": runs[0]["threads"], "gradient_checkpointing": runs[0]["gradient_checkpointing"]}


def table(results: dict) -> str:
    head = "| rows | tokens/step | padding | step 1 tok/s | later steps tok/s | " + " | ".join(f"{p} (CPU s)" for p in PARTS) + " |"
    lines = [head, "|---|---:|---:|---:|---:|" + "---:|" * len(PARTS)]
    for v, r in results.items():
        lines.append(f"| {v} | {r['tokens_per_step']:.0f} | {r['padding']:.2f}× | {r['first_tok_s']:.1f} | {r['later_tok_s']:.1f} | "
                     + " | ".join(f"{r['parts_cpu_s'][p]:.2f}" for p in PARTS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
