"""Compare policy losses and positive fractions on the demo, and write docs/results.md.

Runs ``topr iterate`` on configs/demo.yaml once per variant, on the same seed and
data budget. Every variant starts from the same warm-started policy: the first
run's ``base/``, ``warmstart/`` and ``round-000/`` are copied into the others,
so differences come from the RL rounds alone.

    python benchmarks/compare_losses.py                  # all variants
    python benchmarks/compare_losses.py --only topr sft  # a subset
    python benchmarks/compare_losses.py --write-docs     # also rewrite docs/results.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from docs_section import write_section  # benchmarks/docs_section.py (the script's own directory)

REPO = Path(__file__).resolve().parents[1]

# name -> --set overrides. The loss comparison keeps the demo's curation; the
# sweep varies the effective positive share p̃ for TOPR.
VARIANTS: dict[str, list[str]] = {
    "topr": [],
    "sft": ["train.loss=sft"],
    "reinforce": ["train.loss=reinforce"],
    "tis": ["train.loss=tis"],
    "ppo": ["train.loss=ppo"],
    "topr p̃=0.1": ["curate.positive_fraction=0.1", "curate.baseline=null"],
    "topr p̃=0.2": ["curate.positive_fraction=0.2", "curate.baseline=null"],
    "topr raw (c=0)": ["curate.positive_fraction=null", "curate.baseline=0.0"],
}
# The demo itself runs TOPR at p̃ = 0.5, so "topr" is the p̃ = 0.5 point of the sweep.
SHARED = ("base", "warmstart", "round-000")


def slug(name: str) -> str:
    return name.replace(" ", "_").replace("p̃=", "pfrac").replace("(", "").replace(")", "").replace("=", "")


def run_variant(name: str, overrides: list[str], root: Path, config: Path, template: Path | None) -> list[dict]:
    run_dir = root / slug(name)
    if template is not None and not (run_dir / "round-000").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        for part in SHARED:
            if (template / part).exists() and not (run_dir / part).exists():
                shutil.copytree(template / part, run_dir / part)
    cmd = [sys.executable, "-m", "toprcli", "iterate", "--config", str(config), "--run-dir", str(run_dir), "--no-report"]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    wall = time.perf_counter() - t0
    rows = json.loads(subprocess.run([sys.executable, "-m", "toprcli", "report", str(run_dir), "--json"],
                                     check=True, capture_output=True, text=True, cwd=REPO).stdout)
    for r in rows:
        r["variant"], r["wall_s"] = name, wall
    return rows


def table(results: dict[str, list[dict]]) -> str:
    rounds = sorted({r["round"] for rows in results.values() for r in rows})
    head = "| variant | " + " | ".join(f"r{r} pass@1 / maj@k / invalid" for r in rounds) + " |"
    lines = [head, "|---|" + "---|" * len(rounds)]
    for name, rows in results.items():
        by_round = {r["round"]: r for r in rows}
        cells = []
        for r in rounds:
            x = by_round.get(r, {})
            cells.append("–" if x.get("pass@1") is None else f"{x['pass@1']:.3f} / {x['maj@k']:.3f} / {x['invalid_rate']:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mix_table(results: dict[str, list[dict]]) -> str:
    lines = ["| variant | round | p | c | p̃ | train rows |", "|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            if r.get("p") is not None:
                lines.append(f"| {name} | {r['round']} | {r['p']:.3f} | {r.get('c', 0):.3f} | {r.get('p_effective', 0):.3f} | {r.get('rows_out', '–')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    ap.add_argument("--root", type=Path, default=REPO / "runs" / "compare")
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/results.md")
    ap.add_argument("--json", type=Path, default=None, help="also dump all rows as JSON here")
    args = ap.parse_args()

    names = args.only or list(VARIANTS)
    results: dict[str, list[dict]] = {}
    template = None
    for name in names:
        results[name] = run_variant(name, VARIANTS[name], args.root, args.config, template)
        template = template or args.root / slug(name)
        print(table({name: results[name]}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(table(results))
    print(mix_table(results))
    if args.write_docs:
        write_section(REPO / "docs" / "results.md", "compare", f"{table(results)}\n\n{mix_table(results)}", title="# Results")


if __name__ == "__main__":
    main()
