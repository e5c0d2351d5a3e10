"""`topr train`: train a policy off-policy on a curated training set (TOPR by default)."""

from __future__ import annotations

from pathlib import Path

from toprcli.cli.builder import Stage
from toprcli.cli.common import console, err_console, print_tracked, summary_table
from toprcli.config import TrainConfig
from toprcli.stages import StageResult

DOC = """Train a policy on a curated training set and save it in HF format.

    Runs as one process or under torchrun (FSDP2 over ranks; gloo on CPU). Losses: topr (the
    paper), sft, reinforce, is, tis, ppo, cispo, kimi15, dpo (on `topr curate --pairs` data);
    --loss-option KEY=VALUE sets a loss's own options.

    Examples:
      [bold]topr train -m runs/r0/policy -d runs/r1/train.parquet -o runs/r1/policy --loss topr[/]
      [bold]topr train -m runs/r0/policy -d pairs.parquet -o runs/r1/dpo --loss dpo --loss-option beta=0.1[/]
      [bold]topr train -m runs/r0/policy -d runs/r1/train.parquet -o runs/r1/policy --report-to mlflow --tag variant=topr[/]
      [bold]topr train -c configs/gsm8k-llama3-8b.yaml -m meta-llama/Meta-Llama-3-8B-Instruct -d train.parquet -o policy[/]
      [bold]topr train -c configs/gsm8k-llama3-8b.yaml -d train.parquet -o policy --nproc-per-node 8[/]   (FSDP2, 8 ranks)
      [bold]torchrun --nproc-per-node 8 -m toprcli train -c configs/gsm8k-llama3-8b.yaml -d train.parquet -o policy[/]
    """


def log_file(cfg: TrainConfig) -> str | None:
    from toprcli.training.distributed import env_world_size

    return f"{Path(cfg.out)}.log" if cfg.out and env_world_size() == 1 else None  # a rank writes to its launcher's log


def run(cfg: TrainConfig, progress) -> StageResult | None:
    from toprcli.launch import run_train
    from toprcli.training.distributed import env_rank

    if env_rank() != 0:  # under torchrun, only rank 0 talks
        err_console.quiet = console.quiet = True
        run_train(cfg)
        return None
    def announce(log: Path) -> None:  # the ranks' output goes to <out>.train.log
        err_console.print(f"training on {cfg.nproc_per_node} ranks: log in {log}", highlight=False, markup=False)  # paths: [v1] is text

    return run_train(cfg, progress=progress, on_launch=announce)


def show(result: StageResult, cfg: TrainConfig) -> None:
    s = result.summary
    rows = [("policy", result.out), *[(k.replace("_", " "), s[k]) for k in ("loss", "steps", "epochs", "rows", "tokens")],
            ("tokens/s", s["tokens_per_s"]), ("steps/s", s["steps_per_s"]), ("first loss", s["first_loss"]),
            ("final loss", s["final_loss"]), ("final grad norm", s["final_grad_norm"])]
    sampling = s.get("sampling") or {}
    rows.append(("sampling (log π under)", ", ".join(f"{k} {v}" for k, v in sampling.items() if k != "source") + f" ({sampling.get('source')})"))
    if s.get("reference_logprobs"):
        rows.append(("reference log-probs (unprocessed, T = 1)", "the stored μ" if s["reference_logprobs"] == "stored" else "a new scoring pass"))
    rows.append(("precision / saved as", f"{s.get('precision')} / {s.get('save_dtype')}"))
    if "behavior_gap_mean" in s:
        rows.append((f"|log π − log μ| mean/max ({s.get('behavior_gap_source')})", f"{s['behavior_gap_mean']:.3g} / {s['behavior_gap_max']:.3g}"))
    if s.get("skipped_steps"):
        rows.append(("skipped steps (gradient not finite)", s["skipped_steps"]))
    if s.get("resumed_from_step"):
        rows.append(("resumed from step", s["resumed_from_step"]))
    if s.get("world_size", 1) > 1:
        rows.append(("ranks", s["world_size"]))
    console.print(summary_table(f"{'already trained (same settings), kept:' if result.skipped else 'trained'} {Path(result.out)}", rows))
    print_tracked(result.out, cfg.tracking.report_to)


STAGE = Stage("train", TrainConfig, run, show, DOC, log=log_file, transient=False,
              resume="rerun the same command with --resume to continue from the checkpoint")
