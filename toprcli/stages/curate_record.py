"""A curated file's record: its manifest (``<out>.manifest.json``), the settings and inputs its own metadata
holds, and whether an existing ``--out`` is this run's result (a rerun returns it) or is refused."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from toprcli import shards
from toprcli.config import CurateConfig
from toprcli.errors import UserError
from toprcli.stages import StageResult

STAGE = "curate"


def manifest_path(out: str | os.PathLike[str]) -> Path:
    """Where the manifest of a curated file lives: ``train.parquet`` → ``train.parquet.manifest.json``."""
    out = Path(out)
    return out.with_name(out.name + ".manifest.json")


def write_manifest(out: Path, config: dict[str, Any], fingerprints: dict[str, str], counts: dict[str, Any], wall: float | None) -> None:
    shards.write_json_atomic(manifest_path(out), {
        "stage": STAGE, "config": config, "inputs": fingerprints, "counts": counts, "output": str(out), "wall_time_s": wall,
        "versions": shards.versions(), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })


def previous_or_refuse(cfg: CurateConfig, out: Path, config: dict[str, Any], fingerprints: dict[str, str]) -> StageResult | None:
    """The result of an ``out`` already made from these inputs and settings; an ``out`` that may not be replaced is refused."""
    if not out.exists():
        return None
    previous = previous_result(out, config, fingerprints)
    if previous is None and out.is_dir():
        raise UserError(f"--out {out} is a directory — give a file name such as {out / 'train.parquet'}")
    if previous is None and not cfg.overwrite:
        raise UserError(f"{out} already exists ({what_differs(out, config, fingerprints)}) — pass --overwrite or choose another --out")
    return previous


def previous_result(out: Path, config: dict[str, Any], fingerprints: dict[str, str]) -> StageResult | None:
    """The earlier result when ``out`` was made from these exact inputs and settings (a resumed run). A file a kill
    left without its manifest (between the rename and the manifest's write) is whole: its own metadata records
    its inputs, settings and counts, and the manifest is written now."""
    mpath = manifest_path(out)
    if not out.is_file():
        return None
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError):  # none (or torn): the file's own record
        manifest = record_in_file(out)
        if manifest is not None and made_from(manifest, config, fingerprints):
            write_manifest(out, config, fingerprints, manifest["counts"], None)
    if manifest is None or not made_from(manifest, config, fingerprints):
        return None
    return StageResult(STAGE, str(out), {**manifest["counts"], "manifest": str(mpath)}, skipped=True)


def made_from(record: dict[str, Any], config: dict[str, Any], fingerprints: dict[str, str]) -> bool:
    """``shards.made_from`` with the inputs known by their content, in order (``./r1`` and ``/abs/r1`` are one input),
    and without a seed nothing drew from (neither --subsample nor --pairs all's choice)."""
    def making(c: dict[str, Any]) -> dict[str, Any]:
        drew = c.get("subsample") is not None or (c.get("pairs") == "all" and c.get("max_pairs_per_prompt") is not None)
        return {k: v for k, v in c.items() if k not in ("scored", "overwrite") and (k != "seed" or drew)}

    recorded = record.get("config") or {}
    return making(recorded) == making(config) and list((record.get("inputs") or {}).values()) == list(fingerprints.values())


def what_differs(out: Path, config: dict[str, Any], fingerprints: dict[str, str]) -> str:
    """Why an existing ``out`` is not this run's: its settings that differ, or its inputs."""
    record = record_in_file(out)
    if record is None:
        return "not a training set this topr curated"
    changed = [c for c in shards.changes(record.get("config") or {}, config) if not c.startswith("overwrite=")]
    if changed:
        return "made with " + "; ".join(changed[:3])
    return "made from other inputs" if record.get("inputs") != fingerprints else "from other inputs or settings"


def record_in_file(out: Path) -> dict[str, Any] | None:
    """A curated file's own record in the manifest's shape (its metadata holds settings, inputs and counts for this); None for another file."""
    try:
        meta = shards.read_file_metadata(out)
    except (OSError, ValueError, pa.ArrowException):
        return None
    if meta.get("stage") != STAGE or "inputs" not in meta:  # not a curated set, or one from before inputs were recorded
        return None
    counts = {k: v for k, v in meta.items() if k not in ("stage", "config", "inputs", "sampling", "generation")}
    return {"config": meta["config"], "inputs": meta["inputs"], "counts": counts}
