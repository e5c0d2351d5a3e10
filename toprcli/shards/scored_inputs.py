"""Several scored directories read as one table, in two passes that keep memory flat.

What ``topr curate`` (and ``topr verifier-data``) read. Pass 1 reads only the
light columns a decision needs (ids, rewards, flags), file by file; pass 2
streams every column of the rows that were kept, batch by batch, with new
columns appended, in row groups of a fixed size, into one output file
(:func:`toprcli.shards.write_table_stream`). Rows are numbered globally in
input order: file after file, source after source.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from toprcli.errors import UserError
from toprcli.sampling import Processing
from toprcli.shards.schema import check_nulls, validate_columns
from toprcli.shards.store import METADATA_KEY, check_finished, parquet_files, read_file_metadata, sampling_of

ROW_GROUP = 65_536  # rows a row group holds at most
ROW_GROUP_BYTES = 128 << 20  # and about this many bytes: curate holds ~2-4 row groups at once (4k-token rows: 3 GiB a group)
# A read buffer streams a big row group page by page instead of loading it whole
# (a 1M-row row group: ~0.4 GiB less peak memory, and faster).
READ_BUFFER = 1 << 22
# Columns whose type may differ between inputs (string vs large_string): read as the wider one.
_WIDENED = ("prompt_id", "policy", "finish_reason")


@dataclass
class ScoredInputs:
    files: list[Path]
    file_rows: np.ndarray  # (F,) rows per file
    file_source: np.ndarray  # (F,) index of the source (the path given) each file came from
    schemas: list[pa.Schema]
    file_bytes: np.ndarray  # (F,) uncompressed bytes of each file's row groups, as its footer says

    @classmethod
    def open(cls, paths: list[str]) -> ScoredInputs:
        """Every Parquet file of ``paths`` (scored dirs or files), checked against the scored contract."""
        files, rows, src, schemas, sizes = [], [], [], [], []
        seen: dict[Path, str] = {}
        for s, path in enumerate(paths):
            check_finished(path, "score")
            for f in parquet_files(path):
                real = f.resolve()
                if real in seen:
                    raise UserError(f"{f}: given twice (also via {seen[real]}) — list each scored directory once")
                seen[real] = path
                try:
                    meta = pq.ParquetFile(f).metadata
                except (pa.ArrowInvalid, OSError) as e:
                    raise UserError(f"{f}: not a readable Parquet file ({e}) — regenerate it with `topr score`") from None
                schema = meta.schema.to_arrow_schema()
                validate_columns(schema, "scored", f)
                if "advantage" in schema.names and "weight" in schema.names:  # a curated set: its weights and filtering are gone
                    raise UserError(f"{f} is a curated training set, not scored data — pass the `topr score` directories it was made from")
                files.append(f)
                rows.append(meta.num_rows)
                src.append(s)
                schemas.append(schema)
                sizes.append(sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)))
        return cls(files, np.asarray(rows, dtype=np.int64), np.asarray(src, dtype=np.int64), schemas, np.asarray(sizes, dtype=np.int64))

    @property
    def rows(self) -> int:
        return int(self.file_rows.sum())

    def row_group_rows(self) -> int:
        """Rows a row group of the output holds: :data:`ROW_GROUP`, fewer when the inputs' rows are large (by their
        footers' uncompressed sizes), so that memory is bounded in bytes, not only in rows."""
        per_row = int(self.file_bytes.sum()) / max(1, self.rows)
        return int(min(ROW_GROUP, max(1024, ROW_GROUP_BYTES // max(1.0, per_row))))

    def starts(self) -> np.ndarray:
        """(F + 1,) the global index of each file's first row, then the total."""
        return np.concatenate([[0], np.cumsum(self.file_rows)])

    def sampling(self, paths: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The sampling distribution every input was drawn from, and each source's generation record.

        The trainer computes log π under the distribution μ was sampled from, and one
        training set holds one such distribution: inputs that disagree on it (or where
        only some files record it) are refused, naming both settings.
        """
        first: tuple[Path, dict[str, Any] | None] | None = None
        per_source: dict[str, Any] = {}
        first_rewards: tuple[Path, tuple[Any, ...]] | None = None
        for f, s in zip(self.files, self.file_source):
            meta = read_file_metadata(f)
            first_rewards = _same_rewards(first_rewards, f, meta)
            sampling = sampling_of(meta)
            per_source.setdefault(paths[s], {"sampling": sampling, "generation": meta.get("generation")})
            if first is None:
                first = (f, sampling)
                continue
            f0, s0 = first
            same = (s0 is None and sampling is None) or (
                s0 is not None and sampling is not None and Processing.from_mapping(s0) == Processing.from_mapping(sampling)
            )
            if not same:
                raise UserError(
                    f"the inputs were sampled from different distributions ({f0}: {_show(s0)}; {f}: {_show(sampling)}) — "
                    "a training set holds one sampling distribution; curate them separately (or regenerate with the same settings)"
                )
        return (first[1] if first else None), per_source

    # -- pass 1 ------------------------------------------------------------------

    def read_light(
        self,
        columns: list[str],
        *,
        derived: Mapping[str, tuple[str, Callable[[pa.ChunkedArray], np.ndarray]]] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]:
        """``columns`` of every row as chunked arrays, plus ``derived`` ones.

        ``derived`` maps a name to (a heavy column, a function of it): the column is read
        one file at a time and only the function's result is kept (e.g. an 8-byte
        fingerprint of each completion instead of its text).
        """
        derived = dict(derived or {})
        parts: dict[str, list] = {c: [] for c in columns}
        made: dict[str, list[np.ndarray]] = {name: [] for name in derived}
        heavy = sorted({col for col, _ in derived.values()} - set(columns))
        for i, f in enumerate(self.files):
            t = pq.ParquetFile(f, buffer_size=READ_BUFFER).read(columns=columns + heavy)
            check_nulls(t.select(columns), "scored", f)  # a hand-made file's null: one line naming it, not a cast warning
            for c in columns:
                parts[c].extend(t.column(c).chunks)
            for name, (col, fn) in derived.items():
                made[name].append(fn(t.column(col)))
            del t
            if progress is not None:
                progress(i + 1, len(self.files))
        out: dict[str, Any] = {}
        for c in columns:
            typ = self._type_of(c)
            out[c] = pa.chunked_array([ch if ch.type.equals(typ) else ch.cast(typ) for ch in parts[c]], type=typ)
        for name in derived:
            out[name] = np.concatenate(made[name]) if made[name] else np.zeros(0)
        return out

    def _type_of(self, column: str) -> pa.DataType:
        types = {s.field(column).type for s in self.schemas}
        if len(types) == 1:
            return types.pop()
        return pa.large_string() if column in _WIDENED else types.pop()

    def column_at(self, column: str, rows: np.ndarray) -> pa.ChunkedArray:
        """``column`` (a string column) of the given global rows (ascending), reading only the files that hold some."""
        starts = self.starts()
        out = []
        for i, f in enumerate(self.files):
            lo, hi = np.searchsorted(rows, [starts[i], starts[i + 1]])
            if hi > lo:
                col = pq.ParquetFile(f).read(columns=[column]).column(column)
                out.append(col.take(pa.array(rows[lo:hi] - starts[i])).combine_chunks().cast(pa.large_string()))
        return pa.chunked_array(out, type=pa.large_string())

    # -- pass 2 ------------------------------------------------------------------

    def output_schema(self, added: list[pa.Field], metadata: Mapping[str, Any]) -> pa.Schema:
        """The inputs' columns unified (``added`` replaced, if present), then ``added``, with ``metadata``."""
        names = {f.name for f in added}
        schemas = [pa.schema([f for f in s if f.name not in names]) for s in self.schemas]
        try:
            schema = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise UserError(f"the scored inputs have incompatible columns ({e}) — use them separately") from None
        for f in added:
            schema = schema.append(f)
        return schema.with_metadata({METADATA_KEY: json.dumps(dict(metadata), sort_keys=True, default=str).encode()})

    def stream_kept(
        self,
        keep: np.ndarray,
        added: Mapping[str, np.ndarray],
        schema: pa.Schema,
        *,
        row_group: int = ROW_GROUP,
        progress: Callable[[int, int], None] | None = None,
    ) -> Iterator[pa.Table]:
        """The rows where ``keep`` (N,) is set, every input column plus ``added`` (name → (N,) values),
        conformed to ``schema``, in input order, in tables of exactly ``row_group`` rows (the last shorter)."""
        starts = self.starts()
        pending: list[pa.Table] = []
        n_pending = 0
        for i, f in enumerate(self.files):
            lo = int(starts[i])
            if keep[lo : int(starts[i + 1])].any():
                columns = [n for n in self.schemas[i].names if n not in added]
                # Single-threaded decode: this runs in the writer's reader thread while the main
                # thread encodes, a balanced two-stage pipeline (Arrow's pool would compete with it).
                reader = pq.ParquetFile(f, buffer_size=READ_BUFFER, pre_buffer=False)
                for batch in reader.iter_batches(batch_size=row_group, columns=columns, use_threads=False):
                    hi = lo + batch.num_rows
                    mask = keep[lo:hi]
                    if mask.any():
                        t = pa.Table.from_batches([batch])
                        for name, values in added.items():
                            t = t.append_column(name, pa.array(values[lo:hi], schema.field(name).type))
                        if not mask.all():
                            t = t.filter(pa.array(mask))
                        pending.append(_conform(t, schema))
                        n_pending += t.num_rows
                        if n_pending >= row_group:
                            whole = pa.concat_tables(pending)
                            n_full = (n_pending // row_group) * row_group
                            for k in range(0, n_full, row_group):
                                yield whole.slice(k, row_group)
                            pending, n_pending = [whole.slice(n_full)], n_pending - n_full
                    lo = hi
            if progress is not None:
                progress(i + 1, len(self.files))
        if n_pending:
            yield pa.concat_tables(pending)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns that get dictionary pages: the flat ones except ``completion``.

    Dictionaries pay off for repeated values (prompt text and ids, policy,
    verdict). They do not for unique texts (``completion``), and for the list
    columns (token ids, log-probs) they cost ~20% more CPU for the whole write
    (measured in benchmarks/curate.py) for a smaller file, so those are written plain.
    """
    return [f.name for f in schema if not pa.types.is_nested(f.type) and f.name != "completion"]


def _conform(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        if f.name in batch.column_names:
            col = batch.column(f.name)
            cols.append(col if col.type.equals(f.type) else col.cast(f.type))
        else:
            cols.append(pa.nulls(batch.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


_REWARDS = ("reward_correct", "reward_incorrect", "reward_no_answer")


def _same_rewards(first: tuple[Path, tuple[Any, ...]] | None, f: Path, meta: dict[str, Any]) -> tuple[Path, tuple[Any, ...]] | None:
    """The first file's rewards (as recorded by `topr score`), once ``f``'s are checked equal: one training set has one
    reward scale (a replayed round scored with other rewards moved every advantage and p̃ in silence)."""
    settings = (meta.get("score") or {}).get("settings") or {}
    if not all(k in settings for k in _REWARDS):  # scored before the record, or by another tool: nothing to compare
        return first
    rewards = tuple(settings[k] for k in _REWARDS)
    if first is not None and first[1] != rewards:
        def show(r: tuple[Any, ...]) -> str:
            return ", ".join(f"{k.removeprefix('reward_').replace('_', ' ')} {v}" for k, v in zip(_REWARDS, r))

        raise UserError(f"the inputs were scored with different rewards ({first[0]}: {show(first[1])}; {f}: {show(rewards)}) — "
                        "their advantages would mix two scales; rescore one with the other's --reward-* values, or curate them separately")
    return first or (f, rewards)


def _show(sampling: dict[str, Any] | None) -> str:
    if sampling is None:
        return "no sampling record"
    return ", ".join(f"{k} {v}" for k, v in Processing.from_mapping(sampling).as_dict().items())
