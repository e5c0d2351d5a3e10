"""`topr verifier-data`: scored completions → a verification dataset for training a generative verifier."""

from __future__ import annotations

from toprcli.cli.builder import Stage, lazy
from toprcli.cli.common import console, summary_table
from toprcli.config import VerifierDataConfig
from toprcli.stages import StageResult

DOC = """Turn scored completions into verification prompts labelled Yes (correct) or No, to train a [bold]generative verifier[/].

    Each row shows a question and one candidate solution and asks for a Yes/No verdict on the
    last line; its `answer` is the label. `topr generate` reads the file like any dataset (the
    `verification` preset), the `judge` verifier scores the verdicts, so `topr iterate` trains a
    verifier with TOPR like any policy; `topr eval --verifier-model` then uses it. See docs/verifier.md.

    Examples:
      [bold]topr verifier-data -s runs/demo/round-001/scored runs/demo/round-002/scored -o verify/train.parquet --balance[/]
      [bold]topr verifier-data -s runs/demo/round-003/eval/scored -o verify/test.parquet --max-per-question 4[/]
    """


def show(result: StageResult, cfg: VerifierDataConfig) -> None:
    s = result.summary
    rows = [
        ("candidates in", s["rows_in"]), *[(f"dropped: {k}", v) for k, v in s["dropped"].items()],
        ("rows out", s["rows_out"]), ("labelled Yes / No", f"{s['yes']:,} / {s['no']:,}"),
        ("questions", s["questions"]), ("question text from", s["question_source"]),
        ("wall time (s)", round(result.wall_time_s, 2)),
    ]
    console.print(summary_table(f"{'already written' if result.skipped else 'verification data'} → {result.out}", rows))


STAGE = Stage("verifier-data", VerifierDataConfig, lazy("toprcli.stages.verifier_data:run"), show, DOC, more="scored")
