"""Are two `topr iterate` run directories the same run? For reproducibility and refactoring checks.

Compares every JSON/YAML/JSONL file (configs, manifests, summaries, metrics), every Parquet
file (samples, scores, training sets) and every policy's weights (bytes) of RUN_A and RUN_B, after leaving out what differs between
two honest runs of one command: wall times and throughput, timestamps, versions and commits, the
``inputs`` fingerprints (names, sizes and mtimes of files), and each run directory's own path.
Exits 1 and names the first difference of each file that differs.

Usage: python benchmarks/same_run.py RUN_A RUN_B
  e.g. the demo before and after a change, with VLLM_CPU_OMP_THREADS_BIND=auto (deterministic on CPU):
    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && PYTHONPATH=. python -m toprcli iterate -c configs/demo.yaml --run-dir /tmp/a)
    topr iterate -c configs/demo.yaml --run-dir /tmp/b && python benchmarks/same_run.py /tmp/a /tmp/b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

# Keys whose values differ between two runs of the same command.
VOLATILE = re.compile(r"wall|time|_s$|per_s|timestamp|created|started|finished|pid|host|version|git|commit|seconds|elapsed|peak|rss|date", re.I)
TEXT = (".json", ".yaml", ".jsonl")


def clean(value: Any, root: Path) -> Any:
    """``value`` without volatile keys, the run dir's path written as <RUN>."""
    if isinstance(value, dict):
        return {k.replace(str(root), "<RUN>"): clean(v, root) for k, v in value.items()
                if not VOLATILE.search(k) and "fingerprint" not in k and k != "inputs"}
    if isinstance(value, list):
        return [clean(v, root) for v in value]
    return value.replace(str(root), "<RUN>") if isinstance(value, str) else value


def first_difference(x: Any, y: Any, path: str = "") -> str:
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                return first_difference(x.get(k), y.get(k), f"{path}.{k}")
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return first_difference(u, v, f"{path}[{i}]")
    return f"{path or '(whole file)'}: {x!r:.80} vs {y!r:.80}"


def load(path: Path) -> Any:
    if path.suffix == ".safetensors":  # the weights, bit for bit
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def compare(a: Path, b: Path) -> list[str]:
    """One line per file that differs or exists in one run only."""
    def files(root: Path) -> set[Path]:
        return {p.relative_to(root) for p in root.rglob("*") if p.suffix in (*TEXT, ".parquet", ".safetensors") and "tracking" not in p.name}

    problems = []
    for rel in sorted(files(a) | files(b)):
        if not ((a / rel).is_file() and (b / rel).is_file()):
            problems.append(f"only in {a if (a / rel).is_file() else b}: {rel}")
            continue
        x, y = clean(load(a / rel), a), clean(load(b / rel), b)
        if x != y:
            problems.append(f"differs: {rel} {first_difference(x, y)}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    args = parser.parse_args()
    a, b = args.run_a.resolve(), args.run_b.resolve()
    problems = compare(a, b)
    n_text = sum(1 for p in a.rglob("*") if p.suffix in TEXT and "tracking" not in p.name)
    n_parquet, n_weights = (sum(1 for _ in a.rglob(f"*.{ext}")) for ext in ("parquet", "safetensors"))
    print("\n".join(problems))
    print(f"{n_text} JSON/YAML, {n_parquet} Parquet and {n_weights} safetensors files of {a} compared with {b}: {len(problems)} differ")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
