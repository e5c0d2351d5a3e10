"""The column contract: what samples, scored and curated Parquet files hold (docs/architecture.md §3).

Column names are a public contract (users query these files with pandas,
DuckDB, ``datasets``): add columns freely, never rename these.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa

from toprcli.errors import UserError

SAMPLES_FIELDS = [
    pa.field("prompt_id", pa.string(), nullable=False),
    pa.field("prompt", pa.string(), nullable=False),
    pa.field("answer", pa.string(), nullable=True),
    pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("sample_index", pa.int32(), nullable=False),
    pa.field("completion", pa.string(), nullable=False),
    pa.field("completion_token_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
    pa.field("finish_reason", pa.string(), nullable=False),
    pa.field("policy", pa.string(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
]
SCORED_FIELDS = SAMPLES_FIELDS + [
    pa.field("reward", pa.float32(), nullable=False),
    pa.field("correct", pa.bool_(), nullable=False),
    pa.field("extracted_answer", pa.string(), nullable=True),
    pa.field("verdict", pa.string(), nullable=False),
]
CURATED_FIELDS = SCORED_FIELDS + [
    pa.field("advantage", pa.float32(), nullable=False),
    pa.field("weight", pa.float32(), nullable=False),
]

SAMPLES_SCHEMA = pa.schema(SAMPLES_FIELDS)
SCORED_SCHEMA = pa.schema(SCORED_FIELDS)
CURATED_SCHEMA = pa.schema(CURATED_FIELDS)
SCHEMAS = {"samples": SAMPLES_SCHEMA, "scored": SCORED_SCHEMA, "curated": CURATED_SCHEMA}
# The values of the `verdict` column (toprcli.verifiers names them CORRECT, INCORRECT, ...).
VERDICTS = ("correct", "incorrect", "no_answer", "timeout", "error")
# Which stage writes each kind, so an error can say how to make the file.
_PRODUCER = {"samples": "topr generate", "scored": "topr score", "curated": "topr curate"}


def _type_name(t: pa.DataType) -> str:
    return str(t).replace("list<item: ", "list<").replace("element: ", "")


def validate_columns(
    schema_or_table: pa.Schema | pa.Table,
    kind: str,
    path: str | os.PathLike[str],
    *,
    required: Iterable[str] | None = None,
) -> None:
    """Check that a file has the columns of ``kind`` with the contract's types.

    Extra columns are allowed. ``required`` restricts the check to some
    columns (e.g. training needs token ids but not the prompt text). Raises
    :class:`UserError` naming the first missing column, or every mistyped one,
    and the file.
    """
    if kind not in SCHEMAS:
        raise ValueError(f"unknown schema kind {kind!r}")
    schema = schema_or_table.schema if isinstance(schema_or_table, pa.Table) else schema_or_table
    contract = SCHEMAS[kind]
    names = set(required) if required is not None else set(contract.names)
    mistyped = []
    for field in contract:
        if field.name not in names:
            continue
        if field.name not in schema.names:
            raise UserError(
                f"{path}: missing column {field.name!r} ({_type_name(field.type)}) required for "
                f"{kind} data — produce this file with `{_PRODUCER[kind]}`"
            )
        actual = schema.field(field.name).type
        if not _compatible(actual, field.type):
            mistyped.append(f"column {field.name!r} has type {_type_name(actual)}, expected {_type_name(field.type)}")
    if mistyped:  # all at once: a pandas-written file has several (int64 ids, float64 log-probs), one per rerun was six reruns
        raise UserError(f"{path}: {'; '.join(mistyped)} — rewrite it with `{_PRODUCER[kind]}` or cast the column{'s' if len(mistyped) > 1 else ''}")


def check_nulls(table: pa.Table, kind: str, path: object) -> None:
    """Every contract column ``table`` has that the contract says is never null holds no null, nor
    does any list in it hold one (a null token id read as -2**63 would be blamed on the tokenizer)."""
    import pyarrow.compute as pc

    for field in SCHEMAS[kind]:
        if field.nullable or field.name not in table.column_names:
            continue
        column = table.column(field.name)
        nested = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
        if column.null_count or (nested and pc.list_flatten(column).null_count):
            row = _first_null_row(column)
            raise UserError(f"{path}: column {field.name!r} has a null in row {row} — every row needs a value there; "
                            f"regenerate the file with `{_PRODUCER[kind]}` or fix that row")


def _first_null_row(column: pa.ChunkedArray) -> int:
    """The first row that is null or holds a null."""
    for i, value in enumerate(column.to_pylist()):
        if value is None or (isinstance(value, list) and any(v is None for v in value)):
            return i
    return -1


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Exact type, or a harmless widening pandas/DuckDB writers produce (large_string, large_list)."""
    if actual.equals(expected):
        return True
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_list(expected):
        if pa.types.is_list(actual) or pa.types.is_large_list(actual):
            return actual.value_type.equals(expected.value_type)
    return False


def conform(table: pa.Table, kind: str) -> pa.Table:
    """Cast the contract columns of ``table`` to their exact types, contract columns first."""
    contract = SCHEMAS[kind]
    validate_columns(table, kind, "<table>")
    columns, fields = [], []
    for field in contract:
        columns.append(table.column(field.name).cast(field.type))
        fields.append(field.with_nullable(True))
    for name in table.column_names:
        if name not in contract.names:
            columns.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))
