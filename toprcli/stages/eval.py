"""The eval stage: sample k completions per test prompt, score them, report metrics.

Reads a policy and a prompt dataset. Writes, under ``OUT``:
``samples/`` and ``scored/`` (k samples per prompt), ``greedy/samples`` and
``greedy/scored`` (one greedy completion per prompt, when ``greedy`` is on),
with a generative verifier (``verifier_model`` or ``candidates``) ``verified/``
(and ``judge/`` when verdicts are sampled; :mod:`toprcli.stages.eval_judge`),
and ``eval.json`` last — its presence means the evaluation is complete. A
killed eval resumes through the shard stores of generate and score.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from toprcli import shards
from toprcli.config import EvalConfig, GenerateConfig, SamplingConfig, ScoreConfig, as_now, config_to_dict, validated
from toprcli.data.datasets import default_verifier, load_examples
from toprcli.errors import UserError
from toprcli.evaluation import accuracy, bootstrap_interval, prompt_scores, summarize_scores
from toprcli.generation import open_backend
from toprcli.progress import ProgressFn
from toprcli.stages import StageResult
from toprcli.stages import generate as generate_stage
from toprcli.stages import score as score_stage
from toprcli.stages.eval_judge import VERIFIED, check_judge, judge
from toprcli.tracking import check_installed, open_tracker, sample_rows
from toprcli.verifiers import ERROR, NO_ANSWER, TIMEOUT, check_sources
from toprcli.verifiers.voting import vote_keys, voting_verifier

STAGE = "eval"
EVAL_FILE = "eval.json"


def generate_config(cfg: EvalConfig, out: Path, *, greedy: bool) -> GenerateConfig:
    """The generate config of one eval pass: k samples per prompt, or one greedy completion."""
    sampling = cfg.sampling
    if greedy:  # truncation means nothing to argmax; only length and seed carry over
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=sampling.max_new_tokens, seed=sampling.seed)
    return GenerateConfig(
        model=cfg.model,
        dataset=cfg.dataset,
        out=str(out),
        n=1 if greedy else cfg.n or cfg.k,
        sampling=sampling,
        engine=cfg.engine,
        shard_size=cfg.shard_size,
        iteration=cfg.iteration,
    )


def generation_passes(cfg: EvalConfig) -> list[GenerateConfig]:
    """The generate configs of an eval: k samples per prompt into ``samples/``, then (with
    ``greedy``) one greedy completion per prompt into ``greedy/samples``."""
    out = Path(cfg.out)
    passes = [generate_config(cfg, out / "samples", greedy=False)]
    if cfg.greedy:
        passes.append(generate_config(cfg, out / "greedy" / "samples", greedy=True))
    return passes


def score_config(cfg: EvalConfig, samples: Path, out: Path) -> ScoreConfig:
    return ScoreConfig(samples=str(samples), out=str(out), verifier=cfg.verifier, verifier_by_source=cfg.verifier_by_source,
                       strict=cfg.strict, workers=cfg.workers, timeout=cfg.timeout)


def read_eval(out: str | Path) -> dict[str, Any] | None:
    path = Path(out) / EVAL_FILE
    return shards.read_json(path, needs="metrics") if path.exists() else None


def run(cfg: EvalConfig, *, backend: Any = None, examples: list | None = None, progress: ProgressFn | None = None) -> StageResult:
    """Run (or resume) an evaluation; the result's summary is what ``eval.json`` holds.

    ``backend``: an open generation backend to use (it is not closed), else one is
    opened for ``cfg.engine`` and closed at the end.
    """
    cfg = validated(cfg)
    given, (cfg, done) = cfg.verifier, _checked(cfg)
    out = Path(cfg.out)
    if done is not None:
        done = _rebootstrap(out, done, cfg)
        _track(cfg, out, done)  # logged once: a tracker skips what it has
        return StageResult(STAGE, str(out), done, skipped=True, wall_time_s=done.get("wall_time_s", 0.0))
    shards.check_writable(out)
    with shards.output_lock(out):  # one writer per output
        result = {**_evaluate(cfg, out, backend, examples, progress), "verifier_given": given}  # auto, or as named
        shards.write_json_atomic(out / EVAL_FILE, result)
        _track(cfg, out, result)
    return StageResult(STAGE, str(out), result, wall_time_s=result["wall_time_s"])


def check(cfg: EvalConfig) -> EvalConfig:
    """Everything an eval refuses before it generates (``launch.run_eval`` calls it before data-parallel passes), and
    the config as it runs: ``verifier: auto`` resolved. A finished eval under ``out`` is checked to be this one."""
    return _checked(cfg)[0]


def _checked(cfg: EvalConfig) -> tuple[EvalConfig, dict[str, Any] | None]:
    """:func:`check`, and the finished eval under ``out`` (None: none)."""
    if not cfg.model:
        raise UserError("eval needs a policy — pass --model DIR_OR_HUB_ID")
    if not cfg.out:
        raise UserError("eval needs an output directory — pass --out DIR")
    out = Path(cfg.out)
    check_installed(cfg.tracking.report_to)
    done = read_eval(out)
    cfg = _verifier_resolved(cfg, done)
    if cfg.verifier_model or cfg.candidates:  # a bad verifier, or a changed one, is refused before anything is generated
        check_judge(cfg, out)
    if done is not None:
        _check_same_eval(out, done, cfg)
        if done.get("model_fingerprint") not in (None, _model_fingerprint(cfg.model)):
            raise UserError(f"{out} holds an eval of the model at {cfg.model} as it was before it changed — choose another --out, "
                            f"or delete {out} to evaluate it again")
    return cfg, done


def _verifier_resolved(cfg: EvalConfig, done: dict[str, Any] | None) -> EvalConfig:
    """``verifier: auto`` as the verifier it stands for: the dataset's preset's. A finished eval that was asked for auto on
    the same dataset says what that was, without reading the dataset again (it may have moved since)."""
    if cfg.verifier != "auto":
        return cfg
    recorded = as_now(EvalConfig, (done or {}).get("config") or {})
    if (done or {}).get("verifier_given") == "auto" and recorded.get("dataset") == config_to_dict(cfg.dataset):
        return replace(cfg, verifier=recorded["verifier"])
    return replace(cfg, verifier=default_verifier(cfg.dataset))


# What says how an eval runs, not what it measures: a rerun may change these and keep the result.
HOW_IT_RUNS = {"out", "tracking", "workers", "data_parallel_size", "shard_size", "engine.gpu_memory_utilization",
               "engine.enforce_eager", "engine.tensor_parallel_size", "engine.batch_size", "bootstrap_resamples", "bootstrap_seed"}
# A generative verifier's settings: nothing without one (verifier_model or candidates); the last two only when sampling verdicts.
JUDGING = {"verifier_mode", "verifier_chat_template", "verifier_samples", "verifier_max_new_tokens"}
SAMPLED_ONLY = {"verifier_samples", "verifier_max_new_tokens"}


def _intervals(per_prompt: dict[str, dict[str, float]], cfg: EvalConfig) -> dict[str, Any]:
    """Each metric's 95% interval over prompts (the unit that was sampled), seeded (docs/architecture.md §4), and how."""
    return {"intervals": {name: list(bootstrap_interval(list(v.values()), resamples=cfg.bootstrap_resamples, seed=cfg.bootstrap_seed))
                          for name, v in per_prompt.items()},
            "bootstrap": {"method": "percentile", "level": 0.95, "resamples": cfg.bootstrap_resamples, "seed": cfg.bootstrap_seed, "over": "prompts"}}


def _rebootstrap(out: Path, done: dict[str, Any], cfg: EvalConfig) -> dict[str, Any]:
    """Other bootstrap settings on a finished eval: its intervals again from the stored per-prompt scores (no new samples)."""
    wanted = {"resamples": cfg.bootstrap_resamples, "seed": cfg.bootstrap_seed}
    have = done["metrics"].get("bootstrap") or {}
    if "per_prompt" not in done or {k: have.get(k) for k in wanted} == wanted:
        return done
    metrics = {**done["metrics"], **_intervals(done["per_prompt"], cfg)}
    config = {**(done.get("config") or {}), "bootstrap_resamples": cfg.bootstrap_resamples, "bootstrap_seed": cfg.bootstrap_seed}
    done = {**done, "metrics": metrics, "config": config}
    shards.write_json_atomic(out / EVAL_FILE, done)
    return done


def _model_fingerprint(model: str) -> str | None:
    """A local model's files (names, sizes, times); None for a hub id."""
    return shards.fingerprint(model) if Path(model).is_dir() else None


def _check_same_eval(out: Path, done: dict[str, Any], cfg: EvalConfig) -> None:
    """An ``eval.json`` is this eval's result only if it measured the same thing: other settings are refused."""
    moved = done.get("model_fingerprint") is not None and done["model_fingerprint"] == _model_fingerprint(cfg.model)  # same files elsewhere
    recorded = as_now(EvalConfig, done.get("config") or {})
    judged = bool(cfg.verifier_model or cfg.candidates)  # a change of either is a change of its own
    unused = (JUDGING if not judged else SAMPLED_ONLY if cfg.verifier_mode == "p-yes" else set())
    # Judged both times in the same mode: check_judge compared the verifier's and candidates' files (a moved run dir is its eval).
    unused |= {k for k in ("verifier_model", "candidates") if recorded.get(k) and getattr(cfg, k)}
    changed = sorted(k for k in shards.changed_keys(recorded, config_to_dict(cfg))
                     if not any(k == h or k.startswith(h + ".") for h in HOW_IT_RUNS) and k not in unused and not (k == "model" and moved))
    if changed:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise UserError(f"{out} holds an eval made with other settings (changed: {shown}) — choose another --out, or delete {out} to evaluate there again")


def _track(cfg: EvalConfig, out: Path, result: dict[str, Any]) -> None:
    """The eval's metrics (at step ``iteration``) and a samples table, to ``cfg.tracking``'s trackers."""
    tracker = open_tracker(cfg.tracking, out, config=result["config"])
    if tracker is not None:
        with tracker:
            tracker.log("eval", result["metrics"], cfg.iteration)
            tracker.log_table("eval/completions", sample_rows(out / "scored"), cfg.iteration)


def _evaluate(cfg: EvalConfig, out: Path, backend: Any, examples: list | None, progress: ProgressFn | None) -> dict[str, Any]:
    if examples is None:
        examples = load_examples(cfg.dataset)
    if cfg.verifier == "data_source":  # refused now, not after the samples are generated
        check_sources({e.data_source for e in examples}, cfg.verifier_by_source)
    t0 = time.perf_counter()
    runs = [("sampled", out, False)]
    if cfg.greedy:
        runs.append(("greedy", out / "greedy", True))
    tables = {}
    judging = bool(cfg.verifier_model or cfg.candidates)
    # One engine serves the sampled and the greedy pass, and the verifier's (opening one costs tens of seconds).
    own_backend = None
    pending = [shards.read_manifest(where / "samples") is None for _, where, _ in runs] + [judging and shards.read_manifest(out / VERIFIED) is None]
    if backend is None and any(pending):
        backend = own_backend = open_backend(cfg.engine, cfg.model, seed=cfg.sampling.seed)
    try:
        for name, where, greedy in runs:
            generate_stage.run(generate_config(cfg, where / "samples", greedy=greedy), backend=backend, examples=examples, progress=progress)
            with warnings.catch_warnings():  # eval reports these itself, as its error_rate
                warnings.simplefilter("ignore", score_stage.ChecksFailed)
                try:
                    score_stage.run(score_config(cfg, where / "samples", where / "scored"), progress=progress)
                except score_stage.ScoredOtherwise:  # an interrupted eval rerun with another verifier: eval has no --overwrite
                    raise UserError(f"{where / 'scored'} was scored with other verifier settings by an interrupted eval — delete it to "
                                    "score again, or choose another --out") from None
            columns = ["prompt_id", "sample_index", "correct", "extracted_answer", "verdict", "completion_token_ids", "finish_reason"]
            tables[name] = shards.read_table(where / "scored", columns=columns + (["data_source"] if cfg.verifier == "data_source" else []))
        judged = judge(cfg, out, backend, progress) if judging else {}
    finally:
        if own_backend is not None:
            own_backend.close()

    t = tables["sampled"]
    t = t.take(pc.sort_indices(t, sort_keys=[("prompt_id", "ascending"), ("sample_index", "ascending")]))
    metrics, per_prompt = _sampled_metrics(cfg, t)
    lengths = pc.list_value_length(t.column("completion_token_ids")).to_numpy()
    metrics["mean_completion_tokens"] = float(np.mean(lengths))
    metrics["maj@k"] = metrics[f"maj@{cfg.k}"]
    metrics["pass@k"] = metrics[f"pass@{cfg.k}"]
    if "greedy" in tables:
        g = tables["greedy"]
        metrics["greedy_accuracy"] = accuracy(g.column("correct").to_pylist())
        metrics["greedy_invalid_rate"] = float(np.mean([v == NO_ANSWER for v in g.column("verdict").to_pylist()]))
        metrics["greedy_error_rate"] = float(np.mean([v in (ERROR, TIMEOUT) for v in g.column("verdict").to_pylist()]))
        per_prompt["greedy_accuracy"] = {p: float(c) for p, c in zip(g.column("prompt_id").to_pylist(), g.column("correct").to_pylist())}
    per_prompt.update(judged.pop("per_prompt", {}))  # best-of-k and the votes of the judged candidates, per problem
    metrics.update(_intervals(per_prompt, cfg))
    metrics.update(judged)
    result = {
        "model": cfg.model,
        "dataset": cfg.dataset.source,
        "split": cfg.dataset.split,
        "k": cfg.k,
        "iteration": cfg.iteration,
        "metrics": metrics,
        "per_prompt": per_prompt,  # what the intervals resample, and what a paired comparison of two evals matches
        "config": config_to_dict(cfg),
        "model_fingerprint": _model_fingerprint(cfg.model),  # a model retrained at the same path is another model
        "wall_time_s": time.perf_counter() - t0,
    }
    return result


def _sampled_metrics(cfg: EvalConfig, t: Any) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """pass@1/pass@k/maj@k of the sampled pass, and each per prompt; answers vote together when the verifier finds
    them equivalent. A verifier that extracts no answer (a plugin that only judges) gives nothing to vote on: maj@k is
    None, not 0."""
    prompt_ids, correct = t.column("prompt_id").to_pylist(), t.column("correct").to_pylist()
    extracted = t.column("extracted_answer").to_pylist()
    sources = t.column("data_source").to_pylist() if "data_source" in t.column_names else []
    keys = vote_keys(voting_verifier(cfg.verifier, sources, cfg.verifier_by_source), prompt_ids, extracted, correct, cfg.k,
                     workers=cfg.workers, timeout=cfg.timeout)
    verdicts = t.column("verdict").to_pylist()
    invalid = [v == NO_ANSWER for v in verdicts]
    scores, short = prompt_scores(prompt_ids, correct, cfg.k, keys)  # grouped once: the means and the intervals' inputs
    metrics = summarize_scores(scores, short, k=cfg.k, samples=len(prompt_ids), invalid=invalid)
    metrics["error_rate"] = float(np.mean([v in (ERROR, TIMEOUT) for v in verdicts]))  # checks that failed: counted wrong
    metrics["truncated_rate"] = float(np.mean([r == "length" for r in t.column("finish_reason").to_pylist()]))  # hit max_new_tokens
    per_prompt = {"pass@1": scores["pass@1"], "maj@k": scores["maj@k"], "pass@k": scores["pass@k"]}
    judged = any(v not in (NO_ANSWER, ERROR, TIMEOUT) for v in verdicts)
    if judged and all(a is None or not a.strip() for a in extracted):
        metrics[f"maj@{cfg.k}"] = None
        del per_prompt["maj@k"]
    return metrics, per_prompt
