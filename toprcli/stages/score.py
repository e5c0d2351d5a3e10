"""The score stage: samples shards in, scored shards out.

Reads  ``shard-*.parquet`` of a ``samples/`` directory (or one Parquet file,
       taken as shard 0); every samples column is required (docs/architecture.md §3).
Writes ``scored/shard-NNNNN.parquet`` with the same index as its input shard:
       every input column unchanged, plus ``reward`` (float32), ``correct``
       (bool), ``extracted_answer`` (string, nullable) and ``verdict``
       (correct | incorrect | no_answer | timeout | error); the input file's
       key-value metadata plus a ``score`` entry; then ``_manifest.json``
       (config, input fingerprint, counts, summary), last.

Shard by shard: each is written atomically when scored, so a killed run
resumes where it stopped. A re-run skips complete output shards whose
metadata says they were scored from the same input shard with the same
settings; a shard scored with other settings is an error unless
``overwrite`` (then the output directory's shards are replaced).

Verdicts come from :mod:`toprcli.verifiers` running in worker processes with a
hard per-check time limit. Rewards: ``reward_correct`` for correct,
``reward_no_answer`` for no_answer, ``reward_incorrect`` for incorrect, timeout
and error; a plugin returning a float sets the reward itself.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from toprcli import shards
from toprcli.config import DatasetSpec, ScoreConfig, config_to_dict, from_dict, validated
from toprcli.data.datasets import default_verifier
from toprcli.errors import MadeOtherwise, UserError
from toprcli.progress import ProgressFn
from toprcli.stages import StageResult
from toprcli.stages.score_record import SUMMARY_COLUMNS, ScoreCounts, ShardNotes, gather_notes, summarize
from toprcli.verifiers import ERROR, TIMEOUT, Rewards, VerifierPool, check_sources, plugins, resolve_verifier, reward_of

STAGE = "score"
SCORE_COLUMNS = ("reward", "correct", "extracted_answer", "verdict")
VERIFY_SLICE = 8192  # rows turned into Python strings at a time (bounds memory on huge shards)
RESCORING_FILE = "_rescoring.json"  # an --overwrite run under way (its token)


class ScoredOtherwise(MadeOtherwise):
    """The output holds shards scored from other samples or with other settings."""


class ChecksFailed(UserWarning):
    """Some completions could not be checked (verdict error or timeout): they are rewarded as wrong."""

# Settings that change the scored columns; a complete shard is reused only if they match (timeout, worker_memory_mb: a check
# past them is rewarded as wrong). A plugin's source counts too (_settings).
_SCORE_KEYS = ("verifier", "strict", "timeout", "worker_memory_mb", "reward_correct", "reward_incorrect", "reward_no_answer")


# -- inputs ---------------------------------------------------------------------


def input_shards(samples: str | Path) -> dict[int, Path]:
    """Shard index → file of a samples directory, or {0: file} for one Parquet file."""
    p = Path(samples)
    if p.is_file():
        return {0: p}
    if not p.exists():
        raise UserError(f"{p}: no such file or directory — pass the samples directory `topr generate` wrote")
    found = shards.complete_shards(p)
    if not found:
        raise UserError(f"{p}: no shard-*.parquet files in this directory — check --samples or run `topr generate`")
    shards.check_finished(p, "generation")
    return found


def _validate_inputs(files: dict[int, Path]) -> int:
    """Check every input shard's columns before anything is written; return the total row count."""
    total = 0
    for path in files.values():
        try:
            meta = pq.read_metadata(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise UserError(f"{path}: not a readable Parquet file ({e}) — regenerate it") from None
        schema = meta.schema.to_arrow_schema()
        missing = [name for name in shards.SAMPLES_SCHEMA.names if name not in schema.names]
        if len(missing) > 1:  # name them all; validate_columns reports the first problem only
            raise UserError(
                f"{path}: missing columns {', '.join(repr(m) for m in missing)} required for samples data — "
                "produce this file with `topr generate`"
            )
        shards.validate_columns(schema, "samples", path)
        _refuse_nulls(meta, path)
        total += meta.num_rows
    if total == 0:
        where = next(iter(files.values())).parent if len(files) > 1 else next(iter(files.values()))
        raise UserError(f"{where}: the samples hold no rows — nothing to score; check --samples")
    return total


def _refuse_nulls(meta: Any, path: Path) -> None:
    """A null where the samples contract has none (a prompt_id), read from the file's statistics: it was scored, and
    curate then refused the scores, advising a rescore that wrote the same file."""
    required = {f.name for f in shards.SAMPLES_SCHEMA if not f.nullable}
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            column = meta.row_group(g).column(c)
            stats = column.statistics
            if column.path_in_schema in required and stats is not None and stats.has_null_count and stats.null_count:
                raise UserError(f"{path}: column {column.path_in_schema!r} has a null — every row needs a value there; "
                                "regenerate the file with `topr generate` or fix that row")


def _dataset_verifier(samples: Path) -> str:
    """``auto``: the verifier of the dataset the samples were generated from (their manifest's); gsm8k if it names none."""
    recorded = ((shards.read_manifest(samples) if samples.is_dir() else None) or {}).get("config", {}).get("dataset")
    try:
        return default_verifier(from_dict(DatasetSpec, recorded)) if recorded else "gsm8k"
    except UserError as e:
        raise UserError(f"--verifier auto reads the dataset {samples} was generated from: {e} — or name the verifier (--verifier math, ...)") from None


def _settings(cfg: ScoreConfig) -> dict[str, Any]:
    d = config_to_dict(cfg)
    out = {k: d[k] for k in _SCORE_KEYS + (("verifier_by_source",) if cfg.verifier == "data_source" else ())}
    if cfg.verifier not in ("gsm8k", "data_source"):  # strict is gsm8k's alone: for another verifier it changes nothing
        del out["strict"]
    if cfg.verifier.startswith("python:"):
        out["plugin_source"] = plugins.source_digest(cfg.verifier[len("python:"):])
    if cfg.verifier in ("math", "data_source"):  # another math-verify release may judge otherwise: a rerun must not mix them
        out["math_verify"] = importlib.metadata.version("math-verify")
    return out


def _check_sources(files: dict[int, Path], mapping: dict[str, str]) -> None:
    """--verifier data_source: every row names a source the map knows (else one error, before any work)."""
    sources: set[str | None] = set()
    for path in files.values():
        if "data_source" not in pq.read_schema(path).names:
            raise UserError(f"{path} has no data_source column — --verifier data_source is for verl-format datasets; pick a verifier")
        sources |= set(pq.read_table(path, columns=["data_source"]).column(0).to_pylist())
    check_sources(sources, mapping)


def _reusable(path: Path, settings: dict[str, Any], input_fp: str) -> bool:
    """A shard scored from this input with these settings; a setting an older toprcli did not record is taken as today's.
    A damaged one is not (--overwrite scores it again)."""
    try:
        meta = shards.read_file_metadata(path).get("score") or {}
    except UserError:
        return False
    had = meta.get("settings")
    return isinstance(had, dict) and all(had.get(k, v) == v for k, v in settings.items()) and meta.get("input_fingerprint") == input_fp


# -- scoring one table ----------------------------------------------------------


def score_table(
    table: pa.Table,
    pool: Any,
    rewards: Any,
    *,
    progress: Callable[[int], None] | None = None,
    notes: ShardNotes | None = None,
) -> pa.Table:
    """``table`` (samples columns) + the four score columns, verified by ``pool`` (a VerifierPool).

    Existing score columns are replaced; every other column passes through. ``notes`` gathers what the shard records
    beside its rows.
    """
    n = table.num_rows
    rewards_out: list[float] = []
    correct_out: list[bool] = []
    extracted_out: list[str | None] = []
    verdict_out: list[str] = []
    needs_row = pool.verifier.needs_row
    for start in range(0, n, VERIFY_SLICE):
        part = table.slice(start, VERIFY_SLICE)
        completions = [c if c is not None else "" for c in part.column("completion").to_pylist()]
        answers = part.column("answer").to_pylist()
        columns = pool.verifier.row_columns
        rows = (part.select(list(columns)) if columns else part.drop_columns([c for c in SCORE_COLUMNS if c in part.column_names])).to_pylist() if needs_row else None
        for v in pool.map(completions, answers, rows, progress=progress):
            rewards_out.append(reward_of(v, rewards))
            correct_out.append(v.correct)
            extracted_out.append(v.extracted_answer)
            verdict_out.append(v.verdict)
            if notes is not None:
                notes.add(v)
    keep = table.drop_columns([c for c in SCORE_COLUMNS if c in table.column_names])
    keep = keep.append_column(pa.field("reward", pa.float32(), nullable=False), pa.array(rewards_out, pa.float32()))
    keep = keep.append_column(pa.field("correct", pa.bool_(), nullable=False), pa.array(correct_out, pa.bool_()))
    keep = keep.append_column(pa.field("extracted_answer", pa.string()), pa.array(extracted_out, pa.string()))
    keep = keep.append_column(pa.field("verdict", pa.string(), nullable=False), pa.array(verdict_out, pa.string()))
    return keep


# -- the stage ------------------------------------------------------------------


def run(cfg: ScoreConfig, *, progress: ProgressFn | None = None) -> StageResult:
    """Run the score stage described by ``cfg``; see the module docstring.

    ``progress``: a :data:`~toprcli.progress.ProgressFn` (task "score"), or None.
    """
    t0, cfg = time.monotonic(), validated(cfg)
    if not cfg.samples:
        raise UserError("no --samples given — pass the samples directory `topr generate` wrote")
    if not cfg.out:
        raise UserError("no --out given — pass the directory to write scored shards to")
    samples, out = Path(cfg.samples), Path(cfg.out)
    if samples.resolve() == out.resolve():
        raise UserError(f"--out {out} is the samples directory — write scored shards to another directory")

    # Everything a user can get wrong is checked before anything is written.
    files = input_shards(samples)
    if any(f.resolve().is_relative_to(out.resolve()) for f in files.values()):  # --overwrite would remove or replace them
        raise UserError(f"--out {out} holds the samples being scored — write scored shards to another directory")
    total_rows = _validate_inputs(files)
    if cfg.verifier == "auto":  # recorded as what it stands for: a rerun resolves it the same, or is another scoring
        cfg = replace(cfg, verifier=_dataset_verifier(samples))
    verifier = resolve_verifier(cfg.verifier, strict=cfg.strict, by_source=cfg.verifier_by_source)
    if cfg.verifier == "data_source":
        _check_sources(files, cfg.verifier_by_source)
    rewards = Rewards(cfg.reward_correct, cfg.reward_incorrect, cfg.reward_no_answer)
    settings = _settings(cfg)
    fingerprints = {i: shards.fingerprint(p) for i, p in files.items()}

    existing = shards.complete_shards(out)
    _refuse_foreign(out, existing)
    if not cfg.overwrite:
        _refuse_mixing(samples, files, existing, settings, fingerprints)
    shards.check_output_dir(out)
    shards.check_writable(out)
    with shards.output_lock(out):  # one writer per output
        shards.remove_stale_temporaries(out)  # a killed scorer's half-written shard
        token = _rescoring(cfg, out, files, existing) if cfg.overwrite else None
        todo = [i for i in files if i not in existing or (token and not _rescored(existing[i], token, settings, fingerprints[i]))]
        return _score(cfg, out, files, todo, existing, total_rows, verifier, rewards, settings, fingerprints, progress, t0, token)


def _refuse_mixing(samples: Path, files: dict[int, Path], existing: dict[int, Path], settings: dict[str, Any], fingerprints: dict[int, str]) -> None:
    """Without --overwrite, an output scored from other input or with other settings is refused, not mixed into."""
    orphans = sorted(set(existing) - set(files))  # scored from an input shard that is gone: curate would mix it in
    if orphans:
        raise UserError(f"{existing[orphans[0]]} has no input shard in {samples} any more — "
                        "use a new --out, or --overwrite to rescore (it removes such shards)")
    stale = [i for i in files if i in existing and not _reusable(existing[i], settings, fingerprints[i])]
    if stale:
        raise ScoredOtherwise(f"{existing[stale[0]]} was scored from other samples or with other settings — use a new --out, or --overwrite to rescore",
                              existing[stale[0]].parent)


def _refuse_foreign(out: Path, existing: dict[int, Path]) -> None:
    """Shards in ``out`` that `topr score` did not write (another run's samples) are never rescored over, nor removed."""
    for p in existing.values():
        try:
            meta = shards.read_file_metadata(p)
        except UserError:  # a damaged shard of ours, say: --overwrite rescores it
            continue
        if "score" not in meta:
            raise UserError(f"{p} is not a `topr score` output (it has no score record) — choose another --out")


def _rescoring(cfg: ScoreConfig, out: Path, files: dict[int, Path], existing: dict[int, Path]) -> str:
    """--overwrite rescores every shard. Its token stays in ``_rescoring.json`` until the manifest is written and
    stamps each shard it rescored: the same command rerun after a kill keeps those. Shards of no input go first,
    also when the same command resumes (its input may have shrunk since)."""
    config = {k: v for k, v in config_to_dict(cfg).items() if k != "workers"}
    for i in [i for i in existing if i not in files]:  # not part of this input: would mix into the output
        existing.pop(i).unlink(missing_ok=True)
    path = out / RESCORING_FILE
    try:
        had = json.loads(path.read_text())
    except (OSError, ValueError):
        had = None
    if isinstance(had, dict) and had.get("config") == config:
        return had["token"]
    (out / shards.MANIFEST_NAME).unlink(missing_ok=True)  # the directory is no longer finished
    token = secrets.token_hex(8)
    shards.write_json_atomic(path, {"config": config, "token": token})
    return token


def _rescored(path: Path, token: str, settings: dict[str, Any], input_fp: str) -> bool:
    return _reusable(path, settings, input_fp) and (shards.read_file_metadata(path).get("score") or {}).get("rescoring") == token


def _score(cfg, out, files, todo, existing, total_rows, verifier, rewards, settings, fingerprints, progress, t0, token=None) -> StageResult:
    result = ScoreCounts(out=str(out), shards_skipped=len(files) - len(todo))
    skipped_rows = sum(pq.read_metadata(files[i]).num_rows for i in files if i not in todo)

    report = _progress(progress, total_rows, skipped_rows)
    scored_rows = 0
    t_scoring = 0.0
    if todo:
        with VerifierPool(verifier, workers=cfg.workers, timeout=cfg.timeout, memory_limit_mb=cfg.worker_memory_mb or None) as pool:
            # The manifest marks a finished directory: drop a stale one before the first write.
            (out / shards.MANIFEST_NAME).unlink(missing_ok=True)
            done = skipped_rows
            t1 = time.monotonic()
            for i in todo:
                table = pq.read_table(files[i])
                input_meta = shards.read_file_metadata(files[i])

                def tick(k: int) -> None:
                    nonlocal done
                    done += k
                    report(done)

                notes = ShardNotes()
                scored = score_table(table, pool, rewards, progress=tick, notes=notes)
                meta = dict(input_meta)
                meta["score"] = {"settings": settings, "input_fingerprint": fingerprints[i], "verifier": verifier.name,
                                 **({"rescoring": token} if token else {}), **dataclasses.asdict(notes)}
                shards.write_shard(out, i, scored, metadata=meta)
                scored_rows += scored.num_rows
                result.shards_scored += 1
            t_scoring = time.monotonic() - t1
            result.worker_stats = dict(pool.stats)

    summarize(shards.read_table([out / shards.shard_name(i) for i in files], columns=list(SUMMARY_COLUMNS)), result)
    gather_notes(out, files, result)
    failed = result.verdicts.get(ERROR, 0) + result.verdicts.get(TIMEOUT, 0)
    if todo:
        _refuse_unchecked(cfg, result, out, files)
    _warn_own_rewards(cfg, result)
    if failed:  # e.g. a verifier that does not fit the golds: every sample would train as a wrong one, silently
        example = f" (first: {result.error_examples[0]})" if result.error_examples else ""
        lazy = cfg.verifier.startswith("python:") and result.verdicts.get(TIMEOUT, 0) == result.rows  # or a model loaded on its first call
        fix = ("every check ran past --timeout: a plugin that loads a model on its first call loads it again in each worker started after "
               "a timeout — load it as its module imports, or raise --timeout" if lazy else f"check that verifier {cfg.verifier} fits the data")
        warnings.warn(f"{failed / result.rows:.1%} of the completions could not be checked{example} and are rewarded as wrong (curate leaves the errors out) — {fix}",
                      ChecksFailed, stacklevel=2)
    result.wall_time_s = time.monotonic() - t0
    result.rows_per_s = scored_rows / t_scoring if t_scoring > 0 else None
    shards.write_manifest(
        out,
        stage=STAGE,
        config=config_to_dict(cfg),
        inputs={"samples": cfg.samples, "fingerprint": shards.fingerprint(cfg.samples)},
        counts={"rows": result.rows, "prompts": result.prompts, "shards": len(files), **result.verdicts},
        wall_time_s=result.wall_time_s,
        summary=result.summary(),
    )
    (out / RESCORING_FILE).unlink(missing_ok=True)  # finished: a later --overwrite rescores again
    return StageResult(STAGE, str(out), result.summary(), skipped=not todo, wall_time_s=result.wall_time_s)


def _warn_own_rewards(cfg: ScoreConfig, result: ScoreCounts) -> None:
    """A plugin that returns numbers sets the rewards itself: --reward-* given too would be ignored in silence."""
    default = ScoreConfig()
    given = [f"--{k.replace('_', '-')} {getattr(cfg, k):g}" for k in ("reward_correct", "reward_incorrect") if getattr(cfg, k) != getattr(default, k)]
    if result.own_rewards and given:
        warnings.warn(f"{result.own_rewards} of {result.rows} rewards are the plugin's own numbers (it returned a number, not True/False): "
                      f"{', '.join(given)} applies only to its True/False verdicts — return a bool to use it", stacklevel=2)


def _refuse_unchecked(cfg: ScoreConfig, result: ScoreCounts, out: Path, files: dict[int, Path]) -> None:
    """Nothing checked (every check an error: a verifier that does not fit, data with no golds): refused, the scored shards
    removed. Timeouts are not that: a policy's output can be slow to check (a program a code reward runs that never ends)."""
    if result.verdicts.get(ERROR, 0) < result.rows:
        return
    for i in files:
        (out / shards.shard_name(i)).unlink(missing_ok=True)
    (out / RESCORING_FILE).unlink(missing_ok=True)
    example = f" (first: {result.error_examples[0]})" if result.error_examples else ""
    raise UserError(f"every one of the {result.rows} completions failed its check{example}; the scored shards are removed — check "
                    f"that verifier {cfg.verifier} fits the data (golds in the dataset's answer column; a plugin's signature and errors)")


def _progress(progress: ProgressFn | None, total: int, done: int) -> Callable[[int], None]:
    """report(rows done) over a :data:`~toprcli.progress.ProgressFn` (or nothing)."""
    if progress is None:
        return lambda d: None
    t0, d0 = time.monotonic(), done
    progress("score", done, total)

    def tick(d: int) -> None:
        dt = time.monotonic() - t0
        rate = f"{(d - d0) / dt:,.0f}" if dt > 0.2 else "-"
        progress("score", d, total, **{"rows/s": rate})

    return tick
