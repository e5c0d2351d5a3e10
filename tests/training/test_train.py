"""The trainer (toprcli/training/, cli/train.py) on the built-in tiny model and synthetic curated data.

Tiers: pieces against hand-written references (optimizer, schedule, batching,
log-probs, micro-batch aggregation); tiny end-to-end runs (weights change, the
saved policy loads, resume reproduces an uninterrupted run, bad input fails
with one line and no output).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file
from conftest import Killed
from builders import curated_rows, write_curated
from typer.testing import CliRunner

from toprcli.cli.main import app
from toprcli.config import TrackingConfig, TrainConfig
from toprcli.errors import UserError
from toprcli.losses import AGGREGATIONS, policy_loss
from toprcli.stages.train import run as train_policy
from toprcli.training.batching import (
    TokenData,
    Units,
    collate,
    loss_denominator,
    pack_units,
    plan_micro_batches,
    split_units,
    step_plan,
    unit_longest,
)
from toprcli.sampling import Processing
from toprcli.shards import CURATED_SCHEMA, write_table_atomic
from toprcli.stages.warmstart import GREEDY
from toprcli.training.optim import Adafactor, lr_factor


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(path) / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _cfg(tiny_model_dir, data, out, **kw) -> TrainConfig:
    base = dict(model=str(tiny_model_dir), data=str(data), out=str(out), optimizer="adamw", lr=1e-3, batch_size=16, max_steps=3)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def data_path(tmp_path_factory, tiny_model_dir) -> Path:
    return write_curated(tmp_path_factory.mktemp("data") / "train.parquet", n=48, policy=str(tiny_model_dir))


@pytest.fixture(scope="module")
def token_data(data_path) -> TokenData:
    from toprcli.shards import read_table

    return TokenData.from_table(read_table(data_path))


# -- optimizer and schedule ---------------------------------------------------------


def test_adafactor_matches_transformers_absolute_lr():
    from transformers.optimization import Adafactor as HFAdafactor

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    mine = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    mine.load_state_dict(ref.state_dict())
    opt_ref = HFAdafactor(ref.parameters(), lr=1e-2, scale_parameter=False, relative_step=False, warmup_init=False, weight_decay=0.01)
    opt_mine = Adafactor(mine.parameters(), lr=1e-2, weight_decay=0.01)
    for step in range(5):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        for model, opt in ((ref, opt_ref), (mine, opt_mine)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for a, b in zip(ref.parameters(), mine.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_lr_schedule_warmup_constant_and_cosine():
    f = lambda s, sched: lr_factor(s, schedule=sched, warmup_steps=4, total_steps=14)  # noqa: E731
    assert [f(s, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f(4, "cosine") == 1.0
    assert f(9, "cosine") == pytest.approx(0.5)
    assert f(14, "cosine") == pytest.approx(0.0)
    assert lr_factor(0, schedule="constant", warmup_steps=0, total_steps=3) == 1.0


# -- batching -------------------------------------------------------------------------


def test_data_order_is_seeded_and_covers_epochs():
    one = Units.singletons(10)
    plan = step_plan(one, 4, 2.0, None, seed=3)
    a = plan.order
    assert len(a) == 20 and sorted(a[:10]) == list(range(10)) and sorted(a[10:]) == list(range(10))
    # One stream over the epochs, cut into full steps: an epoch's last rows share a step with the next
    # epoch's first (the step count depends on the rows only; no small steps at epoch ends).
    assert plan.steps == 5 and plan.step_units(1).tolist() == a[4:8].tolist() and plan.step_units(2).tolist() == a[8:12].tolist()
    assert not np.array_equal(a, step_plan(one, 4, 2.0, None, seed=4).order)
    assert step_plan(one, 4, 1.0, None, 0).steps == 3 and step_plan(one, 4, 0.5, None, 0).steps == 2
    seven = step_plan(one, 4, 1.0, 7, seed=0)  # max_steps overrides epochs
    assert seven.steps == 7 and len(seven.order) == 28 and seven.rows_done[-1] == 28


def test_grouped_steps_take_whole_units():
    labels = np.array([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 3, 4])  # unit 3 (5 rows) is larger than the batch
    units = Units.from_labels(labels)
    plan = step_plan(units, 4, 1.0, None, seed=1)
    seen = []
    for k in range(plan.steps):
        step = plan.step_units(k)
        rows = units.rows_of(step)
        assert len(rows) <= 4 or len(step) == 1  # a larger unit gets a step of its own
        seen += step.tolist()
    assert sorted(seen) == list(range(5))
    assert plan.rows_done[-1] == 12
    again = step_plan(units, 4, 1.0, None, seed=1)
    assert np.array_equal(again.order, plan.order) and np.array_equal(again.starts, plan.starts)


def test_micro_batches_respect_the_token_budget_and_align_ranks():
    lengths = np.array([50, 10, 30, 30, 5, 45, 20, 12])
    one = Units.singletons(8)
    rows = np.arange(8)
    for mb in pack_units(rows, one, lengths, 64):
        assert len(mb) * lengths[mb].max() <= 64 or len(mb) == 1
    assert sorted(np.concatenate(pack_units(rows, one, lengths, 64))) == list(range(8))
    parts = split_units(rows, lengths, 2)
    assert sorted(np.concatenate(parts)) == list(range(8))
    assert abs(lengths[parts[0]].sum() - lengths[parts[1]].sum()) <= lengths.max()
    plan = plan_micro_batches(rows, one, lengths, 3, 64)
    assert len({len(p) for p in plan}) == 1  # every rank runs the same number of forwards
    assert sorted(np.concatenate([mb for p in plan for mb in p])) == list(range(8))


def test_pairs_stay_in_one_micro_batch_in_order():
    lengths = np.array([50, 10, 30, 30, 5, 45, 20, 12])
    pairs = Units(np.array([1, 0, 3, 2, 5, 4, 7, 6]), np.array([0, 2, 4, 6, 8]), piece=2)
    for rank in plan_micro_batches(np.arange(4), pairs, lengths, 2, 64):
        for mb in rank:
            assert len(mb) % 2 == 0
            for k in range(0, len(mb), 2):  # a pair, its first row first
                assert (mb[k], mb[k + 1]) in {(1, 0), (3, 2), (5, 4), (7, 6)}
    # A prompt group over the budget is cut into pieces that fit.
    group = Units(np.arange(8), np.array([0, 8]))
    mbs = pack_units(np.array([0]), group, lengths, 100)
    assert all(len(mb) * lengths[mb].max() <= 100 for mb in mbs) and sorted(np.concatenate(mbs).tolist()) == list(range(8))
    # A prompt's pairs (--group-by-prompt with DPO) are cut between pairs: 4 pairs of 100-token rows in a
    # budget of 400 once made one micro-batch of 800 tokens.
    prompt_pairs = Units(np.array([1, 0, 3, 2, 5, 4, 7, 6]), np.array([0, 8]), piece=2)
    mbs = pack_units(np.array([0]), prompt_pairs, np.full(8, 100), 400)
    assert [mb.tolist() for mb in mbs] == [[1, 0, 3, 2], [5, 4, 7, 6]]


@pytest.mark.parametrize("shared", [False, True])
def test_a_plan_from_longest_rows_read_once_is_the_plan(shared):
    """Each step's plan read every row's length (O(rows) a step, O(rows × steps) a run: 85 min at 8M rows); the
    trainer reads each unit's longest row once (Prepared.unit_longest) and every step's plan is the same."""
    rng = np.random.default_rng(0)
    prompts, completions = rng.integers(1, 40, 300), rng.integers(0, 90, 300)
    units = Units.from_labels(rng.integers(0, 60, 300))
    lengths, prompt_lens = (completions, prompts) if shared else (prompts + completions, None)
    longest = unit_longest(units, lengths, prompt_lens)
    sizes = prompts + completions  # packing's cost of a row, in both layouts
    assert longest.tolist() == [max(sizes[units.rows[units.off[u] : units.off[u + 1]]]) for u in range(units.n_units)]
    for step in np.array_split(rng.permutation(units.n_units), 12):
        computed = plan_micro_batches(step, units, lengths, 3, 400, prompt_lens=prompt_lens)
        given = plan_micro_batches(step, units, lengths, 3, 400, prompt_lens=prompt_lens, longest=longest)
        assert [[mb.tolist() for mb in rank] for rank in computed] == [[mb.tolist() for mb in rank] for rank in given]
        assert sum(len(mb) for rank in given for mb in rank) == len(units.rows_of(step))


@pytest.mark.parametrize("shared", [False, True])
def test_the_trainers_longest_rows_are_those_of_its_layout(tiny_model_dir, data_path, tmp_path, shared):
    from toprcli.training.prepare import prepare

    prep = prepare(_cfg(tiny_model_dir, data_path, tmp_path / "p", group_by_prompt=True, shared_prefix=shared))
    sizes = prep.data.prompt_lens + prep.data.completion_lens
    assert prep.unit_longest.tolist() == [max(sizes[prep.units.rows_of(np.array([u]))]) for u in range(prep.units.n_units)]


def test_collate_layout(token_data):
    rows = np.array([3, 0, 7])
    mb = collate(token_data, rows)
    for i, r in enumerate(rows):
        p = token_data.prompt_ids[token_data.prompt_off[r] : token_data.prompt_off[r + 1]]
        c = token_data.completion_ids[token_data.completion_off[r] : token_data.completion_off[r + 1]]
        assert mb.input_ids[i, : len(p)].tolist() == p.tolist()
        assert mb.input_ids[i, len(p) : len(p) + len(c)].tolist() == c.tolist()
        assert mb.mask[i].sum() == len(c)
        assert mb.behavior[i, : len(c)].tolist() == pytest.approx(token_data.behavior[token_data.completion_off[r] : token_data.completion_off[r + 1]].tolist())
    empty = collate(token_data, np.zeros(0, dtype=np.int64))
    assert empty.mask.sum() == 0 and empty.weights.sum() == 0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batch_shares_add_up_to_the_full_batch_loss(token_data, aggregation):
    """Σ_mb loss_mb · D_mb / D_step == the loss of the whole batch at once (any split)."""
    rows = np.arange(20)
    rng = np.random.default_rng(0)
    lp_flat = torch.tensor(token_data.behavior + rng.normal(0, 0.3, len(token_data.behavior)).astype(np.float32))

    def loss_of(sub):
        mb = collate(token_data, sub)
        lp = collate(token_data, sub, behavior=lp_flat.numpy()).behavior
        return policy_loss("topr", lp, mb.behavior, mb.advantages, mb.mask, weights=mb.weights, aggregation=aggregation, norm_length=30)[0]

    full = loss_of(rows)
    denom = loss_denominator(token_data, rows, aggregation)
    parts = sum(loss_of(mb) * loss_denominator(token_data, mb, aggregation) / denom for mb in pack_units(rows, Units.singletons(token_data.n_rows), token_data.seq_lens, 60))
    assert float(parts) == pytest.approx(float(full), rel=1e-5, abs=1e-6)


# -- log-probs ------------------------------------------------------------------------


@pytest.mark.parametrize("processing", [
    Processing(), Processing(temperature=0.7), Processing(top_k=20), Processing(top_p=0.9), Processing(min_p=0.05),
    Processing(temperature=0.7, top_k=30, top_p=0.9, min_p=0.02),
], ids=["plain", "T0.7", "topk20", "topp0.9", "minp0.05", "combined"])
@pytest.mark.parametrize("chunk_size", [3, 10_000])
def test_completion_logprobs_match_a_per_row_reference(tiny_model_dir, token_data, processing, chunk_size):
    """Chunked log π under the sampling processing == a per-row full-vocabulary reference."""
    from transformers import AutoModelForCausalLM

    from toprcli.generation.hf_backend import processed_logprobs
    from toprcli.generation.base import SamplingParams
    from toprcli.training.model import PolicyLogprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    policy = PolicyLogprobs(model, processing, chunk_size=chunk_size)
    rows = np.array([0, 5, 9, 11])
    mb = collate(token_data, rows)
    params = SamplingParams(temperature=processing.temperature, top_k=processing.top_k, top_p=processing.top_p, min_p=processing.min_p)
    with torch.no_grad():
        lp, ent = policy(mb.input_ids, mb.prompt_lens, mb.completion_lens, with_entropy=True)
        for i, r in enumerate(rows):
            p = token_data.prompt_ids[token_data.prompt_off[r] : token_data.prompt_off[r + 1]]
            c = token_data.completion_ids[token_data.completion_off[r] : token_data.completion_off[r + 1]]
            ref = torch.tensor(processed_logprobs(model, [p.tolist()], [c.tolist()], params)[0])
            torch.testing.assert_close(lp[i, : len(c)], ref, rtol=1e-5, atol=1e-6)
            assert torch.isfinite(lp[i, : len(c)]).all()  # the data's tokens are always kept
            if processing == Processing(temperature=0.7):  # untruncated entropy against a plain formula
                ids = torch.tensor(np.concatenate([p, c]))[None]
                logp = torch.log_softmax(model(ids).logits[0].float() / 0.7, -1)
                ref_ent = -(logp.exp() * logp).sum(-1)[len(p) - 1 : len(p) + len(c) - 1]
                torch.testing.assert_close(ent[i, : len(c)], ref_ent, rtol=1e-4, atol=1e-5)


def test_chunked_logprobs_gradient_matches_the_full_computation(tiny_model_dir, token_data):
    """Checkpointed chunks give the gradient of the plain full-vocabulary loss."""
    from transformers import AutoModelForCausalLM

    from toprcli.training.model import PolicyLogprobs

    rows = np.array([1, 2, 3, 4])
    mb = collate(token_data, rows)
    grads = []
    for chunk in (4, 100_000):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        policy = PolicyLogprobs(model, Processing(temperature=0.8, top_k=25), chunk_size=chunk)
        lp, _ = policy(mb.input_ids, mb.prompt_lens, mb.completion_lens)
        (lp * mb.mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


# -- end to end -----------------------------------------------------------------------


def test_train_writes_a_loadable_policy_and_metrics(tiny_model_dir, data_path, tmp_path):
    out = tmp_path / "policy"
    summary = train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=3))
    assert summary["steps"] == 3 and summary["rows"] == 48 and summary["tokens"] > 0
    assert not (tmp_path / "policy.partial").exists()
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl", "train_summary.json", "_manifest.json"} <= names
    assert "checkpoints" not in names
    assert _max_diff(_weights(out), _weights(tiny_model_dir)) > 1e-4  # the weights moved
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("loss", "n_pos", "n_neg", "neg_alpha_mean", "neg_alpha_lt1_frac", "log_ratio_mean", "log_ratio_max",
                "grad_norm", "lr", "tokens_per_s"):
        assert all(math.isfinite(r[key]) for r in records), key
    assert records[0]["n_pos"] + records[0]["n_neg"] == 16
    # μ gap measured with the starting policy on the first step's batch
    assert records[0]["behavior_gap_mean"] > 0 and summary["behavior_gap_source"] == "first step batch"
    assert json.loads((out / "train_summary.json").read_text())["final_loss"] == pytest.approx(records[-1]["loss"])

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok) and next(model.parameters()).dtype == torch.float32
    ids = tok("Question: 1+1\nAnswer:", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3


def test_gradient_accumulation_matches_one_big_batch(tiny_model_dir, data_path, tmp_path):
    """Token-budget micro-batching changes nothing but float summation order."""
    kw = dict(max_steps=2, optimizer="adafactor", lr=1e-2, aggregation="token-mean", whiten_advantages=True)
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "one", micro_batch_tokens=100_000, **kw))
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "many", micro_batch_tokens=64, **kw))
    assert _max_diff(_weights(tmp_path / "one"), _weights(tmp_path / "many")) < 1e-5


def test_resume_after_a_kill_reproduces_the_uninterrupted_run(tiny_model_dir, data_path, tmp_path, kill_after_checkpoint, monkeypatch):
    kw = dict(max_steps=7, save_every=2, optimizer="adafactor", lr=1e-2, schedule="cosine", warmup_steps=2, micro_batch_tokens=200)
    full = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a", **kw))
    kill_after_checkpoint(4)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", **kw))
    monkeypatch.undo()
    assert not (tmp_path / "b").exists() and (tmp_path / "b.partial" / "checkpoints" / "step-00000004").is_dir()
    with open(tmp_path / "b.partial" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a SIGKILL in the middle of a line: the resume once died on it (JSONDecodeError)
    resumed = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", resume=True, **kw))
    assert resumed["resumed_from_step"] == 4 and resumed["steps"] == 7
    # fp32 on CPU: the same operations in the same order, so the weights are identical (tolerance 0)
    assert _max_diff(_weights(tmp_path / "a"), _weights(tmp_path / "b")) == 0.0
    la = [json.loads(x)["loss"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert la == lb and len(la) == 7
    assert resumed["final_loss"] == full["final_loss"]
    # resuming a finished run is a no-op that returns its summary
    again = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", resume=True, **kw))
    assert again["final_loss"] == resumed["final_loss"]


def test_the_last_step_is_checkpointed_so_a_kill_while_saving_the_policy_loses_no_step(tiny_model_dir, data_path, tmp_path,
                                                                                       kill_after_checkpoint, monkeypatch):
    """Saving the policy is the run's memory peak under FSDP; a kill there lost every step since the last checkpoint."""
    kw = dict(max_steps=5, save_every=2, lr=1e-2)
    full = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a", **kw))
    kill_after_checkpoint(5)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", **kw))
    monkeypatch.undo()
    assert (tmp_path / "b.partial" / "checkpoints" / "step-00000005").is_dir()
    resumed = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", resume=True, **kw))
    assert resumed["resumed_from_step"] == 5 and resumed["steps"] == 5
    assert resumed["final_loss"] == full["final_loss"] and resumed["final_lr"] == full["final_lr"]
    assert _max_diff(_weights(tmp_path / "a"), _weights(tmp_path / "b")) == 0.0
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_a_kill_loses_at_most_save_every_minutes_of_training(tiny_model_dir, data_path, tmp_path, kill_after_checkpoint, monkeypatch):
    """With no save_every (the default) a kill -9 or an out-of-memory kill lost every step of the training: a checkpoint
    also goes out once save_every_minutes have passed (here: at once, every step), and the resumed run ends the same."""
    kw = dict(max_steps=4, lr=1e-2)
    full = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a", **kw))
    kill_after_checkpoint(2)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", save_every_minutes=1e-9, **kw))
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "b.partial" / "checkpoints").iterdir()) == ["step-00000002"]
    resumed = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", resume=True, **kw))  # 30 min: none more here
    assert resumed["resumed_from_step"] == 2 and resumed["final_loss"] == full["final_loss"]
    assert _max_diff(_weights(tmp_path / "a"), _weights(tmp_path / "b")) == 0.0


@pytest.mark.parametrize("column, value", [("completion_token_ids", [5, None, 6]), ("behavior_logprobs", None), ("advantage", None)])
def test_a_null_where_the_contract_has_none_is_one_line_naming_column_and_row(tiny_model_dir, data_path, tmp_path, column, value):
    """A null inside a token list was read as -2**63 and blamed on the tokenizer; a null list trained on nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data_path)
    values = table.column(column).to_pylist()
    values[3] = value
    bad = table.set_column(table.schema.get_field_index(column), table.schema.field(column).with_nullable(True),
                           pa.array(values, table.schema.field(column).type))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(UserError, match=f"column '{column}' has a null in row 3"):
        train_policy(_cfg(tiny_model_dir, tmp_path / "bad.parquet", tmp_path / "p"))
    assert not (tmp_path / "p.partial").exists()


def test_epochs_that_give_no_step_are_refused_before_anything_is_written(tiny_model_dir, data_path, tmp_path):
    with pytest.raises(UserError, match="no step"):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "p", epochs=1e-4, max_steps=None))
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.partial").exists()


@pytest.mark.parametrize("dies_in", ["swap_dir_into_place", "drop_training_state"])
def test_a_kill_while_finishing_keeps_the_trained_policy(tiny_model_dir, data_path, tmp_path, monkeypatch, dies_in):
    """Killed just before <out>.partial becomes <out>: the resume continues from the last checkpoint (once
    deleted first, so it trained from step 0). Killed just after: <out> is complete, the resume clears it."""
    import toprcli.stages.train as stage

    kw = dict(max_steps=3, save_every=1, optimizer="adafactor", lr=1e-2)
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a", **kw))

    def die(*args, **kwargs):
        raise Killed(dies_in)

    target = stage.shards if dies_in == "swap_dir_into_place" else stage
    monkeypatch.setattr(target, dies_in, die)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", **kw))
    monkeypatch.undo()
    resumed = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", resume=True, **kw))
    assert resumed["steps"] == 3
    if dies_in == "swap_dir_into_place":  # the last step is checkpointed too: nothing is trained again
        assert resumed["resumed_from_step"] == 3 and not resumed.skipped
    else:
        assert resumed.skipped  # nothing to train again
    assert _max_diff(_weights(tmp_path / "a"), _weights(tmp_path / "b")) == 0.0
    assert not (tmp_path / "b" / "checkpoints").exists() and not (tmp_path / "b.partial").exists()


def _killed_after_step_2(kill_after_checkpoint, monkeypatch, cfg: TrainConfig) -> None:
    """``cfg`` trained until its checkpoint at step 2, then killed (the kill undone for what follows)."""
    kill_after_checkpoint(2)
    with pytest.raises(Killed):
        train_policy(cfg)
    monkeypatch.undo()


def test_resume_refuses_a_checkpoint_of_another_config(tiny_model_dir, data_path, tmp_path, kill_after_checkpoint, monkeypatch):
    kw = dict(max_steps=4, save_every=2)
    _killed_after_step_2(kill_after_checkpoint, monkeypatch, _cfg(tiny_model_dir, data_path, tmp_path / "p", **kw))
    with pytest.raises(UserError, match=r"different config \(changed: lr\) — run without --resume"):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "p", resume=True, lr=5e-3, **kw))
    # How a step is cut into forward passes is no such change: the advice after running out of memory.
    resumed = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "p", resume=True, micro_batch_tokens=64, gradient_checkpointing=True,
                                logprob_chunk_size=4, **kw))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 4


def test_a_rerun_without_resume_says_it_drops_the_checkpoint(tiny_model_dir, data_path, tmp_path, kill_after_checkpoint, monkeypatch):
    """A requeued job's same command without --resume started over and removed the checkpoint in silence."""
    kw = dict(max_steps=4, save_every=2)
    _killed_after_step_2(kill_after_checkpoint, monkeypatch, _cfg(tiny_model_dir, data_path, tmp_path / "p", **kw))
    with pytest.warns(UserWarning, match=r"starting over: the checkpoint of an earlier run \(step-0*2 in .*\) is removed — pass --resume"):
        assert train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "p", **kw))["steps"] == 4


def test_sft_on_a_set_with_no_positive_says_the_policy_will_not_change(tiny_model_dir, tmp_path):
    """sft learns from the rows with A > 0: on a set with none it reported 'trained' (loss 0, gradient 0) and saved the
    starting policy as if it were trained, without a word (a warning, not a refusal: an iterate round with no right
    sample must not stop the run for good)."""
    rows = curated_rows(16, seed=2, positive_share=0.0)
    data = write_curated(tmp_path / "neg.parquet", rows)
    with pytest.warns(UserWarning, match="loss sft trains on the rows with A > 0 and this set has none: the policy will not change"):
        train_policy(_cfg(tiny_model_dir, data, tmp_path / "p", loss="sft"))


def test_sft_warm_start_path_is_fast_and_learns(tiny_model_dir, tmp_path):
    """The pipeline's warm start: gold solutions, advantage 1, weight 1, μ = 0, loss sft."""
    rows = curated_rows(128, seed=1, positive_share=1.0, completion_len=(20, 40))
    rows["behavior_logprobs"] = [[0.0] * len(c) for c in rows["completion_token_ids"]]
    rows["advantage"] = [1.0] * 128
    rows["weight"] = [1.0] * 128
    rows["policy"] = ["gold"] * 128
    # a learnable pattern: every completion is the same sequence
    rows["completion_token_ids"] = [list(range(10, 40))] * 128
    rows["behavior_logprobs"] = [[0.0] * 30] * 128
    path = write_table_atomic(tmp_path / "gold.parquet", pa.Table.from_pydict(rows, schema=CURATED_SCHEMA), {"sampling": GREEDY})
    cfg = _cfg(tiny_model_dir, path, tmp_path / "warm", loss="sft", lr=3e-3, batch_size=64, epochs=4, max_steps=None)
    summary = train_policy(cfg)
    assert summary["steps"] == 8
    assert summary["final_loss"] < 0.5 * summary["first_loss"]  # NLL per token drops
    # μ = 0 is a placeholder, not a distribution: no ratio or gap to it is reported (a gap of 4.6 was, to every tracker)
    records = [json.loads(x) for x in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    assert not [k for r in records for k in r if k.startswith(("log_ratio", "neg_alpha", "behavior_gap"))]
    assert "behavior_gap_mean" not in summary and records[0]["loss"] > 0
    print(f"\nsft tiny model, batch 64: {summary['steps_per_s']:.2f} steps/s, {summary['tokens_per_s']:.0f} tokens/s")


def test_recompute_behavior_uses_the_starting_policy(tiny_model_dir, data_path, tmp_path):
    out = tmp_path / "re"
    summary = train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=1, recompute_behavior=True))
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert summary["behavior_gap_source"] == "full pass" and summary["behavior_gap_tokens"] > 0
    # μ is now π_0 itself: before the first update every sequence ratio is exactly 1
    assert abs(first["log_ratio_mean"]) < 1e-4 and first["neg_alpha_mean"] == pytest.approx(1.0, abs=1e-4)


def test_a_step_0_gap_beyond_rounding_is_warned_of_with_its_fix(tiny_model_dir, data_path, tmp_path):
    # The data's μ is not the tiny model's (uniform + noise): as a bfloat16 engine's μ would be, TOPR's α tapers negatives
    # before any update. One line names the gap, the tapered share and the fixes; recomputing μ silences it.
    with pytest.warns(UserWarning, match=r"before any update.*of the step's negatives are tapered.*--recompute-behavior") as caught:
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a", max_steps=2))
    assert len([w for w in caught if "before any update" in str(w.message)]) == 1  # step 1 only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", max_steps=1, recompute_behavior=True))
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "c", max_steps=1, loss="sft"))  # no ratio in the loss


def test_recompute_behavior_refuses_data_from_another_policy(tiny_model_dir, tmp_path):
    path = write_curated(tmp_path / "other.parquet", n=8, policy="some/other-model")
    out = tmp_path / "x"
    with pytest.raises(UserError, match="some/other-model"):
        train_policy(_cfg(tiny_model_dir, path, out, recompute_behavior=True))
    assert not out.exists() and not (tmp_path / "x.partial").exists()


def test_kl_to_the_starting_policy_and_entropy_bonus(tiny_model_dir, data_path, tmp_path):
    out = tmp_path / "kl"
    train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2, kl_coef=0.1, entropy_coef=0.01))
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # π = ref before the first update
    assert recs[1]["kl"] > 0 and recs[0]["entropy"] > 0


def test_lora_is_saved_merged(tiny_model_dir, data_path, tmp_path):
    out = tmp_path / "lora"
    summary = train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2, lr=1e-2, lora_rank=4, lora_target_modules=["q_proj", "v_proj"]))
    assert summary["trainable_parameters"] < summary["parameters"] / 10
    w, base = _weights(out), _weights(tiny_model_dir)
    # counted with the adapters, as under FSDP (counted after the merge in one process, it differed by run mode)
    assert summary["parameters"] == sum(t.numel() for t in base.values()) + summary["trainable_parameters"]
    assert w.keys() == base.keys()  # plain HF weights: no adapter keys
    moved = {k for k in w if (w[k] - base[k]).abs().max() > 0}
    assert moved and all(("q_proj" in k or "v_proj" in k) for k in moved)


def test_existing_output_needs_overwrite(tiny_model_dir, data_path, tmp_path):
    out = tmp_path / "o"
    train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=1))
    before = _weights(out)
    assert train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=1)).skipped  # the same command again: nothing to do
    with pytest.raises(UserError, match="--overwrite"):
        train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2))
    train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2, overwrite=True))
    assert _max_diff(before, _weights(out)) > 0
    assert [p.name for p in tmp_path.iterdir()] == ["o"]


# -- bad input: one line, exit code 2, no output ----------------------------------------


def _bad_rows(kind: str, vocab: int = 101) -> dict:
    rows = curated_rows(8, vocab=vocab)
    if kind == "vocab":
        rows["completion_token_ids"][3] = rows["completion_token_ids"][3][:-1] + [vocab + 5]
    elif kind == "long":
        rows["completion_token_ids"][2] = [5] * 600
        rows["behavior_logprobs"][2] = [-1.0] * 600
    elif kind == "length":
        rows["behavior_logprobs"][1] = rows["behavior_logprobs"][1] + [-1.0]
    return rows


@pytest.mark.parametrize(
    "case, extra, message",
    [
        ("missing", [], "missing column 'advantage'"),
        ("vocab", [], "outside the model's vocabulary"),
        ("long", [], "longer than the model's context"),
        ("length", [], "different length"),
        ("ok", ["--loss", "nope"], "'nope' — expected a registered loss: 'topr'"),
        ("ok", ["--loss", "topr", "--loss-option", "clip_ratio=0.2"], "'clip_ratio' does not apply to loss 'topr'"),
        ("ok", ["--loss", "tis", "--loss-option", "lower=2", "--loss-option", "upper=1"], "lower"),
        ("nofile", [], "no such file"),
    ],
)
def test_bad_input_one_line_exit_2_no_output(tiny_model_dir, tmp_path, case, extra, message):
    import pyarrow.parquet as pq

    data = tmp_path / "d.parquet"
    if case != "nofile":
        write_curated(data, _bad_rows(case))
    if case == "missing":
        pq.write_table(pq.read_table(data).drop_columns(["advantage"]), data)
    out = tmp_path / "policy"
    res = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--no-progress", *extra])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert lines[0].startswith("error:") and message in " ".join(lines), res.output
    assert not out.exists() and not (tmp_path / "policy.partial").exists()


def test_cli_trains_and_prints_a_summary(tiny_model_dir, data_path, tmp_path):
    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        ["train", "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(out), "--loss", "topr", "--optimizer", "adamw",
         "--lr", "1e-3", "--max-steps", "2", "--batch-size", "8", "--loss-option", "ratio_level=token", "--json", "--no-progress"],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["steps"] == 2 and (out / "config.json").is_file()
    assert json.loads((out / "_manifest.json").read_text())["config"]["loss_options"] == {"ratio_level": "token"}


def test_config_file_and_generic_loss_options(tiny_model_dir, data_path, tmp_path):
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text("train:\n  loss: tis\n  loss_options: {upper: 2.0, adv_clip: 0.5}\n  max_steps: 1\n  optimizer: adamw\n")
    out = tmp_path / "c"
    res = CliRunner().invoke(app, ["train", "-c", str(cfg_file), "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(rec["adv_mean"]) <= 0.5 + 1e-6 and "clip_frac" in rec


def test_prepare_checks_everything_before_output(tiny_model_dir, data_path, tmp_path):
    cfg = _cfg(tiny_model_dir, data_path, tmp_path / "p")
    with pytest.raises(UserError, match="ref_model is set but kl_coef is 0"):
        train_policy(replace(cfg, ref_model=str(tiny_model_dir)))
    with pytest.raises(UserError, match="model dir not found"):
        train_policy(replace(cfg, model=str(tmp_path / "missing-model")))
    with pytest.raises(UserError, match="LoRA target modules not found"):
        train_policy(replace(cfg, lora_rank=2, lora_target_modules=["nope_proj"]))
    assert list(tmp_path.iterdir()) == []


def test_train_reports_each_step_once_across_a_resume(tiny_model_dir, data_path, tmp_path, kill_after_checkpoint, monkeypatch):
    """--report-to tensorboard: a killed run resumes into the same events directory, each step once, beside the policy."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    kw = dict(max_steps=5, save_every=2, tracking=TrackingConfig(report_to=["tensorboard"]))
    kill_after_checkpoint(2)
    with pytest.raises(Killed):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "run", **kw))
    monkeypatch.undo()
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "run", resume=True, **kw))
    events = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"scalars": 0}).Reload()
    losses = [(json.loads(x)["step"], json.loads(x)["loss"]) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars("train/loss")] == losses and len(losses) == 5
    state = json.loads((tmp_path / "run" / "tracking.json").read_text())["backends"]["tensorboard"]
    assert state["logged"] == {"train": 5} and state["log_dir"] == str(tmp_path / "run" / "tb")  # not <out>.partial/tb


def test_a_tracked_training_names_its_output_not_the_partial_dir(tiny_model_dir, data_path, tmp_path, monkeypatch, mlflow_store):
    """The MLflow run of `topr train --out run` was tagged run_dir=run.partial, which is gone once the run finishes."""
    from mlflow.tracking import MlflowClient

    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "run", max_steps=1, tracking=TrackingConfig(report_to=["mlflow"])))
    state = json.loads((tmp_path / "run" / "tracking.json").read_text())["backends"]["mlflow"]
    assert MlflowClient().get_run(state["run_id"]).data.tags["run_dir"] == str((tmp_path / "run").resolve())


@pytest.mark.parametrize("loss, options", [
    ("sft", {}), ("reinforce", {}), ("is", {}), ("tis", {"upper": 2.0}), ("ppo", {"dual_clip": 3.0}),
    ("cispo", {}), ("kimi15", {"tau": 0.1}), ("topr", {"ratio_level": "token"}),
])
def test_every_registered_loss_trains(tiny_model_dir, data_path, tmp_path, loss, options):
    out = tmp_path / loss
    summary = train_policy(_cfg(tiny_model_dir, data_path, out, loss=loss, loss_options=options, max_steps=2, batch_size=8))
    assert summary["steps"] == 2 and math.isfinite(summary["final_loss"])
    assert _max_diff(_weights(out), _weights(tiny_model_dir)) > 0


def test_gradient_checkpointing_changes_nothing(tiny_model_dir, data_path, tmp_path):
    kw = dict(max_steps=2, optimizer="adafactor", lr=1e-2)
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "plain", **kw))
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "gc", gradient_checkpointing=True, **kw))
    assert _max_diff(_weights(tmp_path / "plain"), _weights(tmp_path / "gc")) < 1e-6


def test_bf16_mixed_precision_keeps_the_papers_small_updates(tiny_model_dir, data_path, tmp_path):
    """dtype bfloat16 = bf16 compute with fp32 master weights: 10 Adafactor steps at lr 5e-7 move the
    weights like float32 does; bfloat16-pure (bf16 weights) rounds most of those updates away."""
    kw = dict(max_steps=10, optimizer="adafactor", lr=5e-7, batch_size=16)
    base = _weights(tiny_model_dir)

    def delta(name: str, start=base, **extra) -> torch.Tensor:
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / name, **kw, **extra))
        w = _weights(tmp_path / name)
        assert all(v.dtype == torch.float32 for v in w.values())  # saved in float32 by default
        return torch.cat([(w[k].double() - start[k].double()).flatten() for k in sorted(start)])

    fp32, mixed = delta("fp32", dtype="float32"), delta("bf16", dtype="bfloat16")
    cos = float(torch.nn.functional.cosine_similarity(fp32, mixed, dim=0))
    ratio = float(mixed.norm() / fp32.norm())
    assert cos >= 0.9 and 0.8 <= ratio <= 1.25, (cos, ratio)
    with pytest.warns(UserWarning, match="rounded"):
        pure = delta("pure", start={k: v.to(torch.bfloat16) for k, v in base.items()}, dtype="bfloat16-pure")
    assert float((pure != 0).double().mean()) < 0.5 * float((fp32 != 0).double().mean())


def test_a_killed_training_resumes_after_its_directory_moved(tiny_model_dir, data_path, tmp_path, kill_after_checkpoint, monkeypatch):
    """A run dir moved (or named another way, relative then absolute): the checkpoint's config fingerprint held the
    model's and data's paths, so --resume (which iterate always passes) was refused as 'a different config'."""
    import shutil

    a = tmp_path / "a"
    a.mkdir()
    shutil.copytree(tiny_model_dir, a / "base", copy_function=shutil.copy2)
    shutil.copy2(data_path, a / "train.parquet")
    kw = dict(max_steps=4, save_every=2, optimizer="adafactor", lr=1e-2, micro_batch_tokens=200)
    kill_after_checkpoint(2)
    with pytest.raises(Killed):
        train_policy(_cfg(a / "base", a / "train.parquet", a / "policy", **kw))
    monkeypatch.undo()
    b = tmp_path / "b"
    a.rename(b)  # the move keeps the files as they are
    resumed = train_policy(_cfg(b / "base", b / "train.parquet", b / "policy", resume=True, **kw))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 4


def test_a_reference_model_with_another_vocabulary_is_refused(tiny_model_dir, data_path, tmp_path):
    """A KL reference of another tokenizer died with a bare IndexError in the precompute pass, after <out>.partial
    was made (or, at equal size, gave a meaningless KL)."""
    import shutil

    ref = tmp_path / "ref"
    shutil.copytree(tiny_model_dir, ref)
    config = json.loads((ref / "config.json").read_text())
    (ref / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] - 10}))
    with pytest.raises(UserError, match="--ref-model .* has another vocabulary"):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "p", ref_model=str(ref), kl_coef=0.1, max_steps=1))
    assert not (tmp_path / "p.partial").exists()


def test_mixed_precision_autocast_keeps_no_cast_copy_of_the_weights():
    """autocast's cast cache held a bf16 copy of every weight through each forward: 16 GB more at 8B on one GPU."""
    from toprcli.training.model import Precision

    with Precision("bfloat16", "cpu").autocast(distributed=False):
        assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_cache_enabled()


def test_steps_skipped_for_a_gradient_that_is_not_finite_are_said_and_its_files_are_strict_json(tiny_model_dir, data_path, tmp_path):
    """A diverged run (lr 1e8) skipped 5 of 6 steps in silence: exit 0, no word in the table, `skipped_steps` only in
    train_summary.json, which (like metrics.jsonl) held bare NaN, which strict JSON parsers refuse."""
    from toprcli.cli.main import app
    from toprcli.launch import run_train
    from toprcli.stages.train import SkippedSteps

    def strict(text: str) -> object:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a JSON file"))

    cfg = _cfg(tiny_model_dir, data_path, tmp_path / "p", lr=1e8, loss="reinforce", max_steps=4)
    with pytest.warns(SkippedSteps, match=r"of 4 optimizer steps were skipped: their gradient was not finite"):
        summary = run_train(cfg).summary
    assert summary["skipped_steps"] >= 1
    assert strict((tmp_path / "p" / "train_summary.json").read_text())["skipped_steps"] == summary["skipped_steps"]
    lines = [strict(line) for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert None in [r["grad_norm"] for r in lines]  # NaN written as null
    with pytest.warns(SkippedSteps):
        out = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(tmp_path / "q"), "--optimizer", "adamw",
                                       "--lr", "1e8", "--loss", "reinforce", "--batch-size", "16", "--max-steps", "4"])
    assert out.exit_code == 0 and "skipped steps (gradient not finite)" in out.output


def test_the_mu_gap_is_on_the_first_line_written_whatever_log_every(tiny_model_dir, data_path, tmp_path):
    """With --log-every 2 the step-1 record holding the gap was never written: metrics.jsonl (and so the trackers) had no gap."""
    summary = train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "p", log_every=2))
    records = [json.loads(line) for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3]
    assert records[0]["behavior_gap_mean"] == summary["behavior_gap_mean"] and "behavior_gap_mean" not in records[1]


def test_resume_into_a_dir_that_is_not_a_training_output_says_so(tiny_model_dir, data_path):
    """`topr train -m M -o M --resume` advised "(or --resume to keep a finished run)" to a command that had --resume."""
    from toprcli.errors import UserError

    for resume in (True, False):
        with pytest.raises(UserError, match=r"exists and is not a finished training output \(no train_summary.json\) — pass --overwrite to replace it"):
            train_policy(_cfg(tiny_model_dir, data_path, tiny_model_dir, resume=resume))


def test_resume_keeps_a_finished_out_only_if_it_was_trained_so(tiny_model_dir, data_path, tmp_path):
    """--resume on a finished --out trained with another loss, lr and data printed 'trained' and kept the old policy;
    how it runs (memory, threads) is no difference, and a kept one says it was kept."""
    out = tmp_path / "p"
    first = train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2))
    kept = train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2, resume=True, micro_batch_tokens=1024, threads=1))
    assert kept.skipped and kept["final_loss"] == first["final_loss"]
    # The same command run again (no --resume) does nothing, as every stage: a `set -e` script can be rerun.
    again = train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2))
    assert again.skipped and again["final_loss"] == first["final_loss"]
    with pytest.raises(UserError, match=r"is a finished training with other settings \(changed: loss, lr\)"):
        train_policy(_cfg(tiny_model_dir, data_path, out, max_steps=2, resume=True, loss="sft", lr=1e-5))
    r = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(out), "--optimizer", "adamw",
                                 "--lr", "1e-3", "--batch-size", "16", "--max-steps", "2", "--resume"])
    assert r.exit_code == 0 and "already trained (same settings), kept:" in r.stdout, r.output
    # Another model (its path was not compared, nor its files): not this training.
    from toprcli.models.tiny import TINY_PRESETS, build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=7, **TINY_PRESETS["tiny"])
    (other / "README.md").write_text("another model")  # other files whatever second it was built in
    with pytest.raises(UserError, match=r"other settings \(changed: model \(its files\)\)"):
        train_policy(_cfg(other, data_path, out, max_steps=2, resume=True))


@pytest.mark.parametrize("option, words", [("kl_coef=-1", "'loss_options.kl_coef': -1 — expected a finite number >= 0"),
                                           ("whiten_advantages=maybe", "'loss_options.whiten_advantages': 'maybe' — expected true or false"),
                                           ("entropy_coef=.nan", "'loss_options.entropy_coef'")])
def test_generic_options_given_as_loss_options_are_checked_as_their_flags(tiny_model_dir, data_path, tmp_path, option, words):
    """kl_coef=-1 was a traceback after the model loaded; whiten_advantages=maybe was true; entropy_coef=nan skipped every step."""
    r = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(tmp_path / "o"), "--loss-option", option])
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_what_a_review_of_training_found_is_one_line(tiny_model_dir, data_path, tmp_path):
    """A model dir without weights was an OSError traceback; whiten_advantages with a pairwise loss whitened its ±1 marks
    (and a step of chosen rows only raised mid-run); a warm-up longer than the run never reached --lr, in silence."""
    from toprcli.training.prepare import resolve_loss

    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (no_weights / name).write_bytes((tiny_model_dir / name).read_bytes())
    with pytest.raises(UserError, match=r"cannot load the model .*no-weights \(.*\) — pass a directory with its weights"):
        train_policy(_cfg(no_weights, data_path, tmp_path / "p", max_steps=1))
    with pytest.raises(UserError, match="is pairwise .* whiten_advantages and adv_clip do not apply"):
        resolve_loss(TrainConfig(loss="dpo", whiten_advantages=True))
    with pytest.warns(UserWarning, match=r"warmup_steps 5 > the run's 2 steps: the lr peaks at 0.40 × --lr"):
        train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "w", max_steps=2, warmup_steps=5))


def test_a_finished_policy_found_by_a_pipeline_loses_what_a_kill_left_in_it(tmp_path):
    """Killed between the rename to <out> and the cleanup: a pipeline counts the step done and never trains again, so
    its checkpoints (several times the model's size), the pass and the lock file stayed for good."""
    from toprcli import shards
    from toprcli.stages.train import trained
    from toprcli.training.precompute import PRECOMPUTED_NAME

    policy = tmp_path / "round-001" / "policy"
    (policy / "checkpoints" / "step-00000004").mkdir(parents=True)
    assert not trained(policy) and (policy / "checkpoints").exists()  # not finished: a resume needs them
    (policy / "config.json").write_text("{}")
    (policy / PRECOMPUTED_NAME).write_bytes(b"npz")
    lock = tmp_path / "round-001" / ".policy.lock"
    lock.write_text("pid 1 (killed)")
    assert trained(policy)
    assert sorted(p.name for p in policy.iterdir()) == ["config.json"] and not lock.exists()
    with shards.output_lock(policy):  # a lock someone holds stays
        trained(policy)
        assert lock.exists()


def test_trainer_settings_a_trl_user_reaches_for(tiny_model_dir, data_path, tmp_path):
    """Weight decay pulled norm gains toward 0 (every parameter was decayed); a linear schedule and --grad-clip 0 were
    refused; --kl-coef and loss_options kl_coef both given: one won in silence."""
    import torch

    from toprcli.training.optim import build_optimizer, lr_factor

    params = [torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))]  # a matrix, a norm gain
    opt = build_optimizer("adamw", params, lr=0.1, weight_decay=0.5)
    assert [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups] == [(1, 0.5), (1, 0.0)]
    params[0].grad, params[1].grad = torch.zeros(2, 2), torch.zeros(2)
    opt.step()
    assert torch.allclose(params[0].detach(), torch.full((2, 2), 0.95)) and torch.equal(params[1].detach(), torch.ones(2))
    assert [lr_factor(s, schedule="linear", warmup_steps=2, total_steps=6) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    cfg = _cfg(tiny_model_dir, data_path, tmp_path / "p")
    train_policy(replace(cfg, weight_decay=0.1, schedule="linear", grad_clip=0.0, max_steps=2, warmup_steps=0))
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([cfg.lr, cfg.lr / 2])
    with pytest.raises(UserError, match=r"kl_coef is set twice, to 0.5 \(--kl-coef\) and to 0.1 \(loss_options\)"):
        train_policy(replace(cfg, kl_coef=0.5, loss_options={"kl_coef": 0.1}, out=str(tmp_path / "q")))


def test_adam_betas_and_eps_reach_the_optimizer(tiny_model_dir, data_path, tmp_path):
    """AdamW's betas were fixed at (0.9, 0.999): LLM fine-tuning recipes (and ROLL files) set beta2 0.95."""
    import torch

    from toprcli.training.optim import build_optimizer

    opt = build_optimizer("adamw", [torch.nn.Parameter(torch.ones(2, 2))], lr=0.1, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-6)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["eps"] == 1e-6
    r = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(tmp_path / "p"), "--optimizer", "adamw",
                                 "--adam-betas", "0.9,0.95", "--adam-eps", "1e-6", "--max-steps", "1", "--batch-size", "8", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p" / "_manifest.json").read_text())["config"]["adam_betas"] == [0.9, 0.95]
    bad = CliRunner().invoke(app, ["train", "-m", str(tiny_model_dir), "-d", str(data_path), "-o", str(tmp_path / "q"), "--adam-betas", "0.9"])
    assert bad.exit_code == 2 and "two numbers in [0, 1)" in bad.output


def test_a_training_gives_the_callers_random_generators_back(tiny_model_dir, data_path, tmp_path):
    """Every run reset a notebook's numpy and torch generators to the training's seed (np.random.rand() was 0.5488 after
    each). The training itself is seeded as before: two runs give the same weights."""
    np.random.seed(123)
    torch.manual_seed(123)
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "a", max_steps=1, lora_rank=4))
    assert np.array_equal(np.random.get_state()[1], np_state) and torch.equal(torch.get_rng_state(), torch_state)
    train_policy(_cfg(tiny_model_dir, data_path, tmp_path / "b", max_steps=1, lora_rank=4))
    assert _max_diff(_weights(tmp_path / "a"), _weights(tmp_path / "b")) == 0.0
