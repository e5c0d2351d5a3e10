"""The curate stage: scored shards in, one frozen training set out.

Reads  ``shard-*.parquet`` of one or more ``scored/`` directories (or Parquet
       files), e.g. this round's and earlier rounds' (replay).
Writes ``--out`` — ONE Parquet file (e.g. ``train.parquet``) holding every
       scored column of the kept rows plus ``advantage`` (float32) and
       ``weight`` (float32 ≥ 0), in row groups of 64k rows, with the baseline
       and the resulting mix in its key-value metadata (key ``toprcli``); and
       ``<out>.manifest.json`` next to it (:func:`manifest_path`).

Two passes keep memory flat (ARCHITECTURE.md §3, column projection):

1. the light columns (ids, reward, correct, finish_reason; when
   deduplicating, an 8-byte fingerprint of each ``completion``) are read and every
   decision is made with the vectorised functions of :mod:`toprcli.curation`;
2. each input file is streamed batch by batch, filtered, given its
   ``advantage`` and ``weight``, and appended to a temporary file that is
   fsynced and renamed onto ``--out`` — so ``--out`` exists whole or not at
   all, and a user error writes nothing.

Order of operations (each step sees the rows the previous ones kept):
drop truncated → dedupe → drop uniform-outcome prompts → keep_accuracy →
first positive + all negatives → cap per prompt → subsample → baseline →
advantage → std_normalize → reward_clip. Group and batch-mean baselines, the
std and keep_accuracy's accuracy are estimated from *all* scored samples (an
estimate of E_μ[R | x]; a selection such as "first positive" would bias it), while a
constant c solved from ``positive_fraction`` is solved on the final rows and
weights, since p̃ describes the training set. A prompt group is
(``iteration``, ``policy``, ``prompt_id``): the same prompt sampled by another
round's policy is another group.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from toprcli import curation as cu
from toprcli import shards
from toprcli.config import CurateConfig, config_to_dict
from toprcli.errors import UserError
from toprcli.progress import ProgressFn

GROUP_BASELINES = {"group-mean": "group-mean", "mean": "group-mean", "leave-one-out": "leave-one-out", "loo": "leave-one-out"}
OUT_COLUMNS = ("advantage", "weight")
ROW_GROUP = 65_536
READ_BUFFER = 1 << 22


def manifest_path(out: str | os.PathLike[str]) -> Path:
    """Where the manifest of a curated file lives: ``train.parquet`` → ``train.parquet.manifest.json``."""
    out = Path(out)
    return out.with_name(out.name + ".manifest.json")


@dataclass
class SourceStats:
    path: str
    weight: float
    files: int
    rows_in: int = 0
    rows_out: int = 0
    positives: int = 0  # kept rows with A ≥ 0
    iterations: list[int] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)


@dataclass
class CurateResult:
    """What a curate run produced (also the manifest's ``counts`` and file metadata)."""

    out: str
    manifest: str
    baseline: str  # "constant", "positive-fraction", "group-mean" or "leave-one-out"
    c: float | None  # the constant baseline; None for group baselines
    p: float  # weighted share of `correct` rows in the kept set (±1 rewards: the closed form's p)
    p_effective: float  # Σ_{A≥0} w|A| / Σ w|A| over the kept rows (NaN when every A = 0)
    target: float | None  # the requested positive fraction
    rows_in: int
    rows_out: int
    prompts_in: int
    prompts_out: int
    positives: int
    negatives: int
    correct: int
    dropped: dict[str, int]
    sources: list[SourceStats]
    wall_time_s: float = 0.0
    skipped: bool = False  # True when --out already held this exact result

    def metadata(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("out", "manifest", "skipped", "wall_time_s")}
        d["sources"] = [s.__dict__ for s in self.sources]
        return _json_safe(d)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


# -- options ------------------------------------------------------------------


def parse_baseline(value: float | str | None) -> tuple[str, float | None]:
    """``None`` → constant 0; a number → constant; ``batch-mean``; ``group-mean``/``leave-one-out`` (or ``mean``/``loo``)."""
    if value is None:
        return "constant", 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        c = float(value)
    else:
        text = str(value).strip().lower()
        if text in GROUP_BASELINES:
            return GROUP_BASELINES[text], None
        if text == "batch-mean":
            return "batch-mean", None
        try:
            c = float(text)
        except ValueError:
            raise UserError(
                f"bad --baseline {value!r} — give a number (the constant c), 'batch-mean', 'group-mean' or 'leave-one-out'"
            ) from None
    if not math.isfinite(c):
        raise UserError(f"bad --baseline {value!r} — the constant baseline must be a finite number")
    return "constant", c


def _check_options(cfg: CurateConfig) -> tuple[str, float | None, list[float]]:
    if not cfg.scored:
        raise UserError("no scored data given — pass --scored DIR (one or more `topr score` output directories)")
    if not cfg.out:
        raise UserError("no output given — pass --out FILE, e.g. --out runs/x/train.parquet")
    if not str(cfg.out).endswith(".parquet"):
        raise UserError(f"--out {cfg.out}: the training set is one Parquet file — name it *.parquet")
    if cfg.positive_fraction is not None and cfg.baseline is not None:
        raise UserError(
            "--baseline and --positive-fraction both given — choose one: the positive fraction solves the constant baseline"
        )
    if cfg.positive_fraction is not None:
        p = cfg.positive_fraction
        if not (0.0 < p < 1.0):
            raise UserError(f"--positive-fraction {p} is outside (0, 1) — give the target share of positives, e.g. 0.15")
        kind, c = "positive-fraction", None
        # p̃ is solved for the constant c; a per-prompt std or a clip would move it off the target.
        for name, on in (("std_normalize: group", cfg.std_normalize == "group"), ("reward_clip", cfg.reward_clip is not None)):
            if on:
                raise UserError(
                    f"positive_fraction and {name} both given — {name} changes |A| after c is solved, so p̃ would miss "
                    "the target; drop one of them"
                )
    else:
        kind, c = parse_baseline(cfg.baseline)
    weights = cfg.source_weights if cfg.source_weights is not None else [1.0] * len(cfg.scored)
    if len(weights) != len(cfg.scored):
        raise UserError(
            f"{len(weights)} source weights for {len(cfg.scored)} scored inputs — give one weight per --scored, in the same order"
        )
    for w in weights:
        if not (math.isfinite(w) and w >= 0):
            raise UserError(f"bad source weight {w} — source weights are finite numbers >= 0")
    if not any(w > 0 for w in weights):
        raise UserError("every source weight is 0 — at least one source needs a positive weight")
    return kind, c, [float(w) for w in weights]


# -- pass 1: light columns -----------------------------------------------------


@dataclass
class _Inputs:
    files: list[Path]
    file_rows: np.ndarray  # (F,) rows per file
    file_source: np.ndarray  # (F,) source index per file
    schemas: list[pa.Schema]


def _resolve_inputs(paths: list[str]) -> _Inputs:
    files, rows, src, schemas = [], [], [], []
    seen: dict[Path, str] = {}
    for s, path in enumerate(paths):
        for f in shards.parquet_files(path):
            real = f.resolve()
            if real in seen:
                raise UserError(f"{f}: given twice (also via {seen[real]}) — list each scored directory once")
            seen[real] = path
            try:
                meta = pq.ParquetFile(f).metadata
            except (pa.ArrowInvalid, OSError) as e:
                raise UserError(f"{f}: not a readable Parquet file ({e}) — regenerate it with `topr score`") from None
            schema = meta.schema.to_arrow_schema()
            shards.validate_columns(schema, "scored", f)
            files.append(f)
            rows.append(meta.num_rows)
            src.append(s)
            schemas.append(schema)
    return _Inputs(files, np.asarray(rows, dtype=np.int64), np.asarray(src, dtype=np.int64), schemas)


def _input_sampling(inputs: _Inputs, paths: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The sampling distribution every input was drawn from, and each source's generation record.

    The trainer computes log π under the distribution μ was sampled from, and one
    training set holds one such distribution: inputs that disagree on it (or where
    only some files record it) are refused, naming both settings.
    """
    from toprcli.sampling import Processing

    first: tuple[Path, dict[str, Any] | None] | None = None
    per_source: dict[str, Any] = {}
    for f, s in zip(inputs.files, inputs.file_source):
        meta = shards.read_file_metadata(f)
        sampling = shards.sampling_of(meta)
        per_source.setdefault(paths[s], {"sampling": sampling, "generation": meta.get("generation")})
        if first is None:
            first = (f, sampling)
            continue
        f0, s0 = first
        same = (s0 is None and sampling is None) or (
            s0 is not None and sampling is not None and Processing.from_mapping(s0) == Processing.from_mapping(sampling)
        )
        if not same:
            def show(x: dict[str, Any] | None) -> str:
                return "no sampling record" if x is None else ", ".join(f"{k} {v}" for k, v in Processing.from_mapping(x).as_dict().items())

            raise UserError(
                f"the inputs were sampled from different distributions ({f0}: {show(s0)}; {f}: {show(sampling)}) — "
                "a training set holds one sampling distribution; curate them separately (or regenerate with the same settings)"
            )
    return (first[1] if first else None), per_source


def _read_light(inputs: _Inputs, cfg: CurateConfig, progress: ProgressFn | None) -> dict[str, Any]:
    cols = ["prompt_id", "policy", "iteration", "sample_index", "reward", "correct"]
    if cfg.drop_truncated:
        cols.append("finish_reason")
    parts: dict[str, list] = {c: [] for c in cols}
    fps: list[np.ndarray] = []
    for i, f in enumerate(inputs.files):
        t = pq.ParquetFile(f, buffer_size=READ_BUFFER).read(columns=cols + (["completion"] if cfg.dedupe else []))
        for c in cols:
            parts[c].extend(t.column(c).chunks)
        if cfg.dedupe:
            fps.append(cu.string_fingerprint(t.column("completion")))
        del t
        if progress:
            progress("curate: reading ids and rewards", i + 1, len(inputs.files))
    light: dict[str, Any] = {}
    for c in cols:
        t = _type_of(inputs, c)
        light[c] = pa.chunked_array([ch if ch.type.equals(t) else ch.cast(t) for ch in parts[c]], type=t)
    light["fingerprint"] = np.concatenate(fps) if fps else None
    return light


def _type_of(inputs: _Inputs, column: str) -> pa.DataType:
    types = {s.field(column).type for s in inputs.schemas}
    if len(types) == 1:
        return types.pop()
    return pa.large_string() if column in ("prompt_id", "policy", "finish_reason") else types.pop()


def _numpy(col: pa.ChunkedArray, dtype) -> np.ndarray:
    return col.to_numpy().astype(dtype, copy=False)


def _candidate_strings(inputs: _Inputs, rows: np.ndarray) -> pa.ChunkedArray:
    """The ``completion`` of the given global rows (ascending), reading only files that hold some."""
    starts = np.concatenate([[0], np.cumsum(inputs.file_rows)])
    out = []
    for i, f in enumerate(inputs.files):
        lo, hi = np.searchsorted(rows, [starts[i], starts[i + 1]])
        if hi > lo:
            col = pq.ParquetFile(f).read(columns=["completion"]).column("completion")
            out.append(col.take(pa.array(rows[lo:hi] - starts[i])).combine_chunks().cast(pa.large_string()))
    return pa.chunked_array(out, type=pa.large_string())


# -- the run -------------------------------------------------------------------


def curate(cfg: CurateConfig, *, progress: ProgressFn | None = None) -> CurateResult:
    """Run the curate stage for ``cfg``; raises :class:`UserError` (and writes nothing) on bad input,
    an output that cannot be written, or one another process is writing."""
    kind, c_const, weights = _check_options(cfg)
    out = Path(cfg.out)
    shards.check_writable(out)
    with shards.output_lock(out):  # one writer per output
        return _curate(cfg, kind, c_const, weights, progress)


def _curate(cfg: CurateConfig, kind: str, c_const: float | None, weights: list[float], progress: ProgressFn | None) -> CurateResult:
    t0 = time.perf_counter()
    out = Path(cfg.out)
    inputs = _resolve_inputs(list(cfg.scored))
    config = config_to_dict(cfg)
    fingerprints = {p: shards.fingerprint(p) for p in cfg.scored}

    if out.exists():
        previous = _previous_result(out, config, fingerprints)
        if previous is not None:
            return previous
        if out.is_dir():
            raise UserError(f"--out {out} is a directory — give a file name such as {out / 'train.parquet'}")
        if not cfg.overwrite:
            raise UserError(f"{out} already exists (from other inputs or settings) — pass --overwrite or choose another --out")

    sampling, generation = _input_sampling(inputs, list(cfg.scored))
    n_total = int(inputs.file_rows.sum())
    if n_total == 0:
        raise UserError(f"the scored inputs hold no rows ({', '.join(cfg.scored)}) — check that `topr score` finished")
    light = _read_light(inputs, cfg, progress)
    reward = _numpy(light["reward"], np.float64)
    if not np.all(np.isfinite(reward)):
        bad = int((~np.isfinite(reward)).sum())
        raise UserError(f"{bad} rows have a NaN or infinite reward — fix the verifier's rewards and re-run `topr score`")
    correct = _numpy(light["correct"], bool)
    sample_index = _numpy(light["sample_index"], np.int64)
    row_source = np.repeat(inputs.file_source, inputs.file_rows)  # (N,)
    row_weight = np.asarray(weights, dtype=np.float64)[row_source]
    groups, n_groups = cu.group_ids(light["iteration"], light["policy"], light["prompt_id"])

    # Group baselines use every scored sample of the prompt (see module docstring).
    group_c = None
    if kind == "group-mean":
        group_c = cu.group_mean_baseline(reward, groups, n_groups)
    elif kind == "leave-one-out":
        group_c = cu.leave_one_out_baseline(reward, groups, n_groups)
    elif kind == "batch-mean":
        c_const = float(reward.mean())
    # Likewise the std of std_normalize (ROLL normalises before it masks anything).
    std = None
    if cfg.std_normalize == "batch":
        std = cu.reward_std(reward)
    elif cfg.std_normalize == "group":
        std = cu.group_reward_std(reward, groups, n_groups)

    # -- selection: each step narrows `keep` --------------------------------
    keep = np.ones(n_total, dtype=bool)
    dropped: dict[str, int] = {}

    def narrow(name: str, mask_fn: Callable[[np.ndarray], np.ndarray]) -> None:
        idx = np.flatnonzero(keep)
        mask = mask_fn(idx)
        keep[idx[~mask]] = False
        dropped[name] = int((~mask).sum())

    if cfg.drop_truncated:
        truncated = pc.equal(light["finish_reason"], "length").to_numpy(zero_copy_only=False)
        narrow("truncated", lambda idx: ~truncated[idx].astype(bool))
    if cfg.dedupe:

        def dedupe(idx: np.ndarray) -> np.ndarray:
            cand = cu.duplicate_candidates(groups[idx], light["fingerprint"][idx])
            strings = _candidate_strings(inputs, idx[cand])
            return cu.dedupe_mask(groups[idx], strings, sample_index[idx], candidates=cand)

        narrow("duplicates", dedupe)
    if cfg.drop_uniform_prompts:
        narrow("uniform-outcome prompts", lambda idx: cu.mixed_outcome_mask(correct[idx], groups[idx]))
    if cfg.keep_accuracy is not None:
        # Accuracy from all scored samples of the prompt, like ROLL's difficulty mask.
        in_range = cu.accuracy_range_mask(correct, groups, *cfg.keep_accuracy, n_groups)
        narrow("outside keep_accuracy", lambda idx: in_range[idx])
    if cfg.first_positive:
        narrow("extra positives", lambda idx: cu.first_positive_mask(correct[idx], groups[idx], sample_index[idx]))
    if cfg.max_per_prompt is not None:
        narrow("over max per prompt", lambda idx: cu.cap_per_group_mask(groups[idx], cfg.max_per_prompt, sample_index[idx]))
    if cfg.subsample is not None:

        def sub(idx: np.ndarray) -> np.ndarray:
            mask = np.zeros(len(idx), dtype=bool)
            mask[cu.subsample_indices(len(idx), cfg.subsample, cfg.seed)] = True
            return mask

        narrow("subsampled out", sub)
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        raise UserError(f"no rows left after selection ({_fmt_dropped(dropped)}) — relax the filters")

    # -- baseline and advantages ------------------------------------------------
    r_k, w_k = reward[kept], row_weight[kept]
    if kind == "positive-fraction":
        try:
            c_const = cu.solve_baseline(r_k, cfg.positive_fraction, w_k)
        except ValueError:
            value = float(r_k[w_k > 0][0])
            if cfg.unreachable_baseline is not None:
                # A round with one outcome only (all wrong early on, all right late) must not
                # stop a multi-round run: fall back to the configured constant, and say so.
                c_const = float(cfg.unreachable_baseline)
                kind = "constant (positive fraction unreachable)"
            else:
                raise UserError(
                    f"--positive-fraction {cfg.positive_fraction} is unreachable: every curated row has reward {value:g}, "
                    "so no baseline makes both positives and negatives — add data with both outcomes or use --baseline"
                ) from None
    baseline = group_c[kept] if group_c is not None else c_const
    adv = cu.advantages(r_k, baseline)  # float32 (K,)
    if std is not None or cfg.reward_clip is not None:
        adv = cu.scale_advantages(adv, std[kept] if isinstance(std, np.ndarray) else std, cfg.reward_clip)
    w32 = w_k.astype(np.float32)

    result = _summarise(cfg, kind, c_const, inputs, light, groups, keep, kept, adv, w32, correct, row_source, weights, dropped)
    result.out, result.manifest = str(out), str(manifest_path(out))

    # -- pass 2: stream the kept rows out ----------------------------------------
    advantage_full = np.zeros(n_total, dtype=np.float32)
    weight_full = np.zeros(n_total, dtype=np.float32)
    advantage_full[kept] = adv
    weight_full[kept] = w32
    del light, reward, correct, sample_index, groups, row_source, row_weight, group_c
    meta = {"stage": "curate", **result.metadata(), "config": config, "sampling": sampling, "generation": generation}
    # An old manifest must never vouch for a new file (a kill between the two writes).
    manifest_path(out).unlink(missing_ok=True)
    schema = _output_schema(inputs, meta)
    tables = _kept_tables(inputs, keep, advantage_full, weight_full, schema, progress)
    shards.write_table_stream(out, schema, tables, row_group_size=ROW_GROUP, use_dictionary=_dictionary_columns(schema))
    result.wall_time_s = time.perf_counter() - t0
    shards.write_json_atomic(
        manifest_path(out),
        {
            "stage": "curate",
            "config": config,
            "inputs": fingerprints,
            "counts": result.metadata(),
            "output": str(out),
            "wall_time_s": result.wall_time_s,
            "versions": shards.versions(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    return result


def _fmt_dropped(dropped: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in dropped.items()) or "no filters"


def _summarise(cfg, kind, c, inputs, light, groups, keep, kept, adv, w32, correct, row_source, weights, dropped) -> CurateResult:
    src_k = row_source[kept]
    n_src = len(cfg.scored)
    rows_in = np.bincount(row_source, minlength=n_src)
    rows_out = np.bincount(src_k, minlength=n_src)
    pos_out = np.bincount(src_k, weights=adv >= 0, minlength=n_src).astype(np.int64)
    sources = []
    for s, path in enumerate(cfg.scored):
        in_s = np.flatnonzero(row_source == s)
        sources.append(
            SourceStats(
                path=str(path),
                weight=weights[s],
                files=int((inputs.file_source == s).sum()),
                rows_in=int(rows_in[s]),
                rows_out=int(rows_out[s]),
                positives=int(pos_out[s]),
                iterations=sorted(int(v) for v in pc.unique(light["iteration"].take(pa.array(in_s))).to_pylist()),
                policies=sorted(pc.unique(light["policy"].take(pa.array(in_s))).to_pylist()),
            )
        )
    positives = int((adv >= 0).sum())
    return CurateResult(
        out="",
        manifest="",
        baseline=kind,
        c=c,
        p=cu.positive_share(correct[kept], w32),
        p_effective=cu.effective_positive_share(adv, w32),
        target=cfg.positive_fraction,
        rows_in=int(len(keep)),
        rows_out=int(len(kept)),
        prompts_in=int(groups.max(initial=-1)) + 1,
        prompts_out=int(len(np.unique(groups[kept]))),
        positives=positives,
        negatives=int(len(kept)) - positives,
        correct=int(correct[kept].sum()),
        dropped=dropped,
        sources=sources,
    )


def _output_schema(inputs: _Inputs, meta: dict[str, Any]) -> pa.Schema:
    schemas = [pa.schema([f for f in s if f.name not in OUT_COLUMNS]) for s in inputs.schemas]
    try:
        schema = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise UserError(f"the scored inputs have incompatible columns ({e}) — curate them separately") from None
    schema = schema.append(pa.field("advantage", pa.float32(), nullable=False))
    schema = schema.append(pa.field("weight", pa.float32(), nullable=False))
    return schema.with_metadata({shards.METADATA_KEY: json.dumps(meta, sort_keys=True, default=str).encode()})


def _conform(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        if f.name in batch.column_names:
            col = batch.column(f.name)
            cols.append(col if col.type.equals(f.type) else col.cast(f.type))
        else:
            cols.append(pa.nulls(batch.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _kept_tables(inputs: _Inputs, keep, advantage, weight, schema: pa.Schema, progress: ProgressFn | None):
    """Yield the output in tables of exactly ROW_GROUP rows (the last one shorter), input order."""
    starts = np.concatenate([[0], np.cumsum(inputs.file_rows)])
    pending: list[pa.Table] = []
    n_pending = 0
    for i, f in enumerate(inputs.files):
        lo = int(starts[i])
        if keep[lo : int(starts[i + 1])].any():
            columns = [n for n in inputs.schemas[i].names if n not in OUT_COLUMNS]
            # Single-threaded decode: this runs in the reader thread while the main thread
            # encodes, a balanced two-stage pipeline (Arrow's pool would compete with it).
            # A read buffer streams a big row group page by page instead of loading it whole
            # (a 1M-row row group: ~0.4 GiB less peak memory, and faster).
            reader = pq.ParquetFile(f, buffer_size=READ_BUFFER, pre_buffer=False)
            batches = reader.iter_batches(batch_size=ROW_GROUP, columns=columns, use_threads=False)
            for batch in batches:
                hi = lo + batch.num_rows
                mask = keep[lo:hi]
                if mask.any():
                    t = pa.Table.from_batches([batch])
                    t = t.append_column("advantage", pa.array(advantage[lo:hi], pa.float32()))
                    t = t.append_column("weight", pa.array(weight[lo:hi], pa.float32()))
                    if not mask.all():
                        t = t.filter(pa.array(mask))
                    pending.append(_conform(t, schema))
                    n_pending += t.num_rows
                    if n_pending >= ROW_GROUP:
                        whole = pa.concat_tables(pending)
                        n_full = (n_pending // ROW_GROUP) * ROW_GROUP
                        for k in range(0, n_full, ROW_GROUP):
                            yield whole.slice(k, ROW_GROUP)
                        pending, n_pending = [whole.slice(n_full)], n_pending - n_full
                lo = hi
        if progress:
            progress("curate: writing", i + 1, len(inputs.files))
    if n_pending:
        yield pa.concat_tables(pending)


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns that get dictionary pages: the flat ones except ``completion``.

    Dictionaries pay off for repeated values (prompt text and ids, policy,
    verdict). They do not for unique texts (``completion``), and for the list
    columns (token ids, log-probs) they cost ~20% more CPU for the whole stage
    (measured) for a smaller file, so those are written plain.
    """
    return [f.name for f in schema if not pa.types.is_nested(f.type) and f.name != "completion"]


def _previous_result(out: Path, config: dict[str, Any], fingerprints: dict[str, str]) -> CurateResult | None:
    """The earlier result when ``out`` was made from these exact inputs and settings (a resumed run)."""
    mpath = manifest_path(out)
    if not (out.is_file() and mpath.is_file()):
        return None
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError):
        return None
    ignore = ("overwrite",)
    same_config = {k: v for k, v in manifest.get("config", {}).items() if k not in ignore} == {
        k: v for k, v in config.items() if k not in ignore
    }
    if not same_config or manifest.get("inputs") != fingerprints:
        return None
    counts = dict(manifest["counts"])
    counts["sources"] = [SourceStats(**s) for s in counts["sources"]]
    counts["p_effective"] = counts["p_effective"] if counts["p_effective"] is not None else float("nan")
    counts["p"] = counts["p"] if counts["p"] is not None else float("nan")
    return CurateResult(out=str(out), manifest=str(mpath), skipped=True, wall_time_s=0.0, **counts)
