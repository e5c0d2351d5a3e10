"""Training throughput, side by side in one run: `topr train` vs a bare PyTorch loop (same loss,
model and batches), and `topr train --loss sft` vs TRL's `SFTTrainer` (same positive-only data).

Builds a model (the built-in ``bench`` preset, ~85M parameters, or
``--hidden/--layers`` for other sizes), or uses a real one (``--model smollm2``:
SmolLM2-135M-Instruct from the toprcli cache, or any HF model dir), and synthetic curated data with fixed
lengths (every row is ``--prompt-len`` + ``--completion-len`` tokens, so every
method processes exactly the same number of tokens per step, with no padding).
Writes a JSON result (``--out``) and prints a table (markdown with ``--markdown``).

Each measurement runs in its own subprocess; methods are interleaved round
by round (A B C D, A B C D, ...) so that load from other processes hits all of
them alike. Throughput = tokens per step / median step time, over the steps
after ``--warmup`` (pooled over rounds). Step time is wall time per optimizer
step including batching, logging and the optimizer: `topr train`'s
``step_time_s`` in metrics.jsonl; the bare loop's own clock; for TRL, the time
between consecutive ``on_step_end`` callbacks.

Usage:
  python benchmarks/train.py --demo                # the demo's SFT warm start on the tiny model (steps/s)
  python benchmarks/train.py                       # CPU, bench preset, fp32
  python benchmarks/train.py --batch 16 --rounds 3 --markdown
  python benchmarks/train.py --model smollm2 --methods topr,bare --batch 8 --prompt-len 150 --completion-len 106 --vary --markdown
  python benchmarks/train.py --hidden 1536 --layers 24 --heads 24 --batch 16 --prompt-len 128 --completion-len 384  # GPU, ~0.7B, bf16
"""

from __future__ import annotations

import argparse
import json
import os

# Every method (also TRL, which never imports toprcli) gets passive OpenMP waiting, as toprcli sets it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("topr", "bare", "topr-sft", "trl-sft")
LABELS = {
    "topr": "`topr train --loss topr`",
    "bare": "bare PyTorch loop, same TOPR loss",
    "topr-sft": "`topr train --loss sft`",
    "trl-sft": "TRL `SFTTrainer`",
}
PAIRS = (("topr", "bare", 0.9), ("topr-sft", "trl-sft", 1.0))
# Dense bf16 peak FLOP/s by GPU name fragment (for MFU).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


# -- setup (parent process) ---------------------------------------------------------


def build(work: Path, args) -> dict:
    import numpy as np
    import pyarrow as pa

    from toprcli.models.pretrained import ensure_preset
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model, count_parameters
    from toprcli.shards import CURATED_SCHEMA, write_table_atomic

    model = work / "model"
    vocab = 101
    if args.model:  # a real checkpoint: linked, not copied; token ids drawn from its whole vocabulary
        from transformers import AutoConfig

        source = ensure_preset("smollm2-135m-instruct") if args.model == "smollm2" else Path(args.model).resolve()
        if not model.exists():
            model.symlink_to(source, target_is_directory=True)
        vocab = int(AutoConfig.from_pretrained(source).vocab_size)
    elif not (model / "config.json").exists():
        sizes = dict(TINY_PRESETS[args.preset])
        if args.hidden:
            sizes.update(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads, intermediate_size=None)
        build_tiny_model(model, seed=0, max_position_embeddings=max(512, args.prompt_len + 2 * args.completion_len), **sizes)
    n = args.batch * (args.warmup + args.steps)
    rng = np.random.default_rng(0)
    for name, positive in (("topr", 0.3), ("sft", 1.0)):
        rows = {f.name: [] for f in CURATED_SCHEMA}
        for i in range(n):
            reward = 1.0 if rng.random() < positive else -1.0
            # --vary: completion lengths uniform in [C/4, 7C/4] (mean C), as sampled completions are
            length = int(rng.integers(max(1, args.completion_len // 4), args.completion_len * 7 // 4 + 1)) if args.vary else args.completion_len
            c = rng.integers(4, vocab, length).tolist()
            row = {
                "prompt_id": f"p{i}", "prompt": "q", "answer": "1",
                "prompt_token_ids": [1] + rng.integers(4, vocab, args.prompt_len - 1).tolist(), "sample_index": 0,
                "completion": "a", "completion_token_ids": c,
                "behavior_logprobs": (-np.log(vocab) + rng.normal(0, 0.1, len(c))).astype(np.float32).tolist(),
                "finish_reason": "stop", "policy": str(model), "iteration": 0, "reward": reward, "correct": reward > 0,
                "extracted_answer": "1", "verdict": "correct" if reward > 0 else "incorrect",
                "advantage": reward, "weight": 1.0,
            }
            for k, v in row.items():
                rows[k].append(v)
        write_table_atomic(work / f"{name}.parquet", pa.Table.from_pydict(rows, schema=CURATED_SCHEMA))
    return {"model": str(model), "parameters": count_parameters(model), "rows": n}


def run_worker(method: str, work: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--work", str(work)] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
        if k in ("batch", "steps", "warmup", "prompt_len", "completion_len", "lr", "threads") and v is not None
    ] + (["--vary"] if args.vary else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{method} failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])  # {"times": [[wall, cpu, tokens], ...], "peak_rss_mib": ...}


# -- workers (one subprocess each) --------------------------------------------------


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def worker_topr(work: Path, args, loss: str) -> list[tuple[float, float, int]]:
    """The `topr train` command itself (in this process), timed by its own metrics.jsonl."""
    from toprcli.cli.main import app

    out = work / f"out-{loss}-{os.getpid()}"
    data = work / ("sft.parquet" if loss == "sft" else "topr.parquet")
    argv = [
        "train", "-m", str(work / "model"), "-d", str(data), "-o", str(out), "--loss", loss,
        "--optimizer", "adamw", "--lr", str(args.lr), "--batch-size", str(args.batch),
        "--max-steps", str(args.warmup + args.steps), "--micro-batch-tokens", str(args.batch * (args.prompt_len + args.completion_len)),
        "--aggregation", "token-mean" if loss == "sft" else "seq-mean-token-mean", "--no-progress", "--overwrite",
    ]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    try:
        app(argv, standalone_mode=False)
    except SystemExit as e:
        if e.code:
            raise
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [(r["step_time_s"], r["step_cpu_s"], r["tokens"]) for r in recs]
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    return times


def worker_bare(work: Path, args) -> list[tuple[float, float, int]]:
    """What a user would write by hand: pad, forward, log π, TOPR loss, backward, clip, AdamW."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = _device()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=dev.type == "cuda")
    t = pq.read_table(work / "topr.parquet").to_pydict()
    n = len(t["advantage"])
    order = np.random.default_rng([0, 0]).permutation(n)  # the same order as `topr train --seed 0`
    P = args.prompt_len
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    times = []
    for step in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = order[step * args.batch : (step + 1) * args.batch]
        # pad the step's rows to the longest (prompts all have P tokens), mask the padding
        C = max(len(t["completion_token_ids"][r]) for r in rows)
        ids = torch.zeros(len(rows), P + C, dtype=torch.long)
        mu = torch.zeros(len(rows), C)
        mask = torch.zeros(len(rows), C)
        for i, r in enumerate(rows):
            c = t["completion_token_ids"][r]
            ids[i, : P + len(c)] = torch.tensor(t["prompt_token_ids"][r] + c)
            mu[i, : len(c)] = torch.tensor(t["behavior_logprobs"][r])
            mask[i, : len(c)] = 1.0
        ids, mu, mask = ids.to(dev), mu.to(dev), mask.to(dev)
        adv = torch.tensor([t["advantage"][r] for r in rows], device=dev)
        with amp:
            logits = model(input_ids=ids, use_cache=False).logits
        logits = logits[:, P - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None])[..., 0] * mask  # (B, C)
        # TOPR: α = 1 for A ≥ 0, clip(π/μ, 0, 1) for A < 0 (sequence ratio, stop-grad); ℓ = −α A mean_t log π
        s = (logp.detach() - mu * mask).sum(-1)
        alpha = torch.where(adv < 0, torch.exp(s.clamp(max=0.0)), torch.ones_like(s))
        loss = -(alpha * adv * logp.sum(-1) / mask.sum(-1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)  # the loop logs its loss, as every trainer does
        times.append((time.perf_counter() - t0, time.process_time() - c0, int(P * len(rows) + mask.sum())))
    return times


def worker_trl(work: Path, args) -> list[tuple[float, float, int]]:
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    t = pq.read_table(work / "sft.parquet").to_pydict()
    # labels given directly: loss on completion tokens only, as `topr train --loss sft`
    ds = Dataset.from_dict({
        "input_ids": [p + c for p, c in zip(t["prompt_token_ids"], t["completion_token_ids"])],
        "labels": [[-100] * len(p) + c for p, c in zip(t["prompt_token_ids"], t["completion_token_ids"])],
    })
    stamps: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if not stamps:
                stamps.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, a, state, control, **kw):
            stamps.append((time.perf_counter(), time.process_time()))

    cuda = torch.cuda.is_available()
    cfg = SFTConfig(
        output_dir=str(work / f"trl-{os.getpid()}"), per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
        max_steps=args.warmup + args.steps, learning_rate=args.lr, lr_scheduler_type="constant", optim="adamw_torch_fused" if cuda else "adamw_torch",
        max_grad_norm=1.0, weight_decay=0.0, logging_steps=1, report_to="none", save_strategy="no", use_cpu=not cuda,
        bf16=cuda, gradient_checkpointing=False, max_length=args.prompt_len + 2 * args.completion_len, packing=False,
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(work / "model"), callbacks=[Clock()])
    tokens: list[int] = []  # real (non-pad) tokens of each batch, in order
    collate = trainer.data_collator

    def counting_collator(examples):
        batch = collate(examples)
        tokens.append(int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["input_ids"].numel()))
        return batch

    trainer.data_collator = counting_collator
    trainer.train()
    # first interval: from the first step's begin (data already loaded) to its end
    return [(b[0] - a[0], b[1] - a[1], n) for a, b, n in zip(stamps, stamps[1:], tokens)]


# -- report -------------------------------------------------------------------------


def summarize(results: dict[str, list[list[list[float]]]], tokens_per_step: int, args, meta: dict) -> dict:
    out = {"settings": {**vars(args), **meta, "tokens_per_step": tokens_per_step}, "methods": {}}
    for m, runs in results.items():
        timed = [t for run in runs for t in run[args.warmup:]]
        out["methods"][m] = {
            "median_step_s": statistics.median(t[0] for t in timed),
            "tokens_per_s": statistics.median(t[2] / t[0] for t in timed),  # median of per-step rates
            "tokens_per_cpu_s": statistics.median(t[2] / t[1] for t in timed),
            "mean_tokens_per_step": statistics.mean(t[2] for t in timed),
            "steps": runs,
        }
    for a, b, goal in PAIRS:
        if a in out["methods"] and b in out["methods"]:
            ma, mb = out["methods"][a], out["methods"][b]
            out[f"{a}_vs_{b}"] = {"ratio": ma["tokens_per_s"] / mb["tokens_per_s"], "ratio_cpu": ma["tokens_per_cpu_s"] / mb["tokens_per_cpu_s"], "goal": goal}
    if meta.get("device", "").startswith("cuda"):
        peak = next((v for k, v in PEAK_BF16.items() if k in meta.get("gpu", "")), None)
        if peak:
            for m in out["methods"].values():
                m["mfu"] = 6 * meta["parameters"] * m["tokens_per_s"] / peak
    return out


def print_table(res: dict, markdown: bool) -> None:
    s = res["settings"]
    lengths = f"{s['prompt_len']}+[{max(1, s['completion_len'] // 4)}..{s['completion_len'] * 7 // 4}]" if s.get("vary") else f"{s['prompt_len']}+{s['completion_len']}"
    head = (f"{s['parameters'] / 1e6:.0f}M params, batch {s['batch']} × {lengths} tokens, "
            f"{s['device']}, {s['dtype']}, {s['rounds']} rounds × {s['steps']} timed steps, load avg {s['loadavg_start']:.1f}→{s['loadavg_end']:.1f}")
    rows = []
    for m, r in res["methods"].items():
        rows.append((LABELS[m], f"{r['tokens_per_s']:.0f}", f"{r['median_step_s']:.3f}", f"{r['tokens_per_cpu_s']:.0f}",
                     f"{r['peak_rss_mib']:,.0f}" if "peak_rss_mib" in r else "-", f"{r['mfu'] * 100:.1f}%" if "mfu" in r else "-"))
    ratios = []
    for a, b, _ in PAIRS:
        if f"{a}_vs_{b}" in res:
            r = res[f"{a}_vs_{b}"]
            ratios.append((f"{a} / {b}", f"{r['ratio']:.2f}× wall, {r['ratio_cpu']:.2f}× per CPU-second (goal ≥ {r['goal']}×)"))
    if markdown:
        print(f"\n{head}\n\n| method | tokens/s | median step (s) | tokens per CPU-s | peak RSS (MiB) | MFU |\n| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print()
        for name, val in ratios:
            print(f"- {name}: {val}")
    else:
        print(head)
        for r in rows:
            print(f"  {r[0]:<40} {r[1]:>8} tok/s  {r[2]:>8} s/step  {r[3]:>8} tok/CPU-s  {r[4]:>8} MiB  MFU {r[5]}")
        for name, val in ratios:
            print(f"  {name}: {val}")


def demo_warm_start(args) -> None:
    """The demo's warm start on the tiny model: gold arith solutions, `--loss sft`, batch 64 (one epoch)."""
    from dataclasses import replace

    from toprcli.config import IterateConfig, TrainConfig
    from toprcli.models.tiny import build_tiny_model
    from toprcli.stages import train, warmstart

    with tempfile.TemporaryDirectory(prefix="topr-demo-") as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(tmp / "tiny", seed=0)
        icfg = IterateConfig()
        icfg = replace(icfg, warm_start=replace(icfg.warm_start, examples=args.demo_examples))
        data = warmstart.run(icfg, tokenizer=str(model), out=tmp / "gold.parquet").out
        cfg = TrainConfig(model=str(model), data=str(data), out=str(tmp / "policy"), loss="sft", optimizer="adamw", lr=2e-3,
                          batch_size=64, epochs=1.0, threads=args.threads)
        s = train.run(cfg)
        steps = [json.loads(x) for x in (tmp / "policy" / "metrics.jsonl").read_text().splitlines()]
        cpu = sum(r["step_cpu_s"] for r in steps)
        print(json.dumps({
            "rows": s["rows"], "steps": s["steps"], "tokens": s["tokens"], "steps_per_s": s["steps_per_s"],
            "tokens_per_s": s["tokens_per_s"], "steps_per_cpu_s": s["steps"] / cpu, "wall_time_s": s["wall_time_s"],
            "first_loss": s["first_loss"], "final_loss": s["final_loss"], "loadavg": os.getloadavg()[0],
        }, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="bench", help="built-in model size preset (tiny, small, bench)")
    ap.add_argument("--model", default=None, help="a real model instead: smollm2 (SmolLM2-135M-Instruct) or an HF model dir")
    ap.add_argument("--hidden", type=int, default=None, help="custom model: hidden size (with --layers, --heads)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8, help="sequences per optimizer step")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=96)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of every method")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--vary", action="store_true", help="completion lengths vary (uniform in [C/4, 7C/4]); default: all equal")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in every method (default: torch's)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--work", default=None, help="work dir (default: a temporary dir)")
    ap.add_argument("--out", default=None, help="write the result JSON here")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--demo", action="store_true", help="instead: time the demo's warm start (tiny model, sft, batch 64)")
    ap.add_argument("--demo-examples", type=int, default=2000)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hidden and not args.heads:
        args.heads = max(1, args.hidden // 64)

    if args.demo:
        demo_warm_start(args)
        return
    if args.worker:
        work = Path(args.work)
        import resource

        fn = {"topr": lambda: worker_topr(work, args, "topr"), "topr-sft": lambda: worker_topr(work, args, "sft"),
              "bare": lambda: worker_bare(work, args), "trl-sft": lambda: worker_trl(work, args)}[args.worker]
        times = fn()
        print(json.dumps({"times": times, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return

    import torch

    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="topr-bench-")
        args.work = tmp.name
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    meta = build(work, args)
    cuda = torch.cuda.is_available()
    meta.update(
        device="cuda" if cuda else f"cpu ({os.cpu_count()} cores)", gpu=torch.cuda.get_device_name(0) if cuda else "",
        dtype="bf16 autocast, fp32 master" if cuda else "fp32", torch=torch.__version__, python=platform.python_version(),
        loadavg_start=os.getloadavg()[0],
    )
    try:
        import trl

        meta["trl"] = trl.__version__
    except ImportError:
        meta["trl"] = None
    methods = [m for m in args.methods.split(",") if m and (m != "trl-sft" or meta["trl"])]
    results: dict[str, list[list[float]]] = {m: [] for m in methods}
    peaks: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(args.rounds):
        for m in (methods if r % 2 == 0 else methods[::-1]):  # ABCD, DCBA, ...: drift hits all alike
            t0 = time.perf_counter()
            got = run_worker(m, work, args)
            results[m].append(got["times"])
            peaks[m].append(got["peak_rss_mib"])
            print(f"round {r + 1}/{args.rounds} {m}: {time.perf_counter() - t0:.0f}s, wall/cpu/tokens per step {['%.2f/%.2f/%d' % tuple(x) for x in results[m][-1]]}", file=sys.stderr)
    meta["loadavg_end"] = os.getloadavg()[0]
    res = summarize(results, args.batch * (args.prompt_len + args.completion_len), args, meta)
    for m in methods:
        res["methods"][m]["peak_rss_mib"] = max(peaks[m])
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print_table(res, args.markdown)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
