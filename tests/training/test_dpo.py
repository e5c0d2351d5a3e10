"""Offline DPO in the trainer (toprcli/training/prepare.py, trainer.py): pairs, and the reference's log-probs.

The reference is the starting policy's *unprocessed* distribution (temperature 1,
no truncation). At step 0 π equals it, so every pair's margin is 0 and the loss is
exactly log 2 — when, and only when, the reference used is the unprocessed one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from builders import curated_rows
from toprcli.config import TrainConfig
from toprcli.errors import UserError
from toprcli.shards import CURATED_SCHEMA, write_table_atomic
from toprcli.stages.train import run as train_policy
from toprcli.training.prepare import prepare

PAIR_SCHEMA = CURATED_SCHEMA.append(pa.field("pair_id", pa.int64())).append(pa.field("chosen", pa.bool_()))


def model_logprobs(model_dir: Path, rows: dict, temperature: float) -> list[list[float]]:
    """log softmax(logits / T) of each completion token, one row at a time (no truncation)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p, c in zip(rows["prompt_token_ids"], rows["completion_token_ids"]):
            ids = torch.tensor([p + c])
            logits = model(ids).logits[0, len(p) - 1 : len(p) + len(c) - 1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0].tolist())
    return out


def pair_data(path: Path, model_dir: Path, *, temperature: float, stored_temperature: float | None = None, n: int = 16) -> Path:
    """n rows as n/2 (chosen, rejected) pairs of one prompt each, μ the model's log-probs at the sampling temperature."""
    rows = curated_rows(n, seed=3, policy=str(model_dir), completion_len=(2, 12))
    rows["prompt_id"] = [f"p{i // 2}" for i in range(n)]
    rows["prompt_token_ids"] = [rows["prompt_token_ids"][i - i % 2] for i in range(n)]
    chosen = [i % 2 == 0 for i in range(n)]
    rows.update(correct=chosen, reward=[1.0 if c else -1.0 for c in chosen], advantage=[1.0 if c else -1.0 for c in chosen],
                weight=[1.0] * n, pair_id=[i // 2 for i in range(n)], chosen=chosen)
    rows["behavior_logprobs"] = model_logprobs(model_dir, rows, stored_temperature or temperature)
    sampling = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
    table = pa.Table.from_pydict(rows, schema=PAIR_SCHEMA).replace_schema_metadata({b"toprcli": json.dumps({"sampling": sampling})})
    return write_table_atomic(path, table)


def _cfg(model_dir, data, out, **kw) -> TrainConfig:
    base = dict(model=str(model_dir), data=str(data), out=str(out), loss="dpo", optimizer="adamw", lr=1e-3, batch_size=4,
                max_steps=2, micro_batch_tokens=40)
    return TrainConfig(**{**base, **kw})


def test_the_stored_mu_is_the_reference_only_when_sampled_unprocessed(tmp_path, tiny_model_dir):
    data = pair_data(tmp_path / "t1.parquet", tiny_model_dir, temperature=1.0)
    summary = train_policy(_cfg(tiny_model_dir, data, tmp_path / "out"))
    assert summary["reference_logprobs"] == "stored" and summary["batch_units"] == "pairs"
    assert summary["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["reference_logprobs"] == "stored"


def test_processed_sampling_gets_an_unprocessed_reference_pass(tmp_path, tiny_model_dir):
    # Sampled at T = 0.7: the stored μ is the processed distribution, which differs from the reference.
    data = pair_data(tmp_path / "t07.parquet", tiny_model_dir, temperature=0.7)
    assert prepare(_cfg(tiny_model_dir, data, tmp_path / "o")).reference == "recomputed"
    summary = train_policy(_cfg(tiny_model_dir, data, tmp_path / "out"))
    assert summary["reference_logprobs"] == "recomputed"
    assert summary["first_loss"] == pytest.approx(math.log(2), abs=1e-4)  # π_0 = the recomputed reference
    assert summary["behavior_gap_mean"] > 0.01  # the stored (processed) μ is not the unprocessed π_0
    # With the processed μ as the reference the first loss would not be log 2.
    t07, t1 = model_logprobs(tiny_model_dir, _rows(data), 0.7), model_logprobs(tiny_model_dir, _rows(data), 1.0)
    s = [sum(a) - sum(b) for a, b in zip(t1, t07)]  # log π_0 − log μ per sequence
    z = [0.1 * (s[k] - s[k + 1]) for k in range(0, 4, 2)]  # the first step's two pairs (β = 0.1), any order
    assert any(abs(math.log1p(math.exp(-v)) - math.log(2)) > 1e-3 for v in z)


def test_greedy_or_foreign_data_also_recomputes_and_missing_pairs_are_refused(tmp_path, tiny_model_dir):
    data = pair_data(tmp_path / "t1.parquet", tiny_model_dir, temperature=1.0)
    assert prepare(_cfg(tiny_model_dir, data, tmp_path / "o", recompute_behavior=True)).reference == "recomputed"
    plain = tmp_path / "plain.parquet"
    table = pa.parquet.read_table(data).drop_columns(["pair_id", "chosen"])
    write_table_atomic(plain, table)
    with pytest.raises(UserError, match=r"no 'pair_id' column .*--pairs matched"):
        prepare(_cfg(tiny_model_dir, plain, tmp_path / "o"))


def test_a_pair_with_an_empty_completion_is_refused(tmp_path, tiny_model_dir):
    """A row of no tokens counts 0 in the aggregation: its pair's loss was spread over one row and weighed half."""
    data = pair_data(tmp_path / "t1.parquet", tiny_model_dir, temperature=1.0)
    table = pa.parquet.read_table(data)
    ids = table.column("completion_token_ids").to_pylist()
    mu = table.column("behavior_logprobs").to_pylist()
    ids[3], mu[3] = [], []
    table = table.set_column(table.schema.get_field_index("completion_token_ids"), "completion_token_ids",
                             pa.array(ids, table.schema.field("completion_token_ids").type))
    table = table.set_column(table.schema.get_field_index("behavior_logprobs"), "behavior_logprobs", pa.array(mu, table.schema.field("behavior_logprobs").type))
    write_table_atomic(tmp_path / "empty.parquet", table)
    with pytest.raises(UserError, match=r"row 3 has no completion tokens — a preference pair compares two completions"):
        prepare(_cfg(tiny_model_dir, tmp_path / "empty.parquet", tmp_path / "o"))


def test_a_broken_pair_is_named_by_its_own_pair_id():
    """Units are numbered in their own order, not pair_id's sorted one: [5, 5, 3] names 3 (it named 5)."""
    from toprcli.training.prepare import batch_units

    for pair_id, broken in (([5, 5, 3], 3), ([2, 9, 9, 4, 4], 2), ([7, 1, 1], 7)):
        table = pa.table({"pair_id": pair_id, "chosen": [True, False, True, False, True][: len(pair_id)]})
        with pytest.raises(UserError, match=rf"pair_id {broken} has 1 row\(s\), not 2"):
            batch_units(table, "t.parquet", pairwise=True, group_by_prompt=False)


def _rows(path: Path) -> dict:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()


def test_dpo_with_a_shared_prefix_keeps_pairs_and_starts_at_log_2(tmp_path, tiny_model_dir):
    data = pair_data(tmp_path / "t1.parquet", tiny_model_dir, temperature=1.0)
    summary = train_policy(_cfg(tiny_model_dir, data, tmp_path / "out", shared_prefix=True))
    assert summary["batch_units"] == "pairs by prompt" and summary["shared_prefix"]
    assert summary["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
