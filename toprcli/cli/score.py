"""`topr score`: samples shards → scored shards (reward, correct, extracted_answer, verdict)."""

from __future__ import annotations

from rich.markup import escape

from toprcli.cli.builder import Stage, lazy
from toprcli.cli.common import console, grid_table, summary_table
from toprcli.config import ScoreConfig
from toprcli.stages import StageResult

DOC = """Verify every completion and write its reward: the [bold]score[/] stage.

    Each check runs in a worker process under a hard time limit (model text is untrusted and is
    never evaluated as code). Verdicts: correct, incorrect, no_answer, timeout, error. Rewards
    follow the paper: +1 correct, −1 otherwise. Output shards keep every input column and add
    `reward`, `correct`, `extracted_answer`, `verdict`. A re-run skips shards already scored.

    Examples:
      [bold]topr score --samples runs/x/round-001/samples --out runs/x/round-001/scored[/]
      [bold]topr score -s samples -o scored --verifier math --workers 8 --timeout 10[/]
      [bold]topr score -s samples -o scored --verifier 'regex:ANSWER: (\\S+)'[/]
      [bold]topr score -s samples -o scored --verifier python:my_checks:reward --reward-no-answer 0[/]
    """


def show(result: StageResult, cfg: ScoreConfig) -> None:
    from toprcli.shards.schema import VERDICTS

    s = result.summary
    v, passes = s["verdicts"], s["pass_rate"]
    rows = [
        ("rows", s["rows"]), ("prompts", s["prompts"]),
        ("shards scored / skipped", f"{s['shards_scored']} / {s['shards_skipped']}"),
        ("accuracy", s["accuracy"]), ("mean reward", s["mean_reward"]),
        *[(f"verdict: {k}", v.get(k, 0)) for k in VERDICTS],
        ("prompts with 0 correct", passes["none_correct"]),
        ("prompts with some correct", passes["some_correct"]),
        ("prompts with all correct", passes["all_correct"]),
    ]
    if s["rows_per_s"]:
        rows.append(("rows/s", f"{s['rows_per_s']:,.0f}"))
    rows.append(("wall time (s)", round(result.wall_time_s, 2)))
    console.print(summary_table(f"scored → {result.out} ({cfg.verifier})", rows))
    for n_text, hist_text in passes["histogram"].items():  # how many prompts have k of n samples correct
        n, hist = int(n_text), {int(k): c for k, c in hist_text.items()}
        total = max(1, sum(hist.values()))
        console.print(grid_table(f"pass counts (n={n})", ["correct", "prompts", "share"],
                                 [(f"{k}/{n}", hist.get(k, 0), f"{hist.get(k, 0) / total:.1%}") for k in range(n + 1)]))
    for line in s["error_examples"]:
        console.print(f"[dim]{escape(line)}[/]", highlight=False)


STAGE = Stage("score", ScoreConfig, lazy("toprcli.stages.score:run"), show, DOC)
