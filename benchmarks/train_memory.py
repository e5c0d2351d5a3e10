"""Training at real-model scale: peak memory and tokens/s vs micro-batch size, before and after; FSDP2 start-up; precision.

Each measurement is a separate `topr train` process (peak RSS from GNU time's
maximum resident set size, tokens/s from its ``train_summary.json``), so runs do
not share allocator state. ``--before TREE`` also measures an older checkout of
toprcli (e.g. ``git worktree add /tmp/before <commit>``) on the same data, with
the same command line: the "before" column.

Parts (``--parts``):

- ``sweep``: SmolLM2-135M-Instruct (the cached GGUF import), one optimizer step on
  one micro-batch of ``micro_batch_tokens`` tokens (rows of 150 prompt + 106
  completion tokens, like GSM8K chat prompts with their completions), AdamW, float32,
  for ``--tokens 2048,4096,8192,16384``. Defaults of the tree under test otherwise
  (gradient checkpointing ``auto``).
- ``vocab``: the same sweep on a small random Llama-architecture model with a 128,256-token
  vocabulary (Llama 3's), where the logits tensor is what grows.
- ``fsdp``: peak host memory per rank while starting (model loaded, sharded, weights
  resident) with 2 ranks (gloo) vs one process, against the floor every process pays
  (interpreter, torch, transformers, the model's code: the model built on the meta
  device); with ``--fsdp-big`` also for a random ~0.9 B Llama; and a 2-step run of each.
- ``precision``: 10 Adafactor steps at lr 5e-7 in float32, bfloat16 (fp32 master
  weights) and bfloat16-pure: cosine and norm ratio of the weight change vs float32,
  and the share of weights that changed at all.

Usage:
  python benchmarks/train_memory.py --parts sweep,vocab --before /tmp/before --markdown
  python benchmarks/train_memory.py --parts fsdp,precision
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
PROMPT, COMPLETION = 150, 106


def smollm2() -> Path:
    from toprcli.models.pretrained import ensure_preset

    return ensure_preset("smollm2-135m-instruct")


def big_vocab_model(work: Path) -> Path:
    """A random Llama (hidden 256, 4 layers) with Llama 3's 128,256-token vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = work / "llama-128k-vocab"
    if (out / "config.json").exists():
        return out
    cfg = LlamaConfig(vocab_size=128256, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False, dtype="float32")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def curated(path: Path, vocab: int, rows: int, seed: int = 0) -> Path:
    """A curated training set of ``rows`` rows of PROMPT + COMPLETION token ids, with a sampling record."""
    import numpy as np
    import pyarrow as pa

    from toprcli.shards import CURATED_SCHEMA, write_table_atomic

    rng = np.random.default_rng(seed)
    cols = {f.name: [] for f in CURATED_SCHEMA}
    for i in range(rows):
        reward = 1.0 if i % 3 == 0 else -1.0
        row = {
            "prompt_id": f"p{i}", "prompt": "q", "answer": "1", "prompt_token_ids": rng.integers(3, vocab, PROMPT).tolist(),
            "sample_index": 0, "completion": "a", "completion_token_ids": rng.integers(3, vocab, COMPLETION).tolist(),
            "behavior_logprobs": [-10.0] * COMPLETION, "finish_reason": "length", "policy": "bench", "iteration": 0,
            "reward": reward, "correct": reward > 0, "extracted_answer": "1", "verdict": "correct" if reward > 0 else "incorrect",
            "advantage": reward, "weight": 1.0,
        }
        for k, v in row.items():
            cols[k].append(v)
    meta = {"sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_new_tokens": COMPLETION, "seed": 0}}
    return write_table_atomic(path, pa.Table.from_pydict(cols, schema=CURATED_SCHEMA), meta)


def run_train(tree: Path, model: Path, data: Path, out: Path, args: list[str], *, nproc: int = 1) -> dict:
    """One `topr train` process of ``tree``: its summary, plus GNU time's peak RSS (MiB) and wall time."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
    base = ["-m", "toprcli", "train", "-m", str(model), "-d", str(data), "-o", str(out), "--no-progress", "--json", *args]
    cmd = [sys.executable, *base] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *base]
    timing = out.with_name(out.name + ".time")
    t0 = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(timing), *cmd], env=env, capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"train failed ({tree}): {res.stderr[-2000:]}")
    summary = json.loads((out / "train_summary.json").read_text())
    summary["peak_rss_mib_time"] = int(timing.read_text().split()[-1]) / 1024  # the largest process of the tree
    summary["process_wall_s"] = wall
    return summary


def sweep(label: str, model: Path, vocab: int, tokens: list[int], trees: dict[str, Path], work: Path, steps: int) -> list[dict]:
    rows = []
    for t in tokens:
        per_row = PROMPT + COMPLETION
        batch = max(1, t // per_row)
        data = curated(work / f"{label}-{t}.parquet", vocab, batch * steps)
        row = {"model": label, "micro_batch_tokens": t, "tokens_per_step": batch * per_row}
        for name, tree in trees.items():
            out = work / f"{label}-{t}-{name}"
            try:
                s = run_train(tree, model, data, out, ["--optimizer", "adamw", "--lr", "1e-5", "--batch-size", str(batch),
                                                       "--max-steps", str(steps), "--micro-batch-tokens", str(t)])
                row[f"{name}_peak_gib"] = round(s["peak_rss_mib_time"] / 1024, 2)
                row[f"{name}_tok_s"] = round(s["tokens_per_s"], 1)
                row[f"{name}_gc"] = s.get("gradient_checkpointing")
            except RuntimeError as e:
                row[f"{name}_error"] = str(e).splitlines()[-1][:200]
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


STARTUP = """
import os, resource, sys, torch
from toprcli.sampling import Processing
from toprcli.training.distributed import init_distributed
from toprcli.training.model import Precision, _load_lm, load_policy
ctx = init_distributed()
if os.environ.get("FLOOR"):  # everything but the weights: the model's code and config, the model on the meta device
    _load_lm(sys.argv[1], torch.float32, on_meta=True)
else:
    policy, _ = load_policy(sys.argv[1], ctx, Precision.resolve("float32", ctx.device), Processing())
    with torch.no_grad():
        total = sum(float(p.to_local().sum() if hasattr(p, "to_local") else p.sum()) for p in policy.parameters())  # every weight resident
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"PEAK {ctx.rank} {peak:.1f}", flush=True)
"""


def big_random_model(work: Path) -> Path:
    """A random Llama of ~0.92 B parameters (hidden 2048, 16 layers, SmolLM2's vocabulary, tied embeddings): 3.7 GB in float32.

    Built in a child process, so this one does not keep the memory of a 3.7 GB model it never uses.
    """
    out = work / "llama-0.9b"
    if not (out / "config.json").exists():
        code = (
            "import sys, torch; from transformers import LlamaConfig, LlamaForCausalLM; torch.manual_seed(0); "
            "cfg = LlamaConfig(vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, "
            "num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048, tie_word_embeddings=True, dtype='float32'); "
            "LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])"
        )
        subprocess.run([sys.executable, "-c", code, str(out)], check=True, capture_output=True)
    return out


def fsdp_startup(model: Path, work: Path) -> dict:
    """Peak host memory while starting (model loaded and sharded, every weight resident): one process vs each of 2 ranks,
    and the same for a process that builds everything but the weights (the floor every process pays: interpreter,
    torch, transformers and the model's code)."""
    script = work / "startup.py"
    script.write_text(STARTUP)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

    def peaks(cmd: list[str], **extra: str) -> list[float]:
        out = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True, check=True).stdout
        return [float(ln.split()[2]) for ln in out.splitlines() if ln.startswith("PEAK")]

    single = peaks([sys.executable, str(script), str(model)])[0]
    ranks = peaks([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), str(model)])
    floor = peaks([sys.executable, str(script), str(model)], FLOOR="1")[0]
    return {
        "model": model.name, "startup_single_mib": single, "startup_rank_mib": ranks, "process_floor_mib": floor,
        "startup_ratio": round(max(ranks) / single, 3),
        "startup_ratio_above_floor": round((max(ranks) - floor) / (single - floor), 3),
    }


def fsdp(model: Path, work: Path, big: bool) -> dict:
    row = {"startup": [fsdp_startup(model, work)] + ([fsdp_startup(big_random_model(work), work)] if big else [])}
    data = curated(work / "fsdp.parquet", 49152, 16)
    args = ["--optimizer", "adamw", "--lr", "1e-5", "--batch-size", "8", "--max-steps", "2", "--micro-batch-tokens", "1024"]
    one = run_train(REPO, model, data, work / "fsdp-1", args)
    two = run_train(REPO, model, data, work / "fsdp-2", args, nproc=2)
    row.update(run_single_peak_mib=one["peak_host_rss_mib"], run_rank_peak_mib=two["peak_host_rss_mib"],
               run_ratio=round(two["peak_host_rss_mib"] / one["peak_host_rss_mib"], 3))
    from safetensors.torch import load_file

    a, b = load_file(str(work / "fsdp-1" / "model.safetensors")), load_file(str(work / "fsdp-2" / "model.safetensors"))
    row["max_abs_weight_diff_1_vs_2_ranks"] = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(json.dumps(row), flush=True)
    return row


def precision(model: Path, work: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    data = curated(work / "precision.parquet", 49152, 40)
    base = load_file(str(model / "model.safetensors"))
    deltas = {}
    for dtype in ("float32", "bfloat16", "bfloat16-pure"):
        out = work / f"precision-{dtype}"
        run_train(REPO, model, data, out, ["--optimizer", "adafactor", "--lr", "5e-7", "--batch-size", "4", "--max-steps", "10",
                                           "--micro-batch-tokens", "2048", "--dtype", dtype])
        w = load_file(str(out / "model.safetensors"))
        start = {k: v.to(torch.bfloat16) for k, v in base.items()} if dtype == "bfloat16-pure" else base
        deltas[dtype] = torch.cat([(w[k].double() - start[k].double()).flatten() for k in sorted(base)])
    ref = deltas["float32"]
    row = {}
    for dtype, d in deltas.items():
        row[dtype] = {
            "cosine_vs_fp32": round(float(torch.nn.functional.cosine_similarity(d, ref, dim=0)), 4),
            "norm_ratio_vs_fp32": round(float(d.norm() / ref.norm()), 4),
            "changed_fraction": round(float((d != 0).double().mean()), 4),
        }
    print(json.dumps(row), flush=True)
    return row


def markdown(result: dict) -> str:
    lines = []
    for part in ("sweep", "vocab"):
        rows = result.get(part)
        if not rows:
            continue
        trees = [k[: -len("_peak_gib")] for k in rows[0] if k.endswith("_peak_gib")]
        lines.append("| model | micro_batch_tokens | " + " | ".join(f"{t} peak GiB | {t} tok/s" for t in trees) + " |")
        lines.append("|---|---:|" + "---:|---:|" * len(trees))
        for r in rows:
            cells = " | ".join(f"{r.get(f'{t}_peak_gib', r.get(f'{t}_error', '–'))} | {r.get(f'{t}_tok_s', '–')}" for t in trees)
            lines.append(f"| {r['model']} | {r['micro_batch_tokens']:,} | {cells} |")
        lines.append("")
    if "fsdp" in result:
        f = result["fsdp"]
        lines.append("| model | one process peak MiB | each of 2 ranks, peak MiB | floor MiB (no weights) | rank / single | above the floor |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for r in f["startup"]:
            lines.append(f"| {r['model']} | {r['startup_single_mib']:,.0f} | {' / '.join(f'{x:,.0f}' for x in r['startup_rank_mib'])} | "
                         f"{r['process_floor_mib']:,.0f} | {r['startup_ratio']} | {r['startup_ratio_above_floor']} |")
        lines.append("")
        lines.append(f"2 optimizer steps (AdamW), peak host RSS: one process {f['run_single_peak_mib']:,.0f} MiB, each rank "
                     f"{f['run_rank_peak_mib']:,.0f} MiB ({f['run_ratio']}x); max |ΔW| between them {f['max_abs_weight_diff_1_vs_2_ranks']:.2g}.")
        lines.append("")
    if "precision" in result:
        lines.append("| dtype | cosine(ΔW, ΔW fp32) | ‖ΔW‖ / ‖ΔW fp32‖ | weights changed |")
        lines.append("|---|---:|---:|---:|")
        for k, v in result["precision"].items():
            lines.append(f"| {k} | {v['cosine_vs_fp32']} | {v['norm_ratio_vs_fp32']} | {v['changed_fraction']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="sweep,vocab,fsdp,precision")
    ap.add_argument("--tokens", default="2048,4096,8192,16384")
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps per run (each one micro-batch)")
    ap.add_argument("--before", default=None, help="an older toprcli checkout to measure as 'before'")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None, help="write the result JSON here")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--fsdp-big", action="store_true", help="fsdp: also the start-up of a random ~0.9 B Llama (3.7 GB float32)")
    args = ap.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="topr-train-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"after": REPO}
    if args.before:
        trees = {"before": Path(args.before).resolve(), **trees}
    tokens = [int(t) for t in args.tokens.split(",")]
    parts = args.parts.split(",")
    result: dict = {"host": os.uname().nodename, "cpus": os.cpu_count(), "load_start": os.getloadavg()[0]}
    if "sweep" in parts:
        result["sweep"] = sweep("SmolLM2-135M", smollm2(), 49152, tokens, trees, work, args.steps)
    if "vocab" in parts:
        result["vocab"] = sweep("random Llama, vocab 128k", big_vocab_model(work), 128256, tokens, trees, work, args.steps)
    if "fsdp" in parts:
        result["fsdp"] = fsdp(smollm2(), work, args.fsdp_big)
    if "precision" in parts:
        result["precision"] = precision(smollm2(), work)
    result["load_end"] = os.getloadavg()[0]
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result) if args.markdown else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
