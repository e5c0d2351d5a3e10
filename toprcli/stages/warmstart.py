"""The warm-start stage: a dataset's gold solutions → a training set for supervised training.

Reads the prompt dataset of a pipeline's ``generate`` section (its examples'
``solution``) and the starting model's tokenizer. Writes one curated Parquet
file (``warmstart/gold.parquet`` under ``topr iterate``): a row per gold
solution, rendered exactly as generation renders the prompt, the completion
ending in the tokenizer's EOS, ``advantage`` and ``weight`` 1 — SFT data. The
pipeline then trains on it with the train stage (``IterateConfig.warm_start_train``).

The gold solutions were not sampled, so the file records no sampling
distribution (temperature 0): only losses that ignore μ (``sft``, ``reinforce``)
may train on it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from toprcli import shards
from toprcli.config import IterateConfig
from toprcli.data.datasets import encode_prompt, load_examples, render_prompt
from toprcli.errors import UserError
from toprcli.generation.model_info import load_tokenizer
from toprcli.stages import StageResult
from toprcli.verifiers import CORRECT

STAGE = "warmstart"
GREEDY = {"temperature": 0.0}  # "no sampling distribution": what the trainer reads as μ-less data


def run(cfg: IterateConfig, *, tokenizer: str, out: str | Path) -> StageResult:
    """Write the gold solutions of ``cfg.generate.dataset`` (at most ``cfg.warm_start.examples``)
    as a curated training set to ``out``, tokenised with ``tokenizer``'s tokenizer."""
    t0 = time.perf_counter()
    spec = replace(cfg.generate.dataset, limit=None, size=max(cfg.warm_start.examples, 1))
    examples = [e for e in load_examples(spec) if e.solution][: cfg.warm_start.examples]
    if not examples:
        raise UserError(f"dataset {spec.source!r} has no gold solutions for the warm start — disable warm_start or pick a dataset with answers")
    tok = load_tokenizer(tokenizer)
    prompts = [render_prompt(e, spec, tok) for e in examples]
    completions = [" " + e.solution.strip() for e in examples]
    completion_ids = [list(tok(c, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id] for c in completions]
    n = len(examples)
    table = pa.Table.from_pydict({
        "prompt_id": [e.prompt_id for e in examples],
        "prompt": prompts,
        "answer": [e.answer for e in examples],
        "prompt_token_ids": [encode_prompt(p, tok, spec) for p in prompts],
        "sample_index": [0] * n,
        "completion": completions,
        "completion_token_ids": completion_ids,
        "behavior_logprobs": [[0.0] * len(ids) for ids in completion_ids],  # no μ: unused by the losses that may train on it
        "finish_reason": ["stop"] * n,
        "policy": ["gold"] * n,
        "iteration": [0] * n,
        "reward": [1.0] * n,
        "correct": [True] * n,
        "extracted_answer": [e.answer for e in examples],
        "verdict": [CORRECT] * n,
        "advantage": [1.0] * n,
        "weight": [1.0] * n,
    }, schema=shards.CURATED_SCHEMA)  # the contract's types; a missing column fails here
    shards.write_table_atomic(out, table, {"stage": STAGE, "source": "gold solutions", "sampling": GREEDY})
    return StageResult(STAGE, str(out), {"rows": n, "dataset": spec.source}, wall_time_s=time.perf_counter() - t0)
