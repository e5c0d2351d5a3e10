"""Local dataset files (.jsonl, .json, .parquet, .csv, .tsv; the text ones also compressed: .gz, .bz2, .xz) read
through ``datasets``: CSV cells as written, and a file that cannot be read named with its broken line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toprcli.errors import UserError


LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}  # what datasets (fsspec) and Python both read


def local_suffix(path: str | Path) -> str:
    """A local file's format suffix, its compression's removed (``train.jsonl.gz`` → ``.jsonl``); lower case."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    compressed = bool(suffixes) and suffixes[-1] in COMPRESSIONS
    if compressed:
        suffixes.pop()
    if not suffixes or compressed and suffixes[-1] == ".parquet":  # Parquet compresses inside the file
        return ""
    return suffixes[-1]


def _open_text(path: Path, **kwargs: Any) -> Any:
    """A local text file for reading, decompressed as its suffix says."""
    import importlib

    compression = COMPRESSIONS.get(path.suffix.lower())
    return importlib.import_module(compression).open(path, "rt", **kwargs) if compression else open(path, **kwargs)


def few_shot_source(source: str, split: str) -> tuple[str, str]:
    """(source, split) few-shot examples come from: ``split`` of the dataset; a single local file has no splits
    (any --split reads all of it), so its shots come from another file, named by ``split``."""
    if local_suffix(split) in LOCAL_FORMATS:  # a file of shots, whatever the source
        if not Path(split).expanduser().is_file():
            raise UserError(f"--few-shot-split {split}: file not found — check the path of the file the shots come from")
        return split, "train"
    if local_suffix(source) not in LOCAL_FORMATS or not Path(source).expanduser().is_file():
        return source, split
    raise UserError(f"--few-shot with {source}: one file has no splits, so the shots would be drawn from the problems "
                    f"being evaluated — pass --few-shot-split FILE (e.g. your train.jsonl)")


def read_local(datasets: Any, fmt: str, path: Path) -> Any:
    """A local file through ``datasets``; a file it cannot read is named with the line (or cause)."""
    import logging

    if path.stat().st_size == 0 or fmt != "parquet" and _head(path).strip() in ("", "[]") or fmt == "parquet" and _parquet_rows(path) == 0:
        raise UserError(f"{path} is empty — it holds no rows")
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # its "Failed to read file" log line would precede ours
    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train", **_as_text(datasets, fmt, path))
    except Exception as e:
        where = _diagnose_local(path) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise UserError(f"cannot read {path}: {where} — fix the file (or remove the bad rows)") from None
    finally:
        logger.setLevel(level)
    if len(ds) == 1 and _column_oriented(ds[0]):
        raise UserError(f"{path} is a table by columns (as pandas' to_json() writes by default), not one record per row — write it with "
                        f"df.to_json(path, orient='records'), or as JSONL with orient='records', lines=True")
    return ds


def _parquet_rows(path: Path) -> int | None:
    """A Parquet file's row count from its footer (None when it has none to read: the reader names why)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception:
        return None


def _head(path: Path) -> str:
    """The first 64 KiB of a text file, decompressed ("" when it cannot be read: the reader names why)."""
    try:
        with _open_text(path, encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except (OSError, EOFError, ValueError):
        return "x"


def _column_oriented(row: dict[str, Any]) -> bool:
    """A row that is a whole table: every column a {row index: value} mapping or a list of plain values of one length."""
    values = list(row.values())
    if values and all(isinstance(v, dict) and len(v) > 1 and all(k.isdigit() for k in v) for v in values):
        return True
    lengths = {len(v) if isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v) else -1 for v in values}
    return len(values) > 1 and len(lengths) == 1 and lengths.pop() > 1


def _as_text(datasets: Any, fmt: str, path: Path) -> dict[str, Any]:
    """CSV cells as written: pandas would read 007 as 7, an integer column with a blank as 5.0, NA and None as null."""
    if fmt != "csv":
        return {}
    import csv

    sep = "\t" if local_suffix(path) == ".tsv" else ","
    with _open_text(path, newline="", encoding="utf-8-sig", errors="replace") as f:  # -sig: Excel's "CSV UTF-8" starts with a BOM
        header = next(csv.reader(f, delimiter=sep), [])
    header = [c or f"Unnamed: {i}" for i, c in enumerate(header)]  # an empty name (pandas' index, a trailing comma) as pandas names it
    features = datasets.Features({c: datasets.Value("string") for c in header}) if len(set(header)) == len(header) else None
    return {"keep_default_na": False, "sep": sep, **({"features": features} if features else {})}


def _diagnose_local(path: Path) -> str | None:
    """Where a local .jsonl/.json/.csv/.parquet file is broken, in words (line numbers 1-based)."""
    import csv
    import json

    suffix = local_suffix(path)
    try:
        if suffix == ".jsonl":
            with _open_text(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        return f"line {n} is not valid JSON ({e.msg} at column {e.colno})"
                    if not isinstance(row, dict):
                        return f"line {n} is a JSON {type(row).__name__}, not an object of column values"
        elif suffix == ".json":
            try:
                with _open_text(path, encoding="utf-8") as f:
                    json.loads(f.read())
            except json.JSONDecodeError as e:
                return f"not valid JSON at line {e.lineno}, column {e.colno} ({e.msg})"
        elif suffix in (".csv", ".tsv"):
            with _open_text(path, encoding="utf-8-sig", newline="") as f:
                reader = csv.reader(f, strict=True, delimiter="\t" if suffix == ".tsv" else ",")
                header, rows = next(reader, []), 0
                for row in reader:
                    rows += 1
                    if len(row) != len(header):
                        return f"line {reader.line_num} has {len(row)} fields, the header has {len(header)}"
                if not rows:
                    return "it holds a header and no rows"
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    except csv.Error as e:
        return f"line {reader.line_num}: {e}"
    except Exception as e:  # pyarrow: not a Parquet file, truncated, ...
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None
