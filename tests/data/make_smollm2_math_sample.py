"""Rebuild smollm2_math_sample.jsonl: real SmolLM2 completions of math_problems.jsonl, with raw math-verify verdicts.

    topr generate -c GEN.yaml -o SAMPLES     # see README.md for GEN.yaml
    python tests/data/make_smollm2_math_sample.py SAMPLES

Run it in a process that has not imported toprcli's math verifier (its guards
change math-verify in-process): ``raw_math_verify`` must be the library alone,
``verify(parse(answer), parse(completion))`` with its defaults.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pyarrow.parquet as pq
from math_verify import parse, verify

HERE = Path(__file__).resolve().parent


def main() -> None:
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    problems = {json.loads(line)["answer"]: json.loads(line)["id"] for line in (HERE / "math_problems.jsonl").open()}
    rows = pq.read_table(sorted(Path(sys.argv[1]).glob("shard-*.parquet"))).to_pylist()
    rows.sort(key=lambda r: (problems[r["answer"]], r["sample_index"]))
    with (HERE / "smollm2_math_sample.jsonl").open("w") as f:
        for r in rows:
            raw = bool(verify(parse(r["answer"]), parse(r["completion"])))
            out = {
                "problem": problems[r["answer"]],
                "sample_index": r["sample_index"],
                "answer": r["answer"],
                "finish_reason": r["finish_reason"],
                "raw_math_verify": raw,
                "completion": r["completion"],
            }
            f.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
