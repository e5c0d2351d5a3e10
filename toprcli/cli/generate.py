"""`topr generate`: sample n completions per prompt with behaviour log-probs into Parquet shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import ConfigFile, Verbose, console, echo, err_console, progress_bars, send_noise_to, summary_table, user_errors


@user_errors
def generate(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Policy: a Hugging Face model dir (or hub id).")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="Prompts: builtin:arith, a hub id (openai/gsm8k) or a local .jsonl/.json/.parquet/.csv.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output directory for shard-*.parquet and _manifest.json.")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Completions per prompt (paper: 16 for GSM8K, 32 for MATH). Default: 16.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature. Default: 1.0.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling mass in (0, 1]. Default: 1.0.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Keep the k most likely tokens; -1 is off. Default: -1.")] = None,
    min_p: Annotated[float | None, typer.Option("--min-p", help="Drop tokens less likely than min-p × the most likely one; 0 is off. Default: 0.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", help="Most tokens per completion. Default: 512.")] = None,
    seed: Annotated[int | None, typer.Option(help="Base seed; each prompt's seed derives from (seed, iteration, prompt id). Default: 0.")] = None,
    backend: Annotated[str | None, typer.Option(help="auto (vLLM when it imports), vllm or hf. Default: auto.")] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first K prompts.")] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split. Default: train.")] = None,
    chat_template: Annotated[bool | None, typer.Option("--chat-template/--no-chat-template", help="Render prompts with the tokenizer's chat template (instruct models). Default: off.")] = None,
    system_prompt: Annotated[str | None, typer.Option("--system-prompt", help="System message for --chat-template prompts.")] = None,
    shard_size: Annotated[int | None, typer.Option("--shard-size", help="Prompts per shard file (the unit of resume). Default: 64.")] = None,
    shard_index: Annotated[int | None, typer.Option("--shard-index", help="This process's part, 0..num-shards-1 (data parallel). Default: 0.")] = None,
    num_shards: Annotated[int | None, typer.Option("--num-shards", help="Processes sharing the prompt set (data parallel). Default: 1.")] = None,
    data_parallel_size: Annotated[int | None, typer.Option("--data-parallel-size", help="Launch N processes here, one engine each (GPUs split between them), disjoint shards into --out. Default: 1.")] = None,
    tensor_parallel_size: Annotated[int | None, typer.Option("--tensor-parallel-size", help="GPUs per vLLM engine (tensor parallelism). Default: 1.")] = None,
    dtype: Annotated[str | None, typer.Option(help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16 or float16.")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option("--gpu-memory-utilization", help="vLLM memory share (GPU memory; on CPU, the share of RAM for model + KV cache). Default: 0.9 GPU, 0.2 CPU.")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", help="Context length (prompt + completion); default: the model's.")] = None,
    skip_long: Annotated[bool | None, typer.Option("--skip-long/--no-skip-long", help="Drop prompts longer than the context (counted) instead of stopping.")] = None,
    clip_to_context: Annotated[bool | None, typer.Option("--clip-to-context/--no-clip-to-context", help="Cut completions where a prompt + max-new-tokens would pass the context (recorded in the manifest) instead of stopping.")] = None,
    iteration: Annotated[int | None, typer.Option(help="Round number stored in each row and mixed into the seeds. Default: 0.")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Prompts per generate call (hf backend). Default: 64.")] = None,
    per_request_seed: Annotated[bool | None, typer.Option("--per-request-seed/--no-per-request-seed", help="Seed every prompt from (seed, iteration, prompt id) (vLLM); off: reseed per shard only. Default: on.")] = None,
    config: ConfigFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    verbose: Verbose = False,
) -> None:
    """Sample [bold]n[/] completions per prompt, with the behaviour log-probs the off-policy losses need.

    Writes one row per completion (prompt_token_ids, completion_token_ids, behavior_logprobs,
    finish_reason, ...) to --out/shard-*.parquet; a rerun skips complete shards.

    Examples:
      [bold]topr generate --model models/tiny --dataset builtin:arith --out runs/s0 --n 8 --max-new-tokens 64[/]
      [bold]topr generate -c configs/demo.yaml --out runs/s0[/]
      [bold]topr generate -c configs/demo.yaml -o runs/s0 --shard-index 1 --num-shards 4[/]   (process 1 of 4, same --out)
      [bold]topr generate -m models/smollm2 -d builtin:gsm8k --split test -o runs/s1 --chat-template --n 4 --top-k 50[/]
    """
    from toprcli.config import GenerateConfig, load_config
    from toprcli.stages import generate as generate_stage

    overrides = {
        "model": model,
        "dataset.source": dataset,
        "dataset.split": split,
        "dataset.chat_template": chat_template,
        "dataset.system_prompt": system_prompt,
        "out": str(out) if out is not None else None,
        "n": n,
        "sampling.temperature": temperature,
        "sampling.top_p": top_p,
        "sampling.top_k": top_k,
        "sampling.min_p": min_p,
        "sampling.max_new_tokens": max_new_tokens,
        "sampling.seed": seed,
        "engine.backend": backend,
        "engine.tensor_parallel_size": tensor_parallel_size,
        "engine.dtype": dtype,
        "engine.gpu_memory_utilization": gpu_memory_utilization,
        "engine.max_model_len": max_model_len,
        "engine.batch_size": batch_size,
        "limit": limit,
        "shard_size": shard_size,
        "shard_index": shard_index,
        "num_shards": num_shards,
        "data_parallel_size": data_parallel_size,
        "skip_long": skip_long,
        "clip_to_context": clip_to_context,
        "iteration": iteration,
        "per_request_seed": per_request_seed,
    }
    cfg = load_config(GenerateConfig, config, overrides)
    send_noise_to(f"{cfg.out}.log", verbose)
    if cfg.data_parallel_size > 1:
        from toprcli.launch import generate_data_parallel
        from toprcli.shards import read_manifest

        err_console.print(f"{cfg.data_parallel_size} processes: logs in {cfg.out}/_logs/", highlight=False)
        generate_data_parallel(cfg)
        manifest = read_manifest(cfg.out)
        summary = {**manifest["counts"], "out": cfg.out, "backend": manifest["config"]["engine"]["backend_resolved"],
                   "shards_written": manifest["counts"]["shards"], "shards_skipped": 0, "wall_time_s": manifest["wall_time_s"]}
    else:
        with progress_bars(not as_json) as progress:
            summary = generate_stage.run(cfg, progress=progress).summary
    if as_json:
        echo(json.dumps(summary, sort_keys=True))
        return
    console.print(summary_table(f"generate → {summary['out']}", summary_rows(summary)))


def summary_rows(s: dict) -> list[tuple[str, object]]:
    finish = ", ".join(f"{k} {v}" for k, v in s.get("finish_reasons", {}).items()) or "-"
    rows = [
        ("backend", s["backend"]),
        ("prompts", s["prompts"]),
        ("completions", s["completions"]),
        ("mean completion length", float(s["mean_completion_len"])),
        ("max completion length", s["max_completion_len"]),
        ("finish reasons", finish),
        ("tokens/s", float(s["tokens_per_s"])),
        ("shards written / skipped (complete)", f"{s['shards_written']} / {s['shards_skipped']}"),
    ]
    if s.get("skipped_long"):
        rows.append(("prompts skipped (too long)", s["skipped_long"]))
    if s.get("clipped_to_context"):
        c = s["clipped_to_context"]
        rows.append(("clipped to the context", f"{c['prompts_clipped']} prompts (max_new_tokens {c['max_new_tokens_requested']} → ≥ {c['max_new_tokens_min_effective']})"))
    rows.append(("wall time (s)", float(s["wall_time_s"])))
    return rows
