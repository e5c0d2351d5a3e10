"""The paper's comparison on a real model: TOPR (fixed p̃), TOPR (p̃ following p), positive-only SFT and DPO.

SmolLM2-135M-Instruct on the built-in arithmetic task (level 1), on CPU, with
``topr iterate``: every variant × seed is one run of ``--rounds`` rounds. Round 0
(the base model's eval) is computed once, by the first run, and every other run
branches from it (``--branch-from``: hard links, nothing recomputed). A seed sets
the generation seed and the training data order; the eval (prompts and sampling
seed) is the same for every run, so any two runs are compared prompt by prompt
with a paired bootstrap. Sampling is at temperature 1 without truncation, so DPO's
reference is the stored μ of the round's data (no extra scoring pass).

Prints, and with ``--write-docs`` writes into docs/results.md, the per-round table
(seed means, with each seed's 95% interval range) and the paired intervals of each
variant against TOPR with a fixed p̃, per seed and pooled over seeds (the per-prompt
scores averaged over seeds, prompts resampled).

Usage:
  python benchmarks/compare_rl.py --write-docs            # ~1 h on 2 cores
  python benchmarks/compare_rl.py --seeds 0 --variants topr,dpo --train-prompts 8 --eval-prompts 16   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from docs_section import write_section  # benchmarks/ (the script's own directory)
from real_rl import REPO, config  # the task and its iterate config

VARIANTS = {
    "topr": [],  # p̃ = --p-tilde (0.3), fixed
    # p̃ that follows the data: max(0.1, p), the paper's lower end as a floor — the raw baseline (c = 0) once p > 0.1.
    "topr-at-least-p": ["curate.positive_fraction=0.1", "curate.positive_fraction_rule=at-least-p"],
    "sft": ["train.loss=sft"],
    "dpo": ["train.loss=dpo", "curate.pairs=matched"],
}
METRICS = (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("greedy_accuracy", "greedy"))


def iterate(cfg_file: Path, run_dir: Path, sets: list[str], extra: list[str]) -> tuple[list[dict], float]:
    """One `topr iterate` run (resumed if it exists), then its `topr report --json` rows."""
    cmd = [sys.executable, "-m", "toprcli", "iterate", "--config", str(cfg_file), "--run-dir", str(run_dir), "--no-report", *extra]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    wall = time.perf_counter() - t0
    report = subprocess.run([sys.executable, "-m", "toprcli", "report", str(run_dir), "--json"], check=True,
                            capture_output=True, text=True, cwd=REPO)
    return json.loads(report.stdout), wall


def last_eval(run_dir: Path, r: int) -> dict:
    return json.loads((run_dir / f"round-{r:03d}" / "eval" / "eval.json").read_text())


def paired(a: dict[str, float], b: dict[str, float], resamples: int, seed: int) -> dict:
    """mean(b − a) over shared prompts and its paired percentile bootstrap interval."""
    from toprcli.evaluation import paired_bootstrap_interval

    lo, hi, n = paired_bootstrap_interval(b, a, resamples=resamples, seed=seed)
    shared = set(a) & set(b)
    return {"difference": sum(b[p] - a[p] for p in shared) / n, "interval": [lo, hi], "prompts": n, "outside_noise": lo > 0 or hi < 0}


def seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Per prompt, the mean over seeds (prompts all seeds evaluated)."""
    shared = set.intersection(*(set(s) for s in per_seed))
    return {p: float(np.mean([s[p] for s in per_seed])) for p in shared}


def comparisons(work: Path, variants: list[str], seeds: list[int], rounds: int, resamples: int) -> list[dict]:
    """Each variant against the first (per round ≥ 1, per seed and pooled), per metric."""
    out = []
    base = variants[0]
    for name in variants[1:]:
        for r in range(1, rounds + 1):
            for key, title in METRICS:
                a = [last_eval(work / f"{base}-s{s}", r)["per_prompt"][key] for s in seeds]
                b = [last_eval(work / f"{name}-s{s}", r)["per_prompt"][key] for s in seeds]
                row = {"variant": name, "against": base, "round": r, "metric": title,
                       "per_seed": [paired(x, y, resamples, 0) for x, y in zip(a, b)],
                       "pooled": paired(seed_mean(a), seed_mean(b), resamples, 0)}
                out.append(row)
    return out


def round_table(rows: list[dict], variants: list[str], seeds: list[int]) -> str:
    f = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["| variant | round | pass@1 (seeds) | mean | maj@k mean | greedy mean | 95% interval of pass@1 (per seed) | p (train) | p̃ | train rows |",
             "|---|---:|---|---:|---:|---:|---|---|---|---|"]
    for name in variants:
        by_round: dict[int, list[dict]] = {}
        for r in rows:
            if r["variant"] == name:
                by_round.setdefault(r["round"], []).append(r)
        for rnd, rs in sorted(by_round.items()):
            mean = lambda k: None if any(x.get(k) is None for x in rs) else float(np.mean([x[k] for x in rs]))  # noqa: E731
            ivs = ", ".join(f"[{x['intervals']['pass@1'][0]:.3f}, {x['intervals']['pass@1'][1]:.3f}]" for x in rs if x.get("intervals"))
            lines.append(f"| {name} | {rnd} | {' / '.join(f(x.get('pass@1')) for x in rs)} | {f(mean('pass@1'))} | {f(mean('maj@k'))} | "
                         f"{f(mean('greedy_accuracy'))} | {ivs} | {' / '.join(f(x.get('p')) for x in rs)} | "
                         f"{' / '.join(f(x.get('p_target') if x.get('p_target') is not None else x.get('p_effective')) for x in rs)} | "
                         f"{' / '.join(str(x.get('rows_out', '–')) for x in rs)} |")
    return "\n".join(lines)


def paired_table(comps: list[dict]) -> str:
    lines = ["| variant − topr | round | metric | pooled over seeds: Δ [95% paired interval] | per seed | outside the noise? |",
             "|---|---:|---|---|---|---|"]
    for c in comps:
        p = c["pooled"]
        per = "; ".join(f"{s['difference']:+.3f} [{s['interval'][0]:+.3f}, {s['interval'][1]:+.3f}]" for s in c["per_seed"])
        verdict = "yes" if p["outside_noise"] else "no"
        lines.append(f"| {c['variant']} | {c['round']} | {c['metric']} | {p['difference']:+.3f} [{p['interval'][0]:+.3f}, "
                     f"{p['interval'][1]:+.3f}] | {per} | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arith:1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--train-prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4, help="samples per training prompt")
    ap.add_argument("--eval-prompts", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--p-tilde", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--work", default="runs/compare-rl")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    from toprcli.models.pretrained import ensure_preset

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = str(ensure_preset("smollm2-135m-instruct"))
    cfg_file = work / "config.yaml"
    base = config(args.task, args, work / "unused", model)
    base["eval"]["bootstrap_resamples"] = args.resamples
    cfg_file.write_text(yaml.safe_dump(base, sort_keys=False))
    variants, seeds = args.variants.split(","), [int(s) for s in args.seeds.split(",")]
    t0 = time.perf_counter()
    rows, walls, first = [], {}, None
    for seed in seeds:
        for name in variants:
            run_dir = work / f"{name}-s{seed}"
            sets = VARIANTS[name] + [f"generate.sampling.seed={seed}", f"train.seed={seed}"]
            branch = ["--branch-from", str(first / "round-000")] if first is not None and not run_dir.exists() else []
            got, walls[run_dir.name] = iterate(cfg_file, run_dir, sets, branch)
            first = first or run_dir
            rows += [{**r, "variant": name, "seed": seed} for r in got]
            print(f"{run_dir.name}: {walls[run_dir.name] / 60:.1f} min", flush=True)
    total = time.perf_counter() - t0
    comps = comparisons(work, variants, seeds, args.rounds, args.resamples)
    text = round_table(rows, variants, seeds) + "\n\n" + paired_table(comps)
    print(text)
    (work / "result.json").write_text(json.dumps({"args": vars(args), "rows": rows, "comparisons": comps, "wall_s": walls,
                                                  "total_wall_s": total}, indent=2) + "\n")
    if args.write_docs:
        cmd = "python benchmarks/compare_rl.py " + " ".join(sys.argv[1:])
        body = f"Command: `{cmd}` — {total / 60:.0f} min on 2 CPU cores.\n\n{text}"
        write_section(REPO / "docs" / "results.md", "compare-rl", body, heading="## TOPR, a p̃ that follows p, SFT and DPO on SmolLM2", title="# Results")


if __name__ == "__main__":
    main()
