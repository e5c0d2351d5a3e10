"""The eval stage's verifier pass: a generative verifier judges sampled candidates.

Part of :mod:`toprcli.stages.eval`. The candidates are the eval's own k samples
per prompt (``verifier_model``: another model judges them), or the samples of
another policy in a scored directory (``candidates``: the evaluated model is
the verifier — what ``topr iterate`` measures each round when it trains a
verifier). Each candidate becomes a verification prompt
(:mod:`toprcli.data.verification`), rendered with the ``verification`` preset
(and the verifier's chat template when ``verifier_chat_template``), and gets
a score in [0, 1]:

* ``p-yes`` — P(Yes) / (P(Yes) + P(No)) at the verdict position
  (:mod:`toprcli.generation.verdicts`); its validity is the verdict mass P(Yes) + P(No);
* ``sampled`` — ``verifier_samples`` verdicts are sampled (the generate stage
  into ``judge/samples``, scored by the ``judge`` verifier into ``judge/scored``):
  the share of Yes among the valid ones (0.5 when none is valid); its validity
  is the share of valid verdicts.

Writes ``verified/``: the candidates' scored columns plus ``verifier_score``
(float64) and ``verifier_valid`` (float32), then its ``_manifest.json``; a rerun reuses it.
Returns the verifier's measures (:func:`toprcli.evaluation.verifier_metrics`),
with the names ``best_of_k_verifier`` and ``weighted_maj@k``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from toprcli import shards
from toprcli.config import DatasetSpec, EvalConfig, GenerateConfig, SamplingConfig, ScoreConfig
from toprcli.data.datasets import Example, encode_prompt, render_prompt
from toprcli.data.verification import NO, YES, label_word, verification_id, verification_text
from toprcli.errors import UserError
from toprcli.evaluation import verifier_metrics, verifier_prompt_scores
from toprcli.generation import open_backend
from toprcli.generation.model_info import same_architecture, same_tokenizer
from toprcli.generation.model_info import check_model, load_tokenizer
from toprcli.generation.verdicts import verdict_scores
from toprcli.progress import ProgressFn, report
from toprcli.stages import generate as generate_stage
from toprcli.stages import score as score_stage
from toprcli.verifiers.voting import vote_keys, voting_verifier

VERIFIED = "verified"
CANDIDATE_COLUMNS = ("prompt_id", "sample_index", "completion", "correct", "extracted_answer")  # what judging reads


def check_judge(cfg: EvalConfig, out: Path) -> None:
    """Before anything is generated: the verifier is a model, the candidates have what judging reads, and a judgement
    already under ``out`` (a killed eval's, or a finished one's) was made by this verifier of these candidates."""
    if cfg.verifier_model:
        check_model(cfg.verifier_model)
    if cfg.candidates:
        shards.check_finished(cfg.candidates, "score")  # a killed score's shards so far: judged as if they were all
        found = shards.complete_shards(cfg.candidates)
        if not found:
            raise UserError(f"--candidates {cfg.candidates}: no scored shards there — pass a `topr score` (or an eval's scored/) directory")
        names = shards.read_schema(next(iter(found.values()))).names
        missing = [c for c in CANDIDATE_COLUMNS if c not in names]
        if missing:
            raise UserError(f"--candidates {cfg.candidates} have no {', '.join(repr(c) for c in missing)} column — pass a scored directory")
    if (out / VERIFIED).exists() or (out / "judge").exists():
        info = _judgement(cfg, cfg.verifier_model or cfg.model, _source(cfg, out))
        if not cfg.candidates and (out / "eval.json").exists():  # its own scored/, which the finished eval's checks cover
            del info["candidates_files"]
        _check_judgement(out, info)


def _source(cfg: EvalConfig, out: Path) -> Path:
    return Path(cfg.candidates) if cfg.candidates else out / "scored"


def judge(cfg: EvalConfig, out: Path, backend: Any, progress: ProgressFn | None) -> dict[str, Any]:
    """Score the candidates with the verifier (or reuse ``out/verified``); return the verifier's measures."""
    verified = out / VERIFIED
    source = _source(cfg, out)
    verifier = cfg.verifier_model or cfg.model
    scored_by = _scored_by(cfg, source)
    decides = _judgement(cfg, verifier, source)
    _check_judgement(out, decides)
    info = {"verifier_model": verifier, "candidates": str(source), **decides}
    if shards.read_manifest(verified) is None:
        table = _candidates(source)
        if cfg.verifier_mode == "p-yes":
            scores, valid = _p_yes(cfg, verifier, table, backend, progress)
        else:
            scores, valid = _sampled(cfg, verifier, table, backend, out, progress, decides)
        table = table.append_column(pa.field("verifier_score", pa.float64()), pa.array(scores, pa.float64()))  # float32: P(No) 1e-8 and 1e-9 tied
        table = table.append_column(pa.field("verifier_valid", pa.float32()), pa.array(valid, pa.float32()))
        shards.write_shard(verified, 0, table, metadata={"stage": "eval-judge", **info, "score": scored_by})  # judging it again votes as here
        shards.write_manifest(verified, stage="eval-judge", config=info, inputs={"candidates": str(source)}, counts={"rows": table.num_rows})
    else:  # judged by an earlier, interrupted run of this eval
        table = shards.read_table(verified)
    prompt_ids, correct = table.column("prompt_id").to_pylist(), table.column("correct").to_pylist()
    # This eval's own samples: its k. Another run's (candidates): all of each problem's, however many it drew;
    # cfg.k is then this eval's verdicts per prompt, not the candidates' (it once cut best-of-8 to best-of-4).
    k = max(Counter(prompt_ids).values()) if cfg.candidates else cfg.k
    sources = table.column("data_source").to_pylist() if "data_source" in table.column_names else []  # votes grouped as maj@k's
    answer_checker = (scored_by or {}).get("settings", {}).get("verifier") or "gsm8k"  # scored before it was recorded: the default then
    keys = vote_keys(voting_verifier(answer_checker, sources, cfg.verifier_by_source), prompt_ids, table.column("extracted_answer").to_pylist(),
                     correct, k, workers=cfg.workers, timeout=cfg.timeout)
    scores = table.column("verifier_score").to_numpy().astype(np.float64)
    valid = table.column("verifier_valid").to_numpy().astype(np.float64)
    per_prompt = verifier_prompt_scores(prompt_ids, correct, keys, scores, k)  # what the eval's intervals resample
    m = {**verifier_metrics(prompt_ids, correct, keys, scores, k, valid, per_prompt=per_prompt), "per_prompt": per_prompt}
    if m["verifier_auc"] != m["verifier_auc"]:  # NaN: every candidate right, or every one wrong
        m["verifier_auc"] = None  # JSON has no NaN
    for name in ("best_of_{}_verifier", "weighted_maj@{}", "candidates_maj@{}"):  # also under k's name, as maj@k is
        m[name.format("k")] = m[name.format(k)]
    m["candidates_k"] = k
    m["verifier_invalid_rate"] = float(1.0 - valid.mean())
    m["verifier_model"], m["verifier_mode"] = verifier, cfg.verifier_mode
    return m


def _scored_by(cfg: EvalConfig, source: Path) -> dict[str, Any] | None:
    """How the candidates were scored (their shards' ``score`` record): the verifier that says which answers vote together."""
    if not cfg.candidates:
        return {"settings": {"verifier": cfg.verifier}}
    found = shards.complete_shards(source)
    if not found:
        raise UserError(f"candidates {source}: no scored shards — pass a `topr score` (or eval `scored/`) directory")
    return shards.read_file_metadata(next(iter(found.values()))).get("score")


def _candidates(source: Path) -> pa.Table:
    """The candidates in order; an earlier judgement's scores (candidates that are an eval's verified/) are dropped."""
    table = shards.read_table(source)
    for column in CANDIDATE_COLUMNS:
        if column not in table.column_names:
            raise UserError(f"candidates {source} have no {column!r} column — pass a scored directory")
    table = table.drop_columns([c for c in ("verifier_score", "verifier_valid") if c in table.column_names])
    return table.take(pc.sort_indices(table, sort_keys=[("prompt_id", "ascending"), ("sample_index", "ascending")]))


def _texts(table: pa.Table) -> list[str]:
    """The verification text of every candidate: its question (before rendering, else the prompt) and solution."""
    questions = table.column("question" if "question" in table.column_names else "prompt").to_pylist()
    return [verification_text(q or "", c or "") for q, c in zip(questions, table.column("completion").to_pylist())]


def _spec(cfg: EvalConfig, source: str) -> DatasetSpec:
    """How verification prompts are rendered. Judging --candidates, the evaluated model is the verifier and this eval's
    dataset is its verification data: its system prompt and template are the ones it was trained with."""
    own = {"system_prompt": cfg.dataset.system_prompt, "template": cfg.dataset.template} if cfg.candidates else {}
    return DatasetSpec(source=source, split="test", preset="verification", chat_template=cfg.verifier_chat_template, **own)


def _p_yes(cfg: EvalConfig, verifier: str, table: pa.Table, backend: Any, progress: ProgressFn | None) -> tuple[np.ndarray, np.ndarray]:
    check_model(verifier)
    tokenizer = load_tokenizer(verifier)
    spec = _spec(cfg, "candidates")
    labels = table.column("correct").to_pylist()
    prompts = []
    for text, ok in zip(_texts(table), labels):
        rendered = render_prompt(Example(prompt_id="", question=text, answer=label_word(bool(ok))), spec, tokenizer)
        prompts.append(encode_prompt(rendered, tokenizer, spec))
    report(progress, "verifier: P(Yes)", 0, len(prompts))
    own = None
    if backend is None:
        backend = own = open_backend(cfg.engine, verifier, seed=cfg.sampling.seed)
    elif str(backend.model) != verifier:
        backend.load_weights(verifier)
    try:
        scores, mass = verdict_scores(backend, tokenizer, prompts)
    finally:
        if own is not None:
            own.close()
    report(progress, "verifier: P(Yes)", len(prompts), len(prompts))
    return scores, mass


def _judgement(cfg: EvalConfig, verifier: str, source: Path) -> dict[str, Any]:
    """What decides a judgement, recorded with it: a killed eval rerun with other settings must not report it as its own.
    Models and candidates by their files (a moved run dir resumes); the paths are recorded, not compared."""
    sampled = {"verifier_samples": cfg.verifier_samples, "verifier_max_new_tokens": cfg.verifier_max_new_tokens} if cfg.verifier_mode == "sampled" else {}
    return {"verifier_files": shards.model_identity(verifier), "verifier_mode": cfg.verifier_mode,
            "verifier_chat_template": cfg.verifier_chat_template, **sampled, "candidates_files": shards.fingerprint(source)}


def _check_judgement(out: Path, info: dict[str, Any]) -> None:
    """Refuse the judgement (or the verification prompts) of an earlier run with other settings, or of a verifier or
    candidates whose files changed since; a key an older toprcli did not record is taken as today's."""
    prompts = out / "judge" / "prompts.parquet"
    for where, had in ((out / VERIFIED, (shards.read_manifest(out / VERIFIED) or {}).get("config")),
                       (prompts, shards.read_file_metadata(prompts).get("judgement") if prompts.exists() else None)):
        changed = sorted(k for k in info if had is not None and k in had and had[k] != info[k])
        if changed:
            stale = " and ".join(str(p) for p in (out / VERIFIED, out / "judge", out / "eval.json") if p.exists())
            raise UserError(f"{where} holds a judgement made with other settings (changed: {', '.join(changed)}) — delete "
                            f"{stale} to judge again, or choose another --out")


def _sampled(cfg: EvalConfig, verifier: str, table: pa.Table, backend: Any, out: Path,
             progress: ProgressFn | None, judgement: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``verifier_samples`` verdicts per candidate through the generate and score stages (resumable)."""
    texts = _texts(table)
    ids = [f"{verification_id(t)}-{pid}-{i}" for t, pid, i in zip(texts, table.column("prompt_id").to_pylist(),
                                                                   table.column("sample_index").to_pylist())]
    prompts_file = out / "judge" / "prompts.parquet"
    if not prompts_file.exists():
        labels = [label_word(bool(c)) for c in table.column("correct").to_pylist()]
        data = pa.table({"id": ids, "question": texts, "answer": labels})
        shards.write_table_atomic(prompts_file, data, {"stage": "verifier-data", "source": "eval candidates", "judgement": judgement})
    gcfg = GenerateConfig(
        model=verifier, dataset=_spec(cfg, str(prompts_file)), out=str(out / "judge" / "samples"), n=cfg.verifier_samples,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=cfg.verifier_max_new_tokens, seed=cfg.sampling.seed),
        engine=cfg.engine, shard_size=cfg.shard_size, iteration=cfg.iteration,
    )
    # The run's engine serves the verifier only if it shares the policy's architecture (and so its context) and its
    # tokenizer files (prompts, chat template and stop tokens are the engine's); else the generate stage opens the
    # verifier's own, which renders and decodes with its tokenizer.
    shared = backend is not None and same_architecture(str(backend.model), verifier) and same_tokenizer(str(backend.model), verifier)
    generate_stage.run(gcfg, backend=backend if shared else None, progress=progress)
    scfg = ScoreConfig(samples=gcfg.out, out=str(out / "judge" / "scored"), verifier="judge", workers=cfg.workers, timeout=cfg.timeout)
    score_stage.run(scfg, progress=progress)
    verdicts = shards.read_table(scfg.out, columns=["prompt_id", "extracted_answer"])
    tally: dict[str, Counter] = {}
    for pid, v in zip(verdicts.column("prompt_id").to_pylist(), verdicts.column("extracted_answer").to_pylist()):
        tally.setdefault(pid, Counter())[v if v in (YES, NO) else None] += 1
    scores, valid = np.full(len(ids), 0.5), np.zeros(len(ids))
    for j, vid in enumerate(ids):
        c = tally.get(vid, Counter())
        n_valid = c[YES] + c[NO]
        if n_valid:
            scores[j] = c[YES] / n_valid
        valid[j] = n_valid / max(1, sum(c.values()))
    return scores, valid
