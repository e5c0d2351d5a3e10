"""`topr eval`: pass@1, pass@k, maj@k, greedy accuracy and invalid rate of a policy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import ConfigFile, Verbose, console, echo, progress_bars, send_noise_to, summary_table, user_errors


@user_errors
def eval_command(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Policy: an HF model dir or hub id.")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="Test prompts: builtin:gsm8k, builtin:arith, a hub id or a local .jsonl/.json/.parquet/.csv.")] = None,
    split: Annotated[str | None, typer.Option(help="Dataset split (default: test).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output dir: samples/, scored/, greedy/, eval.json.")] = None,
    k: Annotated[int | None, typer.Option(help="Samples per prompt for pass@k and maj@k (default 16).")] = None,
    verifier: Annotated[str | None, typer.Option(help="gsm8k, math, exact, regex:PATTERN, python:mod:fn, or auto (from the dataset).")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (default 1.0).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling mass in (0, 1] (default 1.0).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Keep the k most likely tokens; -1 is off (default).")] = None,
    min_p: Annotated[float | None, typer.Option("--min-p", help="Min-p truncation; 0 is off (default).")] = None,
    chat_template: Annotated[bool | None, typer.Option("--chat-template/--no-chat-template", help="Render prompts with the tokenizer's chat template (instruct models). Default: off.")] = None,
    system_prompt: Annotated[str | None, typer.Option("--system-prompt", help="System message for --chat-template prompts.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Max new tokens (default 512).")] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first K prompts.")] = None,
    backend: Annotated[str | None, typer.Option(help="auto, vllm or hf.")] = None,
    greedy: Annotated[bool | None, typer.Option("--greedy/--no-greedy", help="Also decode one greedy completion per prompt.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    verifier_model: Annotated[str | None, typer.Option("--verifier-model", help="A generative verifier (model dir) that scores each of the k samples: adds best-of-k and verifier-weighted maj@k.")] = None,
    verifier_mode: Annotated[str | None, typer.Option("--verifier-mode", help="p-yes: P(Yes) at the verdict position (default); sampled: share of Yes among --verifier-samples sampled verdicts.")] = None,
    verifier_samples: Annotated[int | None, typer.Option("--verifier-samples", help="Verdicts sampled per candidate (--verifier-mode sampled). Default: 4.")] = None,
    verifier_chat_template: Annotated[bool | None, typer.Option("--verifier-chat-template/--no-verifier-chat-template", help="Render verification prompts with the verifier's chat template (as it was trained).")] = None,
    candidates: Annotated[Path | None, typer.Option("--candidates", help="Judge this scored dir's samples with --model itself as the verifier (evaluating a trained verifier).")] = None,
    config: ConfigFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary (eval.json's content) as JSON on stdout.")] = False,
    verbose: Verbose = False,
) -> None:
    """Sample k completions per test prompt, score them, and report the metrics.

    Reports greedy accuracy, pass@1 (mean over samples), pass@k (unbiased
    estimator), maj@k (majority vote over extracted answers; ties give
    expected credit) and the invalid rate (no extractable answer). With a generative
    verifier: best-of-k by verifier score, verifier-weighted maj@k, and the verifier's
    accuracy, invalid-verdict rate and AUC on the candidates.

    Examples:
      [bold]topr eval --model runs/demo/round-003/policy --dataset builtin:arith --out eval/r3 --k 8[/]
      [bold]topr eval -m models/smollm2 -d builtin:gsm8k -o eval/smollm2 --chat-template --k 4 --limit 16[/]
      [bold]topr eval --model meta-llama/Meta-Llama-3-8B-Instruct --dataset openai/gsm8k --out eval/base --chat-template[/]
      [bold]topr eval --model runs/demo/round-003/policy --dataset builtin:arith --out eval/v --k 8 --verifier-model runs/verifier/round-002/policy[/]
      [bold]topr eval --model runs/verifier/round-002/policy --dataset verify/test.parquet --out eval/judge --candidates runs/demo/round-003/eval/scored[/]
    """
    from toprcli.config import EvalConfig, load_config
    from toprcli.stages import eval as eval_stage

    cfg = load_config(
        EvalConfig,
        config,
        {
            "model": model, "dataset.source": dataset, "dataset.split": split, "dataset.limit": limit,
            "dataset.chat_template": chat_template, "dataset.system_prompt": system_prompt,
            "out": str(out) if out else None, "k": k, "verifier": verifier,
            "sampling.temperature": temperature, "sampling.top_p": top_p, "sampling.top_k": top_k, "sampling.min_p": min_p,
            "sampling.max_new_tokens": max_new_tokens, "sampling.seed": seed, "engine.backend": backend, "greedy": greedy,
            "verifier_model": verifier_model, "verifier_mode": verifier_mode, "verifier_samples": verifier_samples,
            "verifier_chat_template": verifier_chat_template, "candidates": str(candidates) if candidates else None,
        },
    )
    from toprcli.errors import UserError

    if not cfg.model:
        raise UserError("eval needs a policy — pass --model DIR_OR_HUB_ID")
    send_noise_to(f"{cfg.out}.log", verbose)
    with progress_bars(not as_json, transient=True) as progress:
        result = eval_stage.run(cfg, progress=progress).summary
    if as_json:
        import json

        echo(json.dumps(result, default=str))
        return
    m = result["metrics"]
    rows = [("prompts", m["prompts"]), ("samples", m["samples"]), ("pass@1", m["pass@1"]), (f"pass@{cfg.k}", m["pass@k"]),
            (f"maj@{cfg.k}", m["maj@k"]), ("invalid rate", m["invalid_rate"]), ("mean completion tokens", m["mean_completion_tokens"])]
    if "greedy_accuracy" in m:
        rows.insert(2, ("greedy accuracy", m["greedy_accuracy"]))
    if "best_of_k_verifier" in m:
        rows += [
            ("verifier", f"{m['verifier_model']} ({m['verifier_mode']})"),
            (f"candidates judged ({'--candidates' if cfg.candidates else 'the k samples'})", m["candidates"]),
            (f"maj@{cfg.k} of the candidates", m["candidates_maj@k"]),
            (f"best-of-{cfg.k} by verifier", m["best_of_k_verifier"]),
            (f"verifier-weighted maj@{cfg.k}", m["weighted_maj@k"]),
            ("verifier accuracy", m["verifier_accuracy"]),
            ("verifier invalid-verdict rate", m["verifier_invalid_rate"]),
            ("verifier AUC", m["verifier_auc"]),
        ]
    console.print(summary_table(f"eval of {cfg.model}", rows))
    console.print(f"wrote {Path(cfg.out) / 'eval.json'}", highlight=False)
