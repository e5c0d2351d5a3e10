"""`topr generate`: sample n completions per prompt with behaviour log-probs into Parquet shards."""

from __future__ import annotations

from toprcli.cli.builder import Stage, lazy
from toprcli.cli.common import console, summary_table
from toprcli.config import GenerateConfig
from toprcli.stages import StageResult

DOC = """Sample [bold]n[/] completions per prompt, with the behaviour log-probs the off-policy losses need.

    Writes one row per completion (prompt_token_ids, completion_token_ids, behavior_logprobs,
    finish_reason, ...) to --out/shard-*.parquet; a rerun skips complete shards.

    Examples:
      [bold]topr generate --model models/tiny --dataset builtin:arith --out runs/s0 --n 8 --max-new-tokens 64[/]
      [bold]topr generate -c configs/demo.yaml -m models/tiny --out runs/s0[/]
      [bold]topr generate -c configs/demo.yaml -m models/tiny -o runs/s0 --shard-index 1 --num-shards 4[/]   (process 1 of 4, same --out)
      [bold]topr generate -m models/smollm2 -d builtin:gsm8k --split test -o runs/s1 --chat-template --n 4 --top-k 50[/]
    """


def show(result: StageResult, cfg: GenerateConfig) -> None:
    s = result.summary
    finish = ", ".join(f"{k} {v}" for k, v in s.get("finish_reasons", {}).items()) or "-"
    rows = [
        ("backend", s["backend"]), ("dataset read as", s.get("dataset_preset")), ("prompts", s["prompts"]), ("completions", s["completions"]),
        ("mean completion length", float(s["mean_completion_len"])), ("max completion length", s["max_completion_len"]),
        ("finish reasons", finish), ("tokens/s", float(s["tokens_per_s"])),
        ("shards written / skipped (complete)", f"{s['shards_written']} / {s['shards_skipped']}"),
    ]
    if s.get("skipped_long"):
        rows.append(("prompts skipped (too long)", s["skipped_long"]))
    if s.get("clipped_to_context"):
        c = s["clipped_to_context"]
        rows.append(("clipped to the context", f"{c['prompts_clipped']} prompts (max_new_tokens {c['max_new_tokens_requested']} → ≥ {c['max_new_tokens_min_effective']})"))
    rows.append(("wall time (s)", float(result.wall_time_s)))
    console.print(summary_table(f"generate → {result.out}{' (already generated)' if result.skipped else ''}", rows))


STAGE = Stage("generate", GenerateConfig, lazy("toprcli.launch:run_generate"), show, DOC, transient=False)
