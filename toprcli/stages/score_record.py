"""What a score run records of its verdicts: the counts of its summary and manifest (:class:`ScoreCounts`), and what
each scored shard keeps beside its rows (:class:`ShardNotes`), so a rerun that skips a shard still reports it."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from toprcli import shards
from toprcli.verifiers import ERROR, TIMEOUT, VERDICTS, own_reward

MAX_ERROR_EXAMPLES = 5


@dataclass
class ScoreCounts:
    """What a score run counted: the result's summary and the manifest's."""

    out: str
    rows: int = 0
    prompts: int = 0
    shards_scored: int = 0
    shards_skipped: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    accuracy: float = 0.0
    mean_reward: float = 0.0
    # per-prompt pass rates: {samples per prompt n: {k correct: number of prompts}}
    pass_counts: dict[int, dict[int, int]] = field(default_factory=dict)
    prompts_none_correct: int = 0
    prompts_some_correct: int = 0
    prompts_all_correct: int = 0
    worker_stats: dict[str, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)
    own_rewards: int = 0  # rows rewarded with a plugin's own number
    wall_time_s: float = 0.0
    rows_per_s: float | None = None  # rows scored in this run / time spent scoring them

    def summary(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in ("out", "rows", "prompts", "shards_scored", "shards_skipped", "accuracy", "mean_reward", "verdicts")},
            "pass_rate": {
                "none_correct": self.prompts_none_correct,
                "some_correct": self.prompts_some_correct,
                "all_correct": self.prompts_all_correct,
                "histogram": {str(n): {str(k): c for k, c in h.items()} for n, h in self.pass_counts.items()},
            },
            **{k: getattr(self, k) for k in ("own_rewards", "worker_stats", "error_examples", "wall_time_s", "rows_per_s")},
        }


@dataclass
class ShardNotes:
    """What a scored shard records of its verdicts beside its rows (a rerun that skips it still reports them)."""

    error_examples: list[str] = field(default_factory=list)
    own_rewards: int = 0  # rows whose reward is the plugin's own number, not --reward-*

    def add(self, v: Any) -> None:
        if v.verdict in (ERROR, TIMEOUT) and len(self.error_examples) < MAX_ERROR_EXAMPLES:
            self.error_examples.append(f"{v.verdict}: {v.detail}")
        self.own_rewards += own_reward(v)



def summarize(table: pa.Table, result: ScoreCounts) -> None:
    """Accuracy, verdict counts, mean reward and per-prompt pass counts of scored rows."""
    result.rows = table.num_rows
    if table.num_rows == 0:
        return
    counts = pc.value_counts(table.column("verdict")).to_pylist()
    by = {c["values"]: c["counts"] for c in counts}
    result.verdicts = {v: int(by.get(v, 0)) for v in VERDICTS}
    correct = table.column("correct").to_numpy(zero_copy_only=False).astype(bool)
    result.accuracy = float(correct.mean())
    result.mean_reward = float(np.asarray(table.column("reward").to_numpy(zero_copy_only=False), dtype=np.float64).mean())
    # A prompt group is (iteration, policy, prompt_id), as in curation.
    keys = pa.table({**{c: table.column(c) for c in ("iteration", "policy", "prompt_id")}, "correct": pa.array(correct.astype(np.int64))})
    grouped = keys.group_by(["iteration", "policy", "prompt_id"]).aggregate([("correct", "sum"), ("correct", "count")])
    ks = grouped.column("correct_sum").to_numpy()
    ns = grouped.column("correct_count").to_numpy()
    result.prompts = int(len(ks))
    hist: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for k, n in zip(ks.tolist(), ns.tolist()):
        hist[n][k] += 1
    result.pass_counts = {n: dict(sorted(h.items())) for n, h in sorted(hist.items())}
    result.prompts_none_correct = int((ks == 0).sum())
    result.prompts_all_correct = int((ks == ns).sum())
    result.prompts_some_correct = result.prompts - result.prompts_none_correct - result.prompts_all_correct


SUMMARY_COLUMNS = ("prompt_id", "policy", "iteration", "reward", "correct", "verdict")


def gather_notes(out: Path, files: dict[int, Path], result: ScoreCounts) -> None:
    """Every shard's notes, those an earlier invocation scored too (a rerun reported no errors of them)."""
    result.error_examples, result.own_rewards = [], 0
    for i in sorted(files):
        had = shards.read_file_metadata(out / shards.shard_name(i)).get("score") or {}
        result.error_examples += had.get("error_examples", [])[: MAX_ERROR_EXAMPLES - len(result.error_examples)]
        result.own_rewards += int(had.get("own_rewards", 0))
