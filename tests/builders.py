"""Data the tests build: synthetic curated training sets, GSM8K rows and wrong-answer pairs.

Shared by test modules in several folders (``from builders import write_curated``);
tests/ is on the import path through its conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from conftest import GSM8K_DIR
from toprcli.shards import CURATED_SCHEMA, write_table_atomic
from toprcli.verifiers import gsm8k

GSM8K_TEST = GSM8K_DIR / "test.jsonl"


def curated_rows(
    n: int = 48,
    *,
    vocab: int = 101,
    seed: int = 0,
    policy: str = "model",
    prompt_len: tuple[int, int] = (3, 16),
    completion_len: tuple[int, int] = (1, 24),
    positive_share: float = 0.3,
) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {f.name: [] for f in CURATED_SCHEMA}
    for i in range(n):
        pl = int(rng.integers(*prompt_len))
        cl = int(rng.integers(*completion_len))
        reward = 1.0 if rng.random() < positive_share else -1.0
        row = {
            "prompt_id": f"p{i // 4}",
            "prompt": "q",
            "answer": "1",
            "prompt_token_ids": [1] + rng.integers(4, vocab, pl - 1).tolist(),
            "sample_index": i % 4,
            "completion": "a",
            "completion_token_ids": rng.integers(4, vocab, cl).tolist(),
            # near the log-prob of a uniform model, so ratios are O(1)
            "behavior_logprobs": (-np.log(vocab) + rng.normal(0, 0.1, cl)).astype(np.float32).tolist(),
            "finish_reason": "stop",
            "policy": policy,
            "iteration": 0,
            "reward": reward,
            "correct": reward > 0,
            "extracted_answer": "1",
            "verdict": "correct" if reward > 0 else "incorrect",
            "advantage": reward,
            "weight": float(rng.uniform(0.5, 1.5)),
        }
        for k, v in row.items():
            rows[k].append(v)
    return rows


def write_curated(path: Path, rows: dict[str, list] | None = None, **kwargs) -> Path:
    rows = rows if rows is not None else curated_rows(**kwargs)
    return write_table_atomic(path, pa.Table.from_pydict(rows, schema=CURATED_SCHEMA))


def grouped_file(path, per_prompt: tuple[int, ...] = (4, 1, 3), seed: int = 0, policy: str = "model"):
    """A curated file of prompts with several completions each (equal prompt tokens within a group) (a group of 1 too), uneven completion lengths."""
    n = sum(per_prompt)
    rows = curated_rows(n, seed=seed, prompt_len=(5, 14), completion_len=(1, 12), policy=policy)
    starts = np.cumsum((0,) + tuple(per_prompt))[:-1]
    owner = np.repeat(np.arange(len(per_prompt)), per_prompt)
    rows["prompt_token_ids"] = [rows["prompt_token_ids"][starts[g]] for g in owner]
    rows["prompt_id"] = [f"p{g}" for g in owner]
    return write_curated(path, rows)


def gsm8k_rows() -> list[dict]:
    return [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]


def shifted_pairs(rows: list[dict]) -> list[tuple[str, str]]:
    """(completion of problem i, answer of the next problem whose gold number differs)."""
    pairs = []
    n = len(rows)
    for i, r in enumerate(rows):
        g = gsm8k.gold_number(r["answer"])
        j = (i + 1) % n
        while gsm8k.gold_number(rows[j]["answer"]) == g:
            j = (j + 1) % n
        pairs.append((r["answer"], rows[j]["answer"]))
    return pairs


def scored_table(items: list[tuple], *, iteration: int = 0, policy: str = "tiny", with_question: bool = True) -> pa.Table:
    """A scored shard by hand: items are (prompt_id, question, completion, verdict), verdict one of the
    contract's; sample_index counts within a prompt; rewards ±1."""
    from toprcli.shards import SCORED_SCHEMA

    cols: dict[str, list] = {f.name: [] for f in SCORED_SCHEMA}
    questions: list[str] = []
    seen: dict[str, int] = {}
    for pid, question, completion, verdict in items:
        k = seen.get(pid, 0)
        seen[pid] = k + 1
        ok = verdict == "correct"
        row = {
            "prompt_id": pid, "prompt": f"Question: {question}\nAnswer:", "answer": "7", "prompt_token_ids": [1, 2, 3],
            "sample_index": k, "completion": completion, "completion_token_ids": [4, 5], "behavior_logprobs": [-0.5, -0.25],
            "finish_reason": "stop", "policy": policy, "iteration": iteration, "reward": 1.0 if ok else -1.0, "correct": ok,
            "extracted_answer": None if verdict == "no_answer" else completion[-1:], "verdict": verdict,
        }
        for name, value in row.items():
            cols[name].append(value)
        questions.append(question)
    t = pa.table(cols, schema=SCORED_SCHEMA)
    return t.append_column("question", pa.array(questions, pa.string())) if with_question else t


# A pipeline small enough for end-to-end tests: tiny model built and warm-started, 16 arith prompts × 4,
# the hf backend (format with run_dir).
MICRO_PIPELINE = """
run_dir: {run_dir}
rounds: 1
warm_start:
  enabled: true
  init_model: true
  examples: 64
  train: {{epochs: 1, lr: 2.0e-3, batch_size: 32}}
generate:
  dataset: {{source: builtin:arith, split: train, level: 1, size: 16}}
  n: 4
  sampling: {{max_new_tokens: 24}}
  engine: {{backend: hf}}
  shard_size: 4
score: {{verifier: gsm8k, workers: 1}}
curate: {{positive_fraction: 0.5, unreachable_baseline: 0.0}}
train: {{loss: topr, optimizer: adamw, lr: 1.0e-3, batch_size: 16, save_every: 1}}
eval:
  dataset: {{source: builtin:arith, split: test, level: 1, size: 8}}
  k: 2
  sampling: {{max_new_tokens: 24}}
  engine: {{backend: hf}}
"""
