"""The synthetic curated training sets the trainer tests use (tests/builders.py) keep the contract."""

from __future__ import annotations

from builders import write_curated


def test_synthetic_curated_data_has_the_contract_columns(tmp_path):
    from toprcli.shards import read_table, validate_columns

    path = write_curated(tmp_path / "train.parquet", n=8)
    table = read_table(path)
    validate_columns(table, "curated", path)
    assert table.num_rows == 8
    lens = [len(c) for c in table.column("completion_token_ids").to_pylist()]
    assert lens == [len(b) for b in table.column("behavior_logprobs").to_pylist()]
