"""The verifier demo, trained with TOPR and with positive-only SFT on the same data.

Runs (or finds finished) the generator demo (configs/demo.yaml → runs/demo), builds
the verification data from its scored samples (`topr verifier-data`, as `make
verifier-demo` does), then `topr iterate -c configs/verifier-demo.yaml` twice: with
`train.loss` topr (runs/verifier-demo/topr) and sft (runs/verifier-demo/sft). Every
command is idempotent, so a second run only reads the results. Prints per round:
the verifier's sampled-verdict accuracy on held-out problems' candidates (pass@1),
greedy accuracy, invalid-verdict rate, and, judging the generator's 8 samples per
held-out problem by P(Yes): best-of-8, verifier-weighted maj@8 against plain maj@8
of the same samples, accuracy and AUC. With --write-docs, writes the table into
docs/results.md between markers.

Usage: python benchmarks/verifier_compare.py [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from docs_section import write_section  # benchmarks/docs_section.py (the script's own directory)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
RUNS = {"topr": "runs/verifier-demo/topr", "sft": "runs/verifier-demo/sft"}


def topr(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "toprcli", *args], cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"topr {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    return res.stdout


def run_all() -> dict[str, list[dict]]:
    if not (REPO / "runs/demo/round-003/eval/eval.json").exists():
        topr("iterate", "--config", "configs/demo.yaml")
    topr("verifier-data", "-s", "runs/demo/round-001/scored", "runs/demo/round-002/scored", "runs/demo/round-003/scored",
         "-o", "runs/verifier-demo/train.parquet", "--balance", "--max-per-question", "4")
    topr("verifier-data", "-s", "runs/demo/round-003/eval/scored", "-o", "runs/verifier-demo/test.parquet")
    out = {}
    for loss, run_dir in RUNS.items():
        topr("iterate", "--config", "configs/verifier-demo.yaml", "--set", f"train.loss={loss}", "--run-dir", run_dir, "--no-report")
        out[loss] = json.loads(topr("report", run_dir, "--json"))
    return out


def minutes(run_dir: str) -> float:
    state = json.loads((REPO / run_dir / "state.json").read_text())
    return sum(s["wall_time_s"] for s in state["steps"].values()) / 60


def table(results: dict[str, list[dict]]) -> str:
    def f(v) -> str:
        return "–" if v is None else f"{v:.3f}"

    lines = [
        "| loss | round | verdict accuracy (pass@1) | greedy | invalid verdicts | maj@8 of the samples | best-of-8 by P(Yes) "
        "| weighted maj@8 | verifier accuracy (P(Yes) ≥ 0.5) | AUC |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for loss, rows in results.items():
        for r in rows:
            lines.append(
                f"| {loss} | {r['round']} | {f(r.get('pass@1'))} | {f(r.get('greedy_accuracy'))} | {f(r.get('invalid_rate'))} | "
                f"{f(r.get('candidates_maj@k'))} | {f(r.get('best_of_k_verifier'))} | {f(r.get('weighted_maj@k'))} | "
                f"{f(r.get('verifier_accuracy'))} | {f(r.get('verifier_auc'))} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    results = run_all()
    text = table(results)
    wall = ", ".join(f"{loss} {minutes(d):.1f} min" for loss, d in RUNS.items())
    block = (f"Command: `python benchmarks/verifier_compare.py --write-docs` (each verifier run: {wall} on 2 CPU cores, "
             f"on top of the generator demo's run).\n\n{text}")
    print(block)
    if args.write_docs:
        write_section(REPO / "docs" / "results.md", "verifier", block, title="# Results")


if __name__ == "__main__":
    main()
