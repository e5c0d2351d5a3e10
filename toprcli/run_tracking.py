"""What `topr iterate` reports to its trackers, read from the files each stage wrote.

Per round (the round is the step): accuracy with its 95% intervals, the training mix (p, p̃, c,
rows), training's summary, the verifier's measures, stage wall times, and a table of sample
completions. Per optimizer step (counted over the whole run, ``train/step``): each line of the
rounds' ``metrics.jsonl``. Everything is read from files, so a run that resumes (or turns
tracking on late) reports what it finished before; the tracker skips what it already logged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from toprcli.config import IterateConfig, config_to_dict
from toprcli.runs import LINEAGE_FILE, round_dir
from toprcli.shards import read_json
from toprcli.tracking import Tracker, open_tracker, replay, sample_rows

def open_run_tracker(cfg: IterateConfig, run_dir: Path) -> Tracker | None:
    """The run's tracker; a branch's group is its parent run's name unless ``tracking.group`` says otherwise (the parent
    itself has no group unless its config names one)."""
    lineage = run_dir / LINEAGE_FILE
    parent = Path(read_json(lineage, needs="parent")["parent"]).name if lineage.exists() else None
    return open_tracker(cfg.tracking, run_dir, config=config_to_dict(cfg), group=parent)


def train_offset(run_dir: Path, r: int) -> int:
    """Optimizer steps of the rounds before ``r``: round r's step s is the run's step offset + s."""
    total = 0
    for q in range(1, r):
        summary = round_dir(run_dir, q) / "policy" / "train_summary.json"
        if summary.exists():
            total += int(read_json(summary, needs="steps")["steps"])
    return total


def step_sink(tracker: Tracker, axis: str, offset: int = 0, **extra: Any) -> Callable[[dict[str, Any]], None]:
    """A trainer's ``on_record``: each step's metrics on ``axis`` at the run's step."""
    return lambda record: tracker.log(axis, {**record, **extra}, offset + int(record["step"]))


def log_training(tracker: Tracker, policy: Path, sink: Callable[[dict[str, Any]], None]) -> None:
    """Replay ``policy/metrics.jsonl`` into ``sink`` (what training in a child process, or before tracking, logged)."""
    replay(policy / "metrics.jsonl", sink)


def log_round(tracker: Tracker, run_dir: Path, r: int, summary: dict[str, Any], wall_times: dict[str, float], eval_keys: tuple[str, ...]) -> None:
    """Round ``r``'s numbers (``summary``: runs.round_summary) at step r, and a table of its eval's sample completions.
    The eval's part (``eval_keys``) has a mark of its own: an eval that comes after its round was logged (a run ended
    early, eval_every lowered) is logged then."""
    if summary.get("train_final_loss", 0.0) is None and summary.get("train_steps"):  # NaN, written to JSON as null: a diverged round
        summary = {**summary, "train_final_loss": float("nan")}
    tracker.log("round", {**{k: v for k, v in summary.items() if k not in eval_keys}, **wall_times}, r)
    evaluated = {k: v for k, v in summary.items() if k in eval_keys}
    if evaluated:
        tracker.log("round", evaluated, r, mark="round:eval")
    tracker.log_table("round/completions", sample_rows(round_dir(run_dir, r) / "eval" / "scored"), r)


def wall_times(steps: dict[str, dict], r: int) -> dict[str, float]:
    """``time_<stage>_s`` of round ``r`` from ``state.json``'s steps."""
    prefix = f"{round_dir(Path('.'), r).name}/"
    return {f"time_{key[len(prefix):]}_s": v["wall_time_s"] for key, v in steps.items() if key.startswith(prefix)}
