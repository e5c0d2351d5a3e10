"""Synthetic curated training sets for the trainer tests (random token ids within the vocab).

Imported by the other test_train*.py files (`from test_train_data import write_curated`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from toprcli.shards import CURATED_SCHEMA, write_table_atomic


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


def test_synthetic_curated_data_has_the_contract_columns(tmp_path):
    from toprcli.shards import read_table, validate_columns

    path = write_curated(tmp_path / "train.parquet", n=8)
    table = read_table(path)
    validate_columns(table, "curated", path)
    assert table.num_rows == 8
    lens = [len(c) for c in table.column("completion_token_ids").to_pylist()]
    assert lens == [len(b) for b in table.column("behavior_logprobs").to_pylist()]
