"""`topr iterate`: the whole loop, round after round, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toprcli.cli.common import Verbose, console, err_console, grid_table, progress_bars, send_noise_to, user_errors

ROUND_COLUMNS = ("round", "pass@1", "maj@k", "greedy", "invalid", "p", "p̃", "train rows", "wall s")
# With a generative verifier (eval.verifier_model or eval.candidates): its judgement of the candidates.
VERIFIER_COLUMNS = ("round", "maj@k (cands)", "best-of-k", "weighted maj@k", "accuracy", "invalid", "AUC")


def print_rounds(title: str, rows: list[dict], *, wall: bool = True) -> None:
    """The per-round table (accuracy and training mix) and, when a round has them, the verifier's measures."""
    columns = ROUND_COLUMNS if wall else ROUND_COLUMNS[:-1]
    console.print(grid_table(title, columns, [
        [r["round"], r.get("pass@1"), r.get("maj@k"), r.get("greedy_accuracy"), r.get("invalid_rate"),
         r.get("p"), r.get("p_effective"), r.get("rows_out")] + ([r.get("wall_time_s")] if wall else [])
        for r in rows
    ]))
    judged = [r for r in rows if "best_of_k_verifier" in r]
    if judged:
        console.print(grid_table("the verifier judging the candidates", VERIFIER_COLUMNS, [
            [r["round"], r.get("candidates_maj@k"), r.get("best_of_k_verifier"), r.get("weighted_maj@k"),
             r.get("verifier_accuracy"), r.get("verifier_invalid_rate"), r.get("verifier_auc")]
            for r in judged
        ]))


@user_errors
def iterate(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Pipeline config YAML. Without it, the built-in demo settings (configs/demo.yaml) are used.")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Run directory (overrides run_dir in the config). Rerun the same command to resume.")] = None,
    rounds: Annotated[int | None, typer.Option(help="Number of TOPR rounds (overrides rounds).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override any key, e.g. --set train.lr=1e-6 --set generate.n=8.")] = None,
    report: Annotated[bool, typer.Option(help="Write plots and summary.md into RUN_DIR/report at the end.")] = True,
    verbose: Verbose = False,
) -> None:
    """Run generate → score → curate → train → eval per round; killed at any point, rerun to resume.

    Examples:
      [bold]topr iterate[/]                                    (the CPU demo, built-in task and tiny model)
      [bold]topr iterate --config configs/demo.yaml[/]
      [bold]topr iterate -c configs/gsm8k-llama3-8b.yaml --run-dir runs/gsm8k[/]
      [bold]topr iterate -c configs/demo.yaml --set train.loss=sft --run-dir runs/sft[/]
    """
    import time

    from toprcli.config import IterateConfig, load_config, parse_override
    from toprcli.pipeline import Pipeline
    from toprcli.shards import check_writable

    if config is None:
        config = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
        err_console.print(f"[bold]No --config given: running the built-in demo settings ({config}).[/]", highlight=False)
    sets = dict(parse_override(s) for s in (set_ or []))
    overrides = {"run_dir": str(run_dir) if run_dir else None, "rounds": rounds}
    cfg = load_config(IterateConfig, config, overrides, sets=sets)
    check_writable(cfg.run_dir)  # before anything is printed: a bad run dir is one error line
    send_noise_to(Path(cfg.run_dir) / "topr.log", verbose)
    err_console.print(f"run dir: {cfg.run_dir} · rounds: {cfg.rounds} · loss: {cfg.train.loss} · backend: {cfg.generate.engine.backend}", highlight=False)

    seen: list[dict] = []
    t0 = time.perf_counter()

    def on_round(r: int, summary: dict) -> None:
        summary["wall_time_s"] = round(time.perf_counter() - t0, 1)
        seen.append(summary)
        print_rounds(f"after round {r}", seen)

    with progress_bars(transient=True) as progress:
        rows = Pipeline(cfg, progress=progress, on_round=on_round).run()
    print_rounds(f"run {cfg.run_dir} ({time.perf_counter() - t0:.0f} s this invocation)", rows, wall=False)
    if report:
        from toprcli.report import write_report

        _, out = write_report(cfg.run_dir)
        console.print(f"report: {out}/summary.md, {out}/accuracy.png", highlight=False)
