"""`topr score`: samples shards → scored shards (reward, correct, extracted_answer, verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import ConfigFile, Verbose, console, echo, grid_table, progress_bars, send_noise_to, summary_table, user_errors


@user_errors
def score(
    samples: Annotated[
        Path | None, typer.Option("--samples", "-s", help="The samples directory `topr generate` wrote (or one Parquet file).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory for the scored shards and _manifest.json.")] = None,
    verifier: Annotated[
        str | None,
        typer.Option(
            "--verifier",
            "-v",
            help="gsm8k | math | exact | regex:PATTERN | python:MODULE:FUNCTION (default gsm8k). "
            "A plugin is called as fn(completion: str, answer: str | None, row: dict) -> bool | float; "
            "a float is the reward itself, correct iff > 0; None = no answer.",
        ),
    ] = None,
    strict: Annotated[
        bool | None,
        typer.Option(
            "--strict/--flexible",
            help="gsm8k: require '#### n' (strict) or also accept 'The answer is n' and the last number (flexible, default).",
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-w", help="Verifier worker processes (default: one per core).")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Hard wall-clock limit per check, in seconds (default 5); a check past it is killed and gets verdict 'timeout'."
        ),
    ] = None,
    reward_correct: Annotated[float | None, typer.Option(help="Reward of a correct completion (default 1).")] = None,
    reward_incorrect: Annotated[
        float | None, typer.Option(help="Reward of an incorrect one; also used for 'timeout' and 'error' (default -1).")
    ] = None,
    reward_no_answer: Annotated[float | None, typer.Option(help="Reward when no answer could be read (default -1).")] = None,
    worker_memory_mb: Annotated[
        int | None,
        typer.Option(help="Address-space cap per worker in MiB (default 4096; 0 = none, e.g. for plugins that load CUDA)."),
    ] = None,
    overwrite: Annotated[
        bool | None, typer.Option("--overwrite", help="Rescore an --out that was scored from other samples or settings.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    config: ConfigFile = None,
    verbose: Verbose = False,
) -> None:
    """Verify every completion and write its reward: the [bold]score[/] stage.

    Each check runs in a worker process under a hard time limit (model text is untrusted and is
    never evaluated as code). Verdicts: correct, incorrect, no_answer, timeout, error. Rewards
    follow the paper: +1 correct, −1 otherwise. Output shards keep every input column and add
    `reward`, `correct`, `extracted_answer`, `verdict`. A re-run skips shards already scored.

    Examples:
      [bold]topr score --samples runs/x/round-1/samples --out runs/x/round-1/scored[/]
      [bold]topr score -s samples -o scored --verifier math --workers 8 --timeout 10[/]
      [bold]topr score -s samples -o scored --verifier 'regex:ANSWER: (\\S+)'[/]
      [bold]topr score -s samples -o scored --verifier python:my_checks:reward --reward-no-answer 0[/]
    """
    import json

    from toprcli.config import ScoreConfig, load_config
    from toprcli.shards.schema import VERDICTS
    from toprcli.stages import score as score_stage

    overrides = {
        "samples": str(samples) if samples is not None else None,
        "out": str(out) if out is not None else None,
        "verifier": verifier,
        "strict": strict,
        "workers": workers,
        "timeout": timeout,
        "reward_correct": reward_correct,
        "reward_incorrect": reward_incorrect,
        "reward_no_answer": reward_no_answer,
        "worker_memory_mb": worker_memory_mb,
        "overwrite": overwrite,
    }
    cfg = load_config(ScoreConfig, config, overrides)
    send_noise_to(f"{cfg.out}.log", verbose)
    with progress_bars(not json_out, transient=True) as progress:
        result = score_stage.run(cfg, progress=progress)

    if json_out:
        echo(json.dumps(result.as_dict()))
        return
    s = result.summary
    v, passes = s["verdicts"], s["pass_rate"]
    rows = [
        ("rows", f"{s['rows']:,}"),
        ("prompts", f"{s['prompts']:,}"),
        ("shards scored / skipped", f"{s['shards_scored']} / {s['shards_skipped']}"),
        ("accuracy", s["accuracy"]),
        ("mean reward", s["mean_reward"]),
        *[(f"verdict: {k}", f"{v.get(k, 0):,}") for k in VERDICTS],
        ("prompts with 0 correct", f"{passes['none_correct']:,}"),
        ("prompts with some correct", f"{passes['some_correct']:,}"),
        ("prompts with all correct", f"{passes['all_correct']:,}"),
    ]
    if s["rows_per_s"]:
        rows.append(("rows/s", f"{s['rows_per_s']:,.0f}"))
    rows.append(("wall time (s)", round(result.wall_time_s, 2)))
    console.print(summary_table(f"scored → {result.out} ({cfg.verifier})", rows))
    # Pass-rate distribution: how many prompts have k of n samples correct.
    for n_text, hist_text in passes["histogram"].items():
        n, hist = int(n_text), {int(k): c for k, c in hist_text.items()}
        console.print(
            grid_table(
                f"pass counts (n={n})",
                ["correct", "prompts", "share"],
                [(f"{k}/{n}", f"{hist.get(k, 0):,}", f"{hist.get(k, 0) / max(1, sum(hist.values())):.1%}") for k in range(n + 1)],
            )
        )
    for line in s["error_examples"]:
        console.print(f"[dim]{line}[/]", highlight=False)
