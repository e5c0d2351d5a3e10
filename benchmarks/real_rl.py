"""A real-model RL experiment: SmolLM2-135M-Instruct, TOPR vs positive-only SFT, on CPU.

``--probe`` first measures the base model's pass@1 on candidate tasks (built-in
arithmetic levels, a GSM8K subset; chat template, vLLM) so the experiment uses a
task within its reach. The experiment then runs ``topr iterate`` twice from the
same base model, on the same task, seeds and samples budget:

- ``topr``: TOPR with the baseline solved for an effective positive share p̃
  (``--p-tilde``, chosen from the probe's positive share; see docs/results.md);
- ``sft``: positive-only SFT (``train.loss=sft``: negatives dropped).

Round 0 (the base model's eval) is computed once and copied into both runs.
Prints per-round pass@1, maj@k, invalid rate (and greedy accuracy), and with
``--write-docs`` writes them into docs/results.md between markers.

Usage:
  python benchmarks/real_rl.py --probe
  python benchmarks/real_rl.py --task arith:3 --rounds 2 --p-tilde 0.3 --write-docs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from docs_section import write_section  # benchmarks/docs_section.py (the script's own directory)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]


INSTRUCTION = {  # the chat message; {question} is the problem
    "arith": "{question} Answer with the result on its own last line as '#### <number>'.",
    "gsm8k": None,  # the gsm8k preset's instruction
}


def dataset(task: str, split: str, size: int) -> dict:
    if task.startswith("arith:"):
        return {"source": "builtin:arith", "split": split, "level": int(task.split(":")[1]), "size": size, "chat_template": True,
                "template": INSTRUCTION["arith"]}
    if task == "gsm8k":
        return {"source": "builtin:gsm8k", "split": split, "limit": size, "chat_template": True}
    raise SystemExit(f"unknown task {task!r}: use arith:1..4 or gsm8k")


def max_new(task: str) -> int:
    return 256 if task == "gsm8k" else 96


def probe(tasks: list[str], prompts: int, k: int, work: Path, temperature: float, top_p: float) -> list[dict]:
    from toprcli.config import EngineConfig, EvalConfig, SamplingConfig, from_dict
    from toprcli.config import DatasetSpec
    from toprcli.stages import eval as eval_stage
    from toprcli.generation import open_backend
    from toprcli.models.pretrained import ensure_preset

    model = str(ensure_preset("smollm2-135m-instruct"))
    engine = EngineConfig(backend="vllm")
    backend = open_backend(engine, model)
    rows = []
    try:
        for task in tasks:
            out = work / f"probe-{task.replace(':', '')}-T{temperature}-p{top_p}"
            shutil.rmtree(out, ignore_errors=True)
            cfg = EvalConfig(model=model, dataset=from_dict(DatasetSpec, dataset(task, "test", prompts)), out=str(out), k=k,
                             sampling=SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new(task), seed=7),
                             engine=engine, verifier="gsm8k")
            t0 = time.perf_counter()
            m = eval_stage.run(cfg, backend=backend)["metrics"]
            rows.append({"task": task, "temperature": temperature, "top_p": top_p, "prompts": prompts, "k": k, "pass@1": m["pass@1"], f"maj@{k}": m["maj@k"],
                         "greedy": m.get("greedy_accuracy"), "invalid": m["invalid_rate"],
                         "mean_tokens": round(m["mean_completion_tokens"], 1), "wall_s": round(time.perf_counter() - t0)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        backend.close()
    return rows


def config(task: str, args, run_dir: Path, model: str) -> dict:
    ds = dataset(task, "train", args.train_prompts)
    ev = dataset(task, "test", args.eval_prompts)
    return {
        "run_dir": str(run_dir),
        "model": model,
        "rounds": args.rounds,
        "train_from": "previous",
        "generate": {"dataset": ds, "n": args.n, "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                                                            "max_new_tokens": max_new(task), "seed": 0},
                     "engine": {"backend": "vllm"}, "shard_size": 64},
        "score": {"verifier": "gsm8k"},
        "curate": {"positive_fraction": args.p_tilde, "unreachable_baseline": 0.0},
        "train": {"loss": "topr", "optimizer": "adamw", "lr": args.lr, "batch_size": args.batch_size, "epochs": 1,
                  "micro_batch_tokens": 4096, "schedule": "constant"},
        "eval": {"dataset": ev, "k": args.k, "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                                                        "max_new_tokens": max_new(task), "seed": 1234},
                 "engine": {"backend": "vllm"}, "verifier": "gsm8k"},
    }


def run(variant: str, sets: list[str], cfg_file: Path, run_dir: Path, template: Path | None) -> tuple[list[dict], float]:
    if template is not None and not (run_dir / "round-000").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(template / "round-000", run_dir / "round-000")
    cmd = [sys.executable, "-m", "toprcli", "iterate", "--config", str(cfg_file), "--run-dir", str(run_dir), "--no-report"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    wall = time.perf_counter() - t0
    rows = json.loads(subprocess.run([sys.executable, "-m", "toprcli", "report", str(run_dir), "--json"], check=True,
                                     capture_output=True, text=True, cwd=REPO).stdout)
    for r in rows:
        r["variant"] = variant
    return rows, wall


def table(rows: list[dict]) -> str:
    lines = ["| variant | round | pass@1 | maj@k | greedy | invalid | p (train samples) | p̃ | train rows |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in rows:
        lines.append(f"| {r['variant']} | {r['round']} | {f(r.get('pass@1'))} | {f(r.get('maj@k'))} | {f(r.get('greedy_accuracy'))} | "
                     f"{f(r.get('invalid_rate'))} | {f(r.get('p'))} | {f(r.get('p_effective'))} | {f(r.get('rows_out'))} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", action="store_true", help="only measure the base model's pass@1 on the candidate tasks")
    ap.add_argument("--probe-tasks", default="arith:1,arith:2,arith:3,arith:4,gsm8k")
    ap.add_argument("--probe-prompts", type=int, default=48)
    ap.add_argument("--task", default="arith:3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--train-prompts", type=int, default=256)
    ap.add_argument("--n", type=int, default=4, help="samples per training prompt")
    ap.add_argument("--eval-prompts", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (generation and eval)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (generation and eval)")
    ap.add_argument("--p-tilde", type=float, default=0.3, help="TOPR's effective positive share")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--variants", default="topr,sft")
    ap.add_argument("--work", default="runs/real-rl")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.probe:
        rows = probe(args.probe_tasks.split(","), args.probe_prompts, args.k, work, args.temperature, args.top_p)
        print(json.dumps(rows, indent=2))
        return

    from toprcli.models.pretrained import ensure_preset

    model = str(ensure_preset("smollm2-135m-instruct"))
    cfg_file = work / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config(args.task, args, work / "topr", model), sort_keys=False))
    variants = {"topr": [], "sft": ["train.loss=sft"]}
    t0 = time.perf_counter()
    all_rows, walls, template = [], {}, None
    for name in args.variants.split(","):
        rows, walls[name] = run(name, variants[name], cfg_file, work / name, template)
        template = template or work / name
        all_rows += rows
        print(table(rows), flush=True)
    total = time.perf_counter() - t0
    text = table(all_rows)
    print(text)
    result = {"args": vars(args), "rows": all_rows, "wall_s": walls, "total_wall_s": total}
    (work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.write_docs:
        cmd = "python benchmarks/real_rl.py " + " ".join(sys.argv[1:])
        body = (f"Command: `{cmd}` — {total / 60:.0f} min on 2 CPU cores "
                f"({', '.join(f'{k} {v / 60:.0f} min' for k, v in walls.items())}).\n\n{text}")
        write_section(REPO / "docs" / "results.md", "real-rl", body, heading="## A real model: SmolLM2-135M-Instruct", title="# Results")


if __name__ == "__main__":
    main()
