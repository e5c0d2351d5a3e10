"""`topr iterate`: the whole loop, round after round, resumable."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from toprcli.cli.builder import Stage
from toprcli.cli.common import console, err_console, record_table
from toprcli.config import IterateConfig
from toprcli.stages import StageResult

DOC = """Run generate → score → curate → train → eval per round; killed at any point, rerun to resume.

    Without --config it goes on with an existing --run-dir's recorded config (a branch: with the
    settings its --branch-from round ran with), else runs the built-in demo settings (configs/demo.yaml): the CPU demo, built-in task and tiny model, into
    runs/demo (the defaults below are those of a config that leaves a key out). Every key of
    every stage is reachable with --set.

    Examples:
      [bold]topr iterate[/]
      [bold]topr iterate --config configs/demo.yaml[/]
      [bold]topr iterate -c configs/gsm8k-llama3-8b.yaml --run-dir runs/gsm8k[/]
      [bold]topr iterate -c configs/demo.yaml --set train.loss=sft --run-dir runs/sft[/]
      [bold]topr iterate -c configs/demo.yaml --report-to tensorboard --report-to wandb --project topr-demo[/]
      [bold]topr iterate --run-dir runs/demo --rounds 5[/]   (a finished 3-round demo, extended with its own config)
      [bold]topr iterate -c configs/demo.yaml --rounds 4 --set train.lr=1e-4 --apply-from-next-round[/]
      [bold]topr iterate -c configs/demo.yaml --set train.loss=sft --run-dir runs/sft-from-1 --branch-from runs/demo/round-001[/]
    """
DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
# A round's summary as table columns: header → key.
ROUND_COLUMNS = {"round": "round", "pass@1": "pass@1", "maj@k": "maj@k", "greedy": "greedy_accuracy", "invalid": "invalid_rate",
                 "p": "p", "p̃": "p_effective", "train rows": "rows_out", "wall s": "wall_time_s"}
# With a generative verifier (eval.verifier_model or eval.candidates): its judgement of the candidates.
VERIFIER_COLUMNS = {"round": "round", "maj@k (cands)": "candidates_maj@k", "best-of-k": "best_of_k_verifier", "weighted maj@k": "weighted_maj@k",
                    "accuracy": "verifier_accuracy", "invalid": "verifier_invalid_rate", "AUC": "verifier_auc"}


def print_rounds(title: str, rows: list[dict], *, wall: bool = True, to: Any = console) -> None:
    """The per-round table (accuracy and training mix) and, when a round has them, the verifier's measures."""
    columns = ROUND_COLUMNS if wall else {header: key for header, key in ROUND_COLUMNS.items() if key != "wall_time_s"}
    to.print(record_table(title, columns, rows))
    judged = [r for r in rows if "best_of_k_verifier" in r]
    if judged:
        to.print(record_table("the verifier judging the candidates", VERIFIER_COLUMNS, judged))


def default_config(given: dict) -> Path:
    """Without --config: an existing --run-dir's recorded config (extend or resume it as it ran), a --branch-from round's
    (what it ran with: the branch changes only what --set says), else the demo's."""
    from toprcli.runs import recorded_config_file

    found = recorded_config_file(given.get("run_dir"), given.get("branch_from"))
    if found is None:
        err_console.print(f"[bold]No --config given: running the built-in demo settings ({DEMO}).[/]", highlight=False)
        return DEMO
    path, kind = found
    told = (f"run {given['run_dir']} goes on with its recorded config ({path})" if kind == "run" else
            f"the branch starts from {path}, the settings {given['branch_from']} ran with")
    err_console.print(f"No --config given: {told}.", highlight=False, markup=False)
    return path


def check_config(path: str, given: dict, cfg: IterateConfig) -> None:
    """``-c RUN/config.yaml``, a run's own record, acts on the run_dir written in it: a copied or moved run's names the
    original (it resumed the original, or began anew at its old path, with the copy's work untouched). A key each round
    sets itself, given, is said not to be used (the config drops it)."""
    import warnings

    from toprcli.config import read_yaml
    from toprcli.config.schema import ROUND_SETS, STAGES
    from toprcli.errors import UserError
    from toprcli.runs import CONFIG_FILE, round_dirs
    from toprcli.shards import value_at

    raw = read_yaml(path)
    unused = [f"{s}.{k}" for s, keys in ROUND_SETS.items() for k in keys if value_at(raw, f"{s}.{k}") not in (None, getattr(STAGES[s](), k))]
    if unused:
        warnings.warn(f"{', '.join(unused)} in {path}: each round sets it (its input or output in the run directory), so it is not used")

    home = Path(path).resolve().parent
    made = round_dirs(home) or (home / "base").is_dir() or (home / "warmstart").is_dir()  # a run's dir, whatever it has made
    if given.get("run_dir") is None and Path(path).name == CONFIG_FILE and made and Path(cfg.run_dir).resolve() != home:
        raise UserError(f"{path} is the record of the run in {home}, but names run_dir {cfg.run_dir} (the run was copied or moved?) — "
                        f"to go on with {home}: topr iterate --run-dir {home}; to act on {cfg.run_dir}, pass --run-dir {cfg.run_dir}")


def run(cfg: IterateConfig, progress, report: bool = True, apply_from_next_round: bool = False, branch_from: str | None = None) -> StageResult:
    from toprcli.pipeline import Pipeline
    from toprcli.report import write_report

    seen: list[dict] = []
    t0 = time.perf_counter()

    def on_start(lineage: dict | None) -> None:
        if lineage:
            err_console.print(f"branch of {lineage['parent']} at round {lineage['round']} ({lineage['links']}s; changed: {', '.join(lineage['changed']) or 'nothing'})", highlight=False, markup=False)  # paths: [v1] is text
        err_console.print(f"run dir: {cfg.run_dir} · rounds: {cfg.rounds} · loss: {cfg.train.loss} · backend: {cfg.generate.engine.backend}", highlight=False, markup=False)
        if pipeline.changes:  # a changed setting says where it went: the round in progress takes it for its steps to come
            err_console.print("changed: " + ", ".join(f"{k} {where}" for k, where in pipeline.changes.items()), highlight=False, markup=False)

    def on_round(r: int, summary: dict) -> None:
        summary["wall_time_s"] = round(time.perf_counter() - t0, 1)
        seen.append(summary)
        if progress is not None:  # off a terminal (a log) the new round alone, not the whole table again
            print_rounds(f"after round {r}", seen if console.is_terminal else seen[-1:])
        else:  # --no-progress (a batch job's log) or --json (stdout is the JSON): each round as it ends, on stderr
            print_rounds(f"after round {r}", seen[-1:], to=err_console)

    pipeline = Pipeline(cfg, progress=progress, on_start=on_start, on_round=on_round, apply_from_next_round=apply_from_next_round,
                        branch_from=branch_from, report=(lambda run_dir: write_report(run_dir)[1]) if report else None)
    rows = pipeline.run()
    out = str(pipeline.report_dir) if report else None
    return StageResult("iterate", cfg.run_dir, {"rounds": rows, "report": out, "tracking": pipeline.tracked, "changed": pipeline.changes},
                       wall_time_s=time.perf_counter() - t0)


def show(result: StageResult, cfg: IterateConfig) -> None:
    print_rounds(f"run {cfg.run_dir} ({result.wall_time_s:.0f} s this invocation)", result.summary["rounds"], wall=False)
    if result.summary["report"]:
        console.print(f"report: {result.summary['report']}/summary.md, {result.summary['report']}/accuracy.png", highlight=False, markup=False)
    for name, where in result.summary["tracking"].items():
        console.print(f"{name}: {where}", highlight=False, markup=False)


def log_file(cfg: IterateConfig) -> Path:
    from toprcli.shards import check_writable

    check_writable(cfg.run_dir)  # before anything is printed: a bad run dir is one error line
    return Path(cfg.run_dir) / "topr.log"


EXTRA = {
    "report": (Annotated[bool, typer.Option(metavar="", show_default=False, help="Write plots and summary.md into RUN_DIR/report at the end (default: --report).")], True),
    "apply_from_next_round": (Annotated[bool, typer.Option(metavar="", show_default=False, help="Use a changed config from the next round on, and in the round in progress for the steps it has not begun (default: --no-apply-from-next-round).")], False),
    "branch_from": (Annotated[str | None, typer.Option(help="Start --run-dir from RUN/round-00K of another run (hard links, no copies); the config applies from round K+1.")], None),
}
STAGE = Stage("iterate", IterateConfig, run, show, DOC, log=log_file, default_config=default_config, check_config=check_config,
              extra=EXTRA)
