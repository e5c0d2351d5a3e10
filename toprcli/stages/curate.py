"""The curate stage: scored shards in, one frozen training set out.

Reads  ``shard-*.parquet`` of one or more ``scored/`` directories (or Parquet
       files), e.g. this round's and earlier rounds' (replay).
Writes ``--out`` — ONE Parquet file (e.g. ``train.parquet``) holding every
       scored column of the kept rows plus ``advantage`` (float32) and
       ``weight`` (float32 ≥ 0), in row groups of 64k rows, with the baseline
       and the resulting mix in its key-value metadata (key ``toprcli``); and
       ``<out>.manifest.json`` next to it (:func:`manifest_path`).

Two passes keep memory flat (docs/architecture.md §3, column projection):

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
weights (with ``pairs``, the pairs' rows as written), since p̃ describes the training set. A prompt group is
(``iteration``, ``policy``, ``prompt_id``): the same prompt sampled by another
round's policy is another group.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from toprcli import curation as cu
from toprcli import shards
from toprcli.config import BASELINES, CurateConfig, config_to_dict, validated
from toprcli.errors import UserError
from toprcli.progress import ProgressFn, report
from toprcli.shards.scored_inputs import ScoredInputs, dictionary_columns
from toprcli.stages import StageResult
from toprcli.stages.curate_record import STAGE, manifest_path, previous_or_refuse, write_manifest
from toprcli.verifiers.base import ERROR

ADDED = [pa.field("advantage", pa.float32(), nullable=False), pa.field("weight", pa.float32(), nullable=False)]


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
class CurateCounts:
    """What a curate run produced: the result's summary, the manifest's ``counts`` and the file metadata."""

    baseline: str  # "constant", "positive-fraction", "group-mean" or "leave-one-out"
    c: float | None  # the constant baseline; None for group baselines
    p: float  # weighted share of `correct` rows in the kept set (±1 rewards: the closed form's p)
    p_effective: float  # Σ_{A≥0} w|A| / Σ w|A| over the kept rows (NaN, stored as null, when every A = 0)
    positive_fraction: float | None  # the requested p̃ (None: the baseline was given)
    p_target: float | None  # the p̃ solved for: positive_fraction, or max(positive_fraction, p) with the at-least-p rule
    rows_in: int
    rows_out: int
    prompts_in: int
    prompts_out: int
    positives: int
    negatives: int
    correct: int
    dropped: dict[str, int]
    sources: list[SourceStats]
    pairs: int | None = None  # preference pairs written (None: no pairs asked for)
    prompts_without_pair: int | None = None  # kept prompts with one outcome only

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["sources"] = [s.__dict__ for s in self.sources]
        return shards.json_safe(d)


# -- options ------------------------------------------------------------------


def parse_baseline(value: float | str | None) -> tuple[str, float | None]:
    """``None`` → constant 0; a number → constant; ``batch-mean``; ``group-mean``/``leave-one-out`` (or ``mean``/``loo``)."""
    if value is None:
        return "constant", 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        c = float(value)
    else:
        text = str(value).strip().lower()
        if text in BASELINES:
            return BASELINES[text], None
        try:
            c = float(text)
        except ValueError:
            raise UserError(f"bad --baseline {value!r} — give a number (the constant c), 'batch-mean', 'group-mean' or 'leave-one-out'") from None
    if not math.isfinite(c):
        raise UserError(f"bad --baseline {value!r} — the constant baseline must be a finite number")
    return "constant", c


def _check_options(cfg: CurateConfig) -> tuple[str, float | None, list[float]]:
    """The config's own rules (``CurateConfig.check``: run at load, and here for a config built in code), then the run's."""
    cfg.check()
    if not cfg.scored:
        raise UserError("no scored data given — pass --scored DIR (one or more `topr score` output directories)")
    if not cfg.out:
        raise UserError("no output given — pass --out FILE, e.g. --out runs/x/train.parquet")
    if not str(cfg.out).endswith(".parquet"):
        raise UserError(f"--out {cfg.out}: the training set is one Parquet file — name it *.parquet")
    shards.check_not_an_input(cfg.out, list(cfg.scored), "train.parquet")
    kind, c = ("positive-fraction", None) if cfg.positive_fraction is not None else parse_baseline(cfg.baseline)
    if cfg.unreachable_baseline not in (None, 0.0) and cfg.positive_fraction is None:  # (0.0: iterate's default, for any baseline)
        warnings.warn(f"--unreachable-baseline {cfg.unreachable_baseline} does nothing without --positive-fraction (it is the c used "
                      "when p̃ cannot be reached)", stacklevel=2)
    weights = cfg.source_weights if cfg.source_weights is not None else [1.0] * len(cfg.scored)
    if len(weights) != len(cfg.scored):
        raise UserError(f"{len(weights)} source weights for {len(cfg.scored)} scored inputs — give one weight per --scored, in the same order, "
                        "as one comma list (--source-weights 1,0.5: a second word is read as another scored input)")
    return kind, c, [float(w) for w in weights]


# -- the run -------------------------------------------------------------------


def run(cfg: CurateConfig, *, progress: ProgressFn | None = None) -> StageResult:
    """Run the curate stage for ``cfg``; raises :class:`UserError` (and writes nothing) on bad input,
    an output that cannot be written, or one another process is writing."""
    # scored/ and ./scored are the inputs the record names; ./train.parquet is train.parquet
    cfg = validated(cfg)
    cfg = replace(cfg, scored=[os.path.normpath(s) for s in cfg.scored], out=os.path.normpath(cfg.out) if cfg.out else cfg.out)
    kind, c_const, weights = _check_options(cfg)
    out = Path(cfg.out)
    shards.check_writable(out)
    with shards.output_lock(out):  # one writer per output
        shards.remove_stale_temporaries(out.parent, of=out.name)  # a killed curate's half-written set, as large as the set
        return _curate(cfg, kind, c_const, weights, progress)


def _curate(cfg: CurateConfig, kind: str, c_const: float | None, weights: list[float], progress: ProgressFn | None) -> StageResult:
    t0 = time.perf_counter()
    out = Path(cfg.out)
    inputs = ScoredInputs.open(list(cfg.scored))
    config = config_to_dict(cfg)
    fingerprints = {p: shards.fingerprint(p) for p in cfg.scored}
    previous = previous_or_refuse(cfg, out, config, fingerprints)
    if previous is not None:
        return previous

    # -- pass 1: the light columns, every decision --------------------------------
    sampling, generation = inputs.sampling(list(cfg.scored))
    light, reward = _read_light(inputs, cfg, progress)
    correct = _numpy(light["correct"], bool)
    sample_index = _numpy(light["sample_index"], np.int64)
    row_source = np.repeat(inputs.file_source, inputs.file_rows)  # (N,)
    row_weight = np.asarray(weights, dtype=np.float64)[row_source]
    groups, n_groups = cu.group_ids(light["iteration"], light["policy"], light["prompt_id"])
    # Group and batch-mean baselines, and the std, use every scored sample (see module docstring) that was checked.
    counted = np.flatnonzero(~light["unchecked"]) if cfg.drop_unchecked else np.arange(len(reward))
    group_c, c_const, std = _all_sample_statistics(cfg, kind, c_const, reward, row_weight, groups, n_groups, counted)
    keep, dropped = _select(cfg, inputs, light, correct, groups, n_groups, sample_index)
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        raise UserError(f"no rows left after selection ({_fmt_dropped(dropped)}) — relax the filters")
    r_k, w_k = reward[kept], row_weight[kept]
    pair_order = _pair_order(cfg, correct[kept], groups[kept], sample_index[kept]) if cfg.pairs != "none" else None
    written = pair_order if pair_order is not None else slice(None)  # pairs: the rows as written (each pair's two)
    target = None
    if kind == "positive-fraction":  # solved on the final rows and weights: p̃ describes the training set
        target, c_const, kind = _solve_positive_fraction(cfg, r_k[written], w_k[written], correct[kept][written])
    adv = cu.advantages(r_k, group_c[kept] if group_c is not None else c_const)  # float32 (K,)
    if std is not None or cfg.reward_clip is not None:
        adv = cu.scale_advantages(adv, std[kept] if isinstance(std, np.ndarray) else std, cfg.reward_clip)
    w32 = w_k.astype(np.float32)
    if not np.any(w32[written]):  # a training set that trains nothing: refused, as one the filters left empty
        raise UserError("every row kept has weight 0 (its source weight; the filters left no row of a weighted input) — "
                        "loosen the filters, or give that input a weight above 0")
    if not np.any(adv[written] * w32[written]):
        warnings.warn("every row written has advantage 0: training on this set changes nothing — every reward equals its "
                      "baseline (a group baseline needs prompts with samples of both outcomes, n > 1)", stacklevel=2)
    elif c_const is not None and (wrong := ~correct[kept][written]).any() and not np.any(adv[written][wrong]):
        warnings.warn(f"all {int(wrong.sum())} wrong rows have advantage 0 (their reward equals the baseline {c_const:g}): they train "
                      "nothing (unless training whitens advantages), so this set is its positives only — reward wrong answers below the baseline (score --reward-incorrect -1; "
                      "a plugin that returns 0/1 sets its own rewards) or set --baseline between the two rewards", stacklevel=2)
    rows = (kept, adv, w32) if pair_order is None else (kept[pair_order], adv[pair_order], w32[pair_order])
    counts = _summarise(cfg, kind, c_const, inputs, light, groups, keep, *rows, correct, row_source, weights, dropped, target)
    if pair_order is not None:
        counts.pairs = len(pair_order) // 2
        counts.prompts_without_pair = cu.groups_without_pair(correct[kept], groups[kept])
    del light, reward, correct, sample_index, groups, row_source, row_weight, group_c

    # -- pass 2: stream the kept rows out ----------------------------------------
    advantage_full = np.zeros(inputs.rows, dtype=np.float32)
    weight_full = np.zeros(inputs.rows, dtype=np.float32)
    advantage_full[kept] = adv
    weight_full[kept] = w32
    summary = counts.as_dict()
    meta = {"stage": STAGE, **summary, "config": config, "inputs": fingerprints, "sampling": sampling, "generation": generation}
    # An old manifest must never vouch for a new file (a kill between the two writes).
    manifest_path(out).unlink(missing_ok=True)
    schema = inputs.output_schema(ADDED, meta)
    row_group = inputs.row_group_rows()
    tables = inputs.stream_kept(keep, {"advantage": advantage_full, "weight": weight_full}, schema, row_group=row_group,
                                progress=lambda i, n: report(progress, "curate: writing", i, n))
    if pair_order is not None:
        schema, tables = cu.as_pair_rows(schema, tables, pair_order, row_group)
    shards.write_table_stream(out, schema, tables, row_group_size=row_group, use_dictionary=dictionary_columns(schema))
    wall = time.perf_counter() - t0
    write_manifest(out, config, fingerprints, summary, wall)
    return StageResult(STAGE, str(out), {**summary, "manifest": str(manifest_path(out))}, wall_time_s=wall)


def _all_sample_statistics(cfg: CurateConfig, kind: str, c_const: float | None, reward: np.ndarray, row_weight: np.ndarray,
                           groups: np.ndarray, n_groups: int, counted: np.ndarray) -> tuple[np.ndarray | None, float | None, np.ndarray | float | None]:
    """What is estimated from every scored sample before selection, of the rows ``counted`` (K,) (not those whose
    check failed: their reward says nothing): a per-row group baseline (N,) or None, the constant c (batch-mean: the
    mean reward), and the std of ``std_normalize`` (ROLL normalises before it masks). The batch's statistics count
    each source by its weight: a replayed round as its replay weight says."""
    r, w, g = reward[counted], row_weight[counted], groups[counted]
    per_row = {"group-mean": cu.group_mean_baseline, "leave-one-out": cu.leave_one_out_baseline}.get(kind)
    group_c = _scatter(per_row(r, g, n_groups), counted, len(reward)) if per_row else None
    if kind == "batch-mean":
        c_const = cu.batch_mean(r, w)
    std = None
    if cfg.std_normalize == "batch":
        std = cu.reward_std(r, w)
    elif cfg.std_normalize == "group":
        std = _scatter(cu.group_reward_std(r, g, n_groups), counted, len(reward))
    return group_c, c_const, std


def _scatter(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``values`` (K,) of ``rows`` as a float64 (N,) array, 0 elsewhere (rows no selection keeps)."""
    out = np.zeros(n, dtype=np.float64)
    out[rows] = values
    return out


def _solve_positive_fraction(cfg: CurateConfig, reward: np.ndarray, weight: np.ndarray, correct: np.ndarray) -> tuple[float, float, str]:
    """The constant c that gives the kept rows the effective positive share p̃: (p̃, c, the baseline's kind)."""
    target = cfg.positive_fraction
    if cfg.positive_fraction_rule == "at-least-p":  # never below the data's own share: c = 0 once p passes the target
        target = max(target, cu.positive_share(correct, weight))
    if target >= 1.0:  # every kept row correct: p̃ = 1 wants every A ≥ 0, the raw baseline unless a reward is negative
        weighted = reward[weight > 0]
        return target, min(0.0, float(weighted.min())) if len(weighted) else 0.0, "positive-fraction"
    try:
        return target, cu.solve_baseline(reward, target, weight), "positive-fraction"
    except ValueError:
        if cfg.unreachable_baseline is None:
            weighted = reward[weight > 0]
            rows = "every curated row" if len(weighted) == len(reward) else "every curated row of weight > 0"  # a source of weight 0 counts for nothing
            what = f"{rows} has reward {float(weighted[0]):g}" if len(weighted) else "every curated row has weight 0"
            raise UserError(f"--positive-fraction {cfg.positive_fraction} is unreachable: {what}, so no baseline makes both positives "
                            "and negatives — add data with both outcomes or use --baseline") from None
        # A round with one outcome only (all wrong early on, all right late) must not
        # stop a multi-round run: fall back to the configured constant, and say so.
        return target, float(cfg.unreachable_baseline), "constant (positive fraction unreachable)"


def _pair_order(cfg: CurateConfig, correct: np.ndarray, groups: np.ndarray, sample_index: np.ndarray) -> np.ndarray:
    """Positions in the kept rows, pair by pair: (chosen, rejected, chosen, rejected, ...)."""
    chosen, rejected = cu.preference_pairs(correct, groups, sample_index, mode=cfg.pairs,
                                           max_per_group=cfg.max_pairs_per_prompt, seed=cfg.seed)
    if len(chosen) == 0:
        raise UserError(f"--pairs {cfg.pairs}: no prompt kept both a correct and an incorrect sample, so there is no preference pair — "
                        "sample more completions per prompt (--n) or relax the filters")
    return np.stack([chosen, rejected], axis=1).reshape(-1)


def _select(cfg: CurateConfig, inputs: ScoredInputs, light: dict[str, Any], correct: np.ndarray, groups: np.ndarray,
            n_groups: int, sample_index: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """The selection options in order, each narrowing the rows the previous ones kept: (keep (N,), dropped counts)."""
    n_total = len(correct)
    keep = np.ones(n_total, dtype=bool)
    dropped: dict[str, int] = {}

    def narrow(name: str, mask_fn: Callable[[np.ndarray], np.ndarray]) -> None:
        idx = np.flatnonzero(keep)
        mask = mask_fn(idx)
        keep[idx[~mask]] = False
        dropped[name] = int((~mask).sum())

    if cfg.drop_unchecked and light["unchecked"].any():
        narrow("unchecked", lambda idx: ~light["unchecked"][idx])
    if cfg.drop_truncated:
        truncated = pc.equal(light["finish_reason"], "length").to_numpy(zero_copy_only=False)
        narrow("truncated", lambda idx: ~truncated[idx].astype(bool))
    if cfg.dedupe:

        def dedupe(idx: np.ndarray) -> np.ndarray:
            cand = cu.duplicate_candidates(groups[idx], light["fingerprint"][idx])
            strings = inputs.column_at("completion", idx[cand])
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
    return keep, dropped


def _read_light(inputs: ScoredInputs, cfg: CurateConfig, progress: ProgressFn | None) -> tuple[dict[str, Any], np.ndarray]:
    """Pass 1: the columns every decision needs (with ``dedupe``, an 8-byte fingerprint of each completion), and
    the rewards (N,), checked finite."""
    if inputs.rows == 0:
        raise UserError(f"the scored inputs hold no rows ({', '.join(cfg.scored)}) — check that `topr score` finished")
    cols = ["prompt_id", "policy", "iteration", "sample_index", "reward", "correct"]
    if cfg.drop_truncated:
        cols.append("finish_reason")
    if cfg.drop_unchecked:
        cols.append("verdict")
    derived = {"fingerprint": ("completion", cu.string_fingerprint)} if cfg.dedupe else None
    light = inputs.read_light(cols, derived=derived, progress=lambda i, n: report(progress, "curate: reading ids and rewards", i, n))
    light.setdefault("fingerprint", None)
    if cfg.drop_unchecked:  # the rows whose check failed (N,): read once, for the baselines and the selection
        light["unchecked"] = _numpy(pc.equal(light.pop("verdict"), ERROR), bool)
    reward = _numpy(light["reward"], np.float64)
    if not np.all(np.isfinite(reward)):
        bad = np.flatnonzero(~np.isfinite(reward))
        file = int(np.searchsorted(inputs.starts(), bad[0], side="right")) - 1  # where the first one is
        raise UserError(f"{len(bad)} rows have a NaN or infinite reward (the first: {inputs.files[file]}, row {bad[0] - inputs.starts()[file]}) — "
                        "fix the verifier's rewards and re-run `topr score`")
    return light, reward


def _numpy(col: pa.ChunkedArray, dtype) -> np.ndarray:
    return col.to_numpy().astype(dtype, copy=False)


def _fmt_dropped(dropped: dict[str, int]) -> str:
    return "rows dropped: " + ", ".join(f"{k} {v}" for k, v in dropped.items()) if dropped else "no filters"  # rows, not prompts


def _summarise(cfg, kind, c, inputs, light, groups, keep, kept, adv, w32, correct, row_source, weights, dropped, target=None) -> CurateCounts:
    src_k = row_source[kept]
    n_src = len(cfg.scored)
    rows_in = np.bincount(row_source, minlength=n_src)
    rows_out = np.bincount(src_k, minlength=n_src)
    pos_out = np.bincount(src_k, weights=adv >= 0, minlength=n_src).astype(np.int64)
    sources = []
    for s, path in enumerate(cfg.scored):
        in_s = np.flatnonzero(row_source == s)
        sources.append(SourceStats(
            path=str(path), weight=weights[s], files=int((inputs.file_source == s).sum()), rows_in=int(rows_in[s]),
            rows_out=int(rows_out[s]), positives=int(pos_out[s]),
            iterations=sorted(int(v) for v in pc.unique(light["iteration"].take(pa.array(in_s))).to_pylist()),
            policies=sorted(pc.unique(light["policy"].take(pa.array(in_s))).to_pylist())))
    positives = int((adv >= 0).sum())
    return CurateCounts(
        baseline=kind,
        c=c,
        p=cu.positive_share(correct[kept], w32),
        p_effective=cu.effective_positive_share(adv, w32),
        positive_fraction=cfg.positive_fraction,
        p_target=None if target is None else float(target),
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
