"""What `topr train` holds in memory for its training set, per token (once per machine: its local ranks share it).

A synthetic curated file of ``--rows`` rows with ``--prompt`` prompt tokens and ``--completion`` completion
tokens each (token ids int32, μ float32, as `topr curate` writes them) is loaded by
``training.prepare.load_training_data`` in a fresh process; the process reports its peak RSS over what it
held before the load, and the bytes of the arrays it keeps (``TokenData``).

With ``--local-ranks N``, N processes load it at once as the ranks of one machine under torchrun do
(``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``): local rank 0 reads the set and every rank maps the arrays it wrote
(``training.node_data``), or, with ``--each-reads``, every rank reads its own copy (what it did before). Each
rank reads every token once (as training does) and reports its private memory (``RssAnon``) and the shared
file pages it maps (``RssFile``: one copy in the page cache for all of them).

Usage: python benchmarks/train_data_memory.py [--rows 4096 --prompt 512 --completion 4096] [--write-docs]
       python benchmarks/train_data_memory.py --local-ranks 2 [--each-reads]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
MEASURE = """
import json, resource, sys
from toprcli.training.prepare import load_training_data
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
data, *_ = load_training_data(sys.argv[1], need_policy=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kept = sum(a.nbytes for a in (data.prompt_ids, data.completion_ids, data.behavior, data.prompt_off, data.completion_off, data.behavior_off))
print(json.dumps({"tokens": int(len(data.prompt_ids) + len(data.completion_ids)), "peak_bytes": (peak - before) * 1024, "kept_bytes": int(kept)}))
"""

MEASURE_RANK = """
import json, os, sys
from pathlib import Path
from toprcli.training.prepare import load_training_data
def status():
    return {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in open("/proc/self/status")) if k in ("VmHWM", "RssAnon", "RssFile")}
before = status()
data, *_ = load_training_data(sys.argv[1], need_policy=False, shared=Path(sys.argv[2]) if sys.argv[2] else None)
read = int(data.prompt_ids.sum()) + int(data.completion_ids.sum()) + float(data.behavior.sum())  # every page, as training reads it
after = status()
print(json.dumps({"rank": int(os.environ["LOCAL_RANK"]), "peak_bytes": after["VmHWM"] - before["VmHWM"],
                  "private_bytes": after["RssAnon"] - before["RssAnon"], "mapped_bytes": after["RssFile"] - before["RssFile"]}))
"""


def local_ranks(path: Path, n: int, each_reads: bool, tmp: str) -> list[dict]:
    """N processes loading ``path`` at once as one machine's ranks; each one's measures, by rank."""
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(n), TMPDIR=tmp)
    shared = "" if each_reads else str(Path(tmp) / "topr-data-bench")
    procs = [subprocess.Popen([sys.executable, "-c", MEASURE_RANK, str(path), shared], env={**env, "LOCAL_RANK": str(i)},
                              stdout=subprocess.PIPE, text=True, cwd=REPO) for i in range(n)]
    return sorted((json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs), key=lambda r: r["rank"])


def write_set(path: Path, rows: int, prompt: int, completion: int) -> None:
    import numpy as np
    import pyarrow as pa

    from toprcli.shards import write_table_atomic

    rng = np.random.default_rng(0)

    def lists(length: int, values: np.ndarray) -> pa.ListArray:
        return pa.ListArray.from_arrays(pa.array(np.arange(0, rows * length + 1, length, dtype=np.int32)), pa.array(values))

    table = pa.table({
        "prompt_token_ids": lists(prompt, rng.integers(3, 30_000, rows * prompt, dtype=np.int32)),
        "completion_token_ids": lists(completion, rng.integers(3, 30_000, rows * completion, dtype=np.int32)),
        "behavior_logprobs": lists(completion, -rng.random(rows * completion, dtype=np.float32)),
        "advantage": pa.array(rng.choice([-0.5, 0.5], rows).astype(np.float32)),
        "weight": pa.array(np.ones(rows, dtype=np.float32)),
    })
    write_table_atomic(path, table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--completion", type=int, default=4096)
    ap.add_argument("--write-docs", action="store_true", help="write the result into docs/benchmarks.md")
    ap.add_argument("--local-ranks", type=int, default=0, help="N processes as one machine's ranks (shared arrays)")
    ap.add_argument("--each-reads", action="store_true", help="with --local-ranks: every rank reads its own copy")
    args = ap.parse_args()
    if args.local_ranks:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "train.parquet"
            write_set(path, args.rows, args.prompt, args.completion)
            for r in local_ranks(path, args.local_ranks, args.each_reads, tmp):
                print(f"local rank {r['rank']}: peak +{r['peak_bytes'] / 2**20:,.0f} MiB, private +{r['private_bytes'] / 2**20:,.0f} MiB, "
                      f"shared file pages mapped {r['mapped_bytes'] / 2**20:,.0f} MiB")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.parquet"
        write_set(path, args.rows, args.prompt, args.completion)
        out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, check=True, cwd=REPO)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    body = (f"`python benchmarks/train_data_memory.py --rows {args.rows} --prompt {args.prompt} --completion {args.completion}`: "
            f"{r['tokens']:,} tokens; kept {r['kept_bytes'] / 2**20:,.0f} MiB ({r['kept_bytes'] / r['tokens']:.1f} B a token), "
            f"peak while loading {r['peak_bytes'] / 2**20:,.0f} MiB above the process's start ({r['peak_bytes'] / r['tokens']:.1f} B a token).")
    print(body)
    if args.write_docs:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from docs_section import write_section

        write_section(REPO / "docs" / "benchmarks.md", "train-data-memory", body, heading="## The training set in memory")


if __name__ == "__main__":
    main()
