"""`topr train`: train a policy off-policy on a curated training set (TOPR by default)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from toprcli.cli.common import ConfigFile, Verbose, console, echo, err_console, progress_bars, send_noise_to, summary_table, user_errors


@user_errors(resume="rerun the same command with --resume to continue from the checkpoint")
def train(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Starting policy: an HF model dir or hub id. Use the policy that generated the data (π_k).")] = None,
    data: Annotated[Optional[str], typer.Option("--data", "-d", help="Curated training set (Parquet file or shard dir from `topr curate`).")] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Output dir for the new policy (HF format) + metrics.jsonl + train_summary.json.")] = None,
    loss: Annotated[Optional[str], typer.Option("--loss", help="Policy loss: topr, sft, reinforce, is, tis, ppo, cispo, kimi15.")] = None,
    config: ConfigFile = None,
    loss_option: Annotated[Optional[list[str]], typer.Option("--loss-option", help="A loss option as key=value (repeatable), e.g. --loss-option ratio_level=token.")] = None,
    aggregation: Annotated[Optional[str], typer.Option(help="token-mean, seq-mean-token-sum, seq-mean-token-mean (default), seq-mean-token-sum-norm.")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="adafactor (paper) or adamw.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (paper: 5e-7 with Adafactor).")] = None,
    weight_decay: Annotated[Optional[float], typer.Option(help="Decoupled weight decay.")] = None,
    schedule: Annotated[Optional[str], typer.Option(help="constant or cosine (after a linear warm-up).")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option(help="Linear warm-up steps.")] = None,
    grad_clip: Annotated[Optional[float], typer.Option(help="Clip the global gradient norm to this (default 1.0).")] = None,
    epochs: Annotated[Optional[float], typer.Option(help="Passes over the data (fractions allowed).")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps; overrides --epochs.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Sequences per optimizer step (over all ranks).")] = None,
    micro_batch_tokens: Annotated[Optional[int], typer.Option(help="Token budget of one forward pass (rows × padded length); gradients accumulate over micro-batches.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Check: the data's sampling temperature (read from the data; a different value is refused).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Check: the data's top-p (read from the data; a different value is refused).")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Check: the data's top-k (read from the data; a different value is refused).")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="Check: the data's min-p (read from the data; a different value is refused).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the data order and initialisation.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="auto (fp32 on CPU, bfloat16 on GPU), float32, bfloat16 (fp32 master weights, bf16 compute), bfloat16-pure (bf16 weights: small updates are lost).")] = None,
    save_dtype: Annotated[Optional[str], typer.Option("--save-dtype", help="dtype of the saved weights: float32 (default; keeps small updates), bfloat16, float16.")] = None,
    gradient_checkpointing: Annotated[Optional[bool], typer.Option("--gradient-checkpointing/--no-gradient-checkpointing", help="Recompute activations in backward (less memory). Default: on when a micro-batch's activations would take > 1/8 of the device memory.")] = None,
    save_every: Annotated[Optional[int], typer.Option(help="Checkpoint every N steps (for --resume).")] = None,
    resume: Annotated[Optional[bool], typer.Option("--resume", help="Continue a killed run from its last checkpoint; a finished --out is kept as is.")] = None,
    overwrite: Annotated[Optional[bool], typer.Option("--overwrite", help="Replace an existing --out (at the end, once the new policy is complete).")] = None,
    recompute_behavior: Annotated[Optional[bool], typer.Option("--recompute-behavior", help="Replace stored μ with this trainer's log-probs of the starting policy under the data's sampling processing (data must come from --model).")] = None,
    lora_rank: Annotated[Optional[int], typer.Option(help="Train LoRA adapters of this rank (0 = full fine-tuning); saved merged.")] = None,
    lora_alpha: Annotated[Optional[float], typer.Option(help="LoRA alpha.")] = None,
    lora_dropout: Annotated[Optional[float], typer.Option(help="LoRA dropout.")] = None,
    lora_target: Annotated[Optional[list[str]], typer.Option("--lora-target", help="Module names to adapt (repeatable); default: all linear layers.")] = None,
    ref_model: Annotated[Optional[str], typer.Option(help="Reference policy of the KL penalty (default: the starting policy).")] = None,
    kl_coef: Annotated[Optional[float], typer.Option(help="KL penalty coefficient (0 = off).")] = None,
    kl_estimator: Annotated[Optional[str], typer.Option(help="k1, k2 or k3.")] = None,
    entropy_coef: Annotated[Optional[float], typer.Option(help="Entropy bonus coefficient (0 = off).")] = None,
    whiten_advantages: Annotated[Optional[bool], typer.Option("--whiten-advantages", help="Whiten advantages over each step's batch.")] = None,
    adv_clip: Annotated[Optional[float], typer.Option(help="Clip advantages to [-c, c].")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice; 1 per core share under torchrun).")] = None,
    nproc_per_node: Annotated[Optional[int], typer.Option("--nproc-per-node", help="Train on N ranks of this node: relaunches itself under torchrun (FSDP2). Default: 1.")] = None,
    launcher: Annotated[Optional[str], typer.Option(help="Command template for other launchers, with {config} (e.g. srun torchrun ... -m toprcli train --config {config}).")] = None,
    tensorboard: Annotated[Optional[bool], typer.Option("--tensorboard", help="Also write TensorBoard events to OUT/tb.")] = None,
    log_every: Annotated[Optional[int], typer.Option(help="Write metrics every N steps.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    verbose: Verbose = False,
) -> None:
    """Train a policy on a curated training set and save it in HF format.

    Runs as one process or under torchrun (FSDP2 over ranks; gloo on CPU).

    Examples:
      [bold]topr train -m runs/r0/policy -d runs/r1/train.parquet -o runs/r1/policy --loss topr[/]
      [bold]topr train -c configs/gsm8k.yaml -m meta-llama/Meta-Llama-3-8B-Instruct -d train.parquet -o policy[/]
      [bold]topr train -c configs/gsm8k-llama3-8b.yaml -d train.parquet -o policy --nproc-per-node 8[/]   (FSDP2, 8 ranks)
      [bold]torchrun --nproc-per-node 8 -m toprcli train -c configs/gsm8k-llama3-8b.yaml -d train.parquet -o policy[/]
    """
    from toprcli.config import TrainConfig, load_config, parse_override
    from toprcli.training.distributed import env_rank, env_world_size

    if env_rank() != 0:  # under torchrun, only rank 0 talks
        err_console.quiet = True
        console.quiet = True
    overrides = {
        "model": model, "data": data, "out": out, "loss": loss, "aggregation": aggregation,
        "optimizer": optimizer, "lr": lr, "weight_decay": weight_decay, "schedule": schedule,
        "warmup_steps": warmup_steps, "grad_clip": grad_clip, "epochs": epochs, "max_steps": max_steps,
        "batch_size": batch_size, "micro_batch_tokens": micro_batch_tokens, "temperature": temperature,
        "top_p": top_p, "top_k": top_k, "min_p": min_p, "save_dtype": save_dtype,
        "seed": seed, "dtype": dtype, "gradient_checkpointing": gradient_checkpointing, "save_every": save_every,
        "resume": resume, "overwrite": overwrite, "recompute_behavior": recompute_behavior,
        "lora_rank": lora_rank, "lora_alpha": lora_alpha, "lora_dropout": lora_dropout,
        "lora_target_modules": lora_target or None, "ref_model": ref_model, "kl_coef": kl_coef,
        "kl_estimator": kl_estimator, "entropy_coef": entropy_coef, "whiten_advantages": whiten_advantages,
        "adv_clip": adv_clip, "threads": threads, "tensorboard": tensorboard, "log_every": log_every,
        "nproc_per_node": nproc_per_node, "launcher": launcher,
    }
    for item in loss_option or []:
        key, value = parse_override(item)
        overrides[f"loss_options.{key}"] = value
    cfg = load_config(TrainConfig, config, overrides)
    if env_world_size() == 1:  # a rank under torchrun already writes to its launcher's log
        send_noise_to(f"{cfg.out}.log", verbose)

    from toprcli.launch import runs_in_child, train_in_child
    from toprcli.stages import train as train_stage

    if runs_in_child(cfg) and env_world_size() == 1:  # launch the ranks (their output goes to <out>.train.log)
        err_console.print(f"training on {cfg.nproc_per_node} ranks: log in {cfg.out}.train.log", highlight=False)
        summary = train_in_child(cfg)
    else:
        with progress_bars(progress and env_rank() == 0) as bars:
            summary = train_stage.run(cfg, progress=bars).summary
    if env_rank() != 0:
        return
    if json_out:
        echo(json.dumps(summary, indent=2, default=str))
        return
    rows = [
        ("policy", summary["out"]),
        ("loss", summary["loss"]),
        ("steps", summary["steps"]),
        ("epochs", summary["epochs"]),
        ("rows", summary["rows"]),
        ("tokens", summary["tokens"]),
        ("tokens/s", summary["tokens_per_s"]),
        ("steps/s", summary["steps_per_s"]),
        ("first loss", summary["first_loss"]),
        ("final loss", summary["final_loss"]),
        ("final grad norm", summary["final_grad_norm"]),
    ]
    sampling = summary.get("sampling") or {}
    rows.append(("sampling (log π under)", ", ".join(f"{k} {v}" for k, v in sampling.items() if k != "source") + f" ({sampling.get('source')})"))
    rows.append(("precision / saved as", f"{summary.get('precision')} / {summary.get('save_dtype')}"))
    if "behavior_gap_mean" in summary:
        rows.append((f"|log π − log μ| mean/max ({summary.get('behavior_gap_source')})", f"{summary['behavior_gap_mean']:.3g} / {summary['behavior_gap_max']:.3g}"))
    if summary.get("resumed_from_step"):
        rows.append(("resumed from step", summary["resumed_from_step"]))
    if summary.get("world_size", 1) > 1:
        rows.append(("ranks", summary["world_size"]))
    console.print(summary_table(f"trained {Path(summary['out'])}", rows))
