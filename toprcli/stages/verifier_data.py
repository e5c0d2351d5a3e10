"""The verifier-data stage: scored completions → a verification dataset for a generative verifier.

Reads ``shard-*.parquet`` of one or more ``scored/`` directories (any round's
samples, an eval's samples). Writes ONE Parquet file (``--out``), a dataset
``topr generate`` reads like any other (the ``verification`` preset, detected
from the file's metadata): one row per judged candidate,

==================  ==========================================================
``id``              stable id from the verification text
``question``        the verification text: the problem, the candidate solution
                    and the request for a Yes/No verdict (toprcli.data.verification)
``answer``          the label: ``Yes`` if the candidate was scored correct, else ``No``
``label``           the same as a bool
``source_*``        where the candidate came from (prompt id, iteration, policy,
                    sample index, its question and extracted answer)
``candidate``       the candidate solution as sampled
==================  ==========================================================

with the settings, input fingerprints and counts in its metadata. Candidates
whose score is unknown (``timeout``/``error`` verdicts) are left out; answerless
ones stay, labelled ``No``. Options: one row per distinct (question, candidate)
(``dedupe``, on by default), at most N candidates per question (seeded), and
equal numbers of Yes and No (``balance``: the larger class is subsampled).

The question a verifier is shown is the samples' ``question`` column (the
dataset's question before rendering, written by ``topr generate``); for older
samples without it, the rendered ``prompt``.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from toprcli import shards
from toprcli.config import VerifierDataConfig, config_to_dict, validated
from toprcli.data.verification import label_word, verification_id, verification_text
from toprcli.errors import UserError
from toprcli.progress import ProgressFn, report
from toprcli.shards.scored_inputs import ScoredInputs
from toprcli.stages import StageResult
from toprcli.verifiers import ERROR, TIMEOUT

STAGE = "verifier-data"
_COLUMNS = ["prompt_id", "iteration", "policy", "sample_index", "correct", "verdict", "completion", "extracted_answer"]


def run(cfg: VerifierDataConfig, *, progress: ProgressFn | None = None) -> StageResult:
    """Write the verification dataset of ``cfg.scored`` to ``cfg.out``; see the module docstring."""
    t0, cfg = time.perf_counter(), validated(cfg)
    if not cfg.scored:
        raise UserError("no scored data given — pass --scored DIR (one or more `topr score` output directories)")
    if not cfg.out:
        raise UserError("no --out given — name the verification dataset's file, e.g. --out verify.parquet")
    if not str(cfg.out).endswith(".parquet"):
        raise UserError(f"--out {cfg.out}: the verification dataset is one Parquet file — name it *.parquet")
    out = Path(cfg.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a directory — name the dataset file, e.g. {out / 'train.parquet'}")
    shards.check_not_an_input(out, list(cfg.scored), "verify.parquet")
    inputs = ScoredInputs.open(list(cfg.scored))
    config = config_to_dict(cfg)
    fingerprints = {p: shards.fingerprint(p) for p in cfg.scored}
    if out.exists():
        previous = _previous(out, config, fingerprints)
        if previous is not None:
            return StageResult(STAGE, str(out), previous, skipped=True)
        if not cfg.overwrite:
            raise UserError(f"{out} already exists (from other inputs or settings, or in the input order of an older toprcli) — pass --overwrite "
                            "or choose another --out")
    if inputs.rows == 0:
        raise UserError(f"the scored inputs hold no rows ({', '.join(cfg.scored)}) — check that `topr score` finished")
    shards.check_writable(out)
    with shards.output_lock(out):
        shards.remove_stale_temporaries(out.parent, of=out.name)  # a killed run's half-written file
        table, summary = _build(cfg, inputs, progress)
        shards.write_table_atomic(out, table, {"stage": STAGE, "config": config, "inputs": fingerprints, "counts": summary, "order": ORDER})
    return StageResult(STAGE, str(out), summary, wall_time_s=time.perf_counter() - t0)


def _build(cfg: VerifierDataConfig, inputs: ScoredInputs, progress: ProgressFn | None) -> tuple[pa.Table, dict[str, Any]]:
    question_col = "question" if all("question" in s.names for s in inputs.schemas) else "prompt"
    cols = inputs.read_light(_COLUMNS + [question_col], progress=lambda i, n: report(progress, "verifier-data: reading", i, n))
    rows = {c: cols[c].to_pylist() for c in _COLUMNS + [question_col]}
    n = len(rows["prompt_id"])
    questions = [q if q is not None else "" for q in rows[question_col]]
    completions = [c if c is not None else "" for c in rows["completion"]]
    texts = [verification_text(q, c) for q, c in zip(questions, completions)]

    keep = np.array([v not in (TIMEOUT, ERROR) for v in rows["verdict"]], dtype=bool)
    dropped = {"unscored (timeout/error)": int((~keep).sum())}
    if cfg.dedupe:
        seen: set[str] = set()
        before = int(keep.sum())
        for i in np.flatnonzero(keep):
            if texts[i] in seen:
                keep[i] = False
            seen.add(texts[i])
        dropped["duplicates"] = before - int(keep.sum())
    rng = np.random.default_rng(cfg.seed)
    if cfg.max_per_question is not None:
        before = int(keep.sum())
        idx = np.flatnonzero(keep)
        order = idx[rng.permutation(len(idx))]
        taken: Counter[str] = Counter()
        for i in order:
            if taken[questions[i]] >= cfg.max_per_question:
                keep[i] = False
            taken[questions[i]] += 1
        dropped["over max per question"] = before - int(keep.sum())
    label = np.asarray(rows["correct"], dtype=bool)
    if cfg.balance:
        before = int(keep.sum())
        yes, no = np.flatnonzero(keep & label), np.flatnonzero(keep & ~label)
        if len(yes) == 0 or len(no) == 0:
            raise UserError(
                f"--balance needs both correct and incorrect candidates; the inputs have {len(yes)} correct and {len(no)} "
                "incorrect — drop --balance or add other scored dirs"
            )
        larger = yes if len(yes) > len(no) else no
        keep[rng.choice(larger, size=abs(len(yes) - len(no)), replace=False)] = False
        dropped["balance"] = before - int(keep.sum())
    kept = np.flatnonzero(keep)
    kept = kept[rng.permutation(len(kept))]  # shuffled: the first N rows (a warm start's, an eval's limit) are a sample, not round 1's first problems
    if len(kept) == 0:
        raise UserError("no candidates left after selection — relax --max-per-question / drop --balance")

    def pick(values: list) -> list:
        return [values[i] for i in kept]

    ids, copies = [], Counter()
    for i in kept:  # --no-dedupe keeps repeated candidates: the same text, a unique id each (load_examples refuses twins)
        base = verification_id(texts[i])
        copies[base] += 1
        ids.append(base if copies[base] == 1 else f"{base}-{copies[base]}")
    table = pa.table({
        "id": pa.array(ids, pa.string()),
        "question": pa.array(pick(texts), pa.string()),
        "answer": pa.array([label_word(bool(label[i])) for i in kept], pa.string()),
        "label": pa.array(label[kept], pa.bool_()),
        "source_prompt_id": pa.array(pick(rows["prompt_id"]), pa.string()),
        "source_iteration": pa.array(pick(rows["iteration"]), pa.int32()),
        "source_policy": pa.array(pick(rows["policy"]), pa.string()),
        "source_sample_index": pa.array(pick(rows["sample_index"]), pa.int32()),
        "source_question": pa.array(pick(questions), pa.string()),
        "source_extracted_answer": pa.array(pick(rows["extracted_answer"]), pa.string()),
        "candidate": pa.array(pick(completions), pa.string()),
    })
    counts = {
        "rows_in": n,
        "rows_out": len(kept),
        "yes": int(label[kept].sum()),
        "no": int(len(kept) - label[kept].sum()),
        "questions": len({questions[i] for i in kept}),
        "dropped": dropped,
        "question_source": question_col,
    }
    return table, counts


ORDER = "shuffled"  # how the rows are ordered: a seeded permutation (the first N a sample)


def _previous(out: Path, config: dict[str, Any], fingerprints: dict[str, str]) -> dict[str, Any] | None:
    """The earlier summary when ``out`` was made from these inputs with these settings (a rerun)."""
    try:
        meta = shards.read_file_metadata(out)
    except Exception:
        return None
    same = meta.get("stage") == STAGE and meta.get("order") == ORDER and shards.made_from(meta, config, fingerprints)
    return meta.get("counts") if same else None  # a file of the input order (before ORDER) is made again
