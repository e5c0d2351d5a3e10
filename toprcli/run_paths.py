"""Where a run's relative paths pointed when it started (``paths.json`` in the run dir), and its config as topr last
recorded it (``.recorded-config.yaml``: the run's ``config.yaml`` edited by hand is checked against it as a ``-c`` is).

A config says ``model: models/tiny`` or ``source: data/train.jsonl``; each invocation reads them against its own
working directory. Rerun from another directory (``topr iterate --run-dir ../proj/runs/a``), the same words can name
other files, and the run would go on training on them as if nothing changed (the recorded config compares words, not
files). So the first invocation records each relative path's absolute target, and a later one whose words now name
another existing target is refused; when the recorded target is gone (the project moved with its files), the new one
is taken, and said.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from toprcli.config import IterateConfig, config_to_dict, config_yaml
from toprcli.data.local_files import LOCAL_FORMATS, local_suffix
from toprcli.errors import UserError
from toprcli.runs import CONFIG_FILE, LINEAGE_FILE
from toprcli.shards import read_json, value_at, write_atomic, write_json_atomic, write_text_atomic

PATHS_FILE = "paths.json"
RECORDED_COPY = ".recorded-config.yaml"  # config.yaml as topr last wrote it
PENDING_COPY = ".recorded-config.yaml.pending"  # the copy a launch is about to record (a kill can fall between the two writes)
# The settings that name files a run reads (a model dir, a data file, a few-shot file, a plugin verifier's module).
PATH_KEYS = ("model", "generate.dataset.source", "generate.dataset.few_shot_split", "eval.dataset.source",
             "eval.dataset.few_shot_split", "eval.candidates", "train.ref_model", "eval.verifier_model", "score.verifier", "eval.verifier")


def _relative(key: str, value: Any) -> str | None:
    """The relative file path a setting's value names, or None (absolute, a name such as a verifier's or a split's, a hub
    id): a verifier names a file only as ``python:FILE.py:fn``, a few-shot split only as a data file."""
    if not isinstance(value, str) or not value:
        return None
    if key.endswith("verifier"):
        value = value.split(":")[1] if value.startswith("python:") and value.split(":")[1].endswith(".py") else ""
    elif key.endswith("few_shot_split") and local_suffix(value) not in LOCAL_FORMATS:
        return None
    return None if not value or os.path.isabs(value) or value.startswith(("builtin:", "~")) else value


def check_paths(run_dir: Path, cfg: IterateConfig, *, pinned: bool = True, parent: Path | None = None) -> dict[str, Any]:
    """Refuse a relative path that names another existing file than when the run started; returns the record to keep
    (:func:`record_paths` writes it once the run's config is accepted). A run dir copied or moved with its project
    (``cp -a proj proj2``) finds its files where they lie beside it, as they lay beside the original: taken. Not ``pinned``
    (nothing made yet: a launch from the wrong place that failed at once), the paths of this launch are taken. A new
    branch of the run ``parent`` is held to the parent's record: the rounds it inherits were made with those files."""
    path = Path(run_dir) / PATHS_FILE
    home = own = os.path.realpath(run_dir)  # real paths: a run dir reached through a symlink is where it lies
    lineage = Path(run_dir) / LINEAGE_FILE  # a branch made, its paths not yet recorded (killed in between): its parent's still hold
    parent = Path(read_json(lineage, needs="parent")["parent"]) if lineage.is_file() else parent
    inherited = parent is not None and not path.is_file() and (Path(parent) / PATHS_FILE).is_file()
    if inherited:  # compared from where the parent lies, as its record says; recorded from the branch's own dir
        path, pinned, started = Path(parent) / PATHS_FILE, True, f"the run it branches from ({os.path.realpath(parent)}) used"
        home, again = os.path.realpath(parent), "the same topr iterate --branch-from"
    else:
        started, again = "this run started with", f"topr iterate --run-dir {home}"
    recorded = read_json(path, needs="paths") if path.is_file() else {"cwd": os.getcwd(), "paths": {}}
    resolved, kept = config_to_dict(cfg), {} if inherited else dict(recorded["paths"])
    for key in PATH_KEYS:
        words = _relative(key, value_at(resolved, key))
        if words is None:
            continue
        here, was = os.path.realpath(words), recorded["paths"].get(key) if pinned else None
        beside = os.path.relpath(here, home)  # where the file lies from the run dir: the same in a copy of the whole project
        if was is not None and was["words"] == words and was["path"] != here and was.get("from_run") != beside and os.path.exists(was["path"]):
            what = f"names {here} from here" if os.path.exists(here) else f"does not exist from here ({os.getcwd()})"
            raise UserError(f"{key}: {words} {what}, but {started} {was['path']} — run it from {recorded['cwd']} "
                            f"(cd {recorded['cwd']} && {again}), or write the path absolutely (the run must go on "
                            "with the files it started with)")
        if os.path.exists(here):
            if was is not None and was["words"] == words and was["path"] != here and was.get("from_run") != beside:
                warnings.warn(f"{key}: {words} is {here} now; {was['path']}, where the run started, is gone (the project moved?)")
            kept[key] = {"words": words, "path": here, "from_run": os.path.relpath(here, own)}
    moved = not pinned or inherited or any(v["path"] != recorded["paths"].get(k, v)["path"] for k, v in kept.items())
    return {"cwd": os.getcwd() if moved or not path.is_file() else recorded["cwd"], "paths": kept}


def record_paths(run_dir: Path, record: dict[str, Any]) -> None:
    """Keep ``record`` (from :func:`check_paths`) when it says something new."""
    path = Path(run_dir) / PATHS_FILE
    if not path.is_file() or read_json(path, needs="paths") != record:
        write_json_atomic(path, record)


def recorded_copy(run_dir: Path) -> Path | None:
    """topr's copy of the run's config when ``config.yaml`` no longer matches it (edited by hand), else None: an edit
    then counts as a change, refused or applied from the next round as one passed with ``-c`` (it bypassed both).
    A launch killed between writing ``config.yaml`` and its copy left the copy it meant to write pending: topr's own
    write, not an edit, so the copy is finished first."""
    copy, path, pending = Path(run_dir) / RECORDED_COPY, Path(run_dir) / CONFIG_FILE, Path(run_dir) / PENDING_COPY
    if pending.is_file():
        if path.is_file() and pending.read_bytes() == path.read_bytes():
            os.replace(pending, copy)
        else:  # the launch stopped before config.yaml changed (a refused config): nothing to finish
            pending.unlink()
    return copy if copy.is_file() and path.is_file() and copy.read_bytes() != path.read_bytes() else None


@contextlib.contextmanager
def recording(run_dir: Path, cfg: IterateConfig) -> Iterator[None]:
    """While ``config.yaml`` may be rewritten with ``cfg``: the copy topr will keep is pending (:func:`recorded_copy`
    finishes it after a kill, :func:`keep_recorded_copy` once the config is accepted), and dropped when it is refused.
    A hand edit is pended only once it is accepted: its bytes are ``config.yaml``'s already, so a refused one would be
    taken on the next launch."""
    pending = Path(run_dir) / PENDING_COPY
    write_text_atomic(pending, config_yaml(cfg))
    try:
        yield
    except UserError:
        pending.unlink(missing_ok=True)
        raise


def keep_recorded_copy(run_dir: Path, cfg: IterateConfig, edited: Path | None) -> None:
    """After the run's config is accepted: ``config.yaml`` is the config accepted (a hand edit another ``-c`` overrode
    must not become the record), and topr's copy is ``config.yaml``'s bytes."""
    path, copy = Path(run_dir) / CONFIG_FILE, Path(run_dir) / RECORDED_COPY
    if edited is not None:
        try:
            differs = (yaml.safe_load(path.read_text()) or {}) != config_to_dict(cfg)
        except yaml.YAMLError:  # an edit that broke the file, overridden by -c
            differs = True
        if differs:
            warnings.warn(f"{path} had been edited by hand; it now holds the config this run goes on with (its edit is not used)")
        write_text_atomic(path, config_yaml(cfg))
    if path.is_file() and (not copy.is_file() or copy.read_bytes() != path.read_bytes()):
        data = path.read_bytes()
        write_atomic(copy, lambda tmp: Path(tmp).write_bytes(data))
    (Path(run_dir) / PENDING_COPY).unlink(missing_ok=True)
